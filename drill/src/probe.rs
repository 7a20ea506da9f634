//! The drill's probe on real binaries: before each run, a quiet skewed cluster of the same kind
//! (a at the old era, c at the new one, behind the run's Envoy) answers two questions the load
//! cannot: what a rerouted request costs against a local one (the Mixed Version Proxy's second
//! hop, skewgate's choice at the edge), and whether `kubectl explain` through the load balancer
//! finds every API some apiserver serves (discovery and OpenAPI completeness).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use skewgate_harness::cluster::{self, Cluster, Credentials};
use skewgate_harness::kubectl::Kubectl;

use crate::load::{Era, Load};
use crate::mode::Mode;
use crate::{NEW, OLD, Options};

/// Sequential requests per series (after [`WARMUP`]): enough for a stable p50 and p99.
const REQUESTS: usize = 200;
const WARMUP: usize = 20;
/// `kubectl explain` runs per GVR, each with an empty cache (round robin lands its discovery
/// and OpenAPI requests on different apiservers from one run to the next).
const EXPLAIN_TRIES: usize = 3;
/// Both serve it.
const LOCAL: &str = "/api/v1/namespaces/default/configmaps?limit=500";

/// One series of sequential GETs.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub what: String,
    /// Requests answered 200 (the latencies are theirs).
    pub ok: usize,
    pub total: usize,
    /// Status (or `error`) → count, for the others.
    pub other: BTreeMap<String, usize>,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// What the probe cluster was.
    pub cluster: String,
    /// MVP: how long after the cluster was ready a (1.33) first proxied c's API.
    pub reroute_ready_seconds: Option<f64>,
    /// `local` and `rerouted` through the LB, then straight to a and to c.
    pub series: Vec<Series>,
    pub explain_ok: usize,
    pub explain_total: usize,
    /// GVR → how many of its tries failed, and the first error.
    pub explain_failed: BTreeMap<String, (usize, String)>,
}

impl Probe {
    fn series(&self, what: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.what == what)
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => sorted[(((n - 1) as f64) * p).round() as usize],
    }
}

async fn series(what: &str, client: &reqwest::Client, url: &str) -> Series {
    let mut latencies = Vec::new();
    let mut other: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..WARMUP + REQUESTS {
        let started = Instant::now();
        let status = match client.get(url).header("accept", "application/json").send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                match r.bytes().await {
                    Ok(_) => status.to_string(),
                    Err(_) => "error".to_string(),
                }
            }
            Err(_) => "error".to_string(),
        };
        let took = started.elapsed().as_secs_f64() * 1000.0;
        if i < WARMUP {
            continue;
        }
        match status.as_str() {
            "200" => latencies.push(took),
            _ => *other.entry(status).or_default() += 1,
        }
    }
    latencies.sort_by(f64::total_cmp);
    Series {
        what: what.into(),
        ok: latencies.len(),
        total: REQUESTS,
        other,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
    }
}

/// The MVP: until a proxies c's API (its peer discovery has c), at most 120 s.
async fn until_rerouted(c: &Cluster, rerouted: &str) -> Result<f64> {
    let client = c.direct_client(Duration::from_secs(5))?;
    let url = format!("{}{rerouted}", c.apiserver_url("a")?);
    let started = Instant::now();
    loop {
        if let Ok(r) = client.get(&url).send().await {
            if r.status() == 200 {
                return Ok(started.elapsed().as_secs_f64());
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("a never proxied {rerouted} to c within 120 s (is the Mixed Version Proxy on?)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl explain` of every GVR the drill lists, [`EXPLAIN_TRIES`] times each, through the LB.
async fn explain(
    c: &Cluster,
    cache: &std::path::Path,
    gvrs: &[(String, String, String)],
) -> Result<(usize, usize, BTreeMap<String, (usize, String)>)> {
    let kubectl = Kubectl::new(&c.kubeconfig, cache)?.with_context("skewgate-admin");
    let (mut ok, mut total, mut failed) = (0, 0, BTreeMap::new());
    for (n, (name, resource, api_version)) in gvrs.iter().enumerate() {
        for t in 0..EXPLAIN_TRIES {
            let run = kubectl.with_cache(&cache.join(format!("{n}-{t}")));
            let out = run.run(&["explain", resource, &format!("--api-version={api_version}")]).await?;
            total += 1;
            if out.ok {
                ok += 1;
            } else {
                let entry = failed.entry(name.clone()).or_insert((0, String::new()));
                entry.0 += 1;
                if entry.1.is_empty() {
                    entry.1 = out.stderr.lines().next().unwrap_or_default().trim().to_string();
                }
            }
        }
    }
    Ok((ok, total, failed))
}

/// The probe of `mode`: a (old era) and c (new era) of `o`'s binaries behind the run's Envoy,
/// nothing else running, in a folder under its work folder; the first cluster-wide GVR of
/// `load`'s that only the new era serves asked for, and `kubectl explain` of its lists.
pub async fn probe(mode: Mode, o: &Options, load: &Load) -> Result<Probe> {
    let dir = o.work.join(format!("probe-{}", mode.key()));
    let _ = std::fs::remove_dir_all(&dir);
    let (old, new) = (o.spec(OLD), o.spec(NEW));
    let mut options = cluster::Options::ephemeral(&dir, &[("a", old.as_str()), ("c", new.as_str())]);
    options.real = o.real.clone();
    mode.cluster_options(&mut options);
    options.poll_period = o.poll;
    let rerouted = load
        .lists
        .iter()
        .find(|g| g.era == Era::New && !g.api.namespaced)
        .map(|g| format!("{}?limit=500", g.collection()))
        .context("the new era serves no cluster-wide GVR of its own to ask for")?;
    let c = cluster::start(&options)
        .await
        .with_context(|| format!("starting the {} probe cluster", mode.name()))?;
    let cluster = format!("a={old}, c={new}, behind the {} Envoy", mode.name());
    let result = measure(&c, mode, &dir, &load.list_names(), &rerouted, cluster).await;
    c.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(
    c: &Cluster,
    mode: Mode,
    dir: &std::path::Path,
    gvrs: &[(String, String, String)],
    rerouted: &str,
    cluster: String,
) -> Result<Probe> {
    let reroute_ready_seconds = match mode {
        Mode::Mvp => Some(until_rerouted(c, rerouted).await?),
        Mode::PlainLb | Mode::Skewgate => None,
    };
    let lb = c.client(Credentials::AdminToken, Duration::from_secs(5))?;
    let direct = c.direct_client(Duration::from_secs(5))?;
    let envoy = c.envoy_url()?;
    let (a, cc) = (c.apiserver_url("a")?, c.apiserver_url("c")?);
    let mut all = Vec::new();
    for (what, client, url) in [
        ("local", &lb, format!("{envoy}{LOCAL}")),
        ("rerouted", &lb, format!("{envoy}{rerouted}")),
        ("straight to a", &direct, format!("{a}{rerouted}")),
        ("straight to c", &direct, format!("{cc}{rerouted}")),
    ] {
        all.push(series(what, client, &url).await);
    }
    let (explain_ok, explain_total, explain_failed) = explain(c, &dir.join("kubectl"), gvrs).await?;
    Ok(Probe { cluster, reroute_ready_seconds, series: all, explain_ok, explain_total, explain_failed })
}

fn cell(s: Option<&Series>) -> String {
    match s {
        Some(s) if s.ok == 0 => format!("all {} answered {:?}", s.total, s.other),
        Some(s) if s.ok < s.total => {
            format!("{:.2} / {:.2} ms ({} of {} ok; others {:?})", s.p50_ms, s.p99_ms, s.ok, s.total, s.other)
        }
        Some(s) => format!("{:.2} / {:.2} ms", s.p50_ms, s.p99_ms),
        None => "-".into(),
    }
}

/// A cell of the drill's table, from one run's probe.
pub type Cell<'a> = &'a dyn Fn(Option<&Probe>) -> String;

/// The probe's rows of the drill's table.
pub fn markdown_rows(row: &mut dyn FnMut(&str, Cell<'_>)) {
    let get = |p: Option<&Probe>, what: &str| cell(p.and_then(|p| p.series(what)));
    row("quiet cluster (a at the old release, c at the new): c's API through the LB, p50 / p99", &|r| {
        get(r, "rerouted")
    });
    row("… an API both serve through the LB (local), p50 / p99", &|r| get(r, "local"));
    row("… c's API straight to a (MVP: a proxies it to c), p50 / p99", &|r| get(r, "straight to a"));
    row("… c's API straight to c (local), p50 / p99", &|r| get(r, "straight to c"));
    row("`kubectl explain` through the LB, the drill's 10 GVRs × 3 (ok / tries)", &|p| match p {
        Some(p) => format!("{} / {}", p.explain_ok, p.explain_total),
        None => "-".into(),
    });
}
