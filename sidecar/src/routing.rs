//! From discovery documents to the routing table (built by `core::build::build_table`, the one
//! way to build one); [`crate::envoy::render`] turns it into what Envoy reads. Shared by
//! `skewgate sync` and the offline `skewgate table --discovery`.

use skewgate_core::build::{BuildError, ClusterNames, ServerApis, build_table_with};
use skewgate_core::discovery::ApiGroupDiscoveryList;
use skewgate_core::extensions::Extensions;
use skewgate_core::legacy_build::LegacySet;
use skewgate_core::table::TableConfig;

/// One apiserver as the table sees it: documents `None` means it serves nothing (it failed
/// past its grace period, or never answered) but stays in the table and in the pool.
#[derive(Debug, Clone, Copy)]
pub struct Server<'a> {
    pub id: &'a str,
    pub version: &'a str,
    pub documents: Option<[&'a ApiGroupDiscoveryList; 2]>,
    /// Its legacy discovery documents, for the composed ones (see `build_table_with`).
    pub legacy: Option<&'a LegacySet>,
}

/// The table for `servers`, in the given order.
pub fn build(servers: &[Server<'_>]) -> Result<TableConfig, BuildError> {
    build_with(servers, &Extensions::default())
}

/// [`build`], with CRD- and APIService-backed group/versions sent to the pool.
pub fn build_with(servers: &[Server<'_>], extensions: &Extensions) -> Result<TableConfig, BuildError> {
    let apis: Vec<ServerApis<'_>> = servers
        .iter()
        .map(|s| ServerApis {
            id: s.id,
            version: s.version,
            documents: s.documents.map(|d| d.to_vec()).unwrap_or_default(),
        })
        .collect();
    let legacy: Vec<Option<&LegacySet>> = servers.iter().map(|s| s.legacy).collect();
    build_table_with(&apis, &legacy, &ClusterNames::default(), extensions)
}

/// How big the skew is: what `/metrics` and the logs report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub gvrs: usize,
    /// GVRs that some apiserver does not serve: the filter sends them to a set cluster.
    pub rerouted: usize,
}

pub fn counts(table: &TableConfig) -> Counts {
    let all = table.apiservers.len();
    let resources = table.group_versions.iter().flat_map(|gv| gv.resources.values());
    let (gvrs, rerouted) = resources.fold((0, 0), |(n, r), ids| (n + 1, r + usize::from(ids.len() != all)));
    Counts { gvrs, rerouted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skewgate_core::discovery::{ApiResourceList, core_group_list};

    fn docs(text: &str) -> ApiGroupDiscoveryList {
        ApiGroupDiscoveryList::from_json(text.as_bytes()).unwrap()
    }

    #[test]
    fn a_silent_server_stays_but_serves_nothing() {
        let core = core_group_list(
            &ApiResourceList::from_json(include_bytes!(
                "../../testdata/discovery/legacy_core-v1/api__v1.json"
            ))
            .unwrap(),
        );
        let old =
            docs(include_str!("../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json"));
        let servers = [
            Server { id: "a", version: "v1.33.0", documents: Some([&core, &old]), legacy: None },
            Server { id: "b", version: "", documents: None, legacy: None },
        ];
        let table = build(&servers).unwrap();
        assert_eq!(table.apiservers.len(), 2);
        let c = counts(&table);
        assert!(c.gvrs > 80, "{c:?}");
        assert_eq!(c.gvrs, c.rerouted);
        assert!(table.group_versions.iter().all(|gv| gv.served_by == ["a"]));
    }
}
