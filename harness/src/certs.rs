//! `skewgate-harness certs`: the one-shot certificate job of the docker-compose cluster. Writes
//! the same PKI as `skewgate-harness cluster` (`Pki::generate`), the admin token and a
//! kubeconfig for Envoy's published port, into a directory that the other containers mount.
//!
//! The kubeconfig writing mirrors `cluster::kubeconfig_yaml` (which is being extended
//! elsewhere); fold the two together once that settles. The differences are deliberate: paths
//! here are relative to the kubeconfig, because the job writes inside a container what the
//! host's kubectl reads, and kubectl resolves relative paths against the kubeconfig's folder.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use skewgate_harness::cluster::ADMIN_TOKEN_FILE;
use skewgate_pki::Pki;

/// The certificate folder inside the output directory.
pub const PKI_DIR: &str = "pki";
pub const KUBECONFIG: &str = "kubeconfig";

/// What the containers read, relative to the PKI folder: if one is missing the PKI is made anew.
pub const PKI_FILES: [&str; 11] = [
    "cluster-ca.crt",
    "peer-ca.crt",
    "requestheader-ca.crt",
    "apiserver.crt",
    "apiserver.key",
    "front-proxy.crt",
    "front-proxy.key",
    "envoy-listener.crt",
    "envoy-listener.key",
    "alice.crt",
    "alice.key",
];

/// Writes what is missing of the PKI and the admin token, and the kubeconfig (always). Keeps a
/// complete PKI: running containers hold those certificates, and `docker compose up` runs the
/// job again on every start.
pub fn write(out: &Path, server: &str) -> Result<Value> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let pki = out.join(PKI_DIR);
    let complete = PKI_FILES.iter().all(|f| pki.join(f).is_file());
    if !complete {
        Pki::generate(&pki)?;
    }
    let token_path = out.join(ADMIN_TOKEN_FILE);
    let token = match std::fs::read_to_string(&token_path) {
        Ok(token) if !token.trim().is_empty() => token.trim().to_string(),
        _ => {
            // 256 random bits from the OS, as hex.
            let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
            std::fs::write(&token_path, &token)
                .with_context(|| format!("writing {}", token_path.display()))?;
            token
        }
    };
    let kubeconfig = out.join(KUBECONFIG);
    std::fs::write(&kubeconfig, kubeconfig_yaml(server, &token))
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
    Ok(json!({
        "pki": if complete { "kept" } else { "generated" },
        "dir": out.display().to_string(),
        "kubeconfig": kubeconfig.display().to_string(),
        "server": server,
    }))
}

/// Contexts `skewgate` (alice's client certificate, the default) and `skewgate-admin` (the
/// admin token), both through Envoy at `server`.
fn kubeconfig_yaml(server: &str, token: &str) -> String {
    let pki = |file: &str| PathBuf::from(PKI_DIR).join(file).display().to_string();
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: skewgate\nclusters:\n\
         - name: skewgate\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         contexts:\n\
         - name: skewgate\n  context: {{cluster: skewgate, user: alice}}\n\
         - name: skewgate-admin\n  context: {{cluster: skewgate, user: admin}}\n\
         users:\n\
         - name: alice\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
         - name: admin\n  user:\n    token: {token}\n",
        ca = pki("cluster-ca.crt"),
        cert = pki("alice.crt"),
        key = pki("alice.key"),
    )
}
