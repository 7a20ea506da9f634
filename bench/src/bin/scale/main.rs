//! `make scale`: what the watches and connections of a large cluster cost one edge. Plain Envoy
//! (envoy-config/plain-lb.yaml) and skewgate (bootstrap.yaml, the filter with a sealed table and
//! the sidecar's routes) on the same Envoy binary, one after the other at each size, in front of
//! the same kind of upstream (`skewgate_bench::scale::upstream`: three apiserver listeners sharing
//! one event store), driven by the same clients (`skewgate_bench::scale::clients`: HTTP/2
//! connections with a kubelet's client certificate, many watches each). For each size:
//!   1. Envoy alone, then with the client connections, then with every watch open: resident
//!      memory per connection and per watch;
//!   2. events at a steady rate: Envoy CPU per event, delivery latency (upstream write → client
//!      read, one clock);
//!   3. the same plus short gets at a steady rate: CPU per request, the gets' latency;
//!   4. apiserver b stops (ends its watches, refuses connections, as kube-apiserver at the end of
//!      its shutdown), events and gets going on: time until every watch is open again, Envoy's
//!      peak memory and CPU meanwhile, and every watch's events checked: none may be missing.
//!
//! Writes bench/results/scale.json, bench/results/scale-*.svg and BENCHMARKS.md's scale section.
//!
//! Usage: `scale --help`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};
use skewgate_bench::scale::clients::Clients;
use skewgate_bench::scale::upstream::Upstream;
use skewgate_bench::scale::{self, clients_for, cpu_each, kib_each, percentile};
use skewgate_bench::{self as bench, plot};
use skewgate_core::table::TableConfig;
use skewgate_envoy::{self as resources, Endpoint, Health};
use skewgate_harness::envoy::{Config, Envoy, Settings, sealed_ecds, upstream_tls};
use skewgate_harness::paths;
use skewgate_pki::Pki;

mod polling;

const CONFIGS: [&str; 2] = ["plain", "skewgate"];
const APISERVERS: [&str; 3] = ["a", "b", "c"];
/// The apiserver the drain step stops: b serves the pool's watches and, with a, the set a_b's;
/// c is the only one serving resource.k8s.io/v1 in the example table and has no one to hand its
/// watches to.
const DRAINED: &str = "b";

/// What watches and connections cost plain Envoy and skewgate at scale (`make scale`).
#[derive(Debug, Parser)]
#[command(name = "scale")]
struct Cli {
    /// Watches in all, a run of each configuration at each (the curve). 17,000 is one edge's
    /// share of a 5,000-node cluster's 50,000 behind three, and as many as a hard open-file
    /// limit of 20,000 holds (see `check_file_limit`).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000,17000")]
    watches: Vec<usize>,
    /// Watches per client connection (a kubelet holds about ten; Envoy allows 1,000 streams).
    #[arg(long, default_value_t = 10)]
    per_client: usize,
    /// Watch events a second, across all watches.
    #[arg(long, default_value_t = 1000)]
    events: u64,
    /// Short requests (gets) a second, across all clients.
    #[arg(long, default_value_t = 200)]
    requests: u64,
    /// Watches opened a second at the start.
    #[arg(long, default_value_t = 500)]
    open_rate: u64,
    /// Seconds of each measured phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Envoy's workers. At 1 Envoy has core 1 to itself; clients and upstream share core 0.
    #[arg(long, default_value_t = 1)]
    concurrency: u32,
    /// Apiservers the sidecars poll, a run each.
    #[arg(long, value_delimiter = ',', default_value = "3,5,7")]
    polling_apiservers: Vec<usize>,
    /// Edges (sidecars) polling them, a run each.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    polling_edges: Vec<usize>,
    /// Seconds each polling run is measured.
    #[arg(long, default_value_t = 20)]
    polling_seconds: u64,
    /// The configurations to run at each size (both unless given).
    #[arg(long, value_delimiter = ',', default_value = "plain,skewgate", value_parser = CONFIGS.to_vec())]
    configs: Vec<String>,
    /// The parts to run: watches (Envoy), polling (the sidecar).
    #[arg(long, value_delimiter = ',', default_value = "watches,polling", value_parser = ["watches", "polling"])]
    parts: Vec<String>,
    /// Leave bench/results and BENCHMARKS.md alone (experiments).
    #[arg(long)]
    no_write: bool,
    /// Measure nothing: write the plots and BENCHMARKS.md's section again from
    /// bench/results/scale.json (after a change to how they are drawn).
    #[arg(long)]
    reports: bool,
    /// A smoke run: 1,000 watches, 3-second phases, 3 apiservers polled by 2 edges for 5 s,
    /// nothing written.
    #[arg(long)]
    quick: bool,
}

/// One configuration at one size.
#[derive(Debug, Serialize)]
struct Cell {
    config: &'static str,
    watches: usize,
    clients: usize,
    rss_alone_kib: u64,
    rss_connected_kib: u64,
    rss_watching_kib: u64,
    kib_per_connection: f64,
    kib_per_watch: f64,
    /// Watches that meet the filter in skewgate (the others take the bypass routes).
    watches_through_filter: usize,
    open_s: f64,
    /// Share of a core the upstream used while the watches opened (one TLS handshake each).
    upstream_opening_core_share: f64,
    cpu_us_per_watch_opened: f64,
    idle_cpu_us_per_s: f64,
    events: u64,
    cpu_us_per_event: f64,
    event_p50_ms: f64,
    event_p99_ms: f64,
    requests: u64,
    requests_failed: u64,
    cpu_us_per_request: f64,
    /// Connections Envoy opened to the apiservers per short request (0: it reused idle ones).
    upstream_connections_per_request: f64,
    request_p50_ms: f64,
    request_p99_ms: f64,
    event_p99_ms_with_requests: f64,
    /// Share of a core the upstream and the clients each used while events and requests ran.
    upstream_core_share: f64,
    clients_core_share: f64,
    drain: Drain,
}

#[derive(Debug, Serialize)]
struct Drain {
    /// Watches the stopped apiserver held and ended.
    ended_by_drain: u64,
    /// Watch streams the clients saw end from then until every watch was back (those ended
    /// and any that ended again).
    moved: u64,
    back_s: f64,
    refused: u64,
    failed: u64,
    peak_rss_kib: u64,
    peak_cpu_core_share: f64,
    events_written: u64,
    events_lost: u64,
    events_repeated: u64,
    dropped_slow: u64,
    /// Share of a core the upstream and the clients used during the move (TLS handshakes of the
    /// watches' new upstream connections, mostly).
    upstream_core_share: f64,
    clients_core_share: f64,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.reports {
        let result: Value = serde_json::from_slice(&std::fs::read(results_path())?)?;
        return write_reports(&result);
    }
    let (watch_sizes, seconds, write) = match cli.quick {
        true => (vec![1000], 3, false),
        false => (cli.watches.clone(), cli.seconds, !cli.no_write),
    };
    if write && (cli.parts.len() < 2 || cli.configs.len() < CONFIGS.len()) {
        bail!("--parts or --configs runs a part of the benchmark: add --no-write");
    }
    let watch_sizes = if cli.parts.iter().any(|p| p == "watches") { watch_sizes } else { Vec::new() };
    if cli.per_client == 0 || cli.per_client > 1000 {
        bail!("--per-client must be 1..=1000 (Envoy's max_concurrent_streams)");
    }
    let largest = watch_sizes.iter().copied().max().unwrap_or(0);
    check_file_limit(largest, cli.per_client)?;
    // Before the pinning below, which leaves this process one CPU to see.
    let machine = bench::machine()?;
    // Everything here (driver, upstream, clients) on core 0; threads made later inherit it.
    bench::pin(std::process::id(), "0")?;
    let upstream_rt = runtime("scale-upstream")?;
    let clients_rt = runtime("scale-clients")?;
    let driver = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let run = Run { cli: &cli, seconds, upstream_rt: &upstream_rt, clients_rt: &clients_rt, machine };
    driver.block_on(run.all(&watch_sizes, write))
}

fn runtime(name: &str) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()?)
}

/// Envoy forwards each watch on an HTTP/1.1 connection of its own to the apiserver (the shipped
/// clusters speak HTTP/1.1: upgrades need it), so each watch holds a descriptor in Envoy and one
/// in the upstream, whatever connection it came on; each client connection one more in each of
/// Envoy and this process. Envoy inherits this process's limit. Raising it needs CAP_SYS_RESOURCE,
/// which a container may not have: the run stops before a size the limit cannot hold.
fn check_file_limit(watches: usize, per_client: usize) -> Result<()> {
    let needed = (watches + clients_for(watches, per_client)) as u64 + FD_SPARE;
    let hard = skewgate_harness::envoy::hard_nofile()?;
    if needed > hard {
        bail!(
            "{watches} watches in connections of {per_client} need {needed} open files in Envoy and in this \
             process, over the hard limit of {hard} (raise it with ulimit -Hn, which needs CAP_SYS_RESOURCE)"
        );
    }
    let soft = std::process::Command::new("prlimit")
        .args([format!("--pid={}", std::process::id()), format!("--nofile={hard}:{hard}")])
        .status()
        .context("running prlimit")?;
    if !soft.success() {
        bail!("prlimit could not raise the soft open-file limit to the hard one ({hard})");
    }
    Ok(())
}

/// Descriptors Envoy and this process use besides the watches and connections: listeners, health
/// checks, files, the admin API; measured under 200 for Envoy.
const FD_SPARE: u64 = 400;

struct Run<'a> {
    cli: &'a Cli,
    seconds: u64,
    upstream_rt: &'a tokio::runtime::Runtime,
    clients_rt: &'a tokio::runtime::Runtime,
    machine: Value,
}

impl Run<'_> {
    async fn all(&self, watch_sizes: &[usize], write: bool) -> Result<()> {
        let started = Instant::now();
        let dir = std::env::temp_dir().join(format!("skewgate-scale-{}", std::process::id()));
        let pki = Pki::generate(&dir.join("pki"))?;
        let kubelet =
            pki.cluster_ca.client(&dir.join("pki"), "kubelet", "system:node:node-1", &["system:nodes"])?;
        let wasm = paths::filter_wasm()?;
        let table: TableConfig = serde_json::from_slice(&std::fs::read(
            paths::workspace_root().join("envoy-config/examples/table.json"),
        )?)?;
        let ecds = sealed_ecds(&table, &wasm)?;
        let compiled = skewgate_core::table::RoutingTable::compile(table.clone())?;
        let mut cells = Vec::new();
        let polling = match self.cli.parts.iter().any(|p| p == "polling") {
            true if self.cli.quick => polling::run(&pki, &dir, &[3], &[2], 5, self.upstream_rt).await?,
            true => {
                let (m, e) = (&self.cli.polling_apiservers, &self.cli.polling_edges);
                polling::run(&pki, &dir, m, e, self.cli.polling_seconds, self.upstream_rt).await?
            }
            false => Vec::new(),
        };
        for (round, &watches) in watch_sizes.iter().enumerate() {
            // Each size starts with the other configuration than the last: whichever runs first
            // runs on a machine that has rested.
            for i in 0..CONFIGS.len() {
                let config = CONFIGS[(i + round) % CONFIGS.len()];
                if !self.cli.configs.iter().any(|c| c == config) {
                    continue;
                }
                let case = dir.join(format!("{config}-{watches}"));
                let cell =
                    self.cell(config, watches, &case, &pki, &kubelet, &table, &ecds, &compiled).await?;
                println!("{}", serde_json::to_string(&cell)?);
                cells.push(cell);
            }
        }
        let result = json!({
            "machine": self.machine,
            "envoy": bench::envoy_version()?,
            "commit": bench::commit(),
            "concurrency": self.cli.concurrency,
            "per_client": self.cli.per_client,
            "events_per_second": self.cli.events,
            "requests_per_second": self.cli.requests,
            "seconds_per_phase": self.seconds,
            "took_s": started.elapsed().as_secs_f64(),
            "cells": cells,
            "polling_seconds": self.cli.polling_seconds,
            "polling": polling,
        });
        let _ = std::fs::remove_dir_all(&dir);
        if !write {
            println!("\n{}", markdown(&result));
            return Ok(());
        }
        std::fs::write(results_path(), serde_json::to_string_pretty(&result)? + "\n")?;
        write_reports(&result)?;
        println!(
            "scale took {:.0} s; wrote bench/results/scale.json, bench/results/scale-*.svg, BENCHMARKS.md",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn cell(
        &self,
        config: &'static str,
        watches: usize,
        case: &Path,
        pki: &Pki,
        kubelet: &skewgate_pki::Pair,
        table: &TableConfig,
        ecds: &Value,
        compiled: &skewgate_core::table::RoutingTable,
    ) -> Result<Cell> {
        let per_client = self.cli.per_client;
        let clients_n = clients_for(watches, per_client);
        let tls = skewgate_harness::echo::tls_config(&pki.apiserver, &pki.requestheader_ca.cert_path)?;
        let upstream =
            self.upstream_rt.spawn(async move { Upstream::start(&APISERVERS, tls).await }).await??;
        let endpoints: Vec<Endpoint> = upstream
            .ports
            .iter()
            .map(|(id, port)| Endpoint { id: id.clone(), address: "127.0.0.1".into(), port: *port })
            .collect();
        let cds = resources::cds(table, &endpoints, &upstream_tls(pki), Health::default())?;
        let c = match config {
            "plain" => Config::PlainLb { pool_cluster: table.pool_cluster.clone() },
            _ => Config::Skewgate,
        };
        std::fs::create_dir_all(case)?;
        let settings =
            Settings { concurrency: self.cli.concurrency, ..Settings::new(c, case.to_path_buf(), pki)? };
        let envoy = Envoy::start(settings, &cds, ecds).await?;
        let pid = envoy.child.id();
        bench::pin(pid, if self.cli.concurrency == 1 { "1" } else { "0,1" })?;
        let probes: Vec<String> =
            (0..per_client.min(10)).map(|i| scale::watch_target(i, per_client, 0)).collect();
        let gets: Vec<String> = probes.iter().map(|t| t.replace("watch=true", "limit=1")).collect();
        bench::wait_routable(&envoy, &gets).await?;
        let through_filter = match config {
            "skewgate" => (0..watches).filter(|&i| scale::meets_filter(i, per_client)).count(),
            _ => 0,
        };
        if config == "skewgate" {
            let requests: Vec<bench::Request> =
                probes.iter().map(|p| bench::Request { path: p.clone(), headers: Vec::new() }).collect();
            let (by_route, _) = bench::coverage(compiled, &requests);
            let expected =
                probes.len() - (0..probes.len()).filter(|&i| scale::meets_filter(i, per_client)).count();
            if by_route != expected {
                bail!("of {} watch paths the bypass routes take {by_route}, not {expected}", probes.len());
            }
        }

        settle().await;
        let rss_alone = bench::rss_kib(pid)?;
        let ca = pki.cluster_ca.cert_path.clone();
        let kubelet = kubelet.clone();
        let port = envoy.settings.listen_port;
        let mut clients = self
            .clients_rt
            .spawn(async move { Clients::connect(port, &ca, &kubelet, clients_n, watches).await })
            .await??;
        settle().await;
        let rss_connected = bench::rss_kib(pid)?;

        let (cpu0, opened) = (envoy_cpu(pid)?, Instant::now());
        let opening = Reading::take(pid, &clients.seen)?;
        {
            let _runtime = self.clients_rt.enter();
            clients.watch(watches, per_client, self.cli.open_rate);
        }
        let seen = clients.seen.clone();
        let deadline = Instant::now() + Duration::from_secs(60 + watches as u64 / 100);
        while seen.open.load(Ordering::SeqCst) < watches as u64 {
            if Instant::now() > deadline {
                bail!(
                    "{config}: {} of {watches} watches open after {:?} ({} refused, {} failed)\n{}",
                    seen.open.load(Ordering::SeqCst),
                    opened.elapsed(),
                    seen.refused.load(Ordering::SeqCst),
                    seen.failed.load(Ordering::SeqCst),
                    tail(&envoy.log(), 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let open_s = opened.elapsed().as_secs_f64();
        let opened_reading = Reading::take(pid, &seen)?;
        let upstream_opening_core_share =
            (opened_reading.upstream_us - opening.upstream_us) / (opened_reading.at - opening.at) / 1e6;
        let cpu_opening = envoy_cpu(pid)? - cpu0;
        settle().await;
        let rss_watching = bench::rss_kib(pid)?;
        let idle = idle_rate(pid).await?;

        // Events alone, then gets alone, each in three windows: the median window's CPU per
        // unit. Other work on the machine delays Envoy now and then, and a delayed Envoy reads
        // several events at once for less CPU each (at 10,000 watches one window read 41 µs an
        // event where the others read 80): one window would report the machine's load.
        upstream.set_rate(self.cli.events);
        tokio::time::sleep(Duration::from_secs(1)).await;
        seen.take_latencies();
        let window = Duration::from_secs_f64(self.seconds as f64 / WINDOWS as f64);
        let mut per_event = Vec::new();
        let mut events = 0;
        for _ in 0..WINDOWS {
            let before = Reading::take(pid, &seen)?;
            tokio::time::sleep(window).await;
            let after = Reading::take(pid, &seen)?;
            events += after.events - before.events;
            per_event.push(cpu_each(
                after.envoy_us - before.envoy_us,
                idle,
                after.at - before.at,
                after.events - before.events,
            ));
        }
        let cpu_us_per_event = median(per_event);
        let latencies = seen.take_latencies();

        upstream.set_rate(0);
        seen.short_rate.store(self.cli.requests, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let connections_before = upstream_connections(&envoy).await?;
        let mut per_request = Vec::new();
        let mut gets = 0;
        for _ in 0..WINDOWS {
            let before = Reading::take(pid, &seen)?;
            tokio::time::sleep(window).await;
            let after = Reading::take(pid, &seen)?;
            gets += after.short_ok - before.short_ok;
            per_request.push(cpu_each(
                after.envoy_us - before.envoy_us,
                idle,
                after.at - before.at,
                after.short_ok - before.short_ok,
            ));
        }
        let cpu_us_per_request = median(per_request);
        let upstream_connections_per_request =
            (upstream_connections(&envoy).await? - connections_before) as f64 / gets.max(1) as f64;

        // Both: latencies under load, and the share of a core the upstream and the clients need.
        upstream.set_rate(self.cli.events);
        tokio::time::sleep(Duration::from_secs(1)).await;
        seen.take_latencies();
        seen.take_short_latencies();
        let before = Reading::take(pid, &seen)?;
        tokio::time::sleep(Duration::from_secs(self.seconds)).await;
        let after = Reading::take(pid, &seen)?;
        let requests = after.short_ok - before.short_ok;
        let requests_failed = after.short_failed - before.short_failed;
        let loaded_latencies = seen.take_latencies();
        let short = seen.take_short_latencies();
        let span = after.at - before.at;
        let upstream_core_share = (after.upstream_us - before.upstream_us) / span / 1e6;
        let clients_core_share = (after.clients_us - before.clients_us) / span / 1e6;

        let drain = self.drain(&upstream, &envoy, &seen, watches).await?;
        drop(clients);
        drop(envoy);
        drop(upstream);
        Ok(Cell {
            config,
            watches,
            clients: clients_n,
            rss_alone_kib: rss_alone,
            rss_connected_kib: rss_connected,
            rss_watching_kib: rss_watching,
            kib_per_connection: kib_each(rss_alone, rss_connected, clients_n),
            kib_per_watch: kib_each(rss_connected, rss_watching, watches),
            watches_through_filter: through_filter,
            open_s,
            upstream_opening_core_share,
            cpu_us_per_watch_opened: cpu_opening / watches as f64,
            idle_cpu_us_per_s: idle,
            events,
            cpu_us_per_event,
            event_p50_ms: percentile(&latencies, 50.0),
            event_p99_ms: percentile(&latencies, 99.0),
            requests,
            requests_failed,
            cpu_us_per_request,
            upstream_connections_per_request,
            request_p50_ms: percentile(&short, 50.0),
            request_p99_ms: percentile(&short, 99.0),
            event_p99_ms_with_requests: percentile(&loaded_latencies, 99.0),
            upstream_core_share,
            clients_core_share,
            drain,
        })
    }

    /// [`DRAINED`] stops with events and requests going on; until every watch is open again, and
    /// then every event checked.
    async fn drain(
        &self,
        upstream: &Upstream,
        envoy: &Envoy,
        seen: &Arc<scale::clients::Seen>,
        watches: usize,
    ) -> Result<Drain> {
        let pid = envoy.child.id();
        let ended = seen.ended.load(Ordering::SeqCst);
        let (refused, failed) = (seen.refused.load(Ordering::SeqCst), seen.failed.load(Ordering::SeqCst));
        let started = Instant::now();
        let before = Reading::take(pid, seen)?;
        let ended_by_drain = upstream.drain(DRAINED);
        let (mut peak_rss, mut peak_cpu) = (bench::rss_kib(pid)?, 0.0f64);
        let (mut cpu, mut at) = (envoy_cpu(pid)?, Instant::now());
        let deadline = started + Duration::from_secs(120);
        let back = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            peak_rss = peak_rss.max(bench::rss_kib(pid)?);
            let (now_cpu, now) = (envoy_cpu(pid)?, Instant::now());
            peak_cpu = peak_cpu.max((now_cpu - cpu) / now.duration_since(at).as_secs_f64() / 1e6);
            (cpu, at) = (now_cpu, now);
            let moved = seen.ended.load(Ordering::SeqCst) > ended;
            if moved && seen.open.load(Ordering::SeqCst) == watches as u64 {
                break started.elapsed();
            }
            if Instant::now() > deadline {
                bail!(
                    "{} of {watches} watches open 120 s after {DRAINED} stopped\n{}",
                    seen.open.load(Ordering::SeqCst),
                    tail(&envoy.log(), 20)
                );
            }
        };
        let after = Reading::take(pid, seen)?;
        let span = after.at - before.at;
        // A little more of the steady load on the two that are left, then quiet, and every
        // event written must have reached its watch.
        tokio::time::sleep(Duration::from_secs(2)).await;
        upstream.set_rate(0);
        seen.short_rate.store(0, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let written = upstream.written();
        let sequences = seen.sequences();
        let lost =
            sequences.iter().enumerate().map(|(i, s)| s.lost(written.get(&i).copied().unwrap_or(0))).sum();
        let counts = upstream.counts();
        Ok(Drain {
            ended_by_drain,
            moved: seen.ended.load(Ordering::SeqCst) - ended,
            back_s: back.as_secs_f64(),
            refused: seen.refused.load(Ordering::SeqCst) - refused,
            failed: seen.failed.load(Ordering::SeqCst) - failed,
            peak_rss_kib: peak_rss,
            peak_cpu_core_share: peak_cpu,
            events_written: written.values().sum(),
            events_lost: lost,
            events_repeated: sequences.iter().map(|s| s.repeats).sum(),
            dropped_slow: counts.dropped_slow,
            upstream_core_share: (after.upstream_us - before.upstream_us) / span / 1e6,
            clients_core_share: (after.clients_us - before.clients_us) / span / 1e6,
        })
    }
}

/// Windows a CPU phase is read in (see the events phase).
const WINDOWS: u32 = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Envoy's CPU a second with every watch open and nothing to do (health checks, stats flushes,
/// the filter's timers): the quietest of three seconds. Once a 2-second reading took in work
/// left over from the watches opening and read 15 times the others, which taken off the events'
/// CPU made skewgate's per event look a third cheaper than plain Envoy's.
async fn idle_rate(pid: u32) -> Result<f64> {
    let mut quietest = f64::MAX;
    for _ in 0..3 {
        let (cpu, at) = (envoy_cpu(pid)?, Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        quietest = quietest.min((envoy_cpu(pid)? - cpu) / at.elapsed().as_secs_f64());
    }
    Ok(quietest)
}

/// Connections Envoy has opened to the apiservers, all clusters.
async fn upstream_connections(envoy: &Envoy) -> Result<u64> {
    let stats = envoy.stats().await?;
    Ok(stats
        .iter()
        .filter(|(k, _)| k.starts_with("cluster.") && k.ends_with(".upstream_cx_total"))
        .map(|(_, v)| v)
        .sum())
}

/// Envoy's memory allocator gives freed memory back at most once a second (bootstrap.yaml):
/// two seconds before a reading.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// CPU time of Envoy and of this process's upstream and client threads, and what the clients
/// counted, at one moment.
struct Reading {
    at: f64,
    envoy_us: f64,
    upstream_us: f64,
    clients_us: f64,
    events: u64,
    short_ok: u64,
    short_failed: u64,
}

impl Reading {
    fn take(pid: u32, seen: &scale::clients::Seen) -> Result<Reading> {
        Ok(Reading {
            at: epoch_s(),
            envoy_us: envoy_cpu(pid)?,
            upstream_us: bench::threads_cpu_micros(std::process::id(), Some("scale-upstream"))?,
            clients_us: bench::threads_cpu_micros(std::process::id(), Some("scale-clients"))?,
            events: seen.events.load(Ordering::SeqCst),
            short_ok: seen.short_ok.load(Ordering::SeqCst),
            short_failed: seen.short_failed.load(Ordering::SeqCst),
        })
    }
}

/// Envoy's CPU time, µs: all its threads (main, workers, file watcher, stats flush).
fn envoy_cpu(pid: u32) -> Result<f64> {
    bench::threads_cpu_micros(pid, None)
}

fn epoch_s() -> f64 {
    scale::now_ns() as f64 / 1e9
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn results_path() -> std::path::PathBuf {
    paths::workspace_root().join("bench/results/scale.json")
}

/// The plots and BENCHMARKS.md's section, from a run's results.
fn write_reports(result: &Value) -> Result<()> {
    let md = markdown(result);
    println!("\n{md}");
    let out = paths::workspace_root().join("bench/results");
    std::fs::create_dir_all(&out)?;
    let (memory, cpu) = plots(result);
    std::fs::write(out.join("scale-memory.svg"), memory)?;
    std::fs::write(out.join("scale-cpu.svg"), cpu)?;
    let body = format!(
        "{md}\n![Envoy memory per watch and per connection vs watches](bench/results/scale-memory.svg)\n\n![Envoy CPU per event and per request vs watches](bench/results/scale-cpu.svg)\n"
    );
    skewgate_harness::markdown::update_section(
        &paths::workspace_root().join("BENCHMARKS.md"),
        None,
        BEGIN,
        END,
        &body,
    )
}

const BEGIN: &str = "<!-- scale:begin (generated by `make scale`) -->";
const END: &str = "<!-- scale:end -->";

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The run as BENCHMARKS.md shows it: one row per size and configuration, skewgate's ratio to
/// plain's under it.
fn markdown(result: &Value) -> String {
    let cells: Vec<&Value> = result["cells"].as_array().map(|c| c.iter().collect()).unwrap_or_default();
    let mut md = format!(
        "Measured {} on {} with Envoy {} at commit {} (`--concurrency {}`, {} watches a connection, {} events/s, {} gets/s, {} s a phase; took {:.0} s).\n\n",
        result["machine"]["date"].as_str().unwrap_or(""),
        result["machine"]["cpu"].as_str().unwrap_or(""),
        result["envoy"].as_str().unwrap_or(""),
        result["commit"].as_str().unwrap_or(""),
        result["concurrency"],
        result["per_client"],
        result["events_per_second"],
        result["requests_per_second"],
        result["seconds_per_phase"],
        f(&result["took_s"]),
    );
    if !cells.is_empty() {
        md.push_str(&watch_tables(&cells));
    }
    if let Some(rows) = result["polling"].as_array().filter(|r| !r.is_empty()) {
        md.push_str(&format!(
            "\nThe sidecar, one `skewgate sync` per edge with the shipped periods (discovery in full every 5 s, readiness and discovery ETags every 250 ms), polling stand-in apiservers (the real 1.33 documents, the last at 1.36), {} s each:\n\n",
            result["polling_seconds"]
        ));
        md.push_str("| apiservers | edges | requests/s on each apiserver (mean, busiest) | per edge | discovery answers that were 304 | KiB/s each sidecar read (sockets and files) | KiB/s the 304s saved each apiserver | per sidecar: share of a core, RSS MiB |\n|---|---|---|---|---|---|---|---|\n");
        for r in rows {
            let edges = f(&r["edges"]);
            md.push_str(&format!(
                "| {} | {} | {:.1}, {:.1} | {:.1} | {} of {} | {:.1} | {:.0} | {:.3}, {:.0} |\n",
                r["apiservers"],
                r["edges"],
                f(&r["requests_per_s_per_apiserver"]),
                f(&r["requests_per_s_busiest"]),
                f(&r["requests_per_s_per_apiserver"]) / edges,
                r["discovery_304s"],
                r["discovery_answers"],
                f(&r["bytes_per_s_per_apiserver"]) * f(&r["apiservers"]) / edges / 1024.0,
                f(&r["saved_bytes_per_s_per_apiserver"]) / 1024.0,
                f(&r["sidecar_core_share"]),
                f(&r["sidecar_rss_mib"]),
            ));
        }
    }
    md
}

/// The watch runs' two tables: per size and configuration (skewgate's ratio to plain under each
/// size), and the drain step's.
fn watch_tables(cells: &[&Value]) -> String {
    let mut md = String::new();
    md.push_str("| watches | connections | config | Envoy RSS MiB (alone → connected → watching) | KiB/connection | KiB/watch | opened in s (upstream: share of a core) | CPU µs/watch opened | CPU µs/event | event p50 / p99 ms | CPU µs/get | get p50 / p99 ms | event p99 ms with gets | upstream, clients: share of a core |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut by_size: Vec<u64> = cells.iter().filter_map(|c| c["watches"].as_u64()).collect();
    by_size.sort_unstable();
    by_size.dedup();
    for size in &by_size {
        let of = |config: &str| cells.iter().find(|c| c["watches"] == *size && c["config"] == config);
        for config in CONFIGS {
            let Some(c) = of(config) else { continue };
            md.push_str(&format!(
                "| {} | {} | {} | {:.0} → {:.0} → {:.0} | {:.1} | {:.1} | {:.1} ({:.2}) | {:.0} | {:.1} | {:.2} / {:.2} | {:.1} | {:.2} / {:.2} | {:.2} | {:.2}, {:.2} |\n",
                c["watches"],
                c["clients"],
                config,
                f(&c["rss_alone_kib"]) / 1024.0,
                f(&c["rss_connected_kib"]) / 1024.0,
                f(&c["rss_watching_kib"]) / 1024.0,
                f(&c["kib_per_connection"]),
                f(&c["kib_per_watch"]),
                f(&c["open_s"]),
                f(&c["upstream_opening_core_share"]),
                f(&c["cpu_us_per_watch_opened"]),
                f(&c["cpu_us_per_event"]),
                f(&c["event_p50_ms"]),
                f(&c["event_p99_ms"]),
                f(&c["cpu_us_per_request"]),
                f(&c["request_p50_ms"]),
                f(&c["request_p99_ms"]),
                f(&c["event_p99_ms_with_requests"]),
                f(&c["upstream_core_share"]),
                f(&c["clients_core_share"]),
            ));
        }
        if let (Some(p), Some(s)) = (of("plain"), of("skewgate")) {
            let r = |k: &str| f(&s[k]) / f(&p[k]);
            let d = |k: &str| f(&s[k]) - f(&p[k]);
            md.push_str(&format!(
                "| | | **skewgate ÷ plain** | | **{:.2}** | **{:.2}** | | {:.2} | **{:.2}** | {:+.2} / **{:+.2}** | {:.2} | {:+.2} / {:+.2} | {:+.2} | |\n",
                r("kib_per_connection"),
                r("kib_per_watch"),
                r("cpu_us_per_watch_opened"),
                r("cpu_us_per_event"),
                d("event_p50_ms"),
                d("event_p99_ms"),
                r("cpu_us_per_request"),
                d("request_p50_ms"),
                d("request_p99_ms"),
                d("event_p99_ms_with_requests"),
            ));
        }
    }
    md.push_str(&format!("\nApiserver {DRAINED} stops (ends its watches, refuses connections) with events and gets going on:\n\n"));
    md.push_str("| watches | config | watches b held | watch streams ended (clients) | every watch back after | watch requests refused / unanswered meanwhile | events written | lost | repeated | Envoy peak RSS MiB | Envoy peak CPU (share of a core, 100 ms) | upstream, clients: share of a core |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for size in &by_size {
        for config in CONFIGS {
            let Some(c) = cells.iter().find(|c| c["watches"] == *size && c["config"] == config) else {
                continue;
            };
            let d = &c["drain"];
            if d.is_null() {
                continue;
            }
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} s | {} / {} | {} | **{}** | {} | {:.0} | {:.2} | {:.2}, {:.2} |\n",
                size,
                config,
                d["ended_by_drain"],
                d["moved"],
                f(&d["back_s"]),
                d["refused"],
                d["failed"],
                d["events_written"],
                d["events_lost"],
                d["events_repeated"],
                f(&d["peak_rss_kib"]) / 1024.0,
                f(&d["peak_cpu_core_share"]),
                f(&d["upstream_core_share"]),
                f(&d["clients_core_share"]),
            ));
        }
    }
    md
}

/// Memory per watch and per connection, and CPU per event and per get, against watches.
fn plots(result: &Value) -> (String, String) {
    let cells: Vec<&Value> = result["cells"].as_array().map(|c| c.iter().collect()).unwrap_or_default();
    let series = |config: &str, key: &str, label: &str, color: &'static str, dashed: bool| plot::Series {
        label: format!("{config}: {label}"),
        color,
        dashed,
        points: cells
            .iter()
            .filter(|c| c["config"] == config)
            .filter_map(|c| Some((c["watches"].as_f64()?, c[key].as_f64()?)))
            .collect(),
    };
    let color = |config: &str| if config == "plain" { "#888888" } else { "#1f77b4" };
    let memory: Vec<plot::Series> = CONFIGS
        .iter()
        .flat_map(|c| {
            [
                series(c, "kib_per_watch", "per watch", color(c), false),
                series(c, "kib_per_connection", "per connection", color(c), true),
            ]
        })
        .collect();
    let cpu: Vec<plot::Series> = CONFIGS
        .iter()
        .flat_map(|c| {
            [
                series(c, "cpu_us_per_event", "per event", color(c), false),
                series(c, "cpu_us_per_request", "per get", color(c), true),
            ]
        })
        .collect();
    let axes = |title, y_label| plot::Axes {
        title,
        x_label: "watches through one Envoy (log scale)",
        y_label,
        log_x: true,
    };
    (
        plot::lines(
            &axes("Envoy resident memory per watch and per connection", "KiB"),
            &memory,
            720.0,
            420.0,
        ),
        plot::lines(&axes("Envoy CPU per watch event and per get", "CPU µs"), &cpu, 720.0, 420.0),
    )
}
