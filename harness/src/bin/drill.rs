//! `make drill`: the same rolling upgrade (three stand-ins, 1.33 → 1.36 one at a time) twice under
//! a fixed-rate client load, through Envoy as a plain load balancer and through skewgate. Writes
//! drill/results/latest.json, drill/results/timeline.svg and (not with --quick) the README's
//! drill section.
//!
//! Usage: drill [--quick] [--rate N] [--seed N]

use std::time::Instant;

use anyhow::{Context, Result, bail};
use skewgate_harness::drill::{self, Options};
use skewgate_harness::paths;

fn main() -> Result<()> {
    let mut quick = false;
    let (mut rate, mut seed) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--rate" => rate = Some(args.next().context("--rate N")?.parse::<u32>()?),
            "--seed" => seed = Some(args.next().context("--seed N")?.parse::<u64>()?),
            "-h" | "--help" => {
                println!("usage: drill [--quick] [--rate N] [--seed N]");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; usage: drill [--quick] [--rate N] [--seed N]"),
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
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let runs = runtime.block_on(drill::drill(&o))?;
    let root = paths::workspace_root();
    let out = root.join("drill/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("latest.json"), serde_json::to_string_pretty(&drill::results_json(&o, &runs))?)?;
    std::fs::write(out.join("timeline.svg"), drill::timeline_svg(&runs))?;
    if !quick {
        drill::update_readme(&root.join("README.md"), &o, &runs)?;
    }
    println!("{}", drill::markdown_table(&runs));
    println!(
        "drill took {:.0} s; wrote drill/results/latest.json, drill/results/timeline.svg{}",
        started.elapsed().as_secs_f64(),
        if quick { "" } else { ", README.md" }
    );
    Ok(())
}
