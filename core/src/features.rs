//! Skew below the GVR: features that some apiservers have and others lack although they serve the
//! same resources. A request that uses one goes to the apiservers that have it, learned from the
//! apiservers themselves (their `/metrics`); where none of those that serve the resource has it,
//! it goes where it would have gone, and gets the answer every one of them gives.
//!
//! Today one feature: `WatchList`, the streaming list (`watch` with `sendInitialEvents`), which
//! kube-apiserver refuses with 422 when the gate is off (1.33's default, for instance) and which
//! client-go's reflectors use first wherever their own gate is on.

use std::collections::BTreeMap;

/// The feature gate of streaming lists.
pub const WATCH_LIST: &str = "WatchList";

/// The feature gates the edge routes on: the ones the sidecar reads from each apiserver.
pub const ROUTED: [&str; 1] = [WATCH_LIST];

/// The metric kube-apiserver (1.26+) reports every feature gate's state in, e.g.
/// `kubernetes_feature_enabled{name="WatchList",stage="BETA"} 1`.
pub const METRIC: &str = "kubernetes_feature_enabled";

/// The states of the [`ROUTED`] gates in a Prometheus text exposition; a gate the text does not
/// report is left out (unknown, which the table takes as enabled).
pub fn from_metrics(text: &str) -> BTreeMap<String, bool> {
    let mut gates = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(METRIC).and_then(|r| r.strip_prefix('{')) else { continue };
        let Some((labels, value)) = rest.rsplit_once('}') else { continue };
        let Some(name) = label(labels, "name") else { continue };
        let Some(gate) = ROUTED.iter().find(|g| **g == name) else { continue };
        let enabled = match value.split_whitespace().next() {
            Some("1") => true,
            Some("0") => false,
            _ => continue,
        };
        gates.insert((*gate).to_owned(), enabled);
    }
    gates
}

/// The value of `key` among Prometheus labels (`a="x",b="y"`); gate names need no escapes.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn reads_the_routed_gates() {
        let text = "# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.\n\
                    # TYPE kubernetes_feature_enabled gauge\n\
                    kubernetes_feature_enabled{name=\"VolumeAttributesClass\",stage=\"\"} 1\n\
                    kubernetes_feature_enabled{name=\"WatchList\",stage=\"BETA\"} 0\n\
                    kubernetes_feature_enabled_other{name=\"WatchList\"} 1\n";
        assert_eq!(from_metrics(text), BTreeMap::from([(WATCH_LIST.to_owned(), false)]));
        let on = "kubernetes_feature_enabled{stage=\"BETA\",name=\"WatchList\"} 1 1700000000000";
        assert_eq!(from_metrics(on), BTreeMap::from([(WATCH_LIST.to_owned(), true)]));
        assert!(from_metrics("").is_empty());
        assert!(from_metrics("kubernetes_feature_enabled{name=\"WatchList\"} NaN").is_empty());
        assert!(from_metrics("kubernetes_feature_enabled{name=\"WatchList\"").is_empty());
    }
}
