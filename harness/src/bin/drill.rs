//! `make drill`: the same rolling upgrade (three stand-ins, 1.33 → 1.36 one at a time) twice under
//! a fixed-rate client load, through Envoy as a plain load balancer and through skewgate; or, with
//! --leave-and-return, the only 1.36 apiserver of a skewed cluster away past the sidecar's old
//! grace period and back. Writes drill/results/latest.json and the variant's plot, and (not with
//! --quick) drill/results/<variant>.json and .md and the README's drill section, which keeps
//! both variants' tables.
//!
//! Usage: drill [--quick] [--rate N] [--seed N] [--ready-delay SECONDS] [--poll SECONDS]
//!              [--leave-and-return [--away SECONDS] | --restarts N [--down SECONDS]]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use skewgate_harness::drill::{self, Options, Variant};
use skewgate_harness::paths;

const USAGE: &str = "usage: drill [--quick] [--rate N] [--seed N] [--ready-delay SECONDS] [--poll SECONDS] \
                     [--leave-and-return [--away SECONDS] | --restarts N [--down SECONDS]]";

fn seconds(flag: &str, value: Option<String>, zero_ok: bool) -> Result<Duration> {
    let value = value.with_context(|| format!("{flag} SECONDS"))?;
    let s: f64 = value.parse().with_context(|| format!("{flag} {value:?}: not a number of seconds"))?;
    if !(0.0..=3600.0).contains(&s) || (s == 0.0 && !zero_ok) {
        bail!("{flag} must be {} to 3600 seconds", if zero_ok { "0" } else { "above 0, up" });
    }
    Ok(Duration::from_secs_f64(s))
}

fn main() -> Result<()> {
    let mut quick = false;
    let (mut rate, mut seed, mut ready_delay, mut poll, mut away) = (None, None, None, None, None);
    let mut variant = Variant::Upgrade;
    let (mut restarts, mut down) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--rate" => rate = Some(args.next().context("--rate N")?.parse::<u32>()?),
            "--seed" => seed = Some(args.next().context("--seed N")?.parse::<u64>()?),
            "--ready-delay" => ready_delay = Some(seconds("--ready-delay", args.next(), true)?),
            "--poll" => poll = Some(seconds("--poll", args.next(), false)?),
            "--leave-and-return" => variant = Variant::LeaveAndReturn,
            "--restarts" => {
                variant = Variant::Restarts;
                restarts = Some(args.next().context("--restarts N")?.parse::<usize>()?);
            }
            "--away" => away = Some(seconds("--away", args.next(), false)?),
            "--down" => down = Some(seconds("--down", args.next(), true)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    if away.is_some() && variant != Variant::LeaveAndReturn {
        bail!("--away goes with --leave-and-return");
    }
    if down.is_some() && variant != Variant::Restarts {
        bail!("--down goes with --restarts");
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
    if let Some(d) = ready_delay {
        o.ready_delay = d;
    }
    if let Some(p) = poll {
        o.poll = p;
    }
    o.variant = variant;
    o.away = away;
    if let Some(n) = restarts {
        if !(1..=1000).contains(&n) {
            bail!("--restarts must be 1..=1000");
        }
        o.restarts = n;
    }
    if let Some(d) = down {
        o.down = d;
    }
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let runs = runtime.block_on(drill::drill(&o))?;
    let root = paths::workspace_root();
    let out = root.join("drill/results");
    std::fs::create_dir_all(&out)?;
    let results = serde_json::to_string_pretty(&drill::results_json(&o, &runs))?;
    std::fs::write(out.join("latest.json"), &results)?;
    std::fs::write(out.join(drill::timeline_file(variant)), drill::timeline_svg(&runs))?;
    if !quick {
        std::fs::write(out.join(format!("{}.json", variant.key())), &results)?;
        std::fs::write(out.join(format!("{}.md", variant.key())), drill::readme_part(&o, &runs))?;
        drill::update_readme(&root.join("README.md"), &out)?;
    }
    println!("{}", drill::settings(&o));
    println!("{}", drill::markdown_table(&runs));
    println!(
        "drill took {:.0} s; wrote drill/results/latest.json, drill/results/{}{}",
        started.elapsed().as_secs_f64(),
        drill::timeline_file(variant),
        if quick { "" } else { ", README.md" }
    );
    Ok(())
}
