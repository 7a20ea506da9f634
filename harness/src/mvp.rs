//! Kubernetes' own Mixed Version Proxy (KEP-4020, feature gate
//! `UnknownVersionInteroperabilityProxy`) on the real kube-apiservers of [`crate::real`]: what the
//! launcher adds so that the apiservers of one host proxy to each other, for the drill's
//! "in-apiserver MVP" column (`cluster::Options::mvp`).
//!
//! What it takes (spec §4.2, §4.3, §7, found on v1.36.2):
//! - one identity per apiserver: kube-apiserver names its identity lease after a hash of the
//!   hostname, so apiservers sharing a host would share one identity and never see each other
//!   as peers. Each runs in its own UTS namespace (`unshare --uts`) with hostname `kas-<id>`;
//! - a serving certificate that names `kubernetes.default.svc` (peers verify that name; the
//!   cluster's does), checked against `--peer-ca-file`;
//! - `--peer-advertise-ip/--peer-advertise-port`: where peers reach it (its own listener);
//! - a client certificate for the proxied hop (`--proxy-client-cert-file/-key-file`) from the
//!   requestheader CA, its CN in `--requestheader-allowed-names`: peers read the user from the
//!   `X-Remote-*` headers it sets;
//! - `--endpoint-reconciler-type=lease` (the peer endpoint leases).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::pki::{FRONT_PROXY_CN, Pair, Pki};

pub const FEATURE_GATE: &str = "UnknownVersionInteroperabilityProxy";
/// CN of the client certificate each apiserver presents to its peers on the proxied hop.
pub const PROXY_CLIENT_CN: &str = "kube-apiserver-proxy-client";

/// How the launcher gives each apiserver its own hostname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// `unshare --uts` (root, or CAP_SYS_ADMIN).
    Uts,
    /// `unshare --user --map-root-user --uts` (an unprivileged user where user namespaces are
    /// allowed).
    UserAndUts,
}

impl Namespaces {
    fn unshare_args(&self) -> &'static [&'static str] {
        match self {
            Namespaces::Uts => &["--uts"],
            Namespaces::UserAndUts => &["--user", "--map-root-user", "--uts"],
        }
    }

    /// Which kind of UTS namespace this machine lets us create, tried with `hostname` itself;
    /// a clear error where neither works.
    pub fn probe() -> Result<Self> {
        let mut why = Vec::new();
        for ns in [Namespaces::Uts, Namespaces::UserAndUts] {
            let out =
                Command::new("unshare").args(ns.unshare_args()).args(["hostname", "kas-probe"]).output();
            match out {
                Ok(out) if out.status.success() => return Ok(ns),
                Ok(out) => why.push(format!(
                    "unshare {}: {}",
                    ns.unshare_args().join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => why.push(format!("unshare: {e}")),
            }
        }
        bail!(
            "the in-apiserver Mixed Version Proxy needs one identity per kube-apiserver, which \
             kube-apiserver derives from the hostname: the launcher runs each in its own UTS \
             namespace (hostname kas-<id>), and this machine allows none ({}). Run as root (or \
             with CAP_SYS_ADMIN), or where unprivileged user namespaces are enabled, or run the \
             apiservers on separate hosts.",
            why.join("; ")
        )
    }
}

/// The MVP settings of one control plane.
#[derive(Debug, Clone)]
pub struct Mvp {
    pub peer_ca: PathBuf,
    pub proxy_client: Pair,
    pub namespaces: Namespaces,
}

impl Mvp {
    /// Issues the proxy client certificate (from the requestheader CA, into the PKI folder).
    pub fn new(pki: &Pki, namespaces: Namespaces) -> Result<Self> {
        let proxy_client = pki.requestheader_ca.client(&pki.dir, "proxy-client", PROXY_CLIENT_CN, &[])?;
        Ok(Self { peer_ca: pki.peer_ca.cert_path.clone(), proxy_client, namespaces })
    }

    /// The hostname (and so the identity) of apiserver `id`.
    pub fn hostname(id: &str) -> String {
        format!("kas-{id}")
    }

    /// `--requestheader-allowed-names`: Envoy's front-proxy certificate and the peers'.
    pub fn allowed_names() -> String {
        format!("{FRONT_PROXY_CN},{PROXY_CLIENT_CN}")
    }

    /// The flags an apiserver listening on `addr` gets, before its spec's own (which may
    /// override them).
    pub fn flags(&self, addr: SocketAddr) -> Vec<String> {
        let p = |path: &Path| path.display().to_string();
        vec![
            format!("--feature-gates={FEATURE_GATE}=true"),
            format!("--peer-ca-file={}", p(&self.peer_ca)),
            format!("--peer-advertise-ip={}", addr.ip()),
            format!("--peer-advertise-port={}", addr.port()),
            format!("--proxy-client-cert-file={}", p(&self.proxy_client.cert)),
            format!("--proxy-client-key-file={}", p(&self.proxy_client.key)),
            "--endpoint-reconciler-type=lease".into(),
        ]
    }

    /// `binary` run as apiserver `id` in its own UTS namespace. `unshare` (without `--fork`)
    /// and `sh` both exec, so the process the launcher holds is kube-apiserver itself and its
    /// SIGTERM and SIGKILL reach it.
    pub fn command(&self, binary: &Path, id: &str) -> Command {
        let mut command = Command::new("unshare");
        command
            .args(self.namespaces.unshare_args())
            .args(["--", "/bin/sh", "-c", "hostname \"$1\" && shift && exec \"$@\"", "sh"])
            .arg(Self::hostname(id))
            .arg(binary);
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder under target/tmp, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                crate::paths::workspace_root().join(format!("target/tmp/mvp-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mvp(dir: &Path) -> Mvp {
        let pki = Pki::generate(dir).unwrap();
        Mvp::new(&pki, Namespaces::Uts).unwrap()
    }

    #[test]
    fn flags_name_the_peer_ca_the_apiserver_s_own_address_and_the_proxy_client() {
        let dir = Scratch::new("flags");
        let m = mvp(dir.path());
        let flags = m.flags("127.0.0.1:7003".parse().unwrap());
        let value = |name: &str| {
            flags
                .iter()
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in {flags:?}"))
                .to_string()
        };
        assert_eq!(value("--feature-gates"), "UnknownVersionInteroperabilityProxy=true");
        assert_eq!(value("--peer-advertise-ip"), "127.0.0.1");
        assert_eq!(value("--peer-advertise-port"), "7003");
        assert_eq!(value("--endpoint-reconciler-type"), "lease");
        assert_eq!(value("--peer-ca-file"), dir.path().join("peer-ca.crt").display().to_string());
        assert_eq!(value("--proxy-client-cert-file"), m.proxy_client.cert.display().to_string());
        assert_eq!(value("--proxy-client-key-file"), m.proxy_client.key.display().to_string());
        assert_eq!(Mvp::allowed_names(), "skewgate-front-proxy,kube-apiserver-proxy-client");
    }

    #[test]
    fn the_proxy_client_certificate_is_a_client_certificate_of_the_requestheader_ca() {
        use x509_parser::prelude::*;
        let dir = Scratch::new("cert");
        let m = mvp(dir.path());
        let pem = std::fs::read(&m.proxy_client.cert).unwrap();
        let (_, pem) = parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let cn: Vec<&str> = cert.subject().iter_common_name().filter_map(|a| a.as_str().ok()).collect();
        assert_eq!(cn, [PROXY_CLIENT_CN]);
        let issuer: Vec<&str> = cert.issuer().iter_common_name().filter_map(|a| a.as_str().ok()).collect();
        assert_eq!(issuer, ["requestheader-ca"]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        // The key on disk is the certificate's.
        let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&m.proxy_client.key).unwrap()).unwrap();
        assert_eq!(key.public_key_raw(), cert.public_key().subject_public_key.data.as_ref());
    }

    #[test]
    fn each_apiserver_runs_under_its_own_hostname_and_execs_the_binary() {
        let dir = Scratch::new("command");
        let mut m = mvp(dir.path());
        let command = m.command(Path::new("/opt/k/kube-apiserver"), "b");
        assert_eq!(command.get_program(), "unshare");
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            [
                "--uts",
                "--",
                "/bin/sh",
                "-c",
                "hostname \"$1\" && shift && exec \"$@\"",
                "sh",
                "kas-b",
                "/opt/k/kube-apiserver"
            ]
        );
        m.namespaces = Namespaces::UserAndUts;
        let command = m.command(Path::new("/k"), "a");
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args[..4], ["--user", "--map-root-user", "--uts", "--"]);
        assert_eq!(args[args.len() - 2..], ["kas-a", "/k"]);
    }

    /// The wrapper really sets the hostname and passes the arguments through unchanged
    /// (spaces, quotes), where this machine allows a UTS namespace; where it does not, the
    /// probe's error says what is missing.
    #[test]
    fn the_wrapper_runs_the_program_under_the_hostname() {
        let dir = Scratch::new("wrapper");
        let mut m = mvp(dir.path());
        match Namespaces::probe() {
            Ok(ns) => {
                m.namespaces = ns;
                let script = dir.path().join("show");
                std::fs::write(&script, "#!/bin/sh\nprintf '%s|' \"$(hostname)\" \"$@\"\n").unwrap();
                std::process::Command::new("chmod").arg("+x").arg(&script).status().unwrap();
                let out = m.command(&script, "c").args(["--a=b c", "--q='x'"]).output().unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                assert_eq!(String::from_utf8_lossy(&out.stdout), "kas-c|--a=b c|--q='x'|");
            }
            Err(e) => {
                let e = format!("{e:#}");
                assert!(e.contains("UTS namespace") && e.contains("hostname"), "{e}");
            }
        }
    }
}
