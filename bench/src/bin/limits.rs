//! `make limits`: Envoy's and the sidecar's resident memory at skewgate's size limits and beyond
//! them. Prints one table; nothing is asserted (the limits' behaviour is tested in
//! core, sidecar and harness tests), the figures are for people.
//!
//! Envoy (`--concurrency 2`, the shipped bootstrap, the filter) in front of three echo
//! apiservers, fed one big `ecds.json` after the real 1.33/1.33/1.36 table: the biggest realistic
//! table within the limits, one of 60,000 GVRs, one of 200,000 group/versions (~28 MB), a 100 MB
//! one whose discovery document is not JSON; each on a fresh Envoy and followed by the real table
//! again. Then the sidecar (`skewgate sync` as its own process, with the image's
//! `GLIBC_TUNABLES`) and an Envoy it feeds, while one apiserver's `/apis` grows to the
//! per-apiserver limits, then to 50,000 groups, and back. RSS peaks are sampled every 20 ms.
//!
//! Usage: limits [--skewgate PATH] [--only envoy|sidecar] [--glibc-tunables VALUE]
//! (the filter: `$SKEWGATE_WASM` or target/wasm32-wasip1/release; `skewgate`: target/release;
//! `--glibc-tunables ""` runs the sidecar without the image's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use skewgate_bench::rss_kib;
use skewgate_core::build::{ClusterNames, ServerApis, build_table};
use skewgate_core::discovery::ApiGroupDiscoveryList;
use skewgate_core::table::{GroupVersionConfig, MAX_GROUP_VERSIONS, MAX_GVRS, MAX_TABLE_BYTES, TableConfig};
use skewgate_envoy::{self as resources, Endpoint, Health};
use skewgate_harness::echo::{self, SERVED_BY};
use skewgate_harness::envoy::{Config, Envoy, Settings, free_port, sealed_json, upstream_tls};
use skewgate_harness::limits::{DiscoveryServer, Shape, crd_groups, filler_group_versions};
use skewgate_harness::paths;
use skewgate_pki::{APISERVER_NAME, Pki};
use skewgate_standin::Profile;

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
const ECDS_STATS: [&str; 3] = [
    "extension_config_discovery.http_filter.skewgate.update_success",
    "extension_config_discovery.http_filter.skewgate.update_rejected",
    "extension_config_discovery.http_filter.skewgate.update_failure",
];

fn size(bytes: usize) -> String {
    if bytes < 1_000_000 {
        format!("{:.0} kB", bytes as f64 / 1e3)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

fn mib(kib: u64) -> String {
    format!("{:.0}", kib as f64 / 1024.0)
}

/// Peak RSS of some processes, sampled every 20 ms on a thread of its own.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u64>>,
}

impl Sampler {
    fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peaks = vec![0u64; pids.len()];
            while !flag.load(Ordering::SeqCst) {
                for (peak, pid) in peaks.iter_mut().zip(&pids) {
                    *peak = (*peak).max(rss_kib(*pid).unwrap_or(0));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            peaks
        });
        Self { stop, thread }
    }

    fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

struct Row {
    step: String,
    input: String,
    outcome: String,
    peaks: Vec<u64>,
    after: Vec<u64>,
    note: String,
}

fn print_rows(title: &str, processes: &[&str], rows: &[Row]) {
    println!("\n### {title}\n");
    let cols: Vec<String> =
        processes.iter().flat_map(|p| [format!("{p} peak MiB"), format!("{p} after MiB")]).collect();
    println!("| step | input | outcome | {} | note |", cols.join(" | "));
    println!("|---|---|---|{}---|", "---:|".repeat(cols.len()));
    for r in rows {
        let figures: Vec<String> =
            r.peaks.iter().zip(&r.after).flat_map(|(p, a)| [mib(*p), mib(*a)]).collect();
        println!("| {} | {} | {} | {} | {} |", r.step, r.input, r.outcome, figures.join(" | "), r.note);
    }
}

struct Args {
    skewgate: PathBuf,
    only: Option<String>,
    /// For the sidecar; "" for none.
    tunables: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        skewgate: paths::workspace_root().join("target/release/skewgate"),
        only: None,
        tunables: GLIBC_TUNABLES.to_string(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--skewgate" => a.skewgate = it.next().context("--skewgate PATH")?.into(),
            "--only" => a.only = Some(it.next().context("--only envoy|sidecar")?),
            "--glibc-tunables" => a.tunables = it.next().context("--glibc-tunables VALUE")?,
            other => bail!("unknown argument {other:?} (usage: {USAGE})"),
        }
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = args()?;
    let dir = std::env::temp_dir().join(format!("skewgate-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pki = Pki::generate(&dir.join("pki"))?;
    println!(
        "limits: Envoy {} with {}; {} (GLIBC_TUNABLES {:?})",
        envoy_version(),
        paths::filter_wasm()?.display(),
        args.skewgate.display(),
        args.tunables
    );
    if args.only.as_deref() != Some("sidecar") {
        let rows = envoy_steps(&dir.join("envoy"), &pki).await?;
        print_rows("Envoy fed one ecds.json after another", &["envoy"], &rows);
    }
    if args.only.as_deref() != Some("envoy") {
        let rows = sidecar_steps(&dir.join("sidecar"), &pki, &args.skewgate, &args.tunables).await?;
        print_rows("One apiserver's /apis grows to 50,000 groups and back", &["sidecar", "envoy"], &rows);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

const USAGE: &str = "limits [--skewgate PATH] [--only envoy|sidecar] [--glibc-tunables VALUE]";

/// What skewgate's image (docker/Dockerfile) sets: discovery bodies are mapped and unmapped whole.
const GLIBC_TUNABLES: &str = "glibc.malloc.mmap_threshold=1048576:glibc.malloc.arena_max=1";

fn envoy_version() -> String {
    Command::new(paths::envoy_binary().unwrap_or_default())
        .arg("--version")
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.split("version: ").nth(1).and_then(|v| v.split('/').nth(1)).unwrap_or("?").to_string()
        })
        .unwrap_or_default()
}

/// Alice's client certificate: requests without credentials would take the anonymous twin
/// clusters, which the doubles here (front-proxy clients only) refuse.
fn client(pki: &Pki) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.cluster_ca.cert_path)?)?;
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&pki.alice.identity_pem()?)?)
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// Who serves resourceclaims now, waiting for the first healthy answer.
async fn claims_served_by(client: &reqwest::Client, envoy: &Envoy) -> String {
    let url = format!("https://127.0.0.1:{}{CLAIMS}", envoy.settings.listen_port);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(&url).send().await {
            let status = r.status().as_u16();
            let by = r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(str::to_string);
            if let (200, Some(by)) = (status, by) {
                return by;
            }
            if Instant::now() > deadline {
                return format!("{status}");
            }
        } else if Instant::now() > deadline {
            return "no answer".into();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ecds_counts(envoy: &Envoy) -> Result<Vec<u64>> {
    let stats = envoy.stats().await?;
    Ok(ECDS_STATS.iter().map(|s| stats.get(*s).copied().unwrap_or(0)).collect())
}

/// Writes one table (as JSON text) into Envoy's ecds.json and waits for Envoy's verdict.
async fn ecds_step(
    envoy: &Envoy,
    client: &reqwest::Client,
    step: &str,
    table_json: &str,
    wasm: &Path,
    note: &str,
) -> Result<Row> {
    let ecds = resources::ecds(table_json, wasm).to_string();
    let input = format!("{} ecds.json", size(ecds.len()));
    let before = ecds_counts(envoy).await?;
    let pid = envoy.child.id();
    let sampler = Sampler::start(vec![pid]);
    let started = Instant::now();
    skewgate_envoy::write_atomic(&envoy.settings.ecds_path(), ecds.as_bytes())?;
    drop(ecds);
    let outcome = loop {
        let now = ecds_counts(envoy).await?;
        if let Some(i) = (0..now.len()).find(|&i| now[i] > before[i]) {
            break format!(
                "{} in {:.1} s",
                ["accepted", "rejected", "failure"][i],
                started.elapsed().as_secs_f64()
            );
        }
        if started.elapsed() > Duration::from_secs(300) {
            break "no verdict in 300 s".to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peaks = sampler.finish();
    let after = vec![rss_kib(pid)?];
    let by = claims_served_by(client, envoy).await;
    Ok(Row {
        step: step.into(), input, outcome, peaks, after, note: format!("{note}resourceclaims → {by}")
    })
}

fn real_table() -> Result<TableConfig> {
    let path = paths::envoy_config_dir().join("examples/table.json");
    Ok(serde_json::from_slice(&std::fs::read(&path)?)?)
}

/// The real table plus `n` group/versions of one resource each, one in eight served by c alone
/// and one in eight by a and b (sets the real table already has).
fn wide_table(n: usize) -> Result<TableConfig> {
    let mut table = real_table()?;
    let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for g in 0..n {
        let served_by = match g % 8 {
            3 => ids(&["c"]),
            7 => ids(&["a", "b"]),
            _ => ids(&["a", "b", "c"]),
        };
        table.group_versions.push(GroupVersionConfig {
            group: format!("g{g}.wide.limits.skewgate.io"),
            version: "v1".into(),
            served_by: served_by.clone(),
            resources: [("widgets".to_string(), served_by)].into(),
            extension: false,
        });
    }
    table.generation = format!("wide-{n}");
    Ok(table)
}

/// The documents of a 1.33, 1.33, 1.36 control plane with `groups` CRD groups (5 resources each,
/// full discovery entries) on top, one in eight on c alone and one in eight on a and b.
fn crd_documents(groups: usize) -> Result<Vec<(String, ApiGroupDiscoveryList, ApiGroupDiscoveryList)>> {
    let crds =
        crd_groups(0, groups, "crd.limits.skewgate.io", Shape { versions: 1, resources: 5, full: true });
    let mut out = Vec::new();
    for (id, era, skip) in [("a", "1.33", 3), ("b", "1.33", 3), ("c", "1.36", 7)] {
        let profile = Profile::parse(era)?;
        let mut apis = profile.apis.clone();
        apis.items.extend(crds.iter().enumerate().filter(|(g, _)| g % 8 != skip).map(|(_, c)| c.clone()));
        out.push((id.to_string(), profile.api, apis));
    }
    Ok(out)
}

fn table_from(documents: &[(String, ApiGroupDiscoveryList, ApiGroupDiscoveryList)]) -> Result<TableConfig> {
    let servers: Vec<ServerApis<'_>> = documents
        .iter()
        .map(|(id, api, apis)| ServerApis {
            id,
            version: "",
            documents: vec![api, apis],
            legacy: None,
            features: None,
        })
        .collect();
    build_table(&servers, &ClusterNames::default()).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The most CRD groups whose table stays within the limits.
fn biggest_table() -> Result<(usize, TableConfig)> {
    let probe = table_from(&crd_documents(100)?)?;
    let base = serde_json::to_string(&table_from(&crd_documents(0)?)?)?.len();
    let per_group = (serde_json::to_string(&probe)?.len() - base) / 100;
    let mut groups = ((MAX_TABLE_BYTES - base) / per_group).min(MAX_GVRS / 5).min(MAX_GROUP_VERSIONS - 100);
    loop {
        let table = table_from(&crd_documents(groups)?)?;
        if sealed_json(&table)?.len() <= MAX_TABLE_BYTES {
            return Ok((groups, table));
        }
        groups = groups * 98 / 100;
    }
}

/// One oversized (or at-the-limit) table for a fresh Envoy: its JSON and what to say about it.
type Scenario = (&'static str, fn() -> Result<(String, String)>);

fn at_the_limits() -> Result<(String, String)> {
    let (groups, table) = biggest_table()?;
    let json = sealed_json(&table)?;
    let gvrs: usize = table.group_versions.iter().map(|gv| gv.resources.len()).sum();
    let gvs = table.group_versions.len();
    Ok((
        json.clone(),
        format!("table {}: {groups} CRD groups, {gvs} group/versions, {gvrs} GVRs; ", size(json.len())),
    ))
}

fn too_many_gvrs() -> Result<(String, String)> {
    let mut table = wide_table(0)?;
    table.group_versions.extend(filler_group_versions(6_000, "many.limits.skewgate.io", &["a", "b", "c"]));
    let json = sealed_json(&table)?;
    Ok((json.clone(), format!("table {}, 60,000 GVRs; ", size(json.len()))))
}

fn too_many_bytes() -> Result<(String, String)> {
    let json = sealed_json(&wide_table(200_000)?)?;
    Ok((json.clone(), format!("table {}, 200,000 group/versions; ", size(json.len()))))
}

/// Valid JSON around a discovery document that is not: refused by every version of the filter.
fn garbage_100mb() -> Result<(String, String)> {
    let mut garbage = serde_json::to_value(real_table()?)?;
    garbage["discovery"]["document"] = json!(format!("{{{}", "x".repeat(100_000_000)));
    garbage["generation"] = json!("garbage-100mb");
    Ok((garbage.to_string(), String::new()))
}

/// For each scenario a fresh Envoy: its RSS with the real table, with the scenario's table, and
/// with the real table again.
async fn envoy_steps(dir: &Path, pki: &Pki) -> Result<Vec<Row>> {
    let wasm = paths::filter_wasm()?;
    let server_tls = echo::tls_config(&pki.apiserver, &pki.requestheader_ca.cert_path)?;
    let mut echoes = Vec::new();
    for id in ["a", "b", "c"] {
        echoes.push(echo::start(id, server_tls.clone()).await?);
    }
    let endpoints: Vec<Endpoint> = echoes
        .iter()
        .map(|e| Endpoint { id: e.id.clone(), address: "127.0.0.1".into(), port: e.addr.port() })
        .collect();
    let real = real_table()?;
    // The scenarios' set clusters are the real table's: one CDS for all.
    let cds = resources::cds(&real, &endpoints, &upstream_tls(pki), Health::default())?;
    let real_json = sealed_json(&real)?;
    let real_ecds = resources::ecds(&real_json, &wasm);
    let client = client(pki)?;
    let scenarios: [Scenario; 4] = [
        ("at the limits", at_the_limits),
        ("over MAX_GVRS", too_many_gvrs),
        ("over MAX_TABLE_BYTES", too_many_bytes),
        ("100 MB, not a table", garbage_100mb),
    ];
    let mut rows = Vec::new();
    for (i, (name, make)) in scenarios.into_iter().enumerate() {
        let envoy =
            Envoy::start(Settings::new(Config::Skewgate, dir.join(i.to_string()), pki)?, &cds, &real_ecds)
                .await?;
        let by = claims_served_by(&client, &envoy).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let start = rss_kib(envoy.child.id())?;
        rows.push(Row {
            step: "fresh Envoy".into(),
            input: format!("{} ecds.json (real table)", size(real_ecds.to_string().len())),
            outcome: "accepted".into(),
            peaks: vec![start],
            after: vec![start],
            note: format!("resourceclaims → {by}"),
        });
        let (json, note) = make()?;
        rows.push(ecds_step(&envoy, &client, name, &json, &wasm, &note).await?);
        drop(json);
        rows.push(ecds_step(&envoy, &client, "then the real table", &real_json, &wasm, "").await?);
    }
    Ok(rows)
}

/// `skewgate sync` as a child process; killed when dropped.
struct Sidecar(Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests through Envoy in a closed loop (8 at a time) for `seconds`: answers per second.
async fn throughput(client: &reqwest::Client, url: &str, seconds: u64) -> f64 {
    let until = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_string());
            tokio::spawn(async move {
                let mut ok = 0u64;
                while Instant::now() < until {
                    if client.get(&url).send().await.is_ok_and(|r| r.status() == 200) {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    total as f64 / seconds as f64
}

async fn sidecar_steps(dir: &Path, pki: &Pki, skewgate: &Path, tunables: &str) -> Result<Vec<Row>> {
    if !skewgate.exists() {
        bail!("{} not found: `make release` first, or --skewgate PATH", skewgate.display());
    }
    let wasm = paths::filter_wasm()?;
    let old = Profile::parse("1.33")?;
    let new = Profile::parse("1.36")?;
    let a = DiscoveryServer::start("a", pki, &old.api, &old.apis).await?;
    let b = DiscoveryServer::start("b", pki, &new.api, &new.apis).await?;
    std::fs::create_dir_all(dir)?;
    let settings = Settings::new(Config::Skewgate, dir.join("envoy"), pki)?;
    let sidecar_listen = format!("127.0.0.1:{}", free_port()?);
    let config = json!({
        "apiservers": [
            {"id": "a", "address": "127.0.0.1", "port": a.addr.port()},
            {"id": "b", "address": "127.0.0.1", "port": b.addr.port()},
        ],
        "serverName": APISERVER_NAME,
        "tls": {
            "peerCa": pki.peer_ca.cert_path,
            "clientCert": pki.front_proxy.cert,
            "clientKey": pki.front_proxy.key,
        },
        "envoy": {"dir": settings.dir, "wasm": wasm, "adminUrl": format!("http://127.0.0.1:{}", settings.admin_port)},
        "pollPeriod": "1s",
        "listen": sidecar_listen,
    });
    let config_path = dir.join("sync.json");
    std::fs::write(&config_path, config.to_string())?;
    // The first table, without Envoy's admin API: Envoy starts from these files.
    let mut first = config.clone();
    first["envoy"].as_object_mut().context("envoy")?.remove("adminUrl");
    first["envoy"]["settleDelay"] = json!("0s");
    let first_path = dir.join("first.json");
    std::fs::write(&first_path, first.to_string())?;
    let log = std::fs::File::create(dir.join("sidecar.log"))?;
    let once = Command::new(skewgate)
        .args(["sync", "--once", "--config"])
        .arg(&first_path)
        .stdout(Stdio::null())
        .stderr(log.try_clone()?)
        .status()?;
    let read = |p: PathBuf| -> Result<Value> { Ok(serde_json::from_slice(&std::fs::read(p)?)?) };
    if !once.success() && !settings.ecds_path().exists() {
        bail!("skewgate sync --once failed: see {}", dir.join("sidecar.log").display());
    }
    let envoy =
        Envoy::start(settings.clone(), &read(settings.cds_path())?, &read(settings.ecds_path())?).await?;
    let mut command = Command::new(skewgate);
    command.args(["sync", "--config"]).arg(&config_path).stdout(Stdio::null()).stderr(log);
    if !tunables.is_empty() {
        command.env("GLIBC_TUNABLES", tunables);
    }
    let sidecar = Sidecar(command.spawn()?);
    let http = reqwest::Client::new();
    let metrics_url = format!("http://{sidecar_listen}/metrics");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http.get(format!("http://{sidecar_listen}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
        if Instant::now() > deadline {
            bail!("the sidecar is not ready: see {}", dir.join("sidecar.log").display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = client(pki)?;
    let url = format!("https://127.0.0.1:{}{CLAIMS}", settings.listen_port);
    claims_served_by(&client, &envoy).await;
    let pids = vec![sidecar.0.id(), envoy.child.id()];

    let mut rows = Vec::new();
    let with_crds = |groups: usize, resources: usize| {
        let mut apis = new.apis.clone();
        let shape = Shape { versions: 1, resources, full: false };
        apis.items.extend(crd_groups(0, groups, "big.limits.skewgate.io", shape));
        apis
    };
    // Within every default limit, and the table built from it within the table's.
    let at_limits = with_crds(4_900, 10);
    let giant = with_crds(50_000, 1);
    let steps: [(&str, &ApiGroupDiscoveryList); 4] = [
        ("steady", &new.apis),
        ("b at the limits: 4,900 groups × 10 resources", &at_limits),
        ("b serves 50,000 groups", &giant),
        ("b back to normal", &new.apis),
    ];
    for (step, apis) in steps {
        let bytes = b.set_apis(apis)?;
        let syncs = metric(
            &http.get(&metrics_url).send().await?.text().await?,
            "skewgate_sync_duration_seconds_count",
        );
        let sampler = Sampler::start(pids.clone());
        let started = Instant::now();
        // Five syncs on the new document (or a minute).
        loop {
            let text = http.get(&metrics_url).send().await?.text().await?;
            if metric(&text, "skewgate_sync_duration_seconds_count") >= syncs + 5.0
                || started.elapsed() > Duration::from_secs(60)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let rps = throughput(&client, &url, 3).await;
        let peaks = sampler.finish();
        let after = pids.iter().map(|p| rss_kib(*p).unwrap_or(0)).collect();
        let text = http.get(&metrics_url).send().await?.text().await?;
        let errors: BTreeMap<String, f64> = text
            .lines()
            .filter(|l| l.starts_with("skewgate_sync_errors_total{apiserver=\"b\""))
            .filter_map(|l| {
                let kind = l.split("kind=\"").nth(1)?.split('"').next()?.to_string();
                Some((kind, l.rsplit(' ').next()?.parse().ok()?))
            })
            .collect();
        rows.push(Row {
            step: step.into(),
            input: format!("b's /apis {}", size(bytes)),
            outcome: format!("table {} GVRs, b errors {errors:?}", metric(&text, "skewgate_gvrs ")),
            peaks,
            after,
            note: format!("{rps:.0} requests/s through Envoy"),
        });
    }
    drop(sidecar);
    Ok(rows)
}
