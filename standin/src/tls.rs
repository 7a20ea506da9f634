//! The stand-in's TLS: one server config that asks for a client certificate, accepts one from
//! either trusted CA (or none), and afterwards tells which CA vouched for the peer, so that the
//! request can be authenticated as front-proxy or as an x509 user.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use sha2::Digest;

use skewgate_pki::{Pair, load_certs, load_key};

/// The peer's certificate, as far as it was verified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerCert {
    /// Subject CN and O values when the requestheader CA signed the chain.
    pub front_proxy: Option<Subject>,
    /// The same when the cluster (client) CA signed it.
    pub client: Option<Subject>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// Lower-case hex SHA-256 of the certificate's DER.
    pub fingerprint: String,
}

/// Builds the server config and the two single-CA verifiers used after the handshake.
pub struct Tls {
    pub config: Arc<rustls::ServerConfig>,
    requestheader: Arc<dyn ClientCertVerifier>,
    client: Arc<dyn ClientCertVerifier>,
}

fn roots(paths: &[&Path]) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for path in paths {
        for cert in load_certs(path)? {
            roots.add(cert).with_context(|| format!("CA certificate in {}", path.display()))?;
        }
    }
    Ok(Arc::new(roots))
}

impl Tls {
    /// `requestheader_ca` vouches for the front proxy, `client_ca` for x509 users.
    pub fn new(serving: &Pair, requestheader_ca: &Path, client_ca: &Path) -> Result<Tls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = |roots: Arc<RootCertStore>| {
            WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .allow_unauthenticated()
                .build()
                .context("client certificate verifier")
        };
        let both = verifier(roots(&[requestheader_ca, client_ca])?)?;
        let requestheader = verifier(roots(&[requestheader_ca])?)?;
        let client = verifier(roots(&[client_ca])?)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(both)
            .with_single_cert(load_certs(&serving.cert)?, load_key(&serving.key)?)
            .context("serving certificate")?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls { config: Arc::new(config), requestheader, client })
    }

    /// Which CA vouches for a chain the handshake already accepted.
    pub fn classify(&self, chain: Option<&[CertificateDer<'static>]>) -> PeerCert {
        let Some((leaf, intermediates)) = chain.and_then(<[_]>::split_first) else {
            return PeerCert::default();
        };
        let now = UnixTime::now();
        let by = |verifier: &Arc<dyn ClientCertVerifier>| {
            verifier.verify_client_cert(leaf, intermediates, now).ok().and_then(|_| subject(leaf))
        };
        PeerCert { front_proxy: by(&self.requestheader), client: by(&self.client) }
    }
}

/// CN (the last one, as Go's `pkix.Name` keeps it) and O values of a certificate.
fn subject(der: &CertificateDer<'_>) -> Option<Subject> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let name = cert.subject();
    let common_name = name.iter_common_name().filter_map(|a| a.as_str().ok()).last()?.to_string();
    let organizations =
        name.iter_organization().filter_map(|a| a.as_str().ok().map(str::to_string)).collect();
    let fingerprint = sha2::Sha256::digest(der.as_ref()).iter().map(|b| format!("{b:02x}")).collect();
    Some(Subject { common_name, organizations, fingerprint })
}
