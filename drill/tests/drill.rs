//! The drill in --quick mode, in its adversarial settings: the same code as `make drill`,
//! asserting what skewgate promises and that the plain-LB baseline really suffers from the skew.

use std::time::Duration;

use anyhow::{Result, ensure};
use skewgate_drill::{self as drill, Class, Mode, Options, Run, Variant};

async fn quick(variant: Variant, ready_delay: Duration, poll: Duration) -> Result<Vec<Run>> {
    let started = std::time::Instant::now();
    let mut o = Options::new(true);
    // One folder for the process: each run's lies under it named by variant and column. Short,
    // because the sidecar's OpenAPI socket lies inside it and a Unix socket's path takes at most
    // 107 bytes.
    o.work = o.work.with_file_name(format!("drill-test-{}", std::process::id()));
    o.variant = variant;
    o.ready_delay = ready_delay;
    o.poll = poll;
    let runs = drill::drill(&o).await?;
    println!(
        "{}\n{}\nquick drill took {:.1?}",
        drill::settings(&o),
        drill::markdown_table(&runs),
        started.elapsed()
    );
    Ok(runs)
}

/// skewgate's column: no wrong 404, lost write, connection error, timeout or other status, and
/// 503s only while every apiserver serving the GVR was restarting or away; the plain LB's
/// column has wrong 404s.
fn check(runs: &[Run]) -> Result<&Run> {
    let plain = runs.iter().find(|r| r.mode == Mode::PlainLb).expect("plain run");
    let skewgate = runs.iter().find(|r| r.mode == Mode::Skewgate).expect("skewgate run");
    ensure!(
        plain.count(Class::WrongNotFound) > 0,
        "the plain-LB run shows no wrong 404s: the drill does not exercise the skew"
    );
    check_skewgate(skewgate)?;
    Ok(skewgate)
}

fn check_skewgate(skewgate: &Run) -> Result<()> {
    for class in
        [Class::WrongNotFound, Class::LostWrite, Class::Connection, Class::Timeout, Class::OtherStatus]
    {
        ensure!(
            skewgate.count(class) == 0,
            "skewgate run: {} {}:{}{}",
            skewgate.count(class),
            class.label(),
            skewgate.failures(class, 10),
            skewgate.evidence.as_deref().unwrap_or_default()
        );
    }
    ensure!(
        skewgate.unexpected_503 == 0,
        "skewgate run: {} 503s while some apiserver serving the GVR was up:{}{}",
        skewgate.unexpected_503,
        skewgate.failures(Class::Unavailable, 10),
        skewgate.evidence.as_deref().unwrap_or_default()
    );
    ensure!(skewgate.count(Class::Success) > 0);
    // The client that sends again as client-go does: a re-send never lands a write twice, and
    // what it finally gets is never a wrong 404 or a lost write.
    let client_go = &skewgate.client_go;
    ensure!(client_go.requests > 0, "the client-go-like client sent nothing");
    ensure!(client_go.applied_twice == 0, "skewgate run: {} writes applied twice", client_go.applied_twice);
    for class in [Class::WrongNotFound, Class::LostWrite] {
        let n = client_go.count(class);
        ensure!(n == 0, "skewgate run: the client-go-like client got {n} × {}", class.label());
    }
    if let Some(k) = &skewgate.kubectl {
        ensure!(k.runs > 0, "the kubectl loop never ran");
    }
    Ok(())
}

/// Every apiserver upgraded while it is ready the instant it starts, at the production poll
/// period: only the sidecar's eligibility control keeps Envoy from sending it requests for
/// the GVRs it dropped before its new discovery is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_drill_ready_at_once_production_poll() -> Result<()> {
    let runs = quick(Variant::Upgrade, Duration::ZERO, Duration::from_secs(5)).await?;
    check(&runs)?;
    Ok(())
}

/// The only 1.36 apiserver away for longer than the sidecar's old grace period (five poll
/// periods here) and back, ready at once: its GVRs answer 503 while it is away, never 404, and
/// it serves them again as soon as it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_drill_leave_and_return() -> Result<()> {
    let runs = quick(Variant::LeaveAndReturn, Duration::ZERO, Duration::from_secs(1)).await?;
    let skewgate = check(&runs)?;
    // Away for less than the hold, c's requests wait at the edge rather than get their 503.
    let held = runs.iter().find_map(|r| r.held.as_ref()).map_or(0, |h| h.total());
    ensure!(
        skewgate.count(Class::Unavailable) + held as usize > 0,
        "no 503 and nothing held while c was away: did it leave at all?"
    );
    Ok(())
}

/// b restarted ten times without a drain, alternating releases, ready the instant it listens
/// again (1 s after its old process stopped: a real kube-apiserver takes 0.9–2.2 s), production
/// poll: no request of the load goes wrong, and how long b was kept out and how long its
/// re-admission took are printed (measured, not asserted). skewgate only: the other tests
/// show what the plain LB does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_are_measured() -> Result<()> {
    let mut o = Options::new(true);
    o.work = o.work.with_file_name(format!("drill-test-{}", std::process::id()));
    o.variant = Variant::Restarts;
    o.restarts = 10;
    o.down = Duration::from_secs(1);
    o.ready_delay = Duration::ZERO;
    o.poll = Duration::from_secs(5);
    let run = drill::run(Mode::Skewgate, &o).await?;
    let _ = std::fs::remove_dir(&o.work);
    println!("{}\n{}", drill::settings(&o), drill::markdown_table(std::slice::from_ref(&run)));
    let stats = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (excluded_median, excluded_max) = stats(&run.exclusion_seconds);
    let (out_median, out_max) = stats(&run.out_seconds);
    let (in_median, in_max) = stats(&run.readmission_seconds);
    println!(
        "over {} restarts: stop → Envoy sends it no new request median {excluded_median:.3} s, max \
         {excluded_max:.3} s; kept out (stop → Envoy sends it requests again) median {out_median:.3} s, max \
         {out_max:.3} s; re-admission (serving again → Envoy sends it requests) median {in_median:.3} s, max \
         {in_max:.3} s",
        run.out_seconds.len()
    );
    ensure!(
        [&run.exclusion_seconds, &run.out_seconds, &run.readmission_seconds].iter().all(|v| v.len() == 10),
        "not every restart was measured: {:?} {:?} {:?}",
        run.exclusion_seconds,
        run.out_seconds,
        run.readmission_seconds
    );
    check_skewgate(&run)?;
    Ok(())
}
