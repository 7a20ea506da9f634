//! The sidecar's own cost as the cluster grows: E edges, each its own `skewgate sync` as an
//! operator runs it (shipped defaults: discovery in full every 5 s, readiness and discovery ETags
//! every 250 ms), polling M stand-in apiservers, which count what they answer. Per apiserver: the
//! requests a second the edges put on it, and the bytes the sidecars read (all their socket reads,
//! TLS included, over M); per sidecar: CPU and memory; and how many discovery answers the
//! ETag/304 path turned into 304s.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use serde_json::json;
use skewgate_bench as bench;
use skewgate_harness::sidecar::Sidecar;
use skewgate_harness::standin::{self, Profile, Standin, Store};
use skewgate_harness::{envoy::free_port, paths};
use skewgate_pki::Pki;

/// What the sidecar asks an apiserver for its own discovery.
const DISCOVERY_ACCEPT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";

/// The token the benchmark reads the documents with (not the sidecar's: it is the front proxy).
const READER: &str = "scale-reader";

#[derive(Debug, Serialize)]
pub struct Cell {
    pub apiservers: usize,
    pub edges: usize,
    pub seconds: f64,
    /// Requests a second all edges together put on each apiserver: the mean, and the busiest's.
    pub requests_per_s_per_apiserver: f64,
    pub requests_per_s_busiest: f64,
    /// The apiservers' recent requests (their last few hundred each); of them the `/api` and
    /// `/apis` answers, and of those the 304s.
    pub recent_requests: usize,
    pub discovery_answers: usize,
    pub discovery_304s: usize,
    /// The aggregated `/api` and `/apis` documents of a 1.33 apiserver, bytes: what each 304
    /// would have been without the ETag.
    pub api_bytes: usize,
    pub apis_bytes: usize,
    /// What the 304s saved each apiserver a second: their share of the recent requests, times
    /// the requests a second, times the mean document.
    pub saved_bytes_per_s_per_apiserver: f64,
    /// Bytes a second the sidecars read (`rchar`: sockets and files), over the apiservers. It
    /// hardly grows with the apiservers (10 edges: 1.0 MB/s at 3, 1.2 at 7): most of it is not
    /// discovery; BENCHMARKS.md shows it per sidecar.
    pub bytes_per_s_per_apiserver: f64,
    /// Per sidecar: share of a core, resident memory.
    pub sidecar_core_share: f64,
    pub sidecar_rss_mib: f64,
}

/// Each size of `apiservers` × `edges`, measured for `seconds` once every sidecar is ready.
pub async fn run(
    pki: &Pki,
    dir: &std::path::Path,
    apiservers: &[usize],
    edges: &[usize],
    seconds: u64,
    runtime: &tokio::runtime::Runtime,
) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for &m in apiservers {
        for &e in edges {
            let case = dir.join(format!("polling-{m}-{e}"));
            std::fs::create_dir_all(&case)?;
            let cell = measure(pki, &case, m, e, seconds, runtime).await?;
            println!("{}", serde_json::to_string(&cell)?);
            cells.push(cell);
        }
    }
    Ok(cells)
}

async fn measure(
    pki: &Pki,
    dir: &std::path::Path,
    m: usize,
    e: usize,
    seconds: u64,
    runtime: &tokio::runtime::Runtime,
) -> Result<Cell> {
    let store = Store::new(100);
    let mut standins: Vec<Standin> = Vec::new();
    for i in 0..m {
        // A control plane in the middle of its upgrade: the last apiserver already at 1.36.
        let profile = Profile::parse(if i + 1 == m { "1.36-real" } else { "1.33-real" })?;
        let reader = standin::Token {
            token: READER.into(),
            user: "reader".into(),
            groups: vec!["system:masters".into()],
        };
        let options = standin::Options::of_cluster(pki, &format!("api-{i}"), profile, vec![reader]);
        let store = store.clone();
        standins.push(runtime.spawn(async move { standin::serve(options, store).await }).await??);
    }
    let document = |path: &'static str| {
        let url = format!("https://{}{path}", standins[0].addr);
        async move {
            let client = bench::client()?;
            let answer = client
                .get(url)
                .header("accept", DISCOVERY_ACCEPT)
                .bearer_auth(READER)
                .send()
                .await?
                .error_for_status()?;
            anyhow::Ok(answer.bytes().await?.len())
        }
    };
    let (api_bytes, apis_bytes) = (document("/api").await?, document("/apis").await?);
    let mut sidecars = Vec::new();
    for edge in 0..e {
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let config = json!({
            "apiservers": standins.iter().map(|s| json!({"id": s.id, "address": "127.0.0.1", "port": s.addr.port()})).collect::<Vec<_>>(),
            "serverName": skewgate_harness::pki::APISERVER_NAME,
            "tls": {
                "peerCa": pki.peer_ca.cert_path,
                "clientCert": pki.front_proxy.cert,
                "clientKey": pki.front_proxy.key,
            },
            "envoy": {"dir": dir.join(format!("edge-{edge}")), "wasm": paths::filter_wasm()?},
            "listen": listen.to_string(),
        });
        let path = dir.join(format!("edge-{edge}.json"));
        std::fs::write(&path, config.to_string())?;
        let log = dir.join(format!("edge-{edge}.log"));
        sidecars.push(Sidecar::start(&path, listen, &log, Duration::from_secs(120)).await?);
    }
    // Past the first syncs, which fetch everything.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let pids: Vec<u32> = sidecars.iter().map(Sidecar::pid).collect();
    let reading = || -> Result<(Instant, Vec<u64>, f64, u64)> {
        let cpu = pids.iter().map(|p| bench::threads_cpu_micros(*p, None)).sum::<Result<f64>>()?;
        let read = pids.iter().map(|p| read_bytes(*p)).sum::<Result<u64>>()?;
        let requests =
            standins.iter().map(|s| s.requests.load(std::sync::atomic::Ordering::SeqCst)).collect();
        Ok((Instant::now(), requests, cpu, read))
    };
    let before = reading()?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = reading()?;
    let span = after.0.duration_since(before.0).as_secs_f64();
    let per_apiserver: Vec<f64> = after.1.iter().zip(&before.1).map(|(a, b)| (a - b) as f64 / span).collect();
    let recent: Vec<standin::Served> = standins.iter().flat_map(|s| s.recent()).collect();
    let discovery: Vec<u16> = recent
        .iter()
        .filter(|r| matches!(r.target.split('?').next(), Some("/api" | "/apis")))
        .map(|r| r.status)
        .collect();
    let not_modified = discovery.iter().filter(|s| **s == 304).count();
    let requests_per_s = per_apiserver.iter().sum::<f64>() / m as f64;
    let rss: u64 = pids.iter().map(|p| bench::rss_kib(*p)).sum::<Result<u64>>()?;
    for sidecar in sidecars {
        sidecar.stop().await?;
    }
    drop(standins);
    Ok(Cell {
        apiservers: m,
        edges: e,
        seconds: span,
        requests_per_s_per_apiserver: requests_per_s,
        requests_per_s_busiest: per_apiserver.iter().copied().fold(0.0, f64::max),
        recent_requests: recent.len(),
        discovery_answers: discovery.len(),
        discovery_304s: not_modified,
        api_bytes,
        apis_bytes,
        saved_bytes_per_s_per_apiserver: not_modified as f64 / recent.len().max(1) as f64
            * requests_per_s
            * (api_bytes + apis_bytes) as f64
            / 2.0,
        bytes_per_s_per_apiserver: (after.3 - before.3) as f64 / span / m as f64,
        sidecar_core_share: (after.2 - before.2) / span / 1e6 / e as f64,
        sidecar_rss_mib: rss as f64 / 1024.0 / e as f64,
    })
}

/// Bytes a process has read (`rchar`: files and sockets alike; a sidecar reads little else).
fn read_bytes(pid: u32) -> Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let line =
        io.lines().find_map(|l| l.strip_prefix("rchar:")).ok_or_else(|| anyhow::anyhow!("no rchar"))?;
    Ok(line.trim().parse()?)
}
