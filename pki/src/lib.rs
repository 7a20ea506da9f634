//! Every certificate a skewed control plane needs, generated with rcgen and written as PEM:
//! the cluster CA (users' client certificates), the peer CA (apiserver serving certificates),
//! the requestheader CA (Envoy's front-proxy client certificate), Envoy's listener cert, and the
//! service-account signing key real kube-apiservers need.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The name Envoy expects in every apiserver serving certificate (SNI and SAN), as upstream's
/// peer proxy does.
pub const APISERVER_NAME: &str = "kubernetes.default.svc";
/// CN of Envoy's front-proxy client certificate; apiservers allow only this name.
pub const FRONT_PROXY_CN: &str = "skewgate-front-proxy";

pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: KeyPair,
    pub cert_path: PathBuf,
}

/// A certificate and key on disk.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pair {
    /// Certificate and key in one PEM, as `reqwest::Identity::from_pem` wants them.
    pub fn identity_pem(&self) -> Result<Vec<u8>> {
        let mut pem = std::fs::read(&self.cert)?;
        pem.extend(std::fs::read(&self.key)?);
        Ok(pem)
    }
}

/// Every certificate of a PEM file, for rustls.
pub fn load_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<_, _>>().context("parsing certificates")
}

/// The (first) private key of a PEM file, for rustls.
pub fn load_key(path: &std::path::Path) -> Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    rustls_pemfile::private_key(&mut pem.as_slice())?.context("no private key")
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        let cert_path = write(dir, &format!("{name}.crt"), &cert.pem())?;
        Ok(Self { cert, key, cert_path })
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, dir: &Path, file: &str, cn: &str, names: &[&str]) -> Result<Pair> {
        self.leaf(dir, file, cn.into(), &[], names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate: CN is the user, each O (at most two) a group (kube-apiserver's x509
    /// mapping), in this order. rcgen keeps one value per attribute type, so the second O goes
    /// in under O's OID (2.5.4.10) as a custom type, which encodes the same; a third would have
    /// no type left and silently replace one.
    pub fn client(&self, dir: &Path, file: &str, cn: &str, orgs: &[&str]) -> Result<Pair> {
        if orgs.len() > 2 {
            anyhow::bail!("{file}: rcgen writes at most two O per subject, not {orgs:?}");
        }
        self.leaf(dir, file, cn.into(), orgs, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate whose CN is a UniversalString: Envoy renders it as any other string,
    /// Go's x509 parser (kube-apiserver's) refuses the certificate.
    pub fn client_universal_cn(&self, dir: &Path, file: &str, cn: &str, orgs: &[&str]) -> Result<Pair> {
        let cn = rcgen::UniversalString::try_from(cn.to_owned())?;
        self.leaf(
            dir,
            file,
            rcgen::DnValue::UniversalString(cn),
            orgs,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn leaf(
        &self,
        dir: &Path,
        file: &str,
        cn: rcgen::DnValue,
        orgs: &[&str],
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<Pair> {
        let key = KeyPair::generate()?;
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        let organization = [DnType::OrganizationName, DnType::CustomDnType(vec![2, 5, 4, 10])];
        for (ty, o) in organization.into_iter().zip(orgs) {
            params.distinguished_name.push(ty, *o);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Pair {
            cert: write(dir, &format!("{file}.crt"), &cert.pem())?,
            key: write(dir, &format!("{file}.key"), &key.serialize_pem())?,
        })
    }
}

/// The certificates of one local control plane.
pub struct Pki {
    pub dir: PathBuf,
    /// Signs users' client certificates; Envoy's listener trusts it.
    pub cluster_ca: Ca,
    /// Signs apiserver serving certificates; Envoy trusts it upstream.
    pub peer_ca: Ca,
    /// Signs Envoy's front-proxy client certificate; apiservers trust it for X-Remote-* headers.
    pub requestheader_ca: Ca,
    /// Signs nothing anybody trusts: for "wrong CA" tests.
    pub rogue_ca: Ca,
    pub apiserver: Pair,
    /// A serving certificate like `apiserver`'s (same names) from the rogue CA: what an
    /// impostor, or an apiserver after a botched certificate rotation, presents.
    pub rogue_apiserver: Pair,
    pub front_proxy: Pair,
    pub envoy_listener: Pair,
    /// `CN=alice, O=devs`, from the cluster CA.
    pub alice: Pair,
    /// The service-account token key pair of real kube-apiservers (`cert` is the public key
    /// PEM, for `--service-account-key-file`; `key` for `--service-account-signing-key-file`).
    /// Every apiserver of a cluster must share it, or tokens one issued fail at the others.
    pub service_account: Pair,
}

impl Pki {
    pub fn generate(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let cluster_ca = Ca::new(dir, "cluster-ca")?;
        let peer_ca = Ca::new(dir, "peer-ca")?;
        let requestheader_ca = Ca::new(dir, "requestheader-ca")?;
        let rogue_ca = Ca::new(dir, "rogue-ca")?;
        let local = ["localhost", "127.0.0.1"];
        let apiserver =
            peer_ca.server(dir, "apiserver", "kube-apiserver", &[APISERVER_NAME, local[0], local[1]])?;
        let rogue_apiserver = rogue_ca.server(
            dir,
            "rogue-apiserver",
            "kube-apiserver",
            &[APISERVER_NAME, local[0], local[1]],
        )?;
        let front_proxy = requestheader_ca.client(dir, "front-proxy", FRONT_PROXY_CN, &[])?;
        let envoy_listener = cluster_ca.server(dir, "envoy-listener", "skewgate-envoy", &local)?;
        let alice = cluster_ca.client(dir, "alice", "alice", &["devs"])?;
        let sa = KeyPair::generate()?;
        let service_account = Pair {
            cert: write(dir, "sa.pub", &sa.public_key_pem())?,
            key: write(dir, "sa.key", &sa.serialize_pem())?,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            cluster_ca,
            peer_ca,
            requestheader_ca,
            rogue_ca,
            apiserver,
            rogue_apiserver,
            front_proxy,
            envoy_listener,
            alice,
            service_account,
        })
    }
}
