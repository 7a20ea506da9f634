//! Test-only: certificates (skewgate-pki's, the same as the stand-ins' and Envoy tests') and a
//! tiny TLS server that answers raw bytes, so that fetch tests can produce every kind of broken
//! answer (garbage, truncation, hangs, wrong certificates).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use skewgate_pki::{Ca, Pair, load_certs, load_key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::config::{Identity, Limits, TlsFiles};
use crate::fetch::{ClientTls, Fetcher};
use skewgate_envoy::Endpoint;

/// An apiserver as the cluster's EndpointSlice publishes it, on 127.0.0.1.
pub fn published(id: &str, port: u16) -> crate::peers::Member {
    let endpoint = Endpoint { id: id.into(), address: "127.0.0.1".into(), port };
    crate::peers::Member { endpoint, source: crate::peers::Source::EndpointSlice }
}

/// Everything a fetch test needs on disk.
pub struct Certs {
    pub dir: PathBuf,
    pub peer_ca: Ca,
    pub rogue_ca: Ca,
    pub serving: Pair,
    pub wrong_name: Pair,
    pub client: Pair,
}

impl Certs {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("skewgate-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let peer_ca = Ca::new(&dir, "peer-ca").unwrap();
        let rogue_ca = Ca::new(&dir, "rogue-ca").unwrap();
        let serving = peer_ca.server(&dir, "apiserver", "apiserver", &["kubernetes.default.svc"]).unwrap();
        let wrong_name = peer_ca.server(&dir, "other", "other", &["other.example"]).unwrap();
        let client = rogue_ca.client(&dir, "front-proxy", "front-proxy", &[]).unwrap();
        Self { dir, peer_ca, rogue_ca, serving, wrong_name, client }
    }

    /// A sync configuration with apiserver `a` on `port`, following the cluster's EndpointSlice
    /// (a member that is no longer published leaves at the next look), listing its extensions
    /// or not, Envoy's files under this directory.
    pub fn following_cluster(&self, port: u16, extensions: bool) -> crate::config::SyncConfig {
        let wasm = self.dir.join("filter.wasm");
        std::fs::write(&wasm, "x").unwrap();
        let tls = self.tls_files();
        let doc = serde_json::json!({
            "apiservers": [{"id": "a", "address": "127.0.0.1", "port": port}],
            "tls": {"peerCa": tls.peer_ca, "clientCert": tls.client_cert, "clientKey": tls.client_key},
            "envoy": {"dir": self.dir.join("envoy"), "wasm": wasm},
            "cluster": {"members": "endpointSlice", "leaveAfter": "0s", "extensions": extensions},
        });
        crate::config::SyncConfig::from_value(&doc, &self.dir).unwrap()
    }

    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            peer_ca: self.peer_ca.cert_path.clone(),
            client_cert: self.client.cert.clone(),
            client_key: self.client.key.clone(),
        }
    }

    pub fn fetcher(&self, addr: SocketAddr, limits: Limits) -> Fetcher {
        let tls = ClientTls::load(&self.tls_files()).unwrap();
        let identity = Identity { user: "system:apiserver".into(), groups: vec!["g1".into(), "g2".into()] };
        let endpoint = Endpoint { id: "a".into(), address: addr.ip().to_string(), port: addr.port() };
        Fetcher::new(&endpoint, "kubernetes.default.svc", &tls, &identity, limits).unwrap()
    }
}

/// What the raw server does for one request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Status, content type, body.
    Json(u16, &'static str, Vec<u8>),
    /// Status, ETag, body (JSON), keeping the connection open.
    Tagged(u16, String, Vec<u8>),
    /// These bytes as the whole response, then close.
    Raw(Vec<u8>),
    /// Never answer.
    Hang,
}

pub fn json(body: impl Into<Vec<u8>>) -> Answer {
    Answer::Json(200, "application/json", body.into())
}

pub type Handler = Arc<dyn Fn(&str) -> Answer + Send + Sync>;

/// Requests seen: path and lower-cased headers (repeated ones joined with "|").
pub type Seen = Arc<Mutex<Vec<(String, HashMap<String, String>)>>>;

/// A TLS server on 127.0.0.1 speaking just enough HTTP/1.1; `tls: false` is a plaintext
/// server that answers 400 to whatever arrives.
/// A TLS server configuration with `leaf` as its certificate.
pub fn server_config(leaf: &Pair) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(load_certs(&leaf.cert).unwrap(), load_key(&leaf.key).unwrap())
        .unwrap();
    Arc::new(config)
}

pub async fn serve(
    leaf: &Pair,
    tls: bool,
    handler: Handler,
) -> (SocketAddr, Seen, tokio::task::JoinHandle<()>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(leaf));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, handler, seen) = (acceptor.clone(), handler.clone(), seen2.clone());
            tokio::spawn(async move {
                if tls {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        connection(stream, handler, seen).await;
                    }
                } else {
                    // What a plaintext HTTP server answers to a TLS ClientHello.
                    let mut tcp = tcp;
                    let mut buf = [0u8; 1024];
                    let _ = tcp.read(&mut buf).await;
                    let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
                    let _ = tcp.shutdown().await;
                    let _ = (handler, seen);
                }
            });
        }
    });
    (addr, seen, task)
}

async fn connection<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    handler: Handler,
    seen: Seen,
) {
    loop {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let path = lines.next().and_then(|l| l.split(' ').nth(1)).unwrap_or("").to_owned();
        let mut headers: HashMap<String, String> = HashMap::new();
        for line in lines.filter(|l| !l.is_empty()) {
            if let Some((k, v)) = line.split_once(':') {
                let entry = headers.entry(k.trim().to_ascii_lowercase()).or_default();
                if !entry.is_empty() {
                    entry.push('|');
                }
                entry.push_str(v.trim());
            }
        }
        seen.lock().unwrap().push((path.clone(), headers));
        match handler(&path) {
            Answer::Json(status, content_type, body) => {
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(&body).await.is_err()
                {
                    return;
                }
            }
            Answer::Tagged(status, etag, body) => {
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\netag: {etag}\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(&body).await.is_err()
                {
                    return;
                }
            }
            Answer::Raw(bytes) => {
                let _ = stream.write_all(&bytes).await;
                let _ = stream.shutdown().await;
                return;
            }
            Answer::Hang => {
                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                return;
            }
        }
    }
}
