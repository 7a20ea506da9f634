//! `make drill`: the same rolling upgrade (three apiservers, 1.33 → 1.36 one at a time) twice
//! under a fixed-rate client load, through Envoy as a plain load balancer and through skewgate.
//! On stand-ins it writes drill/results/latest.json, drill/results/timeline.svg and (not with
//! --quick) the README's drill section; on real binaries (`--kube-apiserver PATH --etcd PATH`,
//! or `$SKEWGATE_KUBE_APISERVER` and `$SKEWGATE_ETCD`) drill/results/real-latest.json and
//! drill/results/real-timeline.svg, and leaves the README alone.
//!
//! Usage: drill [--quick] [--rate N] [--seed N] [--kube-apiserver PATH --etcd PATH]

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use skewgate_harness::drill::{self, Options};
use skewgate_harness::paths;
use skewgate_harness::real::Binaries;

const USAGE: &str = "usage: drill [--quick] [--rate N] [--seed N] [--kube-apiserver PATH --etcd PATH]";

fn main() -> Result<()> {
    let mut quick = false;
    let (mut rate, mut seed) = (None, None);
    let (mut kube_apiserver, mut etcd): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--rate" => rate = Some(args.next().context("--rate N")?.parse::<u32>()?),
            "--seed" => seed = Some(args.next().context("--seed N")?.parse::<u64>()?),
            "--kube-apiserver" => kube_apiserver = Some(args.next().context("--kube-apiserver PATH")?.into()),
            "--etcd" => etcd = Some(args.next().context("--etcd PATH")?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    let mut o = Options::new(quick);
    if let Some(rate) = rate {
        if rate == 0 || rate > 2000 {
            bail!("--rate must be 1..=2000");
        }
        o.rate = rate;
    }
    if let Some(seed) = seed {
        o.seed = seed;
    }
    o.real = match (kube_apiserver, etcd) {
        (Some(k), Some(e)) => Some(Binaries::new(Some(&k), &e)?),
        (None, None) => Binaries::from_env()?,
        _ => bail!("--kube-apiserver and --etcd go together; {USAGE}"),
    };
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let runs = runtime.block_on(drill::drill(&o))?;
    let root = paths::workspace_root();
    let out = root.join("drill/results");
    std::fs::create_dir_all(&out)?;
    let prefix = if o.real.is_some() { "real-" } else { "" };
    let (json, svg) = (format!("{prefix}latest.json"), format!("{prefix}timeline.svg"));
    std::fs::write(out.join(&json), serde_json::to_string_pretty(&drill::results_json(&o, &runs))?)?;
    std::fs::write(out.join(&svg), drill::timeline_svg(&runs))?;
    let readme = !quick && o.real.is_none();
    if readme {
        drill::update_readme(&root.join("README.md"), &o, &runs)?;
    }
    println!("{}", drill::markdown_table(&runs));
    println!(
        "drill took {:.0} s; wrote drill/results/{json}, drill/results/{svg}{}",
        started.elapsed().as_secs_f64(),
        if readme { ", README.md" } else { "" }
    );
    Ok(())
}
