//! The rolling-upgrade drill in --quick mode: the same code as `make drill`, asserting what
//! skewgate promises and that the plain-LB baseline really suffers from the skew.

use anyhow::{Result, ensure};
use skewgate_harness::drill::{self, Class, Mode, Options};

// Ignored for now: it finds a skewgate bug. At the first upgrade step (every GVR still on the
// pool), the sidecar pushes the new table only once the restarted apiserver is healthy (the new
// set clusters it is a member of have to warm up first), while the pool already sends it requests
// for GVRs it dropped: 2–5 wrong 404s per run (a variant of docs/known-issues.md #2 the 3 s startup
// does not cover). Run with `cargo test -p skewgate-harness --test drill -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_drill() -> Result<()> {
    let started = std::time::Instant::now();
    let mut o = Options::new(true);
    o.work = o.work.with_file_name(format!("drill-test-{}", std::process::id()));
    let runs = drill::drill(&o).await?;
    println!("{}\nquick drill took {:.1?}", drill::markdown_table(&runs), started.elapsed());
    let plain = runs.iter().find(|r| r.mode == Mode::PlainLb).expect("plain run");
    let skewgate = runs.iter().find(|r| r.mode == Mode::Skewgate).expect("skewgate run");

    ensure!(
        plain.count(Class::WrongNotFound) > 0,
        "the plain-LB run shows no wrong 404s: the drill does not exercise the skew"
    );
    for class in
        [Class::WrongNotFound, Class::LostWrite, Class::Connection, Class::Timeout, Class::OtherStatus]
    {
        ensure!(
            skewgate.count(class) == 0,
            "skewgate run: {} {}:{}",
            skewgate.count(class),
            class.label(),
            skewgate.failures(class, 10)
        );
    }
    ensure!(
        skewgate.unexpected_503 == 0,
        "skewgate run: {} 503s while some apiserver serving the GVR was up:{}",
        skewgate.unexpected_503,
        skewgate.failures(Class::Unavailable, 10)
    );
    ensure!(skewgate.count(Class::Success) > 0);
    Ok(())
}
