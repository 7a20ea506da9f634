//! The pinned kubectl (`.venv/bin/kubectl`) as tests drive it: async runs with a deadline, a
//! private discovery cache, and the request/response pairs of a `-v=8` run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::AsyncWriteExt;

use crate::paths;

/// A kubectl bound to one kubeconfig (and context).
#[derive(Debug, Clone)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    context: Option<String>,
    cache_dir: PathBuf,
    /// What one run may take before it is killed and counted as a failure.
    pub deadline: Duration,
}

/// What one kubectl run did.
#[derive(Debug, Clone)]
pub struct Output {
    pub ok: bool,
    /// The exit status (`None` when a signal ended it): `kubectl diff` exits 1 for "differs".
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Output {
    /// A process that ran to completion, started at `started`.
    pub fn finished(out: &std::process::Output, started: Instant) -> Output {
        Output {
            ok: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            took: started.elapsed(),
        }
    }
}

/// One HTTP exchange from a `-v=8` log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub verb: String,
    pub url: String,
    /// 0 when the log has no response for the request.
    pub status: u16,
    /// Response headers, names as kubectl prints them (canonical case).
    pub headers: Vec<(String, String)>,
}

impl Exchange {
    /// A response header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl Kubectl {
    /// The kubectl from `.venv` (a missing one is an error, never a skip), with its discovery
    /// and HTTP caches in `cache_dir`.
    pub fn new(kubeconfig: &Path, cache_dir: &Path) -> Result<Self> {
        Ok(Self {
            bin: paths::kubectl_binary()?,
            kubeconfig: kubeconfig.to_path_buf(),
            context: None,
            cache_dir: cache_dir.to_path_buf(),
            deadline: Duration::from_secs(30),
        })
    }

    /// The same kubectl with another kubeconfig context.
    pub fn with_context(&self, context: &str) -> Self {
        Self { context: Some(context.to_string()), ..self.clone() }
    }

    /// The same kubectl with its own (empty) cache directory: discovery starts from scratch.
    pub fn with_cache(&self, cache_dir: &Path) -> Self {
        Self { cache_dir: cache_dir.to_path_buf(), ..self.clone() }
    }

    /// `kubectl --kubeconfig … [--context …] --cache-dir … <args>`, killed when dropped.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(&self.cache_dir);
        if let Some(context) = &self.context {
            c.arg("--context").arg(context);
        }
        c.args(args).stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// The same command for a blocking caller, e.g. a watch read from a thread.
    pub fn std_command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(&self.cache_dir);
        if let Some(context) = &self.context {
            c.arg("--context").arg(context);
        }
        c.args(args).stdin(Stdio::null());
        c
    }

    pub async fn run(&self, args: &[&str]) -> Result<Output> {
        self.run_with_stdin(args, None).await
    }

    /// Runs kubectl to completion, feeding `stdin` (for `-f -`).
    pub async fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let started = Instant::now();
        let mut command = self.command(args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().with_context(|| format!("starting kubectl {args:?}"))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).await?;
            drop(pipe);
        }
        let out = match tokio::time::timeout(self.deadline, child.wait_with_output()).await {
            Ok(out) => out?,
            Err(_) => bail!("kubectl {} still running after {:?}", args.join(" "), self.deadline),
        };
        Ok(Output::finished(&out, started))
    }

    /// Runs kubectl and returns its stdout; failing is an error carrying stderr.
    pub async fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args).await?;
        if !out.ok {
            bail!("kubectl {} failed: {}{}", args.join(" "), out.stderr, out.stdout);
        }
        Ok(out.stdout)
    }

    /// `ok` with a manifest on stdin.
    pub async fn ok_with_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        let out = self.run_with_stdin(args, Some(stdin)).await?;
        if !out.ok {
            bail!("kubectl {} failed: {}{}", args.join(" "), out.stderr, out.stdout);
        }
        Ok(out.stdout)
    }

    /// Runs kubectl, which must fail; returns its stderr.
    pub async fn fails(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args).await?;
        if out.ok {
            bail!("kubectl {} succeeded: {}", args.join(" "), out.stdout);
        }
        Ok(out.stderr)
    }
}

/// The request/response pairs of a `kubectl -v=8` log, in order. kubectl logs each request
/// (`"Request" verb=… url=…`) and then its response (`"Response" status=… headers=<` … ` >`).
pub fn exchanges(log: &str) -> Vec<Exchange> {
    /// Which header block the log is in, if any.
    enum Block {
        None,
        Request,
        Response(usize),
    }
    let mut out: Vec<Exchange> = Vec::new();
    let mut pending: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut block = Block::None;
    for line in log.lines() {
        match block {
            Block::Request | Block::Response(_) if line.trim_start().starts_with('>') => {
                block = Block::None;
                continue;
            }
            Block::Request => continue,
            Block::Response(index) => {
                if let Some((name, value)) = line.trim().split_once(": ") {
                    out[index].headers.push((name.to_string(), value.to_string()));
                }
                continue;
            }
            Block::None => {}
        }
        let opens_block = line.trim_end().ends_with("headers=<");
        if line.contains("\"Request\" verb=\"") {
            let verb = quoted(line, "verb=\"").unwrap_or_default();
            let url = quoted(line, "url=\"").unwrap_or_default();
            out.push(Exchange { verb, url, status: 0, headers: Vec::new() });
            pending.push_back(out.len() - 1);
            if opens_block {
                block = Block::Request;
            }
        } else if line.contains("\"Response\"") {
            let status = quoted(line, "status=\"")
                .and_then(|s| s.split_whitespace().next().and_then(|c| c.parse().ok()))
                .unwrap_or(0);
            // Without a request line (lower verbosity) there is nothing to pair it with.
            let Some(index) = pending.pop_front() else { continue };
            out[index].status = status;
            if opens_block {
                block = Block::Response(index);
            }
        }
    }
    out
}

fn quoted(line: &str, key: &str) -> Option<String> {
    let start = line.find(key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}
