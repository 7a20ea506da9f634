//! Which apiservers Envoy may send new requests to.
//!
//! An apiserver is eligible only while the table Envoy runs describes what it serves now: it
//! answered its latest look, it is ready, and it still serves every group/version and
//! group/version/resource the live table sends it. One exception keeps a change that every
//! apiserver makes together (a CRD or an aggregated API removed) from taking them all out at
//! once: what no apiserver serves any more is not held against anyone, since a 404 for it is
//! the right answer from any of them. GVRs an apiserver serves beyond what the table sends it
//! (a new CRD, the next release's APIs) do not matter either: the table sends it none of them.
//!
//! Pure functions of what the sidecar remembers; `sync` turns the verdicts into the `DRAINING`
//! overlay of `cds.json`.

use std::collections::{BTreeMap, BTreeSet};

use skewgate_core::table::TableConfig;

use crate::fetch::Documents;
use crate::tether::Readiness;

/// Why an apiserver must not get new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    /// The live table was built without its discovery (it never answered, or not yet).
    Undescribed,
    /// Its latest probe or fetch did not reach its discovery: the connection refused or
    /// closed, or no answer in time twice in a row.
    Unreachable,
    /// Its `/readyz` failed at the latest probe.
    Unready,
    /// It no longer serves something the live table sends it, and another apiserver does.
    Changed,
    /// The cluster no longer publishes it (EndpointSlice or identity Lease gone): it leaves.
    Departed,
    /// Its `/readyz` fails its `shutdown` check alone (SIGTERM): it serves out its shutdown
    /// delay, and gets new requests only where no other apiserver takes them.
    Stopping,
}

impl Exclusion {
    /// The `reason` label of `skewgate_apiserver_exclusions_total`.
    pub fn label(self) -> &'static str {
        match self {
            Exclusion::Undescribed => "undescribed",
            Exclusion::Unreachable => "unreachable",
            Exclusion::Unready => "unready",
            Exclusion::Changed => "changed",
            Exclusion::Departed => "departed",
            Exclusion::Stopping => "stopping",
        }
    }
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Exclusion::Undescribed => "the live table does not describe it",
            Exclusion::Unreachable => "its discovery does not answer",
            Exclusion::Unready => "its /readyz fails",
            Exclusion::Changed => "it stopped serving APIs the live table sends it",
            Exclusion::Departed => "the cluster no longer publishes it",
            Exclusion::Stopping => "it is stopping (/readyz: shutdown); it keeps what nobody else serves",
        })
    }
}

/// Group/versions and group/version/resources, as routing sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub group_versions: BTreeSet<(String, String)>,
    pub resources: BTreeSet<(String, String, String)>,
}

impl Served {
    pub fn of(documents: &Documents) -> Self {
        let mut served = Served::default();
        for list in [&documents.core, &documents.apis] {
            for group in &list.items {
                for version in &group.versions {
                    served.group_versions.insert((group.name().to_owned(), version.version.clone()));
                    for resource in &version.resources {
                        served.resources.insert((
                            group.name().to_owned(),
                            version.version.clone(),
                            resource.resource.clone(),
                        ));
                    }
                }
            }
        }
        served
    }

    pub fn is_empty(&self) -> bool {
        self.group_versions.is_empty() && self.resources.is_empty()
    }
}

/// What the table Envoy runs sends each apiserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    pub table: TableConfig,
    /// Apiserver id → what the table routes to sets (or the pool) it is a member of.
    pub attributed: BTreeMap<String, Served>,
}

impl Live {
    pub fn of(table: TableConfig) -> Self {
        let mut attributed: BTreeMap<String, Served> =
            table.apiservers.iter().map(|a| (a.id.clone(), Served::default())).collect();
        // An extension's discovery may lag on one apiserver while every one serves it: it is
        // routed to the pool and held against nobody.
        for gv in table.group_versions.iter().filter(|gv| !gv.extension) {
            for id in &gv.served_by {
                if let Some(s) = attributed.get_mut(id) {
                    s.group_versions.insert((gv.group.clone(), gv.version.clone()));
                }
            }
            for (resource, ids) in &gv.resources {
                for id in ids {
                    if let Some(s) = attributed.get_mut(id) {
                        s.resources.insert((gv.group.clone(), gv.version.clone(), resource.clone()));
                    }
                }
            }
        }
        Self { table, attributed }
    }

    /// Whether the table was built with `id`'s discovery: every apiserver serves something
    /// (core/v1 at least), so one the table sends nothing was built without it.
    pub fn describes(&self, id: &str) -> bool {
        self.attributed.get(id).is_some_and(|s| !s.is_empty())
    }
}

/// What is known of one apiserver now.
#[derive(Debug, Clone, Copy)]
pub struct Now<'a> {
    pub id: &'a str,
    /// Its latest known discovery (the last good one while it fails).
    pub served: Option<&'a Served>,
    /// Its latest look reached its discovery.
    pub reachable: bool,
    /// `/readyz` at the latest probe; `None` before the first (Envoy's own checks still apply).
    pub ready: Option<Readiness>,
}

/// One verdict per apiserver, in `now`'s order: `None` = eligible.
pub fn verdicts(live: &Live, now: &[Now<'_>]) -> Vec<Option<Exclusion>> {
    let served_by_anyone = |except: &str, check: &dyn Fn(&Served) -> bool| {
        now.iter().any(|n| n.id != except && n.served.is_some_and(check))
    };
    now.iter()
        .map(|n| {
            if !live.describes(n.id) {
                return Some(Exclusion::Undescribed);
            }
            if !n.reachable {
                return Some(Exclusion::Unreachable);
            }
            if n.ready == Some(Readiness::Unready) {
                return Some(Exclusion::Unready);
            }
            let (Some(attributed), Some(served)) = (live.attributed.get(n.id), n.served) else {
                return Some(Exclusion::Undescribed);
            };
            let lost_gv = attributed
                .group_versions
                .difference(&served.group_versions)
                .any(|gv| served_by_anyone(n.id, &|s: &Served| s.group_versions.contains(gv)));
            let lost_gvr = attributed
                .resources
                .difference(&served.resources)
                .any(|gvr| served_by_anyone(n.id, &|s: &Served| s.resources.contains(gvr)));
            let stopping = n.ready == Some(Readiness::Stopping);
            match (lost_gv || lost_gvr, stopping) {
                (true, _) => Some(Exclusion::Changed),
                (false, true) => Some(Exclusion::Stopping),
                (false, false) => None,
            }
        })
        .collect()
}

/// [`verdicts`] against every table Envoy may be running (the live one, and those a push was
/// handed and no later push confirmed): eligible only where each of them allows it, and out of
/// every cluster, rather than only stopping, where any of them says so.
pub fn verdicts_against(tables: &[&Live], now: &[Now<'_>]) -> Vec<Option<Exclusion>> {
    let mut combined = vec![None; now.len()];
    for live in tables {
        for (verdict, this) in combined.iter_mut().zip(verdicts(live, now)) {
            if matches!(*verdict, None | Some(Exclusion::Stopping)) && this.is_some() {
                *verdict = this;
            }
        }
    }
    combined
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn served(gvrs: &[(&str, &str, &str)]) -> Served {
        Served {
            group_versions: gvrs.iter().map(|(g, v, _)| (g.to_string(), v.to_string())).collect(),
            resources: gvrs.iter().map(|(g, v, r)| (g.to_string(), v.to_string(), r.to_string())).collect(),
        }
    }

    const PODS: (&str, &str, &str) = ("", "v1", "pods");
    const OLD: (&str, &str, &str) = ("resource.k8s.io", "v1beta1", "resourceclaims");
    const NEW: (&str, &str, &str) = ("resource.k8s.io", "v1", "resourceclaims");
    const CRD: (&str, &str, &str) = ("example.com", "v1", "widgets");

    /// a and b serve pods and the old claims (and the CRD), c pods and the new claims; d never
    /// answered.
    fn live() -> Live {
        let apiservers = ["a", "b", "c", "d"].map(|id| json!({"id": id, "cluster": format!("ap-{id}")}));
        let table: TableConfig = serde_json::from_value(json!({
            "schema": 1,
            "apiservers": apiservers,
            "poolCluster": "pool",
            "groupVersions": [
                {"group": "", "version": "v1", "servedBy": ["a", "b", "c"], "resources": {"pods": ["a", "b", "c"]}},
                {"group": "resource.k8s.io", "version": "v1beta1", "servedBy": ["a", "b"], "resources": {"resourceclaims": ["a", "b"]}},
                {"group": "resource.k8s.io", "version": "v1", "servedBy": ["c"], "resources": {"resourceclaims": ["c"]}},
                {"group": "example.com", "version": "v1", "servedBy": ["a", "b", "c"], "resources": {"widgets": ["a", "b", "c"]}}
            ]
        }))
        .unwrap();
        Live::of(table)
    }

    fn now<'a>(id: &'a str, served: &'a Served) -> Now<'a> {
        Now { id, served: Some(served), reachable: true, ready: Some(Readiness::Ready) }
    }

    #[test]
    fn attribution_and_description() {
        let live = live();
        assert_eq!(live.attributed["a"], served(&[PODS, OLD, CRD]));
        assert_eq!(live.attributed["c"], served(&[PODS, NEW, CRD]));
        assert!(live.describes("a") && !live.describes("d") && !live.describes("zz"));
    }

    #[test]
    fn unchanged_apiservers_are_eligible_and_the_rest_say_why() {
        let live = live();
        let (old, new) = (served(&[PODS, OLD, CRD]), served(&[PODS, NEW, CRD]));
        let mut all = vec![now("a", &old), now("b", &old), now("c", &new), now("d", &new)];
        assert_eq!(verdicts(&live, &all), [None, None, None, Some(Exclusion::Undescribed)]);
        all[0].reachable = false;
        all[1].ready = Some(Readiness::Unready);
        all[2].ready = None;
        assert_eq!(
            verdicts(&live, &all),
            [Some(Exclusion::Unreachable), Some(Exclusion::Unready), None, Some(Exclusion::Undescribed)]
        );
        // Stopping: kept where nobody else serves; changed and stopping: changed.
        all[2].ready = Some(Readiness::Stopping);
        assert_eq!(verdicts(&live, &all)[2], Some(Exclusion::Stopping));
        let shrunk = served(&[PODS, CRD]);
        let stopping_changed = Now { ready: Some(Readiness::Stopping), ..now("c", &shrunk) };
        let others = [now("a", &old), now("b", &new), stopping_changed];
        assert_eq!(verdicts(&live, &others)[2], Some(Exclusion::Changed));
    }

    /// b restarted as the new release: it lost the old claims, which a still serves.
    #[test]
    fn losing_what_another_apiserver_serves_excludes() {
        let live = live();
        let (old, new) = (served(&[PODS, OLD, CRD]), served(&[PODS, NEW, CRD]));
        let all = [now("a", &old), now("b", &new), now("c", &new)];
        assert_eq!(verdicts(&live, &all), [None, Some(Exclusion::Changed), None]);
        // Once the table is built from b's new discovery, b is eligible again.
        let mut table = live.table.clone();
        table.group_versions[1].served_by = vec!["a".into()];
        table.group_versions[1].resources.insert("resourceclaims".into(), vec!["a".into()]);
        table.group_versions[2].served_by = vec!["b".into(), "c".into()];
        table.group_versions[2].resources.insert("resourceclaims".into(), vec!["b".into(), "c".into()]);
        assert_eq!(verdicts(&Live::of(table), &all), [None, None, None]);
    }

    /// A group/version dropped whole counts as well (legacy `/apis/<g>/<v>` is routed by it).
    #[test]
    fn losing_a_group_version_excludes() {
        let live = live();
        let old = served(&[PODS, OLD, CRD]);
        let mut partial = old.clone();
        partial.group_versions.remove(&("resource.k8s.io".to_string(), "v1beta1".to_string()));
        let new = served(&[PODS, NEW, CRD]);
        let all = [now("a", &old), now("b", &partial), now("c", &new)];
        assert_eq!(verdicts(&live, &all), [None, Some(Exclusion::Changed), None]);
    }

    /// A CRD deleted everywhere, or added everywhere: nobody is excluded for it.
    #[test]
    fn changes_every_apiserver_makes_exclude_nobody() {
        let live = live();
        let (old, new) = (served(&[PODS, OLD]), served(&[PODS, NEW]));
        assert_eq!(verdicts(&live, &[now("a", &old), now("b", &old), now("c", &new)]), [None, None, None]);
        let more = served(&[PODS, OLD, CRD, ("example.com", "v2", "widgets")]);
        assert_eq!(
            verdicts(&live, &[now("a", &more), now("b", &more), now("c", &served(&[PODS, NEW, CRD]))]),
            [None, None, None]
        );
        // Half way through the deletion, those that have already dropped it wait for the last.
        let crd = served(&[PODS, OLD, CRD]);
        assert_eq!(
            verdicts(&live, &[now("a", &old), now("b", &crd), now("c", &served(&[PODS, NEW]))]),
            [Some(Exclusion::Changed), None, Some(Exclusion::Changed)]
        );
    }

    /// b lags a CRD's discovery: the table sends the CRD to everyone, and nobody is excluded.
    #[test]
    fn a_lagging_extension_excludes_nobody() {
        let mut table = live().table;
        table.group_versions[3].extension = true;
        let live = Live::of(table);
        assert_eq!(live.attributed["a"], served(&[PODS, OLD]));
        let (old, new) = (served(&[PODS, OLD, CRD]), served(&[PODS, NEW, CRD]));
        let lagging = served(&[PODS, OLD]);
        assert_eq!(
            verdicts(&live, &[now("a", &old), now("b", &lagging), now("c", &new)]),
            [None, None, None]
        );
    }

    /// While a push of the table built from b's new discovery is under way (or failed after
    /// writing), Envoy may run either table: b is judged against both. Back as the old release
    /// meanwhile, it fits the live table but not the new one, which Envoy may already route by.
    #[test]
    fn every_table_envoy_may_run_is_judged() {
        let live = live();
        let (old, new) = (served(&[PODS, OLD, CRD]), served(&[PODS, NEW, CRD]));
        let mut table = live.table.clone();
        table.group_versions[1].served_by = vec!["a".into()];
        table.group_versions[1].resources.insert("resourceclaims".into(), vec!["a".into()]);
        table.group_versions[2].served_by = vec!["b".into(), "c".into()];
        table.group_versions[2].resources.insert("resourceclaims".into(), vec!["b".into(), "c".into()]);
        let pushed = Live::of(table);
        let back_as_old = [now("a", &old), now("b", &old), now("c", &new)];
        assert_eq!(verdicts(&live, &back_as_old), [None, None, None]);
        assert_eq!(verdicts_against(&[&live, &pushed], &back_as_old), [None, Some(Exclusion::Changed), None]);
        let as_new = [now("a", &old), now("b", &new), now("c", &new)];
        assert_eq!(verdicts_against(&[&live, &pushed], &as_new), [None, Some(Exclusion::Changed), None]);
        assert_eq!(verdicts_against(&[&pushed], &as_new), [None, None, None]);
        // Stopping by one table and changed by another: out of every cluster.
        let stopping_old = Now { ready: Some(Readiness::Stopping), ..now("b", &old) };
        assert_eq!(
            verdicts_against(&[&live, &pushed], &[now("a", &old), stopping_old, now("c", &new)])[1],
            Some(Exclusion::Changed)
        );
        assert_eq!(
            verdicts_against(&[&live], &[now("a", &old), stopping_old, now("c", &new)])[1],
            Some(Exclusion::Stopping)
        );
    }

    /// The last good discovery of an unreachable apiserver still counts as served: b, which lost
    /// the old claims, stays out while a (which may still serve them) is away.
    #[test]
    fn an_unreachable_apiserver_still_serves_its_last_discovery() {
        let live = live();
        let (old, new) = (served(&[PODS, OLD, CRD]), served(&[PODS, NEW, CRD]));
        let mut a = now("a", &old);
        a.reachable = false;
        assert_eq!(
            verdicts(&live, &[a, now("b", &new), now("c", &new)]),
            [Some(Exclusion::Unreachable), Some(Exclusion::Changed), None]
        );
    }
}
