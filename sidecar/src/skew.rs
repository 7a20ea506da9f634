//! `skewgate table`'s view: the skew at a glance. A matrix of GVR × apiserver (versions in the
//! header), the GVRs that need rerouting first and highlighted, and a one-line summary.

use std::fmt::Write as _;

use serde_json::{Value, json};
use skewgate_core::table::{RoutingTable, Serving};

/// One GVR and who serves it, in apiserver order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub served: Vec<bool>,
}

impl Row {
    pub fn rerouted(&self) -> bool {
        !self.served.iter().all(|s| *s)
    }

    /// `apiVersion` notation: `v1/pods`, `apps/v1/deployments`.
    pub fn name(&self) -> String {
        format!("{}/{}", group_version(&self.group, &self.version), self.resource)
    }
}

/// A group/version that some apiservers do not list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lacking {
    pub group_version: String,
    /// The apiservers without it.
    pub apiservers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    /// (id, version) in table order.
    pub apiservers: Vec<(String, String)>,
    /// Rerouted rows first, then by name.
    pub rows: Vec<Row>,
    /// Most-lacking first.
    pub lacking: Vec<Lacking>,
    /// Where each apiserver came from (config, EndpointSlice, Lease), in `apiservers`' order;
    /// empty when unknown (a table read from a file).
    pub sources: Vec<String>,
}

/// `apiVersion` notation of a group/version: `v1`, `apps/v1`.
pub(crate) fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") }
}

pub fn matrix(table: &RoutingTable) -> Matrix {
    let apiservers: Vec<(String, String)> =
        table.apiservers().iter().map(|a| (a.id.clone(), a.version.clone())).collect();
    let served_by = |serving: Serving| -> Vec<bool> {
        let members: Vec<&str> = table.members(serving).collect();
        apiservers.iter().map(|(id, _)| members.contains(&id.as_str())).collect()
    };
    let mut rows: Vec<Row> = table
        .gvrs()
        .iter()
        .map(|g| Row {
            group: g.group.clone(),
            version: g.version.clone(),
            resource: g.resource.clone(),
            served: served_by(g.serving),
        })
        .collect();
    rows.sort_by(|a, b| {
        (!a.rerouted(), &a.group, &a.version, &a.resource).cmp(&(
            !b.rerouted(),
            &b.group,
            &b.version,
            &b.resource,
        ))
    });
    let mut gvs: Vec<(&str, &str)> = rows.iter().map(|r| (r.group.as_str(), r.version.as_str())).collect();
    gvs.sort_unstable();
    gvs.dedup();
    let mut lacking: Vec<Lacking> = gvs
        .into_iter()
        .filter_map(|(g, v)| {
            let served = served_by(table.group_version(g, v)?);
            let missing: Vec<String> =
                apiservers.iter().zip(&served).filter(|(_, s)| !**s).map(|((id, _), _)| id.clone()).collect();
            (!missing.is_empty()).then(|| Lacking { group_version: group_version(g, v), apiservers: missing })
        })
        .collect();
    // The widest gaps first; among equals, the group/version with the most GVRs.
    let size = |gv: &str| rows.iter().filter(|r| group_version(&r.group, &r.version) == gv).count();
    lacking.sort_by_cached_key(|l| {
        (
            std::cmp::Reverse(l.apiservers.len()),
            std::cmp::Reverse(size(&l.group_version)),
            l.group_version.clone(),
        )
    });
    Matrix { apiservers, rows, lacking, sources: Vec::new() }
}

/// "7 GVRs need rerouting, 2 apiservers lack resource.k8s.io/v1".
pub fn summary(m: &Matrix) -> String {
    let rerouted = m.rows.iter().filter(|r| r.rerouted()).count();
    if rerouted == 0 {
        return format!(
            "no skew: all {} GVRs are served by all {} apiservers",
            m.rows.len(),
            m.apiservers.len()
        );
    }
    let mut line =
        format!("{rerouted} GVR{} need{} rerouting", plural(rerouted), if rerouted == 1 { "s" } else { "" });
    for l in m.lacking.iter().take(2) {
        let n = l.apiservers.len();
        let _ = write!(
            line,
            ", {n} apiserver{} lack{} {}",
            plural(n),
            if n == 1 { "s" } else { "" },
            l.group_version
        );
    }
    if m.lacking.len() > 2 {
        let more = m.lacking.len() - 2;
        let _ = write!(line, " (and {more} more group/version{})", plural(more));
    }
    line
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

const SERVED: &str = "✓";
const NOT_SERVED: &str = "-";
const MARK: &str = "!";
const HIGHLIGHT: &str = "\x1b[1;33m";
const RESET: &str = "\x1b[0m";

/// The matrix as a table for a terminal; `color` highlights rerouted rows with ANSI codes
/// (they are marked with `!` either way).
pub fn render_text(m: &Matrix, color: bool) -> String {
    let names: Vec<String> = m.rows.iter().map(Row::name).collect();
    let first =
        names.iter().map(|n| n.chars().count()).chain(["GROUP/VERSION/RESOURCE".len()]).max().unwrap_or(0);
    let source_width = |i: usize| m.sources.get(i).map_or(0, |s| s.chars().count());
    let widths: Vec<usize> = m
        .apiservers
        .iter()
        .enumerate()
        .map(|(i, (id, v))| id.chars().count().max(v.chars().count()).max(source_width(i)).max(1))
        .collect();
    let mut out = String::new();
    let header = |cells: Vec<&str>, label: &str| {
        let mut line = format!("  {label:<first$}");
        for (cell, w) in cells.iter().zip(&widths) {
            let _ = write!(line, "  {cell:<w$}");
        }
        line.trim_end().to_owned()
    };
    out.push_str(&header(m.apiservers.iter().map(|(id, _)| id.as_str()).collect(), "GROUP/VERSION/RESOURCE"));
    out.push('\n');
    if m.apiservers.iter().any(|(_, v)| !v.is_empty()) {
        out.push_str(&header(m.apiservers.iter().map(|(_, v)| v.as_str()).collect(), ""));
        out.push('\n');
    }
    if m.sources.len() == m.apiservers.len() && !m.sources.is_empty() {
        out.push_str(&header(m.sources.iter().map(String::as_str).collect(), "(from)"));
        out.push('\n');
    }
    for (row, name) in m.rows.iter().zip(&names) {
        let rerouted = row.rerouted();
        let mut line = format!("{} {name:<first$}", if rerouted { MARK } else { " " });
        for (served, w) in row.served.iter().zip(&widths) {
            let _ = write!(line, "  {:<w$}", if *served { SERVED } else { NOT_SERVED });
        }
        let line = line.trim_end();
        if rerouted && color {
            let _ = writeln!(out, "{HIGHLIGHT}{line}{RESET}");
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out.push('\n');
    out.push_str(&summary(m));
    out.push('\n');
    out
}

pub fn render_json(m: &Matrix) -> Value {
    let rerouted = m.rows.iter().filter(|r| r.rerouted()).count();
    json!({
        "apiservers": m.apiservers.iter().enumerate().map(|(i, (id, v))| match m.sources.get(i) {
            Some(source) => json!({"id": id, "version": v, "source": source}),
            None => json!({"id": id, "version": v}),
        }).collect::<Vec<_>>(),
        "gvrs": m.rows.iter().map(|r| json!({
            "group": r.group,
            "version": r.version,
            "resource": r.resource,
            "servedBy": m.apiservers.iter().zip(&r.served).filter(|(_, s)| **s).map(|((id, _), _)| id).collect::<Vec<_>>(),
            "rerouted": r.rerouted(),
        })).collect::<Vec<_>>(),
        "total": m.rows.len(),
        "rerouted": rerouted,
        "lacking": m.lacking.iter().map(|l| json!({"groupVersion": l.group_version, "apiservers": l.apiservers})).collect::<Vec<_>>(),
        "summary": summary(m),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skewgate_core::table::TableConfig;

    fn table() -> RoutingTable {
        let mut t: TableConfig = serde_json::from_value(json!({
            "schema": 1,
            "apiservers": skewgate_core::testing::apiservers("v1.33.0", "v1.36.0", "ap-"),
            "poolCluster": "pool",
            "groupVersions": [
                {"group": "", "version": "v1", "servedBy": ["a", "b", "c"], "resources": {"pods": ["a", "b", "c"]}},
                {"group": "resource.k8s.io", "version": "v1", "servedBy": ["c"], "resources": {"resourceclaims": ["c"], "deviceclasses": ["c"]}},
                {"group": "resource.k8s.io", "version": "v1alpha3", "servedBy": ["a", "b"], "resources": {"deviceclasses": ["a", "b"]}},
                {"group": "apps", "version": "v1", "servedBy": ["a", "b", "c"], "resources": {"deployments": ["a", "b", "c"]}}
            ]
        }))
        .unwrap();
        t.assign_sets(|m| format!("set-{}", m.join("-")));
        RoutingTable::compile(t).unwrap()
    }

    #[test]
    fn rerouted_rows_first_and_summary() {
        let m = matrix(&table());
        let names: Vec<String> = m.rows.iter().map(Row::name).collect();
        assert_eq!(
            names,
            [
                "resource.k8s.io/v1/deviceclasses",
                "resource.k8s.io/v1/resourceclaims",
                "resource.k8s.io/v1alpha3/deviceclasses",
                "v1/pods",
                "apps/v1/deployments"
            ]
        );
        assert_eq!(m.rows[0].served, [false, false, true]);
        assert_eq!(
            summary(&m),
            "3 GVRs need rerouting, 2 apiservers lack resource.k8s.io/v1, 1 apiserver lacks resource.k8s.io/v1alpha3"
        );
    }

    #[test]
    fn text_matrix() {
        let text = render_text(&matrix(&table()), false);
        let expected = "  GROUP/VERSION/RESOURCE                  a        b        c
                                          v1.33.0  v1.33.0  v1.36.0
! resource.k8s.io/v1/deviceclasses        -        -        ✓
! resource.k8s.io/v1/resourceclaims       -        -        ✓
! resource.k8s.io/v1alpha3/deviceclasses  ✓        ✓        -
  v1/pods                                 ✓        ✓        ✓
  apps/v1/deployments                     ✓        ✓        ✓

3 GVRs need rerouting, 2 apiservers lack resource.k8s.io/v1, 1 apiserver lacks resource.k8s.io/v1alpha3
";
        assert_eq!(text, expected, "\n{text}");
        let colored = render_text(&matrix(&table()), true);
        assert_eq!(colored.matches(HIGHLIGHT).count(), 3);
        assert!(colored.lines().nth(5).is_some_and(|l| !l.contains('\x1b')));
    }

    #[test]
    fn sources_show_under_the_ids() {
        let mut m = matrix(&table());
        m.sources = vec!["config".into(), "config".into(), "EndpointSlice".into()];
        let text = render_text(&m, false);
        let line = text.lines().find(|l| l.contains("(from)")).unwrap();
        assert!(line.ends_with("config   config   EndpointSlice"), "{line:?}");
        assert_eq!(render_json(&m)["apiservers"][2]["source"], "EndpointSlice");
        assert!(render_json(&matrix(&table()))["apiservers"][2].get("source").is_none());
    }

    #[test]
    fn json_matrix_and_no_skew() {
        let v = render_json(&matrix(&table()));
        assert_eq!(v["rerouted"], 3);
        assert_eq!(v["gvrs"][1]["servedBy"], json!(["c"]));
        assert_eq!(v["lacking"][0], json!({"groupVersion": "resource.k8s.io/v1", "apiservers": ["a", "b"]}));
        let t: TableConfig = serde_json::from_value(json!({
            "schema": 1, "apiservers": [{"id": "a", "cluster": "ap-a"}], "poolCluster": "pool",
            "groupVersions": [{"group": "", "version": "v1", "servedBy": ["a"], "resources": {"pods": ["a"]}}]
        }))
        .unwrap();
        let m = matrix(&RoutingTable::compile(t).unwrap());
        assert_eq!(summary(&m), "no skew: all 1 GVRs are served by all 1 apiservers");
        let text = render_text(&m, false);
        assert_eq!(text.lines().count(), 4, "{text}");
    }
}
