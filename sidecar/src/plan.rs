//! `skewgate plan`: a rolling upgrade's preflight. From who serves what now (a table, or the
//! apiservers' discovery) and what the target release serves (its discovery), every state the
//! control plane passes through when its apiservers are upgraded one at a time — each one
//! restarting, then upgraded — and in each, the APIs served by some apiservers but not all (a
//! plain load balancer answers 404 for part of their requests), by one only (skewgate holds their
//! requests while it restarts) and by none after they were served (requests fail, stored objects
//! cannot be read). No I/O: `main` gathers the inputs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{Value, json};
use skewgate_core::discovery::ApiGroupDiscoveryList;

use crate::skew::{Matrix, group_version};

/// The GVRs a discovery document lists, named as `skewgate table` names them (`v1/pods`,
/// `apps/v1/deployments`).
pub fn gvrs_of(documents: &[&ApiGroupDiscoveryList]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for doc in documents {
        for group in &doc.items {
            for version in &group.versions {
                for resource in &version.resources {
                    let gv = group_version(&group.metadata.name, &version.version);
                    out.insert(format!("{gv}/{}", resource.resource));
                }
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Now,
    Restarting,
    Upgraded,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Now => "now",
            Phase::Restarting => "restarting",
            Phase::Upgraded => "upgraded",
        }
    }
}

/// One state of the control plane during the upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// 0 before the first apiserver is touched; k while and after the k-th is upgraded.
    pub step: usize,
    pub phase: Phase,
    /// The apiserver of this step (none at step 0).
    pub apiserver: Option<String>,
    /// The apiservers that answer.
    pub up: Vec<String>,
    /// Served by some of `up`, not all: GVR → who serves it.
    pub some_not_all: BTreeMap<String, Vec<String>>,
    /// Served by exactly one of `up`: GVR → that one.
    pub one_only: BTreeMap<String, String>,
    /// Served by none of `up`, though served in an earlier state.
    pub none: BTreeSet<String>,
}

impl State {
    pub fn label(&self) -> String {
        match &self.apiserver {
            Some(id) => format!("{} {id} {}", self.step, self.phase.label()),
            None => format!("{} {}", self.step, self.phase.label()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// (id, version now) in upgrade order.
    pub apiservers: Vec<(String, String)>,
    /// (id, version) of the apiservers left as they are.
    pub staying: Vec<(String, String)>,
    pub states: Vec<State>,
    /// Served now by some apiserver, not by the target release.
    pub removed: BTreeSet<String>,
    /// Served by the target release, by no apiserver now.
    pub added: BTreeSet<String>,
    /// For each removed GVR, the versions of the same group and resource the target serves:
    /// the objects stay readable there (one storage), only clients of the removed version break.
    pub also_served_as: BTreeMap<String, Vec<String>>,
}

impl Plan {
    /// Whether every API served at some state stays served by some apiserver in every later
    /// one: what a pipeline gates on.
    pub fn keeps_everything_served(&self) -> bool {
        self.states.iter().all(|s| s.none.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("--order names {0:?}, which is not one of the apiservers ({1})")]
    Unknown(String, String),
    #[error("--order names {0:?} twice")]
    Twice(String),
}

/// The plan for upgrading `now`'s apiservers named in `order`, in that order (default: all of
/// them, in the table's), each to a server of `target`'s GVRs. The others stay as they are (one
/// already at the target release, say).
pub fn plan(now: &Matrix, target: &BTreeSet<String>, order: &[String]) -> Result<Plan, PlanError> {
    let ids: Vec<&str> = now.apiservers.iter().map(|(id, _)| id.as_str()).collect();
    let order: Vec<usize> = if order.is_empty() {
        (0..ids.len()).collect()
    } else {
        let mut seen = Vec::new();
        for id in order {
            let i = ids
                .iter()
                .position(|x| x == id)
                .ok_or_else(|| PlanError::Unknown(id.clone(), ids.join(", ")))?;
            if seen.contains(&i) {
                return Err(PlanError::Twice(id.clone()));
            }
            seen.push(i);
        }
        seen
    };
    // Top-level resources only: a subresource goes wherever its resource goes.
    let served_now: BTreeMap<String, Vec<bool>> =
        now.rows.iter().filter(|r| !r.resource.contains('/')).map(|r| (r.name(), r.served.clone())).collect();
    let universe: BTreeSet<&String> = served_now.keys().chain(target).collect();
    let any_now: BTreeSet<String> =
        served_now.iter().filter(|(_, s)| s.iter().any(|x| *x)).map(|(g, _)| g.clone()).collect();
    // What server i serves in a state: its old GVRs until upgraded, the target's after.
    let serves = |i: usize, upgraded: &[bool], gvr: &String| -> bool {
        if upgraded[i] { target.contains(gvr) } else { served_now.get(gvr).is_some_and(|s| s[i]) }
    };
    let mut upgraded = vec![false; ids.len()];
    let mut states = Vec::new();
    let mut ever_served: BTreeSet<String> = BTreeSet::new();
    let mut state_of = |step: usize, phase: Phase, down: Option<usize>, upgraded: &[bool]| -> State {
        let up: Vec<usize> = (0..ids.len()).filter(|i| Some(*i) != down).collect();
        let mut state = State {
            step,
            phase,
            apiserver: (step > 0).then(|| ids[order[step - 1]].to_owned()),
            up: up.iter().map(|i| ids[*i].to_owned()).collect(),
            some_not_all: BTreeMap::new(),
            one_only: BTreeMap::new(),
            none: BTreeSet::new(),
        };
        for gvr in &universe {
            let by: Vec<String> =
                up.iter().filter(|i| serves(**i, upgraded, gvr)).map(|i| ids[*i].to_owned()).collect();
            if by.is_empty() {
                if ever_served.contains(*gvr) {
                    state.none.insert((*gvr).clone());
                }
                continue;
            }
            ever_served.insert((*gvr).clone());
            if by.len() == 1 {
                state.one_only.insert((*gvr).clone(), by[0].clone());
            }
            if by.len() < up.len() {
                state.some_not_all.insert((*gvr).clone(), by);
            }
        }
        state
    };
    states.push(state_of(0, Phase::Now, None, &upgraded));
    for (k, i) in order.iter().enumerate() {
        states.push(state_of(k + 1, Phase::Restarting, Some(*i), &upgraded));
        upgraded[*i] = true;
        states.push(state_of(k + 1, Phase::Upgraded, None, &upgraded));
    }
    let removed: BTreeSet<String> = any_now.iter().filter(|g| !target.contains(*g)).cloned().collect();
    let also_served_as = removed
        .iter()
        .filter_map(|gvr| {
            let (group, _, resource) = split(gvr);
            let versions: Vec<String> = target
                .iter()
                .filter(|t| {
                    let (g, _, r) = split(t);
                    g == group && r == resource
                })
                .map(|t| {
                    let (g, v, _) = split(t);
                    group_version(g, v)
                })
                .collect();
            (!versions.is_empty()).then(|| (gvr.clone(), versions))
        })
        .collect();
    Ok(Plan {
        apiservers: order.iter().map(|i| now.apiservers[*i].clone()).collect(),
        staying: (0..ids.len()).filter(|i| !order.contains(i)).map(|i| now.apiservers[i].clone()).collect(),
        states,
        added: target.iter().filter(|g| !any_now.contains(*g)).cloned().collect(),
        removed,
        also_served_as,
    })
}

/// (group, version, resource) of a GVR's name.
fn split(gvr: &str) -> (&str, &str, &str) {
    let mut parts = gvr.rsplitn(3, '/');
    let resource = parts.next().unwrap_or_default();
    let version = parts.next().unwrap_or_default();
    (parts.next().unwrap_or_default(), version, resource)
}

/// Per GVR, the states it is in for one category, as labels.
fn by_gvr<'a>(
    plan: &'a Plan,
    pick: impl Fn(&'a State) -> Vec<(&'a String, String)>,
) -> BTreeMap<&'a String, Vec<String>> {
    let mut out: BTreeMap<&String, Vec<String>> = BTreeMap::new();
    for state in &plan.states {
        for (gvr, note) in pick(state) {
            out.entry(gvr).or_default().push(note);
        }
    }
    out
}

fn with_version(id: &str, version: &str) -> String {
    if version.is_empty() { id.to_owned() } else { format!("{id} ({version})") }
}

pub fn render_text(plan: &Plan) -> String {
    let mut out = String::new();
    let servers: Vec<String> = plan.apiservers.iter().map(|(id, v)| with_version(id, v)).collect();
    let _ = writeln!(
        out,
        "Upgrading {} apiservers one at a time, in this order: {}",
        servers.len(),
        servers.join(", ")
    );
    if !plan.staying.is_empty() {
        let staying: Vec<String> = plan.staying.iter().map(|(id, v)| with_version(id, v)).collect();
        let _ = writeln!(out, "Left as they are: {}", staying.join(", "));
    }
    let _ = writeln!(
        out,
        "The target release adds {} GVRs and removes {}.\n",
        plan.added.len(),
        plan.removed.len()
    );
    let width = plan.states.iter().map(|s| s.label().len()).max().unwrap_or(0).max(5);
    let _ =
        writeln!(out, "  {:width$}  {:>13}  {:>8}  {:>4}  up", "state", "some, not all", "one only", "none");
    for s in &plan.states {
        let _ = writeln!(
            out,
            "  {:width$}  {:>13}  {:>8}  {:>4}  {}",
            s.label(),
            s.some_not_all.len(),
            s.one_only.len(),
            s.none.len(),
            s.up.join(" ")
        );
    }
    let sections: [(&str, BTreeMap<&String, Vec<String>>); 3] = [
        (
            "Served by none, after being served (requests fail; objects stored in them cannot be read)",
            by_gvr(plan, |s| s.none.iter().map(|g| (g, s.label())).collect()),
        ),
        (
            "Served by one apiserver only (while it restarts, skewgate holds their requests and a plain load balancer fails them)",
            by_gvr(plan, |s| s.one_only.iter().map(|(g, by)| (g, format!("{}: {by}", s.label()))).collect()),
        ),
        (
            "Served by some apiservers, not all (a plain load balancer answers 404 for part of their requests; skewgate routes them)",
            by_gvr(plan, |s| s.some_not_all.keys().map(|g| (g, s.label())).collect()),
        ),
    ];
    for (title, rows) in sections {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{title}:");
        let width = rows.keys().map(|g| g.len()).max().unwrap_or(0);
        for (gvr, states) in rows {
            let mark = if let Some(versions) = plan.also_served_as.get(gvr) {
                format!("  [removed by the target; its objects stay readable as {}]", versions.join(", "))
            } else if plan.removed.contains(gvr) {
                "  [removed by the target]".to_owned()
            } else if plan.added.contains(gvr) {
                "  [new in the target]".to_owned()
            } else {
                String::new()
            };
            let _ = writeln!(out, "  {gvr:width$}  {}{mark}", states.join(", "));
        }
    }
    let _ = writeln!(
        out,
        "\n{}",
        if plan.keeps_everything_served() {
            "Every API served at any point stays served by some apiserver throughout."
        } else {
            "Some APIs are served by no apiserver at some point (above): exit status 1."
        }
    );
    out
}

pub fn render_json(plan: &Plan) -> Value {
    json!({
        "apiservers": plan.apiservers.iter().map(|(id, v)| json!({"id": id, "version": v})).collect::<Vec<_>>(),
        "staying": plan.staying.iter().map(|(id, v)| json!({"id": id, "version": v})).collect::<Vec<_>>(),
        "added": plan.added,
        "removed": plan.removed,
        "alsoServedAs": plan.also_served_as,
        "keepsEverythingServed": plan.keeps_everything_served(),
        "states": plan.states.iter().map(|s| json!({
            "step": s.step,
            "phase": s.phase.label(),
            "apiserver": s.apiserver,
            "up": s.up,
            "someNotAll": s.some_not_all,
            "oneOnly": s.one_only,
            "none": s.none,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skew::Row;

    fn row(name: &str, served: &[bool]) -> Row {
        let parts: Vec<&str> = name.split('/').collect();
        let (group, version, resource) = match parts.as_slice() {
            [v, r] => ("", *v, *r),
            [g, v, r] => (*g, *v, *r),
            _ => panic!("{name}"),
        };
        Row {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            served: served.to_vec(),
        }
    }

    fn at<'a>(p: &'a Plan, label: &str) -> &'a State {
        p.states.iter().find(|s| s.label() == label).unwrap_or_else(|| panic!("no state {label}"))
    }

    /// Three 1.33-era apiservers; the target drops `old/v1/gone` and adds `new/v1/fresh`.
    fn three() -> (Matrix, BTreeSet<String>) {
        let matrix = Matrix {
            apiservers: ["a", "b", "c"].iter().map(|id| (id.to_string(), "v1.33.0".into())).collect(),
            rows: vec![
                row("v1/pods", &[true, true, true]),
                Row {
                    group: String::new(),
                    version: "v1".into(),
                    resource: "pods/status".into(),
                    served: vec![true, false, true],
                },
                row("old/v1/gone", &[true, true, true]),
            ],
            lacking: Vec::new(),
            sources: Vec::new(),
        };
        let target = ["v1/pods", "new/v1/fresh"].iter().map(|s| s.to_string()).collect();
        (matrix, target)
    }

    #[test]
    fn each_state_of_a_rolling_upgrade() {
        let (matrix, target) = three();
        let p = plan(&matrix, &target, &[]).unwrap();
        let labels: Vec<String> = p.states.iter().map(State::label).collect();
        assert_eq!(
            labels,
            [
                "0 now",
                "1 a restarting",
                "1 a upgraded",
                "2 b restarting",
                "2 b upgraded",
                "3 c restarting",
                "3 c upgraded"
            ]
        );
        assert_eq!(p.removed, BTreeSet::from(["old/v1/gone".to_string()]));
        assert_eq!(p.added, BTreeSet::from(["new/v1/fresh".to_string()]));
        let s = |label: &str| at(&p, label);
        assert!(s("0 now").some_not_all.is_empty() && s("0 now").none.is_empty());
        // a upgraded: the new API on a only, the dropped one on b and c.
        assert_eq!(s("1 a upgraded").one_only.get("new/v1/fresh").map(String::as_str), Some("a"));
        assert_eq!(s("1 a upgraded").some_not_all["old/v1/gone"], ["b", "c"]);
        // c restarting: the last server of the dropped API is down, and it never comes back.
        assert_eq!(s("3 c restarting").none, BTreeSet::from(["old/v1/gone".to_string()]));
        assert_eq!(s("3 c upgraded").none, BTreeSet::from(["old/v1/gone".to_string()]));
        // A new API that is not served yet is not "none": it never was.
        assert!(!s("1 a restarting").none.contains("new/v1/fresh"));
        // Subresources follow their resource.
        assert!(p.states.iter().all(|s| !s.some_not_all.contains_key("v1/pods/status")));
        assert!(!p.keeps_everything_served());
        let text = render_text(&p);
        assert!(text.contains("old/v1/gone") && text.contains("[removed by the target]"), "{text}");
        assert!(text.contains("exit status 1"), "{text}");
        let json = render_json(&p);
        assert_eq!(json["states"][2]["oneOnly"]["new/v1/fresh"], "a");
        assert_eq!(json["keepsEverythingServed"], false);
    }

    #[test]
    fn an_upgrade_that_only_adds_keeps_everything_served() {
        let (mut matrix, mut target) = three();
        matrix.rows.retain(|r| r.resource != "gone");
        target.insert("v1/pods".into());
        let p = plan(&matrix, &target, &["c".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(p.apiservers.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["c", "a", "b"]);
        assert!(p.keeps_everything_served(), "{}", render_text(&p));
        // The new API's only server is c until a is upgraded; while a restarts, still c.
        let s = |label: &str| at(&p, label);
        assert_eq!(s("2 a restarting").one_only.get("new/v1/fresh").map(String::as_str), Some("c"));
        assert_eq!(s("2 a upgraded").some_not_all["new/v1/fresh"], ["a", "c"]);
        assert!(s("3 b upgraded").some_not_all.is_empty());
    }

    #[test]
    fn an_apiserver_alone_in_serving_an_api_leaves_it_unserved_while_it_restarts() {
        let (mut matrix, mut target) = three();
        // Mid-upgrade already: only c serves `new/v1/fresh`.
        matrix.rows.push(row("new/v1/fresh", &[false, false, true]));
        target.insert("old/v1/gone".into());
        let p = plan(&matrix, &target, &["c".into(), "a".into(), "b".into()]).unwrap();
        let s = |label: &str| at(&p, label);
        assert_eq!(s("0 now").one_only["new/v1/fresh"], "c");
        assert_eq!(s("1 c restarting").none, BTreeSet::from(["new/v1/fresh".to_string()]));
        assert!(s("1 c upgraded").none.is_empty());
    }

    #[test]
    fn a_removed_version_of_a_resource_the_target_keeps() {
        let (mut matrix, mut target) = three();
        matrix.rows.push(row("old/v1beta1/things", &[true, true, true]));
        target.insert("old/v1/things".into());
        let p = plan(&matrix, &target, &[]).unwrap();
        assert_eq!(p.also_served_as["old/v1beta1/things"], ["old/v1"]);
        assert!(!p.also_served_as.contains_key("old/v1/gone"));
        assert_eq!(split("v1/pods"), ("", "v1", "pods"));
        assert!(render_text(&p).contains("its objects stay readable as old/v1"));
    }

    #[test]
    fn an_order_names_each_apiserver_to_upgrade_once() {
        let (matrix, target) = three();
        assert_eq!(
            plan(&matrix, &target, &["x".into()]),
            Err(PlanError::Unknown("x".into(), "a, b, c".into()))
        );
        assert_eq!(plan(&matrix, &target, &["a".into(), "a".into()]), Err(PlanError::Twice("a".into())));
        // Named ones only: c stays as it is, and up throughout.
        let p = plan(&matrix, &target, &["b".into(), "a".into()]).unwrap();
        assert_eq!(p.staying, [("c".to_string(), "v1.33.0".to_string())]);
        assert_eq!(p.states.len(), 5);
        assert!(p.states.iter().all(|s| s.up.contains(&"c".to_string())));
        assert_eq!(p.states[4].some_not_all["old/v1/gone"], ["c"]);
    }

    #[test]
    fn discovery_documents_name_gvrs_as_tables_do() {
        let doc: ApiGroupDiscoveryList = serde_json::from_value(json!({
            "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
            "items": [
                {"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [{"resource": "pods", "scope": "Namespaced"}]}]},
                {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [{"resource": "deployments", "scope": "Namespaced"}]}]}
            ]
        }))
        .unwrap();
        assert_eq!(
            gvrs_of(&[&doc]),
            BTreeSet::from(["v1/pods".to_string(), "apps/v1/deployments".to_string()])
        );
    }
}
