//! Real clients (kubectl, helm, the Python client) run in loops against a local cluster, and
//! what a loop reports: per operation, runs and failures, and for the first failures the
//! client's own messages next to the requests it made as Envoy's access log saw them (path,
//! status, which apiserver answered). Used by `e2e/tests/clients.rs` and
//! `e2e/tests/unauthenticated.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use tokio::io::AsyncWriteExt;

use crate::cluster::{self, Cluster, Options};
use crate::kubectl::{Kubectl, Output};
use crate::paths;
use crate::scenario::fresh_dir;

/// Failures whose output a report shows in full, per operation.
pub const SHOWN: usize = 3;
/// The query parameter of the marker requests that split Envoy's access log into runs.
const MARKER: &str = "skewgate-client-run";

/// One operation's runs.
#[derive(Debug, Default)]
pub struct Tally {
    pub runs: usize,
    pub failures: usize,
    /// Runs in which it was not tried because an earlier step failed (counted as failures).
    pub not_reached: usize,
    /// The first failures: marker label and what the client said.
    shown: Vec<(String, String)>,
    /// Every failure's error line ([`error_line`]), counted.
    causes: BTreeMap<String, usize>,
    took: Duration,
}

/// Every operation of one loop on one cluster. Each run of a client is announced by a marker
/// request through Envoy ([`Loop::mark`]), so that a failure's requests can be cut out of
/// Envoy's access log (on for every request: [`access_log_on`]).
#[derive(Debug)]
pub struct Loop {
    pub title: String,
    pub ops: BTreeMap<&'static str, Tally>,
    started: Instant,
    marks: usize,
}

impl Loop {
    pub fn new(title: impl Into<String>) -> Self {
        Loop { title: title.into(), ops: BTreeMap::new(), started: Instant::now(), marks: 0 }
    }

    /// Announces the next client run in Envoy's access log; returns its label for `record`.
    pub async fn mark(&mut self, c: &Cluster, op: &str, run: usize) -> Result<String> {
        self.marks += 1;
        let label = format!("{}-{op}-{run}", self.marks);
        marker(c, &label).await?;
        Ok(label)
    }

    /// One run of `op`; `failure` is what the client said when it failed.
    pub fn record(&mut self, op: &'static str, label: &str, took: Duration, failure: Option<String>) {
        let tally = self.ops.entry(op).or_default();
        tally.runs += 1;
        tally.took += took;
        if let Some(detail) = failure {
            tally.failures += 1;
            *tally.causes.entry(error_line(&detail)).or_default() += 1;
            if tally.shown.len() < SHOWN {
                tally.shown.push((label.to_string(), detail));
            }
        }
    }

    /// A step of a run that was not tried because an earlier one failed.
    pub fn not_reached(&mut self, op: &'static str) {
        let tally = self.ops.entry(op).or_default();
        tally.runs += 1;
        tally.failures += 1;
        tally.not_reached += 1;
    }

    /// Prints the report (a `CLIENTS-ROW` line per operation, then the failures shown with
    /// their requests), writes the rows to `$SKEWGATE_CLIENTS_SUMMARY` (`make clients`' table),
    /// and fails if any run failed.
    pub async fn conclude(self, c: &Cluster) -> Result<()> {
        let mut failed = Vec::new();
        let mut lines = Vec::new();
        for (op, t) in &self.ops {
            let mean = t.took.as_secs_f64() / t.runs.max(1) as f64;
            let verdict = if t.failures == 0 { "pass" } else { "FAIL" };
            let unreached = match t.not_reached {
                0 => String::new(),
                n => format!(" ({n} not reached)"),
            };
            let line = format!(
                "{}/{op}\t{verdict}\t{}\t{}{unreached}\t{:.1}s\tmean {mean:.2}s per run",
                self.title,
                t.runs,
                t.failures,
                t.took.as_secs_f64()
            );
            println!("CLIENTS-ROW\t{line}");
            lines.push(line);
            if t.failures > 0 {
                failed.push(format!("{op}: {} of {} failed{unreached}", t.failures, t.runs));
            }
        }
        for (op, t) in self.ops.iter().filter(|(_, t)| !t.causes.is_empty()) {
            println!("{} {op}: failures by error", self.title);
            for (cause, n) in &t.causes {
                println!("  {n:>4}× {cause}");
            }
        }
        let shown: Vec<(&str, &str, &str)> = self
            .ops
            .iter()
            .flat_map(|(op, t)| {
                t.shown.iter().map(move |(label, detail)| (*op, label.as_str(), detail.as_str()))
            })
            .collect();
        let log = match shown.is_empty() {
            true => String::new(),
            false => flushed_log(c).await.unwrap_or_else(|e| format!("(no access log: {e:#})")),
        };
        for (op, label, detail) in shown {
            println!("--- {} {op} ({label}) failed:\n{}", self.title, detail.trim_end());
            let requests = run_requests(c, &log, label);
            println!("  requests through Envoy ({}):", requests.len());
            for request in requests {
                println!("    {request}");
            }
            println!();
        }
        println!("{}: {:.1}s", self.title, self.started.elapsed().as_secs_f64());
        if let Some(dir) = std::env::var_os("SKEWGATE_CLIENTS_SUMMARY").map(PathBuf::from) {
            std::fs::create_dir_all(&dir)?;
            let file = self.title.replace(['/', ' '], "_");
            std::fs::write(dir.join(format!("{file}.tsv")), lines.join("\n") + "\n")?;
        }
        ensure!(failed.is_empty(), "{}: {}", self.title, failed.join("; "));
        Ok(())
    }
}

/// A cluster of `apiservers` under `<tmp>/<suite>/<name>-<pid>` (kept when a test fails), with
/// Envoy's access log on, once the edge answers what clients start from.
pub async fn start_edge(tmp: &Path, suite: &str, name: &str, apiservers: &[(&str, &str)]) -> Result<Cluster> {
    paths::envoy_binary()?;
    paths::filter_wasm()?;
    let options = Options::ephemeral(&fresh_dir(tmp, suite, name), apiservers);
    let c = cluster::start(&options).await.with_context(|| format!("starting cluster {name}"))?;
    access_log_on(&c).await?;
    let ready = edge_ready(&c, Duration::from_secs(60)).await?;
    println!(
        "{name}: the edge answered discovery and OpenAPI {:.1}s after the cluster started",
        ready.as_secs_f64()
    );
    Ok(c)
}

/// Every request through Envoy in its access log (off by default: a runtime key).
pub async fn access_log_on(c: &Cluster) -> Result<()> {
    let r = reqwest::Client::new()
        .post(c.envoy()?.admin_url("/runtime_modify?skewgate.access_log_min_status=0"))
        .send()
        .await?;
    ensure!(r.status().is_success(), "turning the access log on: {}", r.status());
    Ok(())
}

/// Waits until the edge answers the documents clients start from (`/api`, `/apis`,
/// `/openapi/v3`, `/openapi/v2`) with 200 to an authorized user: what the edge composes may be
/// ready some time after the cluster started. Returns how long that took (reported, not
/// asserted).
pub async fn edge_ready(c: &Cluster, timeout: Duration) -> Result<Duration> {
    let client = c.client(crate::cluster::Credentials::AdminToken, Duration::from_secs(10))?;
    let started = Instant::now();
    let mut last = Vec::new();
    loop {
        last.clear();
        for path in ["/api", "/apis", "/openapi/v3", "/openapi/v2"] {
            let status = match client.get(format!("{}{path}", c.envoy_url()?)).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            if status != 200 {
                last.push(format!("{path} {status}"));
            }
        }
        if last.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("the edge still answers {} after {timeout:?}", last.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn marker(c: &Cluster, label: &str) -> Result<()> {
    let client = c.client(crate::cluster::Credentials::AdminToken, Duration::from_secs(10))?;
    let r = client.get(format!("{}/version?{MARKER}={label}", c.envoy_url()?)).send().await?;
    ensure!(r.status().is_success(), "marker request {label}: {}", r.status());
    Ok(())
}

/// Envoy's log once everything before now is in it: the access log is flushed on a timer, so
/// a last marker is awaited (lines are written in the order requests end).
async fn flushed_log(c: &Cluster) -> Result<String> {
    let label = format!("end-{}", uuid::Uuid::new_v4());
    marker(c, &label).await?;
    let needle = format!("{MARKER}={label} ");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = c.envoy()?.log();
        if log.contains(&needle) {
            return Ok(log);
        }
        if Instant::now() > deadline {
            bail!("the access log never showed the last marker");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The requests between the marker `label` and the next marker, as `GET /path 200 → id`.
pub fn run_requests(c: &Cluster, log: &str, label: &str) -> Vec<String> {
    let start = format!("{MARKER}={label} ");
    let mut lines = log.lines().skip_while(|l| !l.contains(&start));
    if lines.next().is_none() {
        return vec![format!("(marker {label} not in the access log)")];
    }
    lines
        .take_while(|l| !l.contains(MARKER))
        .filter_map(|l| access_line(l, |port| c.apiserver_at(port)))
        .collect()
}

/// `GET /apis/resource.k8s.io/v1 404 → c (skewgate-set-c)` from one access log line; `who`
/// names the apiserver at a port.
fn access_line(line: &str, who: impl Fn(u16) -> Option<String>) -> Option<String> {
    let request = line.split('"').nth(1)?;
    let mut parts = request.split(' ');
    let (method, path) = (parts.next()?, parts.next()?);
    let rest = line.split('"').nth(2)?.trim();
    let status = rest.split(' ').next()?;
    let field = |key: &str| rest.split(' ').find_map(|w| w.strip_prefix(key)).unwrap_or("-");
    let upstream = field("upstream=");
    let who = upstream
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .and_then(who)
        .unwrap_or_else(|| upstream.to_string());
    Some(format!("{method} {path} {status} → {who} ({})", field("cluster=")))
}

/// A process run to completion within `deadline` (then killed: a failure, not a hung suite).
pub async fn run_process(
    mut command: tokio::process::Command,
    stdin: Option<&str>,
    deadline: Duration,
) -> Result<Output> {
    let started = Instant::now();
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = command.spawn().with_context(|| format!("starting {command:?}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await?;
    }
    let Ok(out) = tokio::time::timeout(deadline, child.wait_with_output()).await else {
        return Ok(Output {
            ok: false,
            code: None,
            stdout: String::new(),
            stderr: format!("still running after {deadline:?}: killed"),
            took: started.elapsed(),
        });
    };
    Ok(Output::finished(&out?, started))
}

/// `kubectl ARGS` run again and again, 100 ms apart, in a task of its own until stopped: what a
/// user polling a resource sees while the control plane changes under it.
pub struct Looping {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Result<Output>>>,
}

impl Looping {
    pub fn start(kubectl: &Kubectl, args: &[&str]) -> Looping {
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (kubectl, flag) = (kubectl.clone(), running.clone());
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let task = tokio::spawn(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut runs = Vec::new();
            while flag.load(std::sync::atomic::Ordering::SeqCst) {
                runs.push(kubectl.run(&args).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            runs
        });
        Looping { running, task }
    }

    /// Stops after the run under way; every run.
    pub async fn stop(self) -> Result<Runs> {
        self.running.store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(Runs(self.task.await?))
    }
}

/// The runs of a [`Looping`].
pub struct Runs(pub Vec<Result<Output>>);

impl Runs {
    /// What each failed run said.
    pub fn failures(&self) -> Vec<String> {
        self.0
            .iter()
            .filter_map(|r| match r {
                Ok(out) if out.ok => None,
                Ok(out) => Some(failure_detail(out)),
                Err(e) => Some(format!("{e:#}")),
            })
            .collect()
    }

    pub fn slowest(&self) -> Duration {
        self.0.iter().flatten().map(|r| r.took).max().unwrap_or_default()
    }

    /// Fails naming every failed run.
    pub fn ensure_none_failed(&self) -> Result<()> {
        let failed = self.failures();
        ensure!(
            failed.is_empty(),
            "{} of {} kubectl runs failed:\n{}",
            failed.len(),
            self.0.len(),
            failed.join("\n")
        );
        Ok(())
    }
}

/// What a failed run said: its exit status and stderr (the first 40 lines), or its stdout when
/// stderr is empty.
pub fn failure_detail(out: &Output) -> String {
    let mut text = format!("exit {:?}\n", out.code);
    for line in out.stderr.lines().filter(|l| !l.trim().is_empty()).take(40) {
        text.push_str(&format!("  {}\n", truncate(line, 600)));
    }
    if out.stderr.trim().is_empty() && !out.stdout.trim().is_empty() {
        text.push_str(&format!("  stdout: {}\n", truncate(out.stdout.trim(), 600)));
    }
    text
}

/// The line of a failure's detail that says what went wrong: the last one starting with
/// `error`/`Error` (kubectl, helm), else the last non-empty line (the first 200 characters).
pub fn error_line(detail: &str) -> String {
    let lines: Vec<&str> = detail.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("error") || l.starts_with("Error"))
        .or(lines.last())
        .copied()
        .unwrap_or("(nothing said)");
    truncate(line, 200)
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_detail_keeps_stderr_and_falls_back_to_stdout() {
        let out = |stdout: &str, stderr: &str| Output {
            ok: false,
            code: Some(1),
            stdout: stdout.into(),
            stderr: stderr.into(),
            took: Duration::ZERO,
        };
        let d = failure_detail(&out("ignored", "error: unable to recognize \"STDIN\"\n\n"));
        assert_eq!(d, "exit Some(1)\n  error: unable to recognize \"STDIN\"\n");
        assert_eq!(failure_detail(&out("3 of 4 found", "")), "exit Some(1)\n  stdout: 3 of 4 found\n");
        let long = "x".repeat(700);
        assert!(failure_detail(&out("", &long)).ends_with("…\n"));
    }

    #[test]
    fn error_lines_are_what_the_client_said_last() {
        let detail = "exit Some(1)\n  level=DEBUG msg=x\n  Error: INSTALLATION FAILED: boom\n  more\n";
        assert_eq!(error_line(detail), "Error: INSTALLATION FAILED: boom");
        assert_eq!(error_line("exit Some(1)\n  3 of 4 found\n"), "3 of 4 found");
        assert_eq!(error_line(""), "(nothing said)");
    }

    #[test]
    fn access_log_lines_name_the_apiserver() {
        let line = "[2026-11-23T05:12:00.123Z] \"GET /apis/resource.k8s.io/v1?timeout=32s HTTP/2\" 404 - \
                    via_upstream route=default cluster=skewgate-pool upstream=127.0.0.1:4501 3ms \
                    client=127.0.0.1:5555";
        let who = |port: u16| (port == 4501).then(|| "b".to_string());
        assert_eq!(
            access_line(line, who).as_deref(),
            Some("GET /apis/resource.k8s.io/v1?timeout=32s 404 → b (skewgate-pool)")
        );
        let local = "[2026-11-23T05:12:00.123Z] \"GET /apis HTTP/1.1\" 503 UH no_healthy_upstream \
                     route=default cluster=skewgate-pool upstream=- 0ms client=127.0.0.1:5555";
        assert_eq!(access_line(local, who).as_deref(), Some("GET /apis 503 → - (skewgate-pool)"));
    }
}
