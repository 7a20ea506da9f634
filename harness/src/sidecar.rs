//! The discovery sidecar as an operator runs it: the `skewgate` binary
//! ([`paths::skewgate_binary`]), `skewgate sync --config sidecar.json`, its log in a file of its
//! own. What it does is read as an operator reads it: `/readyz`, `/metrics` and `/status`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::paths;
use crate::process::Process;

/// How long a sidecar has to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Sidecar {
    /// Where `/healthz`, `/readyz`, `/metrics` and `/status` answer.
    pub listen: SocketAddr,
    process: Process,
    http: reqwest::Client,
}

impl Sidecar {
    /// Starts `skewgate sync --config CONFIG` (whose `listen` is `listen`), its output appended
    /// to `log`, and waits until its `/readyz` passes: a table in Envoy and the first OpenAPI
    /// round done, so that a client's first `kubectl explain` does not meet a 503.
    pub async fn start(config: &Path, listen: SocketAddr, log: &Path, timeout: Duration) -> Result<Self> {
        let mut command = Command::new(paths::skewgate_binary()?);
        command.arg("sync").arg("--config").arg(config);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        let banner = format!("skewgate sync --config {}", config.display());
        let process = Process::spawn(command, log, &banner)?;
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build()?;
        let mut sidecar = Self { listen, process, http };
        sidecar.wait_ready(timeout).await?;
        Ok(sidecar)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let url = format!("http://{}/readyz", self.listen);
        let deadline = Instant::now() + timeout;
        loop {
            if !self.process.running() {
                bail!("the sidecar exited before it was ready:\n{}", self.process.log_tail(20));
            }
            let answer = self.http.get(&url).send().await;
            if answer.as_ref().is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let why = match answer {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                bail!(
                    "the sidecar is not ready after {timeout:?}: {}\n{}",
                    why.trim(),
                    self.process.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its process id, for what /proc says of it (CPU, memory, bytes read).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// SIGTERM, and until it has exited.
    pub async fn stop(mut self) -> Result<()> {
        self.process.terminate()?;
        self.process.wait(STOP_TIMEOUT).await
    }

    /// SIGKILL: it dies wherever it is, mid-sync or not.
    pub fn kill(self) {
        drop(self.process);
    }

    /// Its Prometheus text.
    pub async fn metrics(&self) -> Result<String> {
        let url = format!("http://{}/metrics", self.listen);
        Ok(self.http.get(url).send().await?.error_for_status()?.text().await?)
    }

    /// Its latest sync's report (`/status`), `None` before its first sync ended.
    pub async fn status(&self) -> Result<Option<Value>> {
        let answer = self.http.get(format!("http://{}/status", self.listen)).send().await?;
        if answer.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Ok(None);
        }
        Ok(Some(answer.error_for_status()?.json().await?))
    }
}

/// `skewgate sync --config CONFIG --once`: one sync, Envoy's files written; its report.
pub fn sync_once(config: &Path, log: &Path) -> Result<Value> {
    let output = Command::new(paths::skewgate_binary()?)
        .arg("sync")
        .arg("--config")
        .arg(config)
        .arg("--once")
        .output()
        .context("running skewgate sync --once")?;
    let _ = std::fs::write(log, &output.stderr);
    if !output.status.success() {
        bail!(
            "skewgate sync --config {} --once failed ({}):\n{}",
            config.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("skewgate sync --once printed no report")
}

/// The report's entry for apiserver `id`.
pub fn apiserver<'a>(report: &'a Value, id: &str) -> Option<&'a Value> {
    report["apiservers"].as_array()?.iter().find(|a| a["id"] == id)
}

/// Where a sidecar keeps its log in a cluster's directory.
pub fn log_path(out: &Path) -> PathBuf {
    out.join("sidecar.log")
}
