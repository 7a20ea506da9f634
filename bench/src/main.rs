//! `make bench`: what skewgate costs per request. Same Envoy 1.40 binary, same upstream (a second
//! Envoy answering at once), same request mix, three configurations run interleaved:
//!   (a) plain LB: no filter, one route to the pool (envoy-config/plain-lb.yaml) — the floor;
//!   (b) skewgate: the filter with the routing table (envoy-config/bootstrap.yaml), and the routes
//!       the sidecar writes with it, whose bypass routes take requests that need no decision;
//!   (c) native: one Envoy route per GVR generated from the same table, no filter;
//!   and the ways around the proxy-wasm filter: module (the dynamic module ahead of the filter), filter-only (skewgate
//!   without bypass routes: every request meets the filter), module-only (the module, no filter),
//!   and shipped (bootstrap.yaml's listener and routes, no filter: what the shipped settings cost).
//! The upstream answers discovery requests with documents of the size skewgate composes (an
//! apiserver's own are as large), so that plain Envoy forwards as many bytes as skewgate sends.
//! At --concurrency 1 also per request class (uniform, uniform-cert, rerouted, discovery, realistic).
//! For table sizes real (~110 GVRs), 1,000 and 10,000, at --concurrency 1 (Envoy pinned to a core
//! of its own) and 2. Also the table reload latency and the errors during reloads under load.
//! Writes bench/results/latest.json, bench/results/cpu-per-request.svg and the results section
//! of BENCHMARKS.md.
//!
//! Usage: `bench --help`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};
use skewgate_bench::{self as bench, WrkRun};
use skewgate_core::table::{GroupVersionConfig, TableConfig};
use skewgate_envoy::{self as resources, Endpoint, Health};
use skewgate_harness::envoy::{Config, Envoy, Settings, free_port, sealed_ecds, sealed_json, upstream_tls};
use skewgate_harness::paths;
use skewgate_pki::Pki;

/// plain (first: the others' ratios are to it), skewgate as shipped (the filter behind its bypass
/// routes), generated routes (one per GVR, no filter), the native module ahead of the filter,
/// filter-only (the shipped routes without bypass: every request meets the
/// filter), the module alone (no filter behind it: no discovery composition; what the chain
/// costs), and `shipped`: bootstrap.yaml's listener and routes with no filter, every route to the
/// pool — what the shipped Envoy settings cost before any skewgate code runs.
const CONFIGS: [&str; 7] = ["plain", "skewgate", "native", "module", "filter-only", "module-only", "shipped"];
const PROBE_GROUP: &str = "probe.bench.skewgate.io";

#[derive(Debug, Serialize)]
struct Cell {
    concurrency: u32,
    table: String,
    gvrs: usize,
    config: &'static str,
    /// `mix` (the original anonymous mix) or a request class of [`bench::class_mixes`].
    mix: String,
    round: usize,
    #[serde(flatten)]
    wrk: WrkRun,
    cpu_us_per_request: f64,
    rss_kib: u64,
    /// This cell's CPU per request over plain's in the same round.
    cpu_ratio_to_plain: f64,
    rps_ratio_to_plain: f64,
}

#[derive(Debug, Serialize)]
struct Reload {
    config: &'static str,
    table: String,
    gvrs: usize,
    /// What one reload writes: `ecds.json` (with the routes when they change); plain Envoy's,
    /// `rds.json`.
    file_bytes: usize,
    latencies_ms: Vec<f64>,
    median_ms: f64,
    reloads_under_load: usize,
    requests_under_load: u64,
    errors_under_load: u64,
}

struct Args {
    seconds: u64,
    rounds: usize,
    sizes: Vec<(String, Option<usize>)>,
    concurrencies: Vec<u32>,
    /// Write results and BENCHMARKS.md (off for experiments).
    write: bool,
    /// Request mixes to run (`mix` and the classes of `bench::class_mixes`); all when empty.
    mixes: Vec<String>,
    /// Configurations to run, plain first (the others' ratios are to it); all by default.
    configs: Vec<&'static str>,
    /// Count instructions per request under callgrind ([`INSTRUCTION_CLASSES`]).
    instructions: bool,
}

/// What cost skewgate adds per request, against plain Envoy (`make bench`; BENCHMARKS.md).
#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Cli {
    /// Seconds per run. Short runs, many rounds: the machine's speed drifts over minutes (plain
    /// Envoy's CPU per request moved 25 % between rounds of one run), and a ratio is only as good
    /// as the runs it compares were close in time.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
    /// Rounds; each starts one configuration later.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Table sizes: real (the real 1.33 + 1.36 discovery), 1000, 10000.
    #[arg(long, value_delimiter = ',', default_value = "real,1000,10000", value_parser = ["real", "1000", "10000"])]
    sizes: Vec<String>,
    /// Envoy worker counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    concurrency: Vec<u32>,
    /// Request mixes: mix and the classes uniform, uniform-cert, rerouted, discovery, realistic
    /// (all when not given).
    #[arg(long, value_delimiter = ',')]
    mixes: Vec<String>,
    /// Configurations besides plain, which always runs first (the others' ratios are to it).
    #[arg(long, value_delimiter = ',', value_parser = CONFIGS[1..].to_vec())]
    configs: Vec<String>,
    /// Leave bench/results and BENCHMARKS.md alone (experiments).
    #[arg(long)]
    no_write: bool,
    /// Skip the instruction counts under callgrind.
    #[arg(long)]
    no_instructions: bool,
    /// A 1-minute smoke run: one round of 2 s at --concurrency 1, no instruction counts.
    #[arg(long)]
    quick: bool,
}

fn args() -> Result<Args> {
    let cli = Cli::parse();
    let sizes = [("real", None), ("1000", Some(1_000)), ("10000", Some(10_000))]
        .into_iter()
        .filter(|(name, _)| cli.sizes.iter().any(|s| s == name))
        .map(|(name, n)| (name.to_owned(), n))
        .collect();
    let configs: Vec<&'static str> = match cli.configs.is_empty() {
        true => CONFIGS.to_vec(),
        false => {
            CONFIGS.iter().copied().filter(|c| *c == "plain" || cli.configs.iter().any(|w| w == c)).collect()
        }
    };
    let mut a = Args {
        seconds: cli.seconds,
        rounds: cli.rounds,
        sizes,
        concurrencies: cli.concurrency,
        write: !cli.no_write,
        mixes: cli.mixes,
        configs,
        instructions: !cli.no_instructions,
    };
    if cli.quick {
        a.seconds = 2;
        a.rounds = 1;
        a.concurrencies = vec![1];
        a.instructions = false;
    }
    if a.write && a.configs.len() != CONFIGS.len() {
        bail!("--configs runs a part of the benchmark: add --no-write");
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = args()?;
    let started = Instant::now();
    let machine = bench::machine()?;
    // The benchmark driver, wrk and the upstream share core 0; Envoy under test gets core 1 at
    // --concurrency 1. Without pinning, runs move by ±10 µs/request on this 2-core VM.
    bench::pin(std::process::id(), "0")?;
    let dir = std::env::temp_dir().join(format!("skewgate-bench-{}", std::process::id()));
    let pki = Pki::generate(&dir.join("pki"))?;
    let wasm = paths::filter_wasm()?;

    let tls = upstream_tls(&pki);
    let base: TableConfig = serde_json::from_slice(&std::fs::read(
        paths::workspace_root().join("envoy-config/examples/table.json"),
    )?)?;

    let mut cells = Vec::new();
    let mut reloads = Vec::new();
    let mut memory = Vec::new();
    let mut coverage = Vec::new();
    let mut instructions = Vec::new();
    for &concurrency in &args.concurrencies {
        for (name, size) in &args.sizes {
            let table = with_probes(
                &match size {
                    Some(n) => bench::synthetic_table(&base, *n),
                    None => base.clone(),
                },
                false,
            );
            let gvrs = bench::gvr_count(&table);
            let case = dir.join(format!("c{concurrency}-{name}"));
            let compiled = skewgate_core::table::RoutingTable::compile(table.clone())?;
            let answers: Vec<bench::Answer> = bench::class_mixes(&table)
                .iter()
                .flat_map(|(_, requests)| bench::discovery_answers(&compiled, requests))
                .collect();
            let (upstream, endpoints) = start_upstream(&case.join("upstream"), &pki, &answers).await?;
            let cds = resources::cds(&table, &endpoints, &tls, Health::default())?;
            let ecds = sealed_ecds(&table, &wasm)?;
            let mut envoys = Vec::new();
            for &config in &args.configs {
                let c = match config {
                    "plain" => Config::PlainLb { pool_cluster: table.pool_cluster.clone() },
                    "skewgate" | "filter-only" | "shipped" => Config::Skewgate,
                    "module" => Config::Native {
                        module_ecds: skewgate_harness::native::module_ecds(&sealed_json(&table)?),
                        wasm: true,
                    },
                    // Alone, the module has no filter to leave the hold's requests to (those for
                    // an API of one apiserver): its table without the hold, so that it routes
                    // every request itself.
                    "module-only" => {
                        let alone = sealed_json(&without_hold(table.clone()))?;
                        Config::Native {
                            module_ecds: skewgate_harness::native::module_ecds(&alone),
                            wasm: false,
                        }
                    }
                    _ => Config::NativeRoutes {
                        pool_cluster: table.pool_cluster.clone(),
                        routes: bench::native_routes(&table),
                    },
                };
                let mut s = Settings { concurrency, ..Settings::new(c, case.join(config), &pki)? };
                // The shipped bootstrap with the routes of a table without bypass (every request
                // meets the filter, as before the bypass routes), and with no filter at all.
                if config == "filter-only" || config == "shipped" {
                    let rendered = skewgate_harness::envoy::render_bootstrap(&s)?;
                    let routed = skewgate_harness::envoy::with_static_routes(&rendered, &s.route_timeout)?;
                    s.config = Config::Custom(match config {
                        "shipped" => bench::without_filter(&routed, &table.pool_cluster)?,
                        _ => routed,
                    });
                }
                let envoy = Envoy::start(s, &cds, &ecds).await?;
                bench::pin(envoy.child.id(), if concurrency == 1 { "1" } else { "0,1" })?;
                envoys.push(envoy);
            }
            // wrk cannot present a client certificate: an Envoy of its own does, one listener per
            // configuration, on core 0 with wrk and the upstream.
            let client_ports: Vec<(u16, u16)> =
                envoys.iter().map(|e| Ok((free_port()?, e.settings.listen_port))).collect::<Result<_>>()?;
            let kubelet = pki.cluster_ca.client(
                &dir.join("pki"),
                "kubelet",
                "system:node:node-1",
                &["system:nodes"],
            )?;
            let client_admin = free_port()?;
            let client_bootstrap =
                bench::certificate_client_bootstrap(&pki, &kubelet, &client_ports, client_admin).to_string();
            let client = Envoy::start(
                Settings {
                    admin_port: client_admin,
                    concurrency: 1,
                    ..Settings::new(Config::Custom(client_bootstrap), case.join("client"), &pki)?
                },
                &json!({"resources": []}),
                &json!({"resources": []}),
            )
            .await?;
            bench::pin(client.child.id(), "0")?;
            let mix = bench::request_mix(&table);
            let script = case.join("mix.lua");
            bench::write_wrk_script(&script, &mix)?;
            for envoy in &envoys {
                bench::wait_routable(envoy, &mix).await?;
            }
            // The request classes at --concurrency 1 only: they multiply the runs.
            let mut scripts = vec![("mix".to_string(), script.clone())];
            if concurrency == 1 {
                let anonymous: Vec<bench::Request> = mix
                    .iter()
                    .map(|path| bench::Request { path: path.clone(), headers: Vec::new() })
                    .collect();
                let (by_route, by_module) = bench::coverage(&compiled, &anonymous);
                println!(
                    "{name:>5} mix (anonymous): of {} requests the bypass routes take {by_route}",
                    mix.len()
                );
                coverage.push(json!({"table": name, "class": "mix", "requests": mix.len(), "bypass_routes": by_route, "module": by_module}));
                for (class, requests) in bench::class_mixes(&table) {
                    let (by_route, by_module) = bench::coverage(&compiled, &requests);
                    println!(
                        "{name:>5} {class:<9}: of {} requests the bypass routes take {by_route}, the module {by_module}",
                        requests.len()
                    );
                    coverage.push(json!({"table": name, "class": class, "requests": requests.len(), "bypass_routes": by_route, "module": by_module}));
                    let path = case.join(format!("{class}.lua"));
                    bench::write_wrk_requests(&path, &requests)?;
                    scripts.push((class.to_string(), path));
                }
            }
            // Every class exists at --concurrency 1: a misspelt one would run nothing.
            let unknown = args.mixes.iter().find(|m| !scripts.iter().any(|(mix, _)| mix == *m));
            if let (1, Some(unknown)) = (concurrency, unknown) {
                let known: Vec<&str> = scripts.iter().map(|(mix, _)| mix.as_str()).collect();
                bail!("unknown mix {unknown:?} (one of {})", known.join(", "));
            }
            scripts.retain(|(mix, _)| args.mixes.is_empty() || args.mixes.contains(mix));
            let (threads, connections) = if concurrency == 1 { (1, 16) } else { (2, 32) };
            for round in 1..=args.rounds {
                for (mix_name, script) in &scripts {
                    // Each round starts with the next configuration: whichever ran first in a
                    // round measured lower (plain against itself: 0.94–1.00), which a fixed order
                    // would have charged to every other configuration.
                    let mut runs = Vec::new();
                    let n = args.configs.len();
                    for i in (0..n).map(|i| (i + round - 1) % n) {
                        let (envoy, (client_port, _)) = (&envoys[i], &client_ports[i]);
                        let pid = envoy.child.id();
                        let url = match mix_name.ends_with("-cert") {
                            true => format!("http://127.0.0.1:{client_port}"),
                            false => format!("https://127.0.0.1:{}", envoy.settings.listen_port),
                        };
                        let cpu_before = bench::cpu_micros(pid)?;
                        let script = script.clone();
                        let seconds = args.seconds;
                        let wrk = tokio::task::spawn_blocking(move || {
                            bench::wrk(&url, &script, threads, connections, seconds)
                        })
                        .await??;
                        let cpu = (bench::cpu_micros(pid)? - cpu_before) / wrk.requests.max(1) as f64;
                        runs.push((i, cpu, bench::rss_kib(pid)?, wrk));
                    }
                    runs.sort_by_key(|(i, ..)| *i);
                    let (base_cpu, base_rps) = (runs[0].1, runs[0].3.requests_per_second);
                    for ((_, cpu, rss_kib, wrk), &config) in runs.into_iter().zip(&args.configs) {
                        let cell = Cell {
                            concurrency,
                            table: name.clone(),
                            gvrs,
                            config,
                            mix: mix_name.clone(),
                            round,
                            cpu_us_per_request: cpu,
                            rss_kib,
                            cpu_ratio_to_plain: cpu / base_cpu,
                            rps_ratio_to_plain: wrk.requests_per_second / base_rps,
                            wrk,
                        };
                        println!(
                            "c{concurrency} {name:>5} {mix_name:<9} {config:<8} round {round}: {:>7.0} req/s  p50 {:.2} ms  p99 {:.2} ms  {:>6.1} µs CPU/req ({:.2}× plain)  RSS {} MiB  errors {}",
                            cell.wrk.requests_per_second,
                            cell.wrk.p50_ms,
                            cell.wrk.p99_ms,
                            cell.cpu_us_per_request,
                            cell.cpu_ratio_to_plain,
                            cell.rss_kib / 1024,
                            cell.wrk.errors
                        );
                        cells.push(cell);
                    }
                }
            }
            let envoy_of = |config: &str| args.configs.iter().position(|c| *c == config).map(|i| &envoys[i]);
            if let Some(envoy) = envoy_of("skewgate") {
                memory.push(json!({
                    "concurrency": concurrency,
                    "table": name,
                    "gvrs": gvrs,
                    "wasm_stats": wasm_memory_stats(envoy).await?,
                }));
            }
            if concurrency == 1 {
                for config in ["skewgate", "module"] {
                    if let Some(envoy) = envoy_of(config) {
                        reloads.push(reload(envoy, config, &table, name, gvrs, &wasm, &script).await?);
                    }
                }
                // What plain Envoy's own reload of the same routes takes, for the ratio.
                if envoy_of("skewgate").is_some() {
                    let dir = case.join("plain-reload");
                    let mut s = Settings::new(Config::Skewgate, dir, &pki)?;
                    let bootstrap = skewgate_harness::envoy::render_bootstrap(&s)?;
                    s.config = Config::Custom(bench::without_filter_keeping_routes(&bootstrap)?);
                    let envoy =
                        Envoy::start(s, &cds, &sealed_ecds(&with_probes(&table, false), &wasm)?).await?;
                    bench::pin(envoy.child.id(), "1")?;
                    // Token requests: without the filter only the bypass routes route.
                    let uniform = case.join("uniform.lua");
                    reloads.push(plain_reload(&envoy, &table, name, gvrs, &wasm, &uniform).await?);
                }
            }
            drop(client);
            // Each configuration again, alone and under callgrind, on the same files and ports.
            let settings: Vec<Settings> = envoys.iter().map(|e| e.settings.clone()).collect();
            drop(envoys);
            if args.instructions && concurrency == 1 && name == "real" {
                for (settings, &config) in settings.into_iter().zip(&args.configs) {
                    let classes =
                        scripts.iter().filter(|(mix, _)| INSTRUCTION_CLASSES.contains(&mix.as_str()));
                    let counted = count_instructions(settings, &cds, &ecds, classes).await?;
                    for (class, requests, per_request) in counted {
                        println!(
                            "instructions {name} {class:<9} {config:<11}: {per_request:>7} per request ({requests} requests)"
                        );
                        instructions.push(json!({"table": name, "gvrs": gvrs, "class": class, "config": config, "requests": requests, "per_request": per_request}));
                    }
                }
            }
            drop(upstream);
        }
    }

    let summary = summarize(&cells);
    let result = json!({
        "machine": machine,
        "envoy": bench::envoy_version()?,
        "commit": bench::commit(),
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "wrk": "1 thread, 16 connections at --concurrency 1; 2 threads, 32 connections at --concurrency 2; TLS in, mTLS out",
        "took_s": started.elapsed().as_secs_f64(),
        "summary": summary,
        "reloads": reloads,
        "coverage": coverage,
        "wasm_memory": memory,
        "instructions": with_ratios(instructions),
        "cells": cells,
    });
    println!("\n{}", markdown_tables(&result));
    if !args.write {
        return Ok(());
    }
    let out = paths::workspace_root().join("bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("latest.json"), serde_json::to_string_pretty(&result)? + "\n")?;
    std::fs::write(out.join("cpu-per-request.svg"), plot(&summary))?;
    write_markdown(&result)?;
    println!(
        "bench took {:.0} s; wrote bench/results/latest.json, bench/results/cpu-per-request.svg, BENCHMARKS.md",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The request classes (token clients) whose instructions per request `make bench` counts at
/// the real table: CPU time on this machine moves by ±5 % between runs, too much to tell
/// 1.03 × plain from 1.06 ×; instructions counted by callgrind repeat to within 0.3 %. They leave
/// out the kernel's share (TLS records, sockets), the same for every configuration, so their
/// ratios run above CPU's.
const INSTRUCTION_CLASSES: [&str; 5] = ["mix", "uniform", "rerouted", "discovery", "realistic"];

/// Starts `settings` under callgrind and counts, for each class, the instructions per request
/// of `wrk` (1 thread, 2 connections, 8 s) after a warm-up: (class, requests, per request).
async fn count_instructions(
    mut settings: Settings,
    cds: &Value,
    ecds: &Value,
    classes: impl Iterator<Item = &(String, std::path::PathBuf)>,
) -> Result<Vec<(String, u64, u64)>> {
    let dumps = settings.dir.join("callgrind");
    let _ = std::fs::remove_dir_all(&dumps);
    std::fs::create_dir_all(&dumps)?;
    settings.wrapper = bench::callgrind_wrapper(&dumps);
    let envoy = Envoy::start(settings, cds, ecds).await?;
    let pid = envoy.child.id();
    let url = format!("https://127.0.0.1:{}", envoy.settings.listen_port);
    const REQUESTS: &str = "http.apiserver.downstream_rq_total";
    let mut counted = Vec::new();
    for (class, script) in classes {
        let run = |seconds: u64| {
            let (url, script) = (url.clone(), script.clone());
            tokio::task::spawn_blocking(move || bench::wrk(&url, &script, 1, 2, seconds))
        };
        let warm = run(2).await??;
        if warm.errors > 0 {
            bail!("{class}: {} of {} requests failed under callgrind", warm.errors, warm.requests);
        }
        let before = envoy.stat(REQUESTS).await?;
        bench::callgrind_control(pid, &["-z"])?;
        bench::callgrind_control(pid, &["-i", "on"])?;
        let wrk = run(8).await??;
        bench::callgrind_control(pid, &["-i", "off"])?;
        let total = tokio::task::block_in_place(|| bench::callgrind_dump(pid, &dumps))?;
        let requests = envoy.stat(REQUESTS).await? - before;
        if wrk.errors > 0 || requests == 0 {
            bail!("{class}: {} of {} requests failed under callgrind", wrk.errors, wrk.requests);
        }
        counted.push((class.clone(), requests, total / requests));
    }
    Ok(counted)
}

/// `instructions` with each row's ratio to plain's of the same class.
fn with_ratios(instructions: Vec<Value>) -> Vec<Value> {
    let plain = |class: &Value| {
        instructions
            .iter()
            .find(|r| r["class"] == *class && r["config"] == "plain")
            .and_then(|r| r["per_request"].as_f64())
    };
    instructions
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if let (Some(base), Some(own)) = (plain(&r["class"]), r["per_request"].as_f64()) {
                r["ratio_to_plain"] = json!((own / base * 1000.0).round() / 1000.0);
            }
            r
        })
        .collect()
}

/// The apiservers' stand-in (see [`bench::upstream_bootstrap`]), on core 0 with the driver and wrk.
async fn start_upstream(dir: &Path, pki: &Pki, answers: &[bench::Answer]) -> Result<(Envoy, Vec<Endpoint>)> {
    let ports: Vec<(String, u16)> =
        ["a", "b", "c"].iter().map(|id| Ok((id.to_string(), free_port()?))).collect::<Result<_>>()?;
    let admin = free_port()?;
    let bootstrap = bench::upstream_bootstrap(pki, &ports, admin, answers).to_string();
    let s = Settings {
        admin_port: admin,
        concurrency: 1,
        ..Settings::new(Config::Custom(bootstrap), dir.to_path_buf(), pki)?
    };
    let upstream = Envoy::start(s, &json!({"resources": []}), &json!({"resources": []})).await?;
    bench::pin(upstream.child.id(), "0")?;
    let endpoints =
        ports.into_iter().map(|(id, port)| Endpoint { id, address: "127.0.0.1".into(), port }).collect();
    Ok((upstream, endpoints))
}

/// Two probe GVRs whose serving apiserver swaps between `a` and `b` when `swapped` flips: the
/// reload test watches for the swap.
fn with_probes(table: &TableConfig, swapped: bool) -> TableConfig {
    let mut t = table.clone();
    t.group_versions.retain(|gv| gv.group != PROBE_GROUP);
    let (first, second) = if swapped { ("b", "a") } else { ("a", "b") };
    let one = |id: &str| vec![id.to_string()];
    t.group_versions.push(GroupVersionConfig {
        group: PROBE_GROUP.into(),
        version: "v1".into(),
        served_by: vec!["a".into(), "b".into()],
        resources: BTreeMap::from([("probes".into(), one(first)), ("probes2".into(), one(second))]),
        extension: false,
    });
    let names = skewgate_core::build::ClusterNames::default();
    t.assign_sets(|m| names.set_cluster(m));
    t.generation = format!("{}-{}", table.generation, if swapped { "swapped" } else { "plain" });
    t
}

/// `table` with the hold off: what the module alone routes (it has no filter to leave the hold's
/// requests to).
fn without_hold(mut table: TableConfig) -> TableConfig {
    table.policy.hold.max_wait = Duration::ZERO;
    table
}

async fn served_by(client: &reqwest::Client, url: &str) -> Option<String> {
    // A token client's, whichever routes the configuration has for those without one.
    let r = client.get(url).bearer_auth("bench-token").send().await.ok()?;
    r.headers().get("x-skewgate-served-by")?.to_str().ok().map(String::from)
}

/// Rename of ecds.json → first response routed by the new table, five times; then ten reloads
/// during a wrk run, counting failed requests.
async fn reload(
    envoy: &Envoy,
    config: &'static str,
    table: &TableConfig,
    name: &str,
    gvrs: usize,
    wasm: &Path,
    script: &Path,
) -> Result<Reload> {
    let tables = [with_probes(table, false), with_probes(table, true)];
    let ecds: Vec<Value> = tables.iter().map(|t| sealed_ecds(t, wasm)).collect::<Result<_>>()?;
    let bytes = ecds[0].to_string().len();
    // With the module, its ECDS file first, then the filter's (Envoy::write_ecds).
    let swap = |i: usize| envoy.write_ecds(&ecds[i]);
    timed_reloads(envoy, config, (name, gvrs, bytes), script, swap).await
}

/// Plain Envoy's own reload of the same routes: the bootstrap the sidecar writes for, with its
/// route file but no filter, swapping the probe tables by their `rds.json` alone, as the
/// sidecar's push writes it (the clusters stay; the bypass routes carry the probes), timed as
/// [`reload`] is: the floor a table reload is held against. The probes' sets of one apiserver
/// have their bypass routes as rendered (for while the apiserver is up: nothing takes them out
/// here), which are all that routes them without the filter.
async fn plain_reload(
    envoy: &Envoy,
    table: &TableConfig,
    name: &str,
    gvrs: usize,
    wasm: &Path,
    script: &Path,
) -> Result<Reload> {
    let tables = [false, true].map(|swapped| with_probes(table, swapped));
    let rds: Vec<String> = tables
        .iter()
        .map(|t| Ok(envoy.settings.rds_for(&sealed_ecds(t, wasm)?).to_string()))
        .collect::<Result<_>>()?;
    let path = envoy.settings.files().rds_path();
    let swap = |i: usize| Ok(skewgate_envoy::write_atomic(&path, rds[i].as_bytes())?);
    timed_reloads(envoy, "plain", (name, gvrs, rds[0].len()), script, swap).await
}

/// `swap(i)` makes probe table `i` (0 or 1) the one Envoy runs: timed from the write to the first
/// response routed by it, five times; then ten swaps during a wrk run of `script`, counting
/// failed requests.
async fn timed_reloads(
    envoy: &Envoy,
    config: &'static str,
    (name, gvrs, file_bytes): (&str, usize, usize),
    script: &Path,
    swap: impl Fn(usize) -> Result<()>,
) -> Result<Reload> {
    let client = bench::client()?;
    let url = format!("https://127.0.0.1:{}/apis/{PROBE_GROUP}/v1/probes", envoy.settings.listen_port);
    let mut latencies = Vec::new();
    let mut current = 0;
    for _ in 0..5 {
        let next = 1 - current;
        let want = if next == 1 { "b" } else { "a" };
        let start = Instant::now();
        swap(next)?;
        loop {
            if served_by(&client, &url).await.as_deref() == Some(want) {
                break;
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("table {next} not live 20 s after the rename:\n{}", envoy.log());
            }
        }
        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
        current = next;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let url = format!("https://127.0.0.1:{}", envoy.settings.listen_port);
    let script = script.to_path_buf();
    let load = tokio::task::spawn_blocking(move || bench::wrk(&url, &script, 1, 16, 12));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..10 {
        current = 1 - current;
        swap(current)?;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    let run = load.await??;
    let mut sorted = latencies.clone();
    sorted.sort_by(f64::total_cmp);
    let r = Reload {
        config,
        table: name.into(),
        gvrs,
        file_bytes,
        median_ms: sorted[sorted.len() / 2],
        latencies_ms: latencies,
        reloads_under_load: 10,
        requests_under_load: run.requests,
        errors_under_load: run.errors,
    };
    println!(
        "reload {config} {name:>5} ({gvrs} GVRs, {} KiB): median {:.1} ms {:?}; 10 reloads under load: {} requests, {} errors",
        r.file_bytes / 1024,
        r.median_ms,
        r.latencies_ms.iter().map(|l| format!("{l:.1}")).collect::<Vec<_>>(),
        r.requests_under_load,
        r.errors_under_load
    );
    Ok(r)
}

/// Envoy 1.40 exposes no per-VM memory gauge for V8; report what the admin API has on wasm.
async fn wasm_memory_stats(envoy: &Envoy) -> Result<Value> {
    let stats = envoy.stats().await?;
    let wasm: BTreeMap<&String, &u64> = stats.iter().filter(|(k, _)| k.starts_with("wasm")).collect();
    Ok(json!(wasm))
}

/// Medians over rounds, per (concurrency, table, config).
fn summarize(cells: &[Cell]) -> Vec<Value> {
    let mut groups: BTreeMap<(u32, usize, &str, &str), Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        groups.entry((c.concurrency, c.gvrs, c.mix.as_str(), c.config)).or_default().push(c);
    }
    groups
        .into_iter()
        .map(|((concurrency, gvrs, mix, config), cs)| {
            let median = |f: &dyn Fn(&Cell) -> f64| {
                let mut v: Vec<f64> = cs.iter().map(|c| f(c)).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            json!({
                "concurrency": concurrency,
                "table": cs[0].table,
                "gvrs": gvrs,
                "config": config,
                "mix": mix,
                "rps": median(&|c| c.wrk.requests_per_second),
                "p50_ms": median(&|c| c.wrk.p50_ms),
                "p99_ms": median(&|c| c.wrk.p99_ms),
                "cpu_us_per_request": median(&|c| c.cpu_us_per_request),
                "cpu_ratio_to_plain": median(&|c| c.cpu_ratio_to_plain),
                "rps_ratio_to_plain": median(&|c| c.rps_ratio_to_plain),
                "rss_mib": median(&|c| c.rss_kib as f64 / 1024.0),
                "errors": cs.iter().map(|c| c.wrk.errors).sum::<u64>(),
            })
        })
        .collect()
}

fn markdown_tables(result: &Value) -> String {
    let mut md = String::new();
    md.push_str(&format!(
        "Measured {} on {} with Envoy {} at commit {} ({} s per run, {} rounds, each configuration in turn, each round starting one configuration later; medians; requests: `mix` is the anonymous mix, the others are the token request classes at --concurrency 1).\n\n",
        result["machine"]["date"].as_str().unwrap_or(""),
        result["machine"]["cpu"].as_str().unwrap_or(""),
        result["envoy"].as_str().unwrap_or(""),
        result["commit"].as_str().unwrap_or(""),
        result["seconds_per_run"],
        result["rounds"],
    ));
    md.push_str("| Envoy concurrency | table | GVRs | requests | config | req/s | p50 ms | p99 ms | CPU µs/req | CPU × plain | req/s × plain | RSS MiB | errors |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for s in result["summary"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {:.0} | {} |\n",
            s["concurrency"],
            s["table"].as_str().unwrap_or(""),
            s["gvrs"],
            s["mix"].as_str().unwrap_or(""),
            s["config"].as_str().unwrap_or(""),
            s["rps"].as_f64().unwrap_or(f64::NAN),
            s["p50_ms"].as_f64().unwrap_or(f64::NAN),
            s["p99_ms"].as_f64().unwrap_or(f64::NAN),
            s["cpu_us_per_request"].as_f64().unwrap_or(f64::NAN),
            s["cpu_ratio_to_plain"].as_f64().unwrap_or(f64::NAN),
            s["rps_ratio_to_plain"].as_f64().unwrap_or(f64::NAN),
            s["rss_mib"].as_f64().unwrap_or(f64::NAN),
            s["errors"],
        ));
    }
    if let Some(rows) = result["instructions"].as_array().filter(|r| !r.is_empty()) {
        md.push_str("\nInstructions per request, counted by callgrind (Envoy alone under valgrind, `wrk` 1 thread, 2 connections, 8 s after a 2 s warm-up; user space only: the kernel's share, the same for every configuration, is not in them):\n\n| table | GVRs | requests | config | instructions/req | × plain |\n|---|---|---|---|---|---|\n");
        for r in rows {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.3} |\n",
                r["table"].as_str().unwrap_or(""),
                r["gvrs"],
                r["class"].as_str().unwrap_or(""),
                r["config"].as_str().unwrap_or(""),
                r["per_request"],
                r["ratio_to_plain"].as_f64().unwrap_or(f64::NAN),
            ));
        }
    }
    md.push_str("\n| config | table | GVRs | file written, KiB (ecds.json; plain: rds.json) | reload: rename → new table answers (median of 5) | × plain's reload | requests during 10 reloads | failed |\n|---|---|---|---|---|---|---|---|\n");
    let reloads = result["reloads"].as_array().map(Vec::as_slice).unwrap_or_default();
    for r in reloads {
        let plain = reloads.iter().find(|p| p["config"] == "plain" && p["table"] == r["table"]);
        let ratio = plain.and_then(|p| Some(r["median_ms"].as_f64()? / p["median_ms"].as_f64()?));
        md.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} ms | {} | {} | {} |\n",
            r["config"].as_str().unwrap_or(""),
            r["table"].as_str().unwrap_or(""),
            r["gvrs"],
            r["file_bytes"].as_u64().unwrap_or(0) / 1024,
            r["median_ms"].as_f64().unwrap_or(f64::NAN),
            ratio.map_or("".to_owned(), |x| format!("{x:.2}")),
            r["requests_under_load"],
            r["errors_under_load"],
        ));
    }
    md
}

const BEGIN: &str = "<!-- bench:begin (generated by `make bench`) -->";
const END: &str = "<!-- bench:end -->";

fn write_markdown(result: &Value) -> Result<()> {
    let path = paths::workspace_root().join("BENCHMARKS.md");
    let empty = format!("# Benchmarks\n\n{BEGIN}\n{END}\n");
    let body = format!(
        "{}\n![Envoy CPU per request vs table size](bench/results/cpu-per-request.svg)\n",
        markdown_tables(result)
    );
    skewgate_harness::markdown::update_section(&path, Some(&empty), BEGIN, END, &body)
}

/// CPU µs/request against table size (log scale), one line per configuration and concurrency.
fn plot(summary: &[Value]) -> String {
    let points: Vec<(u32, &str, f64, f64)> = summary
        .iter()
        .filter(|s| s["mix"] == "mix")
        .filter_map(|s| {
            Some((
                s["concurrency"].as_u64()? as u32,
                s["config"].as_str()?,
                s["gvrs"].as_f64()?,
                s["cpu_us_per_request"].as_f64()?,
            ))
        })
        .collect();
    let colors = [
        ("plain", "#888888"),
        ("skewgate", "#1f77b4"),
        ("native", "#d62728"),
        ("module", "#2ca02c"),
        ("filter-only", "#9467bd"),
    ];
    let mut series = Vec::new();
    for concurrency in [1u32, 2] {
        for (config, color) in colors {
            let letter = match config {
                "plain" => "a",
                "skewgate" => "b",
                _ => "c",
            };
            series.push(bench::plot::Series {
                label: format!("({letter}) {config}, c={concurrency}"),
                color,
                dashed: concurrency == 2,
                points: points
                    .iter()
                    .filter(|p| p.0 == concurrency && p.1 == config)
                    .map(|p| (p.2, p.3))
                    .collect(),
            });
        }
    }
    let axes = bench::plot::Axes {
        title: "Envoy CPU per request vs routing table size",
        x_label: "GVRs in the table (log scale)",
        y_label: "Envoy CPU µs / request",
        log_x: true,
    };
    bench::plot::lines(&axes, &series, 720.0, 420.0)
}
