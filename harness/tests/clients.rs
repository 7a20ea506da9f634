//! Real clients through skewgate, as a new user runs them during skew: the pinned kubectl (apply,
//! server-side apply, create with default validation, diff, explain of a nested field of a
//! new-API kind), the Python client's DynamicClient and helm (install, upgrade, uninstall), each
//! run with fresh caches so that every run learns the API from scratch; and every document a
//! client reads to learn the API, asked for anonymously and with a bad token, must get an
//! apiserver's 401/403.
//!
//! Each loop runs on two clusters: the era stand-ins (1.33, 1.33, 1.36) and the stand-ins
//! serving a real kube-apiserver's captured documents (1.33-real, 1.33-real, 1.36-real).
//! `SKEWGATE_CLIENT_RUNS` sets the run counts: a number (every loop that many runs), `full`
//! (kubectl 50, Python 50, helm 20) or unset (3 each). A loop reports, per operation, its
//! failures and the first failures' stderr (with the requests the client made), then fails if
//! any run failed.
//!
//! Needs `make wasm` and `make setup` (Envoy, kubectl, helm and the Python client in .venv):
//! fails, never skips. `make clients` runs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_harness::cluster::{self, Cluster, Credentials, Options};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::kubectl::{Kubectl, Output};
use skewgate_harness::paths;

const ERA: &[(&str, &str)] = &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")];
const REAL: &[(&str, &str)] = &[("a", "1.33-real"), ("b", "1.33-real"), ("c", "1.36-real")];
/// What kubectl and client-go ask `/api` and `/apis` for first (aggregated, protobuf or JSON).
const AGGREGATED: &str = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,\
                          application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json";
/// What kubectl asks `/openapi/v2` for first.
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// Failures whose output a report shows in full, per operation.
const SHOWN: usize = 3;
/// One client run's limit: a hung run is a failure, not a hung suite.
const DEADLINE: Duration = Duration::from_secs(90);
const TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Scaffolding

/// Runs per loop: (kubectl, Python, helm).
fn runs() -> Result<(usize, usize, usize)> {
    match std::env::var("SKEWGATE_CLIENT_RUNS").ok().as_deref().map(str::trim) {
        None | Some("") => Ok((3, 3, 3)),
        Some("full") => Ok((50, 50, 20)),
        Some(n) => {
            let n: usize =
                n.parse().with_context(|| format!("SKEWGATE_CLIENT_RUNS={n:?}: a number or full"))?;
            ensure!(n > 0, "SKEWGATE_CLIENT_RUNS=0 would test nothing");
            Ok((n, n, n))
        }
    }
}

/// A cluster of its own under `target/tmp/clients/<name>-<pid>`, kept when the test fails.
async fn start(name: &str, apiservers: &[(&str, &str)]) -> Result<Cluster> {
    paths::envoy_binary()?;
    paths::kubectl_binary()?;
    paths::filter_wasm()?;
    let out =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("clients").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let options = Options::ephemeral(&out, apiservers);
    cluster::start(&options).await.with_context(|| format!("starting cluster {name}"))
}

async fn finish(c: Cluster) -> Result<()> {
    let out = c.out.clone();
    c.shutdown().await?;
    let _ = std::fs::remove_dir_all(out);
    Ok(())
}

/// One operation's runs.
#[derive(Debug, Default)]
struct Tally {
    runs: usize,
    failures: usize,
    /// The first failures: run number and what the client said.
    shown: Vec<(usize, String)>,
    took: Duration,
}

/// The outcome of every operation of one loop on one cluster.
#[derive(Debug)]
struct Loop {
    title: String,
    ops: BTreeMap<&'static str, Tally>,
    started: Instant,
}

impl Loop {
    fn new(title: impl Into<String>) -> Self {
        Loop { title: title.into(), ops: BTreeMap::new(), started: Instant::now() }
    }

    fn record(&mut self, op: &'static str, run: usize, took: Duration, failure: Option<String>) {
        let tally = self.ops.entry(op).or_default();
        tally.runs += 1;
        tally.took += took;
        if let Some(detail) = failure {
            tally.failures += 1;
            if tally.shown.len() < SHOWN {
                tally.shown.push((run, detail));
            }
        }
    }

    /// Prints the report (a `CLIENTS-ROW` line per operation, then the failures shown), writes
    /// the rows for `make clients`' summary, and fails if any run failed.
    fn conclude(self) -> Result<()> {
        let mut failed = Vec::new();
        let mut lines = Vec::new();
        for (op, t) in &self.ops {
            let mean = t.took.as_secs_f64() / t.runs.max(1) as f64;
            let verdict = if t.failures == 0 { "pass" } else { "FAIL" };
            let line = format!(
                "{}/{op}\t{verdict}\t{}\t{}\t{:.1}s\tmean {mean:.2}s per run",
                self.title,
                t.runs,
                t.failures,
                t.took.as_secs_f64()
            );
            println!("CLIENTS-ROW\t{line}");
            lines.push(line);
            if t.failures > 0 {
                failed.push(format!("{op}: {} of {} failed", t.failures, t.runs));
            }
        }
        for (op, t) in &self.ops {
            for (run, detail) in &t.shown {
                println!("--- {} {op}, run {run} failed:\n{}\n", self.title, detail.trim_end());
            }
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

/// A process run to completion within [`DEADLINE`].
async fn run_process(mut command: tokio::process::Command, stdin: Option<&str>) -> Result<Output> {
    let started = Instant::now();
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = command.spawn().with_context(|| format!("starting {command:?}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::io::AsyncWriteExt::write_all(&mut pipe, text.as_bytes()).await?;
    }
    let out = match tokio::time::timeout(DEADLINE, child.wait_with_output()).await {
        Ok(out) => out?,
        Err(_) => {
            return Ok(Output {
                ok: false,
                code: None,
                stdout: String::new(),
                stderr: format!("still running after {DEADLINE:?}: killed"),
                took: started.elapsed(),
            });
        }
    };
    Ok(Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    })
}

/// What a failed run said, in short: the client's own messages, then the requests it made
/// (`-v=6` lines: method, URL, status), so that the cause shows request by request.
fn failure_detail(out: &Output) -> String {
    let mut said = Vec::new();
    let mut requests = Vec::new();
    for line in out.stderr.lines() {
        match request_line(line) {
            Some(request) => requests.push(request),
            None if is_klog(line) => {}
            None => said.push(line.to_string()),
        }
    }
    let mut text = format!("exit {:?}\n", out.code);
    for line in said.iter().take(40) {
        text.push_str(&format!("  {}\n", truncate(line, 600)));
    }
    if !requests.is_empty() {
        text.push_str("  requests:\n");
        for request in &requests {
            text.push_str(&format!("    {request}\n"));
        }
    }
    if said.is_empty() && !out.stdout.trim().is_empty() {
        text.push_str(&format!("  stdout: {}\n", truncate(out.stdout.trim(), 600)));
    }
    text
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// A klog line (`I1123 05:12:00.123456 ...`).
fn is_klog(line: &str) -> bool {
    let mut chars = line.chars();
    matches!(chars.next(), Some('I' | 'W' | 'E')) && chars.take(4).all(|c| c.is_ascii_digit())
}

/// `GET /apis/resource.k8s.io/v1 200` from client-go's `-v=6` response line.
fn request_line(line: &str) -> Option<String> {
    if !is_klog(line) || !line.contains("\"Response\"") {
        return None;
    }
    let field = |key: &str| {
        let start = line.find(key)? + key.len();
        let end = line[start..].find('"')? + start;
        Some(line[start..end].to_string())
    };
    let url = field("url=\"")?;
    let path = url.split_once("://").and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_string()));
    Some(format!(
        "{} {} {}",
        field("verb=\"").unwrap_or_default(),
        path.unwrap_or(url),
        field("status=\"").unwrap_or_default()
    ))
}

/// A fresh, empty directory under the cluster's folder.
fn fresh_dir(c: &Cluster, name: &str) -> Result<PathBuf> {
    let dir = c.out.join("fresh").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// ---------------------------------------------------------------------------------------------
// kubectl

fn manifest(name: &str) -> Result<String> {
    let path = paths::workspace_root().join("testdata/clients/dra.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.replace("@NAME@", name))
}

/// One kubectl run with its own empty cache directory, as alice through Envoy.
async fn kubectl_fresh(c: &Cluster, cache: &str, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    let dir = fresh_dir(c, cache)?;
    let k = Kubectl::new(&c.kubeconfig, &dir)?;
    let mut all = args.to_vec();
    all.push("-v=6");
    let mut command = k.command(&all);
    command.env("HOME", &dir);
    let out = run_process(command, stdin).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn kubectl_loop(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let (runs, _, _) = runs()?;
    let c = start(name, apiservers).await?;
    let mut report = Loop::new(format!("kubectl {name}"));
    for run in 0..runs {
        let applied = manifest(&format!("apply-{run}"))?;
        let server_side = manifest(&format!("ssa-{run}"))?;
        let created = manifest(&format!("create-{run}"))?;
        let steps: [(&'static str, Vec<&str>, Option<&str>); 5] = [
            ("apply", vec!["apply", "-f", "-"], Some(&applied)),
            ("diff", vec!["diff", "-f", "-"], Some(&applied)),
            ("apply-server-side", vec!["apply", "--server-side", "-f", "-"], Some(&server_side)),
            ("create", vec!["create", "-f", "-"], Some(&created)),
            (
                "explain",
                vec![
                    "explain",
                    "resourceclaims.spec.devices.requests.exactly",
                    "--api-version=resource.k8s.io/v1",
                ],
                None,
            ),
        ];
        for (op, args, stdin) in steps {
            let out = kubectl_fresh(&c, op, &args, stdin).await?;
            let ok = match op {
                // 1: the objects differ from the manifest, which is not an error.
                "diff" => matches!(out.code, Some(0 | 1)),
                "explain" => out.ok && out.stdout.contains("deviceClassName"),
                _ => out.ok,
            };
            report.record(op, run, out.took, (!ok).then(|| failure_detail(&out)));
        }
        // Not one of the operations under test, but reported: deleting needs discovery too.
        let all = [applied, server_side, created].join("\n---\n");
        let out = kubectl_fresh(
            &c,
            "delete",
            &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            Some(&all),
        )
        .await?;
        report.record("delete", run, out.took, (!out.ok).then(|| failure_detail(&out)));
    }
    let concluded = report.conclude();
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_era() -> Result<()> {
    kubectl_loop("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_real() -> Result<()> {
    kubectl_loop("real", REAL).await
}

// ---------------------------------------------------------------------------------------------
// The Python client

/// Every (group, version, resource, kind) some apiserver serves, from each apiserver's own
/// aggregated discovery, straight from it: what a DynamicClient must find through skewgate.
async fn served_anywhere(c: &Cluster) -> Result<BTreeSet<(String, String, String, String)>> {
    let direct = c.direct_client(TIMEOUT)?;
    let mut union = BTreeSet::new();
    for (id, _) in c.running() {
        let url = c.apiserver_url(&id)?;
        for path in ["/api", "/apis"] {
            let r = direct.get(format!("{url}{path}")).header("accept", NOPEER).send().await?;
            ensure!(r.status() == 200, "{id} {path}: {}", r.status());
            let doc: Value = r.json().await?;
            for group in doc["items"].as_array().into_iter().flatten() {
                let g = group["metadata"]["name"].as_str().unwrap_or_default();
                for version in group["versions"].as_array().into_iter().flatten() {
                    let v = version["version"].as_str().unwrap_or_default();
                    for resource in version["resources"].as_array().into_iter().flatten() {
                        let r = resource["resource"].as_str().unwrap_or_default();
                        let kind = resource["responseKind"]["kind"].as_str().unwrap_or_default();
                        union.insert((g.to_string(), v.to_string(), r.to_string(), kind.to_string()));
                    }
                }
            }
        }
    }
    ensure!(union.iter().any(|(g, v, r, _)| (g.as_str(), v.as_str(), r.as_str()) == ("", "v1", "pods")));
    Ok(union)
}

async fn python_loop(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let (_, runs, _) = runs()?;
    let python = paths::python_with_kubernetes()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/dynamic_client.py");
    let c = start(name, apiservers).await?;
    let expected = served_anywhere(&c).await?;
    let expected_file = c.out.join("expected-gvrs.json");
    let list: Vec<[&str; 4]> =
        expected.iter().map(|(g, v, r, k)| [g.as_str(), v.as_str(), r.as_str(), k.as_str()]).collect();
    std::fs::write(&expected_file, serde_json::to_vec(&list)?)?;
    let mut report = Loop::new(format!("python {name}"));
    for run in 0..runs {
        let dir = fresh_dir(&c, "python")?;
        let mut command = tokio::process::Command::new(&python);
        command
            .arg(&script)
            .arg(&c.kubeconfig)
            .arg("skewgate")
            .arg(dir.join("discovery-cache.json"))
            .arg(&expected_file)
            .env("HOME", &dir);
        let out = run_process(command, None).await?;
        let _ = std::fs::remove_dir_all(&dir);
        let failure = (!out.ok).then(|| {
            let misses: Vec<&str> = out.stderr.lines().collect();
            format!(
                "exit {:?}; {} ({} lines on stderr):\n  {}",
                out.code,
                out.stdout.trim(),
                misses.len(),
                misses.iter().take(25).copied().collect::<Vec<_>>().join("\n  ")
            )
        });
        report.record("dynamic-client-finds-every-gvr", run, out.took, failure);
    }
    println!("python {name}: {} GVRs expected (the union of the apiservers' own discovery)", expected.len());
    let concluded = report.conclude();
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_era() -> Result<()> {
    python_loop("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_real() -> Result<()> {
    python_loop("real", REAL).await
}

// ---------------------------------------------------------------------------------------------
// helm

/// helm with empty caches and configuration (its discovery cache too: `KUBECACHEDIR`), as
/// alice through Envoy.
async fn helm(c: &Cluster, helm: &Path, args: &[&str]) -> Result<Output> {
    let dir = fresh_dir(c, "helm")?;
    let mut command = tokio::process::Command::new(helm);
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["--kube-context", "skewgate", "--namespace", "default", "--debug"])
        .env("HOME", &dir)
        .env("KUBECACHEDIR", dir.join("kube-cache"))
        .env("HELM_CACHE_HOME", dir.join("cache"))
        .env("HELM_CONFIG_HOME", dir.join("config"))
        .env("HELM_DATA_HOME", dir.join("data"))
        .env_remove("KUBECONFIG");
    let out = run_process(command, None).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn helm_loop(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let (_, _, runs) = runs()?;
    let bin = paths::helm_binary()?;
    let chart = paths::workspace_root().join("testdata/clients/chart");
    let chart = chart.to_str().context("chart path")?.to_string();
    let c = start(name, apiservers).await?;
    let mut report = Loop::new(format!("helm {name}"));
    for run in 0..runs {
        let release = format!("loop-{run}");
        let steps: [(&'static str, Vec<&str>); 3] = [
            ("install", vec!["install", &release, &chart]),
            ("upgrade", vec!["upgrade", &release, &chart, "--set", "message=upgraded"]),
            ("uninstall", vec!["uninstall", &release]),
        ];
        for (op, args) in steps {
            let out = helm(&c, &bin, &args).await?;
            report.record(op, run, out.took, (!out.ok).then(|| failure_detail(&out)));
        }
    }
    let concluded = report.conclude();
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_era() -> Result<()> {
    helm_loop("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_real() -> Result<()> {
    helm_loop("real", REAL).await
}

// ---------------------------------------------------------------------------------------------
// Documents for authenticated users only

/// Every document a client reads to learn the API, with the Accept it asks for it with: the
/// union of what the apiservers serve (straight from each), so that a group/version only one
/// of them serves is asked for too.
async fn documents(c: &Cluster) -> Result<Vec<(String, &'static str)>> {
    let direct = c.direct_client(TIMEOUT)?;
    let mut paths: BTreeSet<(String, &'static str)> = BTreeSet::new();
    for path in ["/api", "/apis"] {
        paths.insert((path.to_string(), AGGREGATED));
        paths.insert((path.to_string(), NOPEER));
        paths.insert((path.to_string(), "application/json"));
    }
    paths.insert(("/openapi/v3".to_string(), "application/json"));
    paths.insert(("/openapi/v2".to_string(), "application/json"));
    paths.insert(("/openapi/v2".to_string(), V2_PROTOBUF));
    for (id, _) in c.running() {
        let url = c.apiserver_url(&id)?;
        let core: Value = direct.get(format!("{url}/api")).send().await?.json().await?;
        for v in core["versions"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            paths.insert((format!("/api/{v}"), "application/json"));
        }
        let groups: Value = direct.get(format!("{url}/apis")).send().await?.json().await?;
        for group in groups["groups"].as_array().into_iter().flatten() {
            let g = group["name"].as_str().unwrap_or_default();
            paths.insert((format!("/apis/{g}"), "application/json"));
            for gv in group["versions"].as_array().into_iter().flatten() {
                let gv = gv["groupVersion"].as_str().unwrap_or_default();
                paths.insert((format!("/apis/{gv}"), "application/json"));
            }
        }
        let index: Value = direct.get(format!("{url}/openapi/v3")).send().await?.json().await?;
        for entry in index["paths"].as_object().into_iter().flatten().map(|(_, e)| e) {
            if let Some(relative) = entry["serverRelativeURL"].as_str() {
                paths.insert((relative.to_string(), "application/json"));
            }
        }
    }
    // And what the edge itself lists, as an authenticated user sees it (its hashes may differ).
    let admin = c.client(Credentials::AdminToken, TIMEOUT)?;
    let index: Value = admin.get(format!("{}/openapi/v3", c.envoy_url()?)).send().await?.json().await?;
    for entry in index["paths"].as_object().into_iter().flatten().map(|(_, e)| e) {
        if let Some(relative) = entry["serverRelativeURL"].as_str() {
            paths.insert((relative.to_string(), "application/json"));
        }
    }
    Ok(paths.into_iter().collect())
}

/// A client for Envoy with no credential, or with `Authorization: Bearer garbage`.
fn stranger(c: &Cluster, token: Option<&str>) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&c.pki.cluster_ca.cert_path)?)?;
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    }
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .no_proxy()
        .timeout(TIMEOUT)
        .default_headers(headers)
        .build()?)
}

async fn documents_need_authentication(name: &str, apiservers: &[(&str, &str)]) -> Result<()> {
    let c = start(&format!("auth-{name}"), apiservers).await?;
    let documents = documents(&c).await?;
    let mut report = Loop::new(format!("unauthenticated {name}"));
    // Anonymous access is on (kube-apiserver's default): system:anonymous gets 403 for discovery
    // and OpenAPI; a token nobody issued gets 401 whatever anonymous access says.
    for (op, token, expected) in [("anonymous", None, 403), ("bearer-garbage", Some("garbage"), 401)] {
        let client = stranger(&c, token)?;
        for (path, accept) in &documents {
            let started = Instant::now();
            let r = client.get(format!("{}{path}", c.envoy_url()?)).header("accept", *accept).send().await?;
            let status = r.status().as_u16();
            let served_by = r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = r.bytes().await?;
            let kind = serde_json::from_slice::<Value>(&body).ok().map(|v| v["kind"].clone());
            let failure =
                (status != expected || served_by.is_none() || kind != Some(json!("Status"))).then(|| {
                    format!(
                        "GET {path} (Accept: {accept}): {status}, expected {expected} from an apiserver; \
                     served by {served_by:?}, kind {kind:?}, {} bytes",
                        body.len()
                    )
                });
            report.record(op, 0, started.elapsed(), failure);
        }
    }
    println!("unauthenticated {name}: {} documents, each anonymous and with a bad token", documents.len());
    let concluded = report.conclude();
    if concluded.is_ok() {
        finish(c).await?;
    }
    concluded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_era() -> Result<()> {
    documents_need_authentication("era", ERA).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_real() -> Result<()> {
    documents_need_authentication("real", REAL).await
}

#[test]
fn request_lines_are_read_from_client_go_logs() {
    let line = r#"I1123 05:12:00.123456   42 round_trippers.go:632] "Response" verb="GET" url="https://127.0.0.1:4443/apis/resource.k8s.io/v1?timeout=32s" status="404 Not Found" milliseconds=3"#;
    assert_eq!(request_line(line).as_deref(), Some("GET /apis/resource.k8s.io/v1?timeout=32s 404 Not Found"));
    assert_eq!(request_line("error: the server doesn't have a resource type \"resourceclaims\""), None);
    let out = Output {
        ok: false,
        code: Some(1),
        stdout: String::new(),
        stderr: format!("{line}\nerror: unable to recognize \"STDIN\"\n"),
        took: Duration::ZERO,
    };
    let detail = failure_detail(&out);
    assert!(detail.contains("unable to recognize"), "{detail}");
    assert!(detail.contains("GET /apis/resource.k8s.io/v1?timeout=32s 404"), "{detail}");
}
