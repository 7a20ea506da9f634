//! What the skewgate filter costs Envoy per request: the same Envoy binary, listener, clusters
//! and loopback upstreams, with the filter (envoy-config/bootstrap.yaml) and without it
//! (envoy-config/plain-lb.yaml), driven by wrk, rounds interleaved. Envoy CPU per request comes
//! from /proc (utime + stime) over each run. A quick figure for development; `make bench` is the
//! full benchmark.
//!
//! Usage: filter_cost [SECONDS_PER_RUN] [ROUNDS]

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;
use skewgate::envoy::{self as resources, Endpoint, Health, UpstreamTls};
use skewgate_core::table::TableConfig;
use skewgate_harness::echo;
use skewgate_harness::envoy::{Config, Envoy, Settings, free_port};
use skewgate_harness::paths;
use skewgate_harness::pki::{APISERVER_NAME, Pki};

const PODS: &str = "/api/v1/namespaces/default/pods";
const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";

struct Run {
    requests: u64,
    errors: u64,
    cpu_us_per_request: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let rounds: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2);
    let dir = std::env::temp_dir().join(format!("skewgate-filter-cost-{}", std::process::id()));
    let pki = Pki::generate(&dir.join("pki"))?;
    let server_tls = echo::tls_config(&pki.apiserver, &pki.requestheader_ca.cert_path)?;
    let mut echoes = Vec::new();
    for id in ["a", "b", "c"] {
        echoes.push(echo::start(id, server_tls.clone()).await?);
    }
    let endpoints: Vec<Endpoint> = echoes
        .iter()
        .map(|e| Endpoint { id: e.id.clone(), address: "127.0.0.1".into(), port: e.addr.port() })
        .collect();
    let all = ["a", "b", "c"];
    let mut table: TableConfig = serde_json::from_value(json!({
        "schema": 1,
        "apiservers": all.iter().map(|id| json!({"id": id, "cluster": format!("skewgate-apiserver-{id}")})).collect::<Vec<_>>(),
        "poolCluster": "skewgate-pool",
        "groupVersions": [
            {"group": "", "version": "v1", "servedBy": all, "resources": {"pods": all}},
            {"group": "resource.k8s.io", "version": "v1", "servedBy": ["c"], "resources": {"resourceclaims": ["c"]}}
        ]
    }))?;
    table.assign_sets(|m| format!("skewgate-set-{}", m.join("_")));
    let tls = UpstreamTls {
        peer_ca: pki.peer_ca.cert_path.display().to_string(),
        client_cert: pki.front_proxy.cert.display().to_string(),
        client_key: pki.front_proxy.key.display().to_string(),
        server_name: APISERVER_NAME.into(),
    };
    let cds = resources::cds(&table, &endpoints, &tls, Health::default())?;
    let ecds = resources::ecds(&serde_json::to_string(&table)?, &paths::filter_wasm()?);
    let settings = |config: Config, name: &str| -> Result<Settings> {
        Ok(Settings {
            config,
            dir: dir.join(name),
            listen_port: free_port()?,
            admin_port: free_port()?,
            serving_cert: pki.envoy_listener.cert.clone(),
            serving_key: pki.envoy_listener.key.clone(),
            client_ca: pki.cluster_ca.cert_path.clone(),
            route_timeout: "65s".into(),
            concurrency: 1,
        })
    };
    let plain = Envoy::start(
        settings(Config::PlainLb { pool_cluster: "skewgate-pool".into() }, "plain")?,
        &cds,
        &ecds,
    )
    .await?;
    let skewgate = Envoy::start(settings(Config::Skewgate, "skewgate")?, &cds, &ecds).await?;
    tokio::time::sleep(Duration::from_secs(3)).await; // first health checks
    // Envoy gets a core of its own, wrk and the upstreams share the other (run this binary under
    // `taskset -c 0`): contention otherwise moves CPU/request by ±10 µs between runs.
    if std::env::var_os("SKEWGATE_PIN").is_some() {
        for envoy in [&plain, &skewgate] {
            let pid = envoy.child.id().to_string();
            let ok = Command::new("taskset").args(["-a", "-cp", "1", &pid]).output()?.status.success();
            if !ok {
                bail!("taskset failed for pid {pid}");
            }
        }
    }

    let cells: [(&str, &Envoy, &str); 3] = [
        ("plain LB, pods", &plain, PODS),
        ("skewgate, pods (pool)", &skewgate, PODS),
        ("skewgate, resourceclaims (rerouted)", &skewgate, CLAIMS),
    ];
    let mut results: Vec<Vec<Run>> = cells.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        for (i, (name, envoy, path)) in cells.iter().enumerate() {
            let run = measure(envoy, path, seconds)?;
            println!(
                "round {round} {name:<38} {:>8} req  {:>6.1} µs CPU/req  p50 {:.2} ms  p99 {:.2} ms  errors {}",
                run.requests, run.cpu_us_per_request, run.p50_ms, run.p99_ms, run.errors
            );
            results[i].push(run);
        }
    }
    let median = |runs: &[Run]| {
        let mut v: Vec<f64> = runs.iter().map(|r| r.cpu_us_per_request).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&results[0]);
    println!("\nmedian Envoy CPU per request (concurrency 1, wrk -t1 -c16, {seconds}s × {rounds} rounds):");
    for ((name, ..), runs) in cells.iter().zip(&results) {
        let m = median(runs);
        println!("  {name:<38} {m:>6.1} µs  ({:.2} × plain, +{:.1} µs)", m / base, m - base);
    }
    if results.iter().flatten().any(|r| r.errors > 0) {
        bail!("some requests failed: the figures above do not count");
    }
    Ok(())
}

fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

fn measure(envoy: &Envoy, path: &str, seconds: u64) -> Result<Run> {
    let tick_us = 1_000_000.0 / clock_ticks_per_second()?;
    let pid = envoy.child.id();
    let url = format!("https://127.0.0.1:{}{path}", envoy.settings.listen_port);
    let before = cpu_ticks(pid)?;
    let out = Command::new("wrk")
        .args(["-t1", "-c16", &format!("-d{seconds}s"), "--latency", &url])
        .output()
        .context("running wrk (apt-get install wrk)")?;
    let after = cpu_ticks(pid)?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    let requests: u64 = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .context("wrk: no request count")?
        .parse()?;
    let errors = text
        .lines()
        .filter(|l| l.contains("Non-2xx") || l.starts_with("  Socket errors"))
        .map(|l| l.rsplit(' ').next().unwrap_or("0").parse::<u64>().unwrap_or(1))
        .sum();
    let percentile = |p: &str| -> f64 {
        text.lines()
            .find(|l| l.trim_start().starts_with(p))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(parse_latency_ms)
            .unwrap_or(f64::NAN)
    };
    Ok(Run {
        requests,
        errors,
        cpu_us_per_request: (after - before) as f64 * tick_us / requests.max(1) as f64,
        p50_ms: percentile("50%"),
        p99_ms: percentile("99%"),
    })
}

fn parse_latency_ms(s: &str) -> f64 {
    let (num, scale) = if let Some(v) = s.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (s, f64::NAN)
    };
    num.parse::<f64>().map(|n| n * scale).unwrap_or(f64::NAN)
}

fn clock_ticks_per_second() -> Result<f64> {
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}
