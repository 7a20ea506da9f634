//! `make drill`: the same rolling upgrade (three stand-ins, 1.33 → 1.36 one at a time) twice under
//! a fixed-rate client load, through Envoy as a plain load balancer and through skewgate; or, with
//! --leave-and-return, the only 1.36 apiserver of a skewed cluster away past the sidecar's old
//! grace period and back. Writes drill/results/latest.json and the variant's plot, and (not with
//! --quick) drill/results/<variant>.json and .md and docs/drill.md's generated section, which keeps
//! both variants' tables. On real binaries (`--kube-apiserver PATH --etcd PATH`, or
//! `$SKEWGATE_KUBE_APISERVER` and `$SKEWGATE_ETCD`) the same files are named `real-…` and the
//! page is left alone. On real binaries the upgrade has a third run, the plain LB in front of
//! apiservers running Kubernetes' own Mixed Version Proxy, each run is preceded by a probe
//! (rerouted vs local latency, `kubectl explain`), and the first upgraded apiserver, the sole
//! server of the new APIs, is stopped for 20 s and back, then SIGKILLed for 20 s and back
//! (`--sole-away SECONDS`, 0: no such step; stand-ins: off unless given).
//!
//! Usage: drill [--quick] [--rate N] [--seed N] [--ready-delay SECONDS] [--poll SECONDS]
//!              [--leave-and-return [--away SECONDS] | --restarts N [--down SECONDS]]
//!              [--sole-away SECONDS] [--kube-apiserver PATH --etcd PATH]
//!              [--only plain-lb|mvp|skewgate] [--keep]
//!
//! `--only` runs one column alone, to look into, and writes its latest.json and plot under
//! target/tmp/drill-PID/ rather than drill/results/; `--keep` leaves each run's files (Envoy's log and access log, the sidecar's log, the
//! table) under target/tmp/drill-PID/ and prints where.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use skewgate_drill::{self as drill, Options, Variant};
use skewgate_harness::paths;
use skewgate_harness::real::Binaries;

const USAGE: &str = "usage: drill [--quick] [--rate N] [--seed N] [--ready-delay SECONDS] [--poll SECONDS] \
                     [--leave-and-return [--away SECONDS] | --restarts N [--down SECONDS]] \
                     [--sole-away SECONDS] [--kube-apiserver PATH --etcd PATH \
                     [--kube-controller-manager PATH] [--old-kube-apiserver PATH \
                     [--old-kube-controller-manager PATH]]] [--only plain-lb|mvp|skewgate] [--keep]";

fn seconds(flag: &str, value: Option<String>, zero_ok: bool) -> Result<Duration> {
    let value = value.with_context(|| format!("{flag} SECONDS"))?;
    let s: f64 = value.parse().with_context(|| format!("{flag} {value:?}: not a number of seconds"))?;
    if !(0.0..=3600.0).contains(&s) || (s == 0.0 && !zero_ok) {
        bail!("{flag} must be {} to 3600 seconds", if zero_ok { "0" } else { "above 0, up" });
    }
    Ok(Duration::from_secs_f64(s))
}

fn main() -> Result<()> {
    let (mut quick, mut keep, mut only) = (false, false, None);
    let (mut rate, mut seed, mut ready_delay, mut poll, mut away) = (None, None, None, None, None);
    let mut variant = Variant::Upgrade;
    let (mut restarts, mut down, mut sole_away) = (None, None, None);
    let (mut kube_apiserver, mut etcd): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut controller_manager: Option<PathBuf> = None;
    let (mut old_apiserver, mut old_controller_manager): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--keep" => keep = true,
            "--only" => {
                let key = args.next().context("--only plain-lb|mvp|skewgate")?;
                let mode = drill::Mode::all(true).iter().find(|m| m.key() == key);
                only = Some(*mode.with_context(|| format!("--only {key:?}: plain-lb, mvp or skewgate"))?);
            }
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
            "--sole-away" => sole_away = Some(seconds("--sole-away", args.next(), true)?),
            "--kube-apiserver" => kube_apiserver = Some(args.next().context("--kube-apiserver PATH")?.into()),
            "--etcd" => etcd = Some(args.next().context("--etcd PATH")?.into()),
            "--kube-controller-manager" => {
                controller_manager = Some(args.next().context("--kube-controller-manager PATH")?.into())
            }
            "--old-kube-apiserver" => {
                old_apiserver = Some(args.next().context("--old-kube-apiserver PATH")?.into())
            }
            "--old-kube-controller-manager" => {
                old_controller_manager =
                    Some(args.next().context("--old-kube-controller-manager PATH")?.into())
            }
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
    (o.only, o.keep) = (only, keep);
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
    // A controller-manager runs against the front door in every run (plain LB, MVP, skewgate).
    o.real = match (kube_apiserver, etcd) {
        (Some(k), Some(e)) => {
            Some(Binaries::new(Some(&k), &e)?.with_controller_manager(controller_manager.as_deref())?)
        }
        (None, None) => match Binaries::from_env()? {
            Some(b) if controller_manager.is_some() => {
                Some(b.with_controller_manager(controller_manager.as_deref())?)
            }
            found => found,
        },
        _ => bail!("--kube-apiserver and --etcd go together; {USAGE}"),
    };
    if old_apiserver.is_some() || old_controller_manager.is_some() {
        let real = o
            .real
            .take()
            .context("--old-kube-apiserver needs the release upgraded to (--kube-apiserver and --etcd)")?;
        o.real = Some(real.with_old_release(old_apiserver.as_deref(), old_controller_manager.as_deref())?);
    }
    if o.release() && variant != Variant::Upgrade {
        bail!("--old-kube-apiserver goes with the upgrade (the other variants emulate the old release)");
    }
    if controller_manager.is_some() && o.real.is_none() {
        bail!("--kube-controller-manager needs real apiservers (--kube-apiserver and --etcd); {USAGE}");
    }
    if o.only == Some(drill::Mode::Mvp) && o.real.is_none() {
        bail!("--only mvp needs real apiservers (--kube-apiserver and --etcd)");
    }
    if sole_away.is_some() && variant != Variant::Upgrade {
        bail!("--sole-away goes with the upgrade (the first upgraded apiserver is the sole new one)");
    }
    o.sole_away = match (sole_away, &o.real, variant) {
        (Some(d), _, _) => Some(d).filter(|d| !d.is_zero()),
        (None, Some(_), Variant::Upgrade) => Some(Duration::from_secs(20)),
        (None, _, _) => None,
    };
    if o.real.is_some() && ready_delay.is_some() {
        bail!("--ready-delay is for stand-ins: real kube-apiservers take their own start-up");
    }
    if o.real.is_some() && down.is_some() {
        bail!("--down is for stand-ins: a real kube-apiserver takes its own time to listen again");
    }
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // What a release pair differs in decides the load, and the results name it.
    if o.release() {
        o.release_load = Some(runtime.block_on(drill::release_load(&o))?);
    }
    let runs = runtime.block_on(drill::drill(&o))?;
    let root = paths::workspace_root();
    // One column alone is for looking into: its files stay beside its run's, out of the results.
    let out = match o.only {
        Some(_) => o.work.clone(),
        None => root.join("drill/results"),
    };
    std::fs::create_dir_all(&out)?;
    // Real binaries' results sit next to the stand-ins' and stay out of docs/drill.md's section.
    let prefix = match (&o.real, o.release()) {
        (Some(_), true) => "release-",
        (Some(_), false) => "real-",
        (None, _) => "",
    };
    let (latest, timeline) =
        (format!("{prefix}latest.json"), format!("{prefix}{}", drill::timeline_file(variant)));
    let results = serde_json::to_string_pretty(&drill::results_json(&o, &runs))?;
    std::fs::write(out.join(&latest), &results)?;
    std::fs::write(out.join(&timeline), drill::timeline_svg(&o, &runs))?;
    // A partial or quick run leaves the committed comparison alone.
    let whole = !quick && o.only.is_none();
    let page = whole && o.real.is_none();
    if whole {
        std::fs::write(out.join(format!("{prefix}{}.json", variant.key())), &results)?;
        std::fs::write(out.join(format!("{prefix}{}.md", variant.key())), drill::page_part(&o, &runs))?;
    }
    if page {
        drill::update_page(&root.join("docs/drill.md"), &out)?;
    }
    println!("{}", drill::settings(&o));
    println!("{}", drill::markdown_table(&runs));
    for run in runs.iter().filter(|r| r.mode == drill::Mode::Skewgate) {
        if let Some(evidence) = &run.evidence {
            println!("{}: requests that went wrong{}{evidence}\n", run.name, run_failures(run));
        }
    }
    println!(
        "drill took {:.0} s; wrote {}, {}{}",
        started.elapsed().as_secs_f64(),
        out.join(&latest).display(),
        out.join(&timeline).display(),
        if page { ", docs/drill.md" } else { "" }
    );
    Ok(())
}

/// Each failed request of `run`, one line each, every class.
fn run_failures(run: &drill::Run) -> String {
    drill::Class::ERRORS.iter().map(|class| run.failures(*class, 10)).collect()
}
