//! The apiservers' endpoints in files of their own (EDS), apart from their clusters (CDS).
//!
//! Envoy replaces a cluster whose definition changed by a new one, and a new cluster's hosts
//! count as unhealthy until their first health check: if that first check is slow (an apiserver
//! busy during an upgrade, a loaded machine), the whole cluster answers `no_healthy_upstream`
//! until the next one, though every apiserver in it is up; its connections are opened again too.
//! Marking one apiserver `DRAINING` (and back) changes every cluster it is in. An EDS cluster is
//! not replaced when only its endpoints change: each host keeps its health-check state and its
//! connections, and only the marked one is taken out. So every cluster whose endpoints are IP
//! addresses gets them from `eds/<cluster>.json`. One named by DNS names keeps them inline:
//! Envoy resolves names for STRICT_DNS clusters only (EDS takes addresses).
//!
//! The rest of the project sees one form, the clusters with their endpoints inline
//! ([`crate::resources::cds`]); [`split`] turns it into the files Envoy reads and [`join`] back.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

const LOAD_ASSIGNMENT_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// `cds.json` as Envoy reads it, and the EDS files it names, in the order to write them (the
/// endpoints first: a new EDS cluster reads its file as it starts).
#[derive(Debug, Clone, PartialEq)]
pub struct OnDisk {
    pub eds: Vec<(PathBuf, Value)>,
    pub cds: Value,
}

/// Where the endpoints of `cluster` live. Cluster names are the project's own (letters, digits,
/// `-`, `_`, `.`; at most ~220 characters), so the name is the file's.
pub fn eds_path(eds_dir: &Path, cluster: &str) -> PathBuf {
    eds_dir.join(format!("{cluster}.json"))
}

/// `cds` (endpoints inline) as Envoy is to read it: every STATIC cluster of apiservers becomes
/// an EDS cluster whose endpoints are in its own file under `eds_dir`.
pub fn split(cds: &Value, eds_dir: &Path) -> OnDisk {
    let mut cds = cds.clone();
    let mut eds = Vec::new();
    let clusters = cds.get_mut("resources").and_then(Value::as_array_mut);
    for cluster in clusters.into_iter().flatten() {
        let Some(fields) = cluster.as_object_mut() else { continue };
        if !takes_eds(fields) {
            continue;
        }
        let name = fields.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let Some(Value::Object(mut assignment)) = fields.remove("load_assignment") else { continue };
        // Nothing is rebuilt when an EDS endpoint changes, so there is no warming to spare a
        // drained host's health check; a changed flag would even have Envoy replace the host
        // and keep the old one, still checked and taking requests, until its checks fail.
        for endpoint in lb_endpoints_mut(&mut assignment) {
            if let Some(inner) = endpoint.get_mut("endpoint").and_then(Value::as_object_mut) {
                inner.remove("health_check_config");
            }
        }
        let path = eds_path(eds_dir, &name);
        fields.insert("type".into(), json!("EDS"));
        fields.insert(
            "eds_cluster_config".into(),
            json!({
                "service_name": name,
                "eds_config": {"path_config_source": {"path": path}, "resource_api_version": "V3"}
            }),
        );
        let mut resource = Map::new();
        resource.insert("@type".into(), json!(LOAD_ASSIGNMENT_TYPE));
        resource.extend(assignment);
        eds.push((path, json!({ "resources": [Value::Object(resource)] })));
    }
    OnDisk { eds, cds }
}

/// The clusters of an on-disk `cds` with their endpoints inline again, each EDS file read with
/// `read`; a cluster whose file `read` does not find (or that is no file of [`split`]'s) stays
/// as it is.
pub fn join(cds: &Value, mut read: impl FnMut(&Path) -> Option<Value>) -> Value {
    let mut cds = cds.clone();
    let clusters = cds.get_mut("resources").and_then(Value::as_array_mut);
    for cluster in clusters.into_iter().flatten() {
        let Some(fields) = cluster.as_object_mut() else { continue };
        let Some(path) = fields
            .get("eds_cluster_config")
            .and_then(|c| c.pointer("/eds_config/path_config_source/path"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let Some(mut file) = read(Path::new(path)) else { continue };
        let Some(Value::Object(mut assignment)) =
            file.get_mut("resources").and_then(|r| r.get_mut(0)).map(Value::take)
        else {
            continue;
        };
        assignment.remove("@type");
        fields.remove("eds_cluster_config");
        fields.insert("type".into(), json!("STATIC"));
        fields.insert("load_assignment".into(), Value::Object(assignment));
    }
    cds
}

/// A cluster of apiservers Envoy does not resolve: STATIC, every endpoint an apiserver's.
fn takes_eds(cluster: &Map<String, Value>) -> bool {
    if cluster.get("type").and_then(Value::as_str) != Some("STATIC") {
        return false;
    }
    let mut endpoints = cluster
        .get("load_assignment")
        .and_then(|a| a.get("endpoints"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|l| l.get("lb_endpoints").and_then(Value::as_array))
        .flatten()
        .peekable();
    endpoints.peek().is_some()
        && endpoints.all(|e| {
            e.pointer("/metadata/filter_metadata/skewgate/apiserver").is_some()
                && e.pointer("/endpoint/address/socket_address").is_some()
        })
}

fn lb_endpoints_mut(assignment: &mut Map<String, Value>) -> impl Iterator<Item = &mut Value> {
    assignment
        .get_mut("endpoints")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(|l| l.get_mut("lb_endpoints").and_then(Value::as_array_mut))
        .flatten()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::collections::BTreeSet;

    use super::*;
    use crate::resources::tests::{table, tls};
    use crate::resources::{Endpoint, Health, Overlay, cds, draining_in, with_draining};

    fn logical(b_address: &str) -> Value {
        let endpoints = [
            Endpoint { id: "a".into(), address: "127.0.0.1".into(), port: 7001 },
            Endpoint { id: "b".into(), address: b_address.into(), port: 6443 },
        ];
        let mut v = cds(&table(), &endpoints, &tls(), Health::default()).unwrap();
        // A cluster of the sidecar's own, on a socket: never an EDS one.
        v["resources"].as_array_mut().unwrap().push(json!({
            "name": "openapi", "type": "STATIC",
            "load_assignment": {"cluster_name": "openapi", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"pipe": {"path": "/x.sock"}}}}
            ]}]}
        }));
        v
    }

    fn types(cds: &Value) -> BTreeMap<String, String> {
        cds["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap().to_owned(), c["type"].as_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn clusters_of_addresses_read_their_endpoints_from_files_of_their_own() {
        let v = logical("127.0.0.2");
        let disk = split(&v, Path::new("/e"));
        let t = types(&disk.cds);
        assert_eq!(t["pool"], "EDS");
        assert_eq!(t["ap-b"], "EDS");
        assert_eq!(t["openapi"], "STATIC");
        let pool = &disk.cds["resources"][0];
        assert!(pool.get("load_assignment").is_none());
        assert_eq!(pool["eds_cluster_config"]["eds_config"]["path_config_source"]["path"], "/e/pool.json");
        assert_eq!(pool["eds_cluster_config"]["service_name"], "pool");
        let paths: Vec<&Path> = disk.eds.iter().map(|(p, _)| p.as_path()).collect();
        assert_eq!(
            paths,
            [
                Path::new("/e/pool.json"),
                Path::new("/e/ap-a.json"),
                Path::new("/e/ap-b.json"),
                Path::new("/e/set-b.json")
            ]
        );
        let file = &disk.eds[0].1["resources"][0];
        assert_eq!(file["@type"], LOAD_ASSIGNMENT_TYPE);
        assert_eq!(file["cluster_name"], "pool");
        assert_eq!(file["endpoints"][0]["lb_endpoints"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn clusters_of_names_keep_their_endpoints_inline() {
        let v = logical("apiserver-b");
        let disk = split(&v, Path::new("/e"));
        let t = types(&disk.cds);
        assert_eq!(
            (t["pool"].as_str(), t["ap-a"].as_str(), t["ap-b"].as_str()),
            ("STRICT_DNS", "EDS", "STRICT_DNS")
        );
        assert_eq!(disk.eds.len(), 1);
    }

    #[test]
    fn the_overlay_changes_only_endpoint_files() {
        let v = logical("127.0.0.2");
        let plain = split(&v, Path::new("/e"));
        let overlay = Overlay { draining: BTreeSet::from(["b".to_owned()]), ..Overlay::default() };
        let drained = split(&with_draining(&v, &overlay), Path::new("/e"));
        assert_eq!(plain.cds, drained.cds, "cds.json must not change: Envoy would rebuild the clusters");
        assert_ne!(plain.eds, drained.eds);
        let b = &drained.eds[0].1["resources"][0]["endpoints"][0]["lb_endpoints"][1];
        assert_eq!(b["health_status"], "DRAINING");
        assert!(b["endpoint"].get("health_check_config").is_none(), "{b}");
    }

    #[test]
    fn join_undoes_split() {
        for address in ["127.0.0.2", "apiserver-b"] {
            let overlay = Overlay { draining: BTreeSet::from(["a".to_owned()]), ..Overlay::default() };
            let v = with_draining(&logical(address), &overlay);
            let disk = split(&v, Path::new("/e"));
            let files: BTreeMap<PathBuf, Value> = disk.eds.iter().cloned().collect();
            let joined = join(&disk.cds, |p| files.get(p).cloned());
            assert_eq!(draining_in(&joined), overlay);
            assert_eq!(split(&joined, Path::new("/e")), disk, "{address}");
            assert_eq!(join(&disk.cds, |_| None), disk.cds, "a missing file leaves its cluster as it is");
        }
        assert_eq!(join(&logical("127.0.0.2"), |_| None), logical("127.0.0.2"));
    }
}
