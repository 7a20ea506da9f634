//! A child process of the test kit's (a real kube-apiserver, etcd, the `skewgate` sidecar), its
//! output appended to a log file of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A child process that is killed if it is still running when dropped (a failed test leaves
/// no apiserver behind).
pub(crate) struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    pub(crate) fn spawn(mut command: Command, log: &Path, banner: &str) -> Result<Self> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        writeln!(file, "==== {banner}")?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {banner}"))?;
        Ok(Self { child, log: log.to_path_buf() })
    }

    /// SIGKILL, and until it is gone.
    pub(crate) fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM (std's `Child::kill` only sends SIGKILL).
    pub(crate) fn terminate(&mut self) -> Result<()> {
        if self.running() {
            let status = Command::new("kill").args(["-s", "TERM", &self.child.id().to_string()]).status()?;
            if !status.success() && self.running() {
                bail!("kill -TERM {} failed", self.child.id());
            }
        }
        Ok(())
    }

    /// Until the process has exited; SIGKILL after `timeout`.
    pub(crate) async fn wait(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.running() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("pid {} still running {timeout:?} after SIGTERM: killed", self.child.id());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
