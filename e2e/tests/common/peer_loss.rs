//! Scenario 5, peer loss: c, the only server of three GVRs, killed under load and started
//! again. Its GVRs answer 503 Status (never 404) while it is away and stay in the table; every
//! other request succeeds, but for those the kill raced.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use skewgate_harness::cluster::Cluster;
use skewgate_harness::load::{Record, Report};
use skewgate_harness::scenario::{Row, ids, kubectl, successes_after};

use super::{CLAIMS, Suite, answers_after};

/// What the load loop saw of c's outage.
pub struct Outage {
    pub report: Report,
    /// When c was killed and started again, on the load's clock.
    pub killed: Duration,
    /// When the kill was done: a stand-in's server task goes only once the runtime gets to it,
    /// and a busy machine can take a while; a request sent before then may still be answered.
    pub killed_by: Duration,
    pub restarted: Duration,
    /// How long Envoy's health checks took to see c down, and up again once it was ready.
    pub unhealthy_after: Duration,
    pub healthy_after: Duration,
    /// kubectl's error for c's resourceclaims during the outage.
    pub kubectl_error: String,
    /// The GVRs only c serves, those it does not, and those everybody serves.
    c_only: Vec<String>,
    others: Vec<String>,
    all_served: Vec<String>,
}

/// The outage's records, judged.
pub struct Outcomes<'a> {
    pub unexpected: Vec<&'a Record>,
    /// 503 Status answers for c's GVRs.
    pub outage_503: usize,
    /// The first of them, after the kill.
    pub first_503: Option<Duration>,
    /// When each of c's GVRs succeeded again, after the restart.
    pub recovered: BTreeMap<String, Duration>,
    /// Failures of the others' requests the kill raced.
    pub in_flight: usize,
}

impl Suite {
    /// Load on the ten GVRs (`warm_up` for 10 successes each), c killed, 30 answers each for
    /// its GVRs after Envoy saw it down, c started again: its GVRs succeed within `back_within`.
    pub async fn peer_loss(
        &self,
        c: &mut Cluster,
        row: &mut Row,
        warm_up: Duration,
        back_within: Duration,
    ) -> Result<Outage> {
        let by = self.ten_by_servers(&c.table_on_disk()?)?;
        let c_only = by[&ids(&["c"])].clone();
        let all_served = by[&ids(&["a", "b", "c"])].clone();
        let names = self.ten_names();
        let others: Vec<String> = names.iter().filter(|n| !c_only.contains(n)).cloned().collect();
        let load = self.load(c, 5, Duration::from_millis(20))?;
        successes_after(&load, &names, Duration::ZERO, 10, warm_up).await?;

        let killed = load.now();
        c.kill_apiserver("c").await?;
        let killed_by = load.now();
        println!("killing c took {:?}", killed_by - killed);
        let unhealthy_after = c.wait_envoy_sees("c", false, Duration::from_secs(10)).await?;
        // The outage goes on past the health checks' verdict: 30 more answers for each of c's
        // GVRs (about 1.5 s).
        let unhealthy = load.now();
        answers_after(&load, &c_only, unhealthy, 30, Duration::from_secs(20), |r| r.status.is_some()).await?;
        let kubectl_error = kubectl(c)?.fails(&["get", CLAIMS, "-A"]).await?;
        row.requests += 1;
        println!("kubectl during the outage: {}", kubectl_error.trim());

        let restarted = load.now();
        c.start_apiserver("c", self.new_profile).await?;
        successes_after(&load, &c_only, restarted, 20, back_within).await?;
        let healthy_after = c.wait_envoy_sees("c", true, Duration::from_secs(10)).await?;
        let report = load.finish().await;
        println!("{}", report.summary());
        Ok(Outage {
            report,
            killed,
            killed_by,
            restarted,
            unhealthy_after,
            healthy_after,
            kubectl_error,
            c_only,
            others,
            all_served,
        })
    }
}

impl Outage {
    /// c's GVRs: fine before the kill, 503 Status from the kill until c was back, then fine;
    /// everything else: every request succeeded. `raced(r, killed)`: a failure of a request
    /// under way when c was killed that the suite forgives (as in a 503 Status).
    pub fn outcomes(&self, raced: impl Fn(&Record, Duration) -> bool) -> Result<Outcomes<'_>> {
        let (report, killed, restarted) = (&self.report, self.killed, self.restarted);
        let mut out = Outcomes {
            unexpected: Vec::new(),
            outage_503: 0,
            first_503: None,
            recovered: BTreeMap::new(),
            in_flight: 0,
        };
        for name in &self.c_only {
            let records: Vec<&Record> = report.of(name).collect();
            let back = records
                .iter()
                .filter(|r| r.started > restarted && r.ok())
                .map(|r| r.started)
                .min()
                .context("never back")?;
            out.recovered.insert(name.clone(), back - restarted);
            for r in records {
                let expected = if r.ended() < killed || r.started >= back {
                    r.ok()
                } else if r.started < self.killed_by || r.in_flight_at(killed) || raced(r, killed) {
                    r.ok() || r.is_unavailable_status()
                } else {
                    r.is_unavailable_status()
                };
                if !expected {
                    out.unexpected.push(r);
                }
                if r.is_unavailable_status() {
                    out.outage_503 += 1;
                    let after = r.ended().saturating_sub(killed);
                    out.first_503 = Some(out.first_503.map_or(after, |f| f.min(after)));
                }
            }
        }
        for name in &self.others {
            for r in report.of(name).filter(|r| !r.ok()) {
                if self.all_served.contains(name) && raced(r, killed) {
                    out.in_flight += 1;
                } else {
                    out.unexpected.push(r);
                }
            }
        }
        Ok(out)
    }
}

impl Outcomes<'_> {
    /// Nothing unexpected, some 503s during the outage, never a 404.
    pub fn check(&self, row: &mut Row, report: &Report) -> Result<()> {
        row.tally(report, &self.unexpected, "outcomes")?;
        ensure!(self.outage_503 > 0, "no 503 during the outage");
        ensure!(report.records.iter().all(|r| r.status != Some(404)), "a 404");
        Ok(())
    }

    /// How long c's slowest GVR took to succeed again after the restart.
    pub fn back_after(&self) -> Duration {
        self.recovered.values().max().copied().unwrap_or_default()
    }
}
