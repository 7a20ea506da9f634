//! The connection the sidecar keeps open to each apiserver, and probes it over.
//!
//! A probe is `/readyz`, then `/api` and `/apis` with `If-None-Match` of the ETags of the
//! apiserver's last good documents (304: unchanged), one after the other on the same HTTP/1.1
//! connection: cheap enough to repeat every few hundred milliseconds, and it keeps the connection
//! from ever being idle long enough for the apiserver to close it. So when the connection does
//! close, the apiserver's process stopped (a restart, a crash), and the sidecar knows the moment
//! it happens — before a restarted process listens again — instead of at its next probe.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http1::SendRequest;
use reqwest::header::{ACCEPT, ETAG, HOST, HeaderMap, HeaderValue, IF_NONE_MATCH};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use skewgate_core::discovery::ACCEPT_NOPEER;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::config::{Identity, TlsFiles};
use crate::fetch::{ClientError, ErrorKind, Etags, FetchError, identity_headers};
use skewgate_envoy::Endpoint;

/// How much of a changed document is read (and dropped: a full fetch follows) to keep the
/// connection usable.
const MAX_BODY: usize = 64 << 20;

/// How much of an answer is kept: a failing `/readyz` of kube-apiserver 1.36 lists ~40 checks
/// in ~1.5 KiB.
const KEPT: usize = 16 << 10;

/// What `/readyz` says of an apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// 200.
    Ready,
    /// It fails its `shutdown` check and nothing else: kube-apiserver after SIGTERM, serving
    /// every request for its `--shutdown-delay-duration` while its load balancers take it out.
    /// The last server of an API keeps that API's requests until it stops answering.
    Stopping,
    /// Anything else: starting (post-start hooks, informers), or a failing dependency.
    Unready,
}

impl Readiness {
    /// From `/readyz`'s status and body: on a failure kube-apiserver lists every check, `[-]`
    /// before each failing one (`[-]shutdown failed: reason withheld`).
    pub fn of(status: u16, body: &[u8]) -> Readiness {
        if status == 200 {
            return Readiness::Ready;
        }
        let text = String::from_utf8_lossy(body);
        let mut failing = text.lines().filter_map(|l| l.strip_prefix("[-]"));
        let stopping = failing.next().is_some_and(|check| check.starts_with("shutdown "));
        match stopping && failing.next().is_none() {
            true => Readiness::Stopping,
            false => Readiness::Unready,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Readiness::Ready => "ready",
            Readiness::Stopping => "stopping",
            Readiness::Unready => "unready",
        }
    }
}

/// What a probe found: whether the apiserver is ready and still serves the documents whose
/// ETags it was asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub readiness: Readiness,
    /// `Some(true)`: both documents unchanged (304); `Some(false)`: at least one changed;
    /// `None`: no ETags to ask with (legacy discovery).
    pub unchanged: Option<bool>,
}

/// How to reach one apiserver; [`Tether::connect`] opens a [`Link`].
#[derive(Clone)]
pub struct Tether {
    pub id: String,
    address: String,
    port: u16,
    server_name: ServerName<'static>,
    host: HeaderValue,
    tls: Arc<rustls::ClientConfig>,
    identity: HeaderMap,
}

impl std::fmt::Debug for Tether {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tether").field("id", &self.id).field("port", &self.port).finish()
    }
}

/// The TLS client side every tether shares: the peer CA, the front-proxy certificate.
pub fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&files.peer_ca)
        .map_err(|e| ClientError(format!("tls.peerCa {}: {e}", files.peer_ca.display())))?;
    for cert in certs {
        let cert = cert.map_err(|e| ClientError(format!("tls.peerCa {}: {e}", files.peer_ca.display())))?;
        roots.add(cert).map_err(|e| ClientError(format!("tls.peerCa {}: {e}", files.peer_ca.display())))?;
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.client_cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| ClientError(format!("tls.clientCert {}: {e}", files.client_cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(&files.client_key)
        .map_err(|e| ClientError(format!("tls.clientKey {}: {e}", files.client_key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| ClientError(format!("tls.clientCert/clientKey: {e}")))?;
    Ok(Arc::new(config))
}

impl Tether {
    pub fn new(
        endpoint: &Endpoint,
        server_name: &str,
        tls: Arc<rustls::ClientConfig>,
        identity: &Identity,
    ) -> Result<Self, ClientError> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| ClientError(format!("serverName {server_name:?}: {e}")))?;
        let host = HeaderValue::from_str(&format!("{server_name}:{}", endpoint.port))
            .map_err(|e| ClientError(format!("serverName {server_name:?}: {e}")))?;
        Ok(Self {
            id: endpoint.id.clone(),
            address: endpoint.address.clone(),
            port: endpoint.port,
            server_name: name,
            host,
            tls,
            identity: identity_headers(identity)?,
        })
    }

    /// TCP, TLS (the peer CA and the server name checked, the front-proxy certificate shown),
    /// HTTP/1.1.
    pub async fn connect(&self) -> Result<Link, FetchError> {
        let failed =
            |kind: ErrorKind, e: &dyn std::fmt::Display| FetchError::new("(connect)", kind, e.to_string());
        let tcp = TcpStream::connect((self.address.as_str(), self.port))
            .await
            .map_err(|e| failed(ErrorKind::Connect, &e))?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| failed(ErrorKind::Tls, &e))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| failed(ErrorKind::Request, &e))?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Link { sender, connection, host: self.host.clone(), identity: self.identity.clone() })
    }
}

/// One open connection to an apiserver.
pub struct Link {
    sender: SendRequest<Empty<Bytes>>,
    /// Ends when the connection does.
    connection: JoinHandle<()>,
    host: HeaderValue,
    identity: HeaderMap,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl Link {
    /// Resolves when the apiserver (or the network) closes the connection.
    pub async fn closed(&mut self) {
        let _ = (&mut self.connection).await;
    }

    /// `/readyz`, then `/api` and `/apis` asked with `etags` (if it has both). Any failure
    /// leaves the link unusable.
    pub async fn probe(&mut self, etags: &Etags) -> Result<Probe, FetchError> {
        let (status, _, body) = self.get("/readyz", None, None).await?;
        let readiness = Readiness::of(status.as_u16(), &body);
        let Some((api, apis)) = etags.both() else { return Ok(Probe { readiness, unchanged: None }) };
        let mut unchanged = true;
        for (path, tag) in [("/api", api), ("/apis", apis)] {
            let (status, etag, _) = self.get(path, Some(ACCEPT_NOPEER), Some(tag)).await?;
            let same = match status {
                hyper::StatusCode::NOT_MODIFIED => true,
                // A server that ignores If-None-Match but sends the same ETag has not changed.
                hyper::StatusCode::OK => etag.as_deref() == Some(tag),
                other => {
                    return Err(FetchError::new(path, ErrorKind::HttpStatus, other.to_string()));
                }
            };
            unchanged &= same;
        }
        Ok(Probe { readiness, unchanged: Some(unchanged) })
    }

    /// One GET; the body is read so that the connection can carry the next, and its first
    /// `KEPT` bytes kept (what `/readyz` says; a changed document is never held whole).
    async fn get(
        &mut self,
        path: &str,
        accept: Option<&'static str>,
        if_none_match: Option<&str>,
    ) -> Result<(hyper::StatusCode, Option<String>, Vec<u8>), FetchError> {
        let failed = |kind: ErrorKind, e: &dyn std::fmt::Display| FetchError::new(path, kind, e.to_string());
        let mut request = hyper::Request::get(path)
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(ErrorKind::Request, &e))?;
        let headers = request.headers_mut();
        headers.extend(self.identity.clone());
        headers.insert(HOST, self.host.clone());
        if let Some(accept) = accept {
            headers.insert(ACCEPT, HeaderValue::from_static(accept));
        }
        if let Some(tag) = if_none_match {
            let tag = HeaderValue::from_str(tag).map_err(|e| failed(ErrorKind::Request, &e))?;
            headers.insert(IF_NONE_MATCH, tag);
        }
        self.sender.ready().await.map_err(|e| failed(ErrorKind::Closed, &e))?;
        let response = self.sender.send_request(request).await.map_err(|e| failed(ErrorKind::Closed, &e))?;
        let status = response.status();
        let etag = response.headers().get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut body = Limited::new(response.into_body(), MAX_BODY);
        let mut kept = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| failed(ErrorKind::Truncated, &e))?;
            if let Some(data) = frame.data_ref() {
                kept.extend_from_slice(&data[..data.len().min(KEPT.saturating_sub(kept.len()))]);
            }
        }
        Ok((status, etag, kept))
    }
}

/// How long to wait for a probe before the link counts as failed.
pub fn probe_timeout(health_timeout_ms: u64) -> Duration {
    Duration::from_millis(health_timeout_ms.max(100))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Answer, Certs, json, serve};

    /// kube-apiserver after SIGTERM fails its `shutdown` check alone and still serves; one that
    /// starts fails others (the stand-ins answer both as v1.36 does).
    #[test]
    fn readiness_tells_stopping_from_starting() {
        assert_eq!(Readiness::of(200, b"ok"), Readiness::Ready);
        let stopping = b"[+]ping ok\n[+]etcd ok\n[-]shutdown failed: reason withheld\nreadyz check failed\n";
        assert_eq!(Readiness::of(500, stopping), Readiness::Stopping);
        assert_eq!(
            Readiness::of(500, b"[-]shutdown failed: reason withheld\nreadyz check failed\n"),
            Readiness::Stopping
        );
        let starting = skewgate_standin::startup::STARTING_READYZ;
        assert_eq!(Readiness::of(500, starting.as_bytes()), Readiness::Unready);
        let both = b"[-]etcd failed: reason withheld\n[-]shutdown failed: reason withheld\n";
        assert_eq!(Readiness::of(500, both), Readiness::Unready);
        assert_eq!(Readiness::of(500, b""), Readiness::Unready);
        assert_eq!(Readiness::of(503, b"[-]shutdownx failed\n"), Readiness::Unready);
    }

    const APIS_133: &str =
        include_str!("../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json");

    fn tether(certs: &Certs, addr: std::net::SocketAddr) -> Tether {
        let identity = Identity { user: "system:apiserver".into(), groups: vec!["g1".into(), "g2".into()] };
        let endpoint = Endpoint { id: "a".into(), address: addr.ip().to_string(), port: addr.port() };
        Tether::new(&endpoint, "kubernetes.default.svc", tls_config(&certs.tls_files()).unwrap(), &identity)
            .unwrap()
    }

    fn tagged(status: u16, etag: &str, body: &str) -> Answer {
        Answer::Tagged(status, etag.to_owned(), body.as_bytes().to_vec())
    }

    #[tokio::test]
    async fn probes_ask_with_the_etags_on_one_connection_and_see_it_close() {
        use std::sync::atomic::{AtomicU8, Ordering};
        let certs = Certs::new("tether-probe");
        // 1: unchanged, ready; 2: /apis changed, unready; 3: the server hangs up.
        let phase = Arc::new(AtomicU8::new(1));
        let p = phase.clone();
        let handler: crate::testing::Handler =
            Arc::new(move |path: &str| match (p.load(Ordering::SeqCst), path) {
                (3, _) => Answer::Raw(Vec::new()),
                (_, "/api") => tagged(304, "\"CORE\"", ""),
                (1, "/apis") => tagged(304, "\"APIS1\"", ""),
                (_, "/apis") => tagged(200, "\"APIS2\"", APIS_133),
                (1, "/readyz") => json("ok"),
                (_, "/readyz") => Answer::Json(500, "text/plain", b"[-]etcd failed".to_vec()),
                _ => Answer::Json(404, "application/json", b"{}".to_vec()),
            });
        let (addr, seen, _task) = serve(&certs.serving, true, handler).await;
        let mut link = tether(&certs, addr).connect().await.unwrap();
        let etags = Etags { api: Some("\"CORE\"".into()), apis: Some("\"APIS1\"".into()) };
        assert_eq!(
            link.probe(&etags).await.unwrap(),
            Probe { readiness: Readiness::Ready, unchanged: Some(true) }
        );
        {
            let seen = seen.lock().unwrap();
            assert_eq!(
                seen.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
                ["/readyz", "/api", "/apis"]
            );
            let (_, h) = &seen[2];
            assert_eq!(h["if-none-match"], "\"APIS1\"");
            assert_eq!(h["accept"], ACCEPT_NOPEER);
            assert_eq!(h["host"], format!("kubernetes.default.svc:{}", addr.port()));
            let (_, h) = &seen[0];
            assert_eq!(h["x-remote-user"], "system:apiserver");
            assert_eq!(h["x-remote-group"], "g1|g2");
        }
        phase.store(2, Ordering::SeqCst);
        assert_eq!(
            link.probe(&etags).await.unwrap(),
            Probe { readiness: Readiness::Unready, unchanged: Some(false) }
        );
        // Without ETags (legacy discovery) only readiness is asked about.
        assert_eq!(
            link.probe(&Etags::default()).await.unwrap(),
            Probe { readiness: Readiness::Unready, unchanged: None }
        );
        // All of that on one connection, which the server's hanging up ends.
        phase.store(3, Ordering::SeqCst);
        let error = link.probe(&etags).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Closed, "{error}");
        tokio::time::timeout(Duration::from_secs(5), link.closed()).await.unwrap();

        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert_eq!(tether(&certs, closed).connect().await.err().map(|e| e.kind), Some(ErrorKind::Connect));
        let rogue = certs
            .rogue_ca
            .server(&certs.dir, "rogue-apiserver", "rogue-apiserver", &["kubernetes.default.svc"])
            .unwrap();
        let (addr, _, _task) = serve(&rogue, true, Arc::new(|_: &str| json("{}"))).await;
        assert_eq!(tether(&certs, addr).connect().await.err().map(|e| e.kind), Some(ErrorKind::Tls));
    }

    /// An idle link notices at once when the apiserver stops.
    #[tokio::test]
    async fn a_closed_connection_is_noticed_without_a_request() {
        let certs = Certs::new("tether-closed");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = crate::testing::server_config(&certs.serving);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let stream = acceptor.accept(tcp).await.unwrap();
            // The process "exits": its end of the connection goes away.
            drop(stream);
        });
        let mut link = tether(&certs, addr).connect().await.unwrap();
        server.await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), link.closed()).await.unwrap();
    }
}
