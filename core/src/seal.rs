//! The tie between a routing table and the `cds.json` written with it.
//!
//! Envoy applies any `ecds.json` that parses; a table naming a cluster Envoy does not have
//! answers 503 for everything routed there. The sidecar seals every table it writes: `clusters`
//! lists the clusters of the `cds.json` it writes with it, and `generation` becomes the content
//! hash of the table (without the generation itself). The filter compiles a sealed table only if
//! both still hold, so a table edited after it was sealed, or naming a cluster outside the ones
//! it came with, is refused and the last good table keeps serving. The filter and the native
//! module take no unsealed table ([`require`]): without the requirement, removing `clusters`
//! would remove the check. The seal is a content hash, not a signature: it stops tables that
//! were edited, hand-written or written for other clusters, not a writer who seals a table as
//! the sidecar does (the files' permissions and the sidecar's guard are what keep that writer
//! out; docs/deploy.md).

use crate::table::{TableConfig, TableError};

/// Seals `table` with the clusters written alongside it.
pub fn seal(table: &mut TableConfig, clusters: impl IntoIterator<Item = String>) {
    let mut clusters: Vec<String> = clusters.into_iter().collect();
    clusters.sort();
    clusters.dedup();
    table.clusters = clusters;
    table.generation = String::new();
    table.generation = content_hash(table);
}

/// Seals `table` with exactly the clusters it names: for a table written without a `cds.json`
/// of the sidecar's (tests, the benchmarks' tables).
pub fn seal_as_named(table: &mut TableConfig) {
    let named: Vec<String> = named_clusters(table).into_iter().map(|(_, name)| name).collect();
    seal(table, named);
}

/// Refuses a table without a seal: what Envoy hands the filter must be a table the sidecar
/// wrote.
pub fn require(table: &TableConfig) -> Result<(), TableError> {
    if table.clusters.is_empty() {
        return Err(TableError {
            field: "clusters".into(),
            reason:
                "missing: the table is not sealed, and Envoy takes only sealed tables (the sidecar seals \
                     every table it writes with the clusters of its cds.json)"
                    .into(),
            over_limit: false,
        });
    }
    Ok(())
}

/// Refuses a sealed table that names a cluster outside its `clusters` or whose generation is not
/// its content hash.
pub fn check(table: &mut TableConfig) -> Result<(), TableError> {
    if table.clusters.is_empty() {
        return Ok(());
    }
    for (field, name) in named_clusters(table) {
        if table.clusters.binary_search(&name).is_err() {
            return Err(TableError {
                field,
                reason: format!("names cluster {name:?}, not one of the clusters written with the table"),
                over_limit: false,
            });
        }
    }
    let declared = std::mem::take(&mut table.generation);
    let hash = content_hash(table);
    table.generation = declared;
    if table.generation != hash {
        return Err(TableError {
            field: "generation".into(),
            reason: format!(
                "{:?} is not the content hash of the table ({hash}): edited after it was sealed",
                table.generation
            ),
            over_limit: false,
        });
    }
    Ok(())
}

/// Every cluster the table routes to, with the field that names it.
fn named_clusters(table: &TableConfig) -> Vec<(String, String)> {
    let mut named = vec![("poolCluster".to_owned(), table.pool_cluster.clone())];
    named.extend(
        table
            .apiservers
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("apiservers[{i}].cluster"), a.cluster.clone())),
    );
    named.extend(
        table.sets.iter().enumerate().map(|(i, s)| (format!("sets[{i}].cluster"), s.cluster.clone())),
    );
    let twins: Vec<(String, String)> = std::iter::once(&table.pool_cluster)
        .chain(table.sets.iter().map(|s| &s.cluster))
        .filter_map(|c| table.anonymous_cluster(c))
        .map(|twin| ("anonymousClusterPrefix".to_owned(), twin))
        .collect();
    named.extend(twins);
    if let Some(openapi) = &table.openapi_cluster {
        named.push(("openapiCluster".to_owned(), openapi.clone()));
    }
    named
}

/// [`crate::digest::short_hash`] of the serialised table, streamed: the serialised table (up to
/// `MAX_TABLE_BYTES`) is never held, since a Wasm VM's memory never shrinks.
fn content_hash(table: &TableConfig) -> String {
    use sha2::Digest;
    struct Hasher(sha2::Sha512);
    impl std::io::Write for Hasher {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hasher = Hasher(sha2::Sha512::new());
    // Serialising a table cannot fail (string keys only); an empty hash would never match.
    if serde_json::to_writer(&mut hasher, table).is_err() {
        return String::new();
    }
    crate::digest::hex_prefix(&hasher.0.finalize())
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::table::RoutingTable;
    use serde_json::json;

    fn table() -> TableConfig {
        serde_json::from_value(json!({
            "schema": 1,
            "apiservers": [{"id": "a", "cluster": "ap-a"}, {"id": "c", "cluster": "ap-c"}],
            "poolCluster": "pool",
            "sets": [{"cluster": "set-c", "members": ["c"]}],
            "groupVersions": [
                {"group": "", "version": "v1", "servedBy": ["a", "c"], "resources": {"pods": ["a", "c"]}},
                {"group": "resource.k8s.io", "version": "v1", "servedBy": ["c"],
                 "resources": {"resourceclaims": ["c"]}}
            ],
            "anonymousClusterPrefix": "anon-"
        }))
        .unwrap()
    }

    fn written() -> Vec<String> {
        ["pool", "ap-a", "ap-c", "set-c", "anon-pool", "anon-set-c", "openapi"].map(String::from).to_vec()
    }

    #[test]
    fn a_sealed_table_compiles_and_survives_json() {
        let mut t = table();
        seal(&mut t, written());
        let json = serde_json::to_string(&t).unwrap();
        let compiled = RoutingTable::from_sealed_json(json.as_bytes()).unwrap();
        assert_eq!(compiled.generation(), t.generation);
        assert_eq!(t.generation.len(), 16);
        // Tools read unsealed tables; Envoy's filter does not take them.
        RoutingTable::compile(table()).unwrap();
        let unsealed = serde_json::to_string(&table()).unwrap();
        let e = RoutingTable::from_sealed_json(unsealed.as_bytes()).expect_err("an unsealed table taken");
        assert_eq!(e.field, "clusters");
        assert!(e.reason.contains("not sealed"), "{e}");
        // Removing the seal's clusters from a sealed table leaves an unsealed one.
        let mut stripped = t.clone();
        stripped.clusters.clear();
        let stripped = serde_json::to_string(&stripped).unwrap();
        assert_eq!(RoutingTable::from_sealed_json(stripped.as_bytes()).unwrap_err().field, "clusters");
    }

    #[test]
    fn a_table_sealed_as_named_names_only_its_clusters() {
        let mut t = table();
        seal_as_named(&mut t);
        assert_eq!(t.clusters, ["anon-pool", "anon-set-c", "ap-a", "ap-c", "pool", "set-c"]);
        let json = serde_json::to_string(&t).unwrap();
        RoutingTable::from_sealed_json(json.as_bytes()).unwrap();
    }

    /// The F3 faults a table can carry: each refused, naming why.
    #[test]
    fn edits_after_sealing_are_refused() {
        type Case = (&'static str, fn(&mut TableConfig), &'static str, &'static str);
        let cases: [Case; 4] = [
            ("unknown pool", |t| t.pool_cluster = "nope".into(), "poolCluster", "\"nope\""),
            ("unknown set", |t| t.sets[0].cluster = "nope-0".into(), "sets[0].cluster", "\"nope-0\""),
            (
                "resourceclaims to another apiserver",
                |t| {
                    t.group_versions[1].served_by = vec!["a".into()];
                    t.group_versions[1].resources.insert("resourceclaims".into(), vec!["a".into()]);
                },
                "generation",
                "edited after it was sealed",
            ),
            (
                "a cluster listed but changed hash",
                |t| t.generation = "0123456789ABCDEF".into(),
                "generation",
                "content hash",
            ),
        ];
        for (name, edit, field, reason) in cases {
            let mut t = table();
            seal(&mut t, written());
            edit(&mut t);
            let e = RoutingTable::compile(t).expect_err(name);
            assert_eq!(e.field, field, "{name}: {e}");
            assert!(e.reason.contains(reason), "{name}: {e}");
            assert!(!e.over_limit);
        }
    }
}
