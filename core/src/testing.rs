//! Fixtures for the tests of core and of the crates built on it (feature `testing`).

use serde_json::{Value, json};

/// Apiservers `a` and `b` at `old`, `c` at `new`, their clusters `{cluster_prefix}a` and so on:
/// the skew most tests set up.
pub fn apiservers(old: &str, new: &str, cluster_prefix: &str) -> Value {
    let server = |id: &str, version: &str| json!({"id": id, "cluster": format!("{cluster_prefix}{id}"), "version": version});
    json!([server("a", old), server("b", old), server("c", new)])
}

/// A routing table of three apiservers, c the newest: resourceclaims v1 and evictions only on c,
/// deviceclasses v1alpha3 only on a and b, everything else on all three.
pub fn sample() -> Value {
    json!({
        "schema": 1,
        "generation": "t1",
        "apiservers": apiservers("v1.33.4", "v1.36.0", "apiserver-"),
        "poolCluster": "pool",
        "sets": [
            {"cluster": "set-c", "members": ["c"]},
            {"cluster": "set-a-b", "members": ["a", "b"]}
        ],
        "groupVersions": [
            {"group": "", "version": "v1", "servedBy": ["a", "b", "c"],
             "resources": {"pods": ["a", "b", "c"], "configmaps": ["a", "b", "c"]}},
            {"group": "resource.k8s.io", "version": "v1", "servedBy": ["c"],
             "resources": {"resourceclaims": ["c"]}},
            {"group": "resource.k8s.io", "version": "v1beta1", "servedBy": ["a", "b", "c"],
             "resources": {"resourceclaims": ["a", "b", "c"]}},
            {"group": "resource.k8s.io", "version": "v1alpha3", "servedBy": ["a", "b", "c"],
             "resources": {"deviceclasses": ["a", "b"], "devicetaintrules": ["a", "b", "c"]}},
            {"group": "lifecycle.k8s.io", "version": "v1alpha1", "servedBy": ["c"],
             "resources": {"evictions": ["c"]}}
        ],
        "discovery": {"etag": "ABC123", "document": "{\"kind\":\"APIGroupDiscoveryList\"}"}
    })
}

/// `table` sealed with the clusters it names ([`crate::seal::seal_as_named`]): the filter and
/// the native module take only sealed tables. A value that is no table comes back unchanged,
/// for the filter to refuse.
pub fn sealed(table: &Value) -> Value {
    let Ok(mut config) = serde_json::from_value::<crate::table::TableConfig>(table.clone()) else {
        return table.clone();
    };
    crate::seal::seal_as_named(&mut config);
    serde_json::to_value(config).unwrap_or_else(|_| table.clone())
}
