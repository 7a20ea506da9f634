//! Building a routing table from the apiservers' discovery documents (pure: the caller fetches).
//!
//! Every (group, version) any apiserver lists becomes a table entry served by exactly the
//! apiservers that list it, each top-level resource likewise; every proper subset that serves
//! something gets a set cluster; the peer-aggregated `/apis` comes along, merged and hashed.

use std::collections::BTreeMap;
use std::fmt;

use crate::digest::short_hash;
use crate::discovery::{ApiGroupDiscovery, ApiGroupDiscoveryList, etag, merge_peer_discovery};
use crate::extensions::Extensions;
use crate::legacy_build::{LegacySet, compose_legacy};
use crate::policy::PolicyConfig;
use crate::table::{
    ApiserverConfig, DiscoveryConfig, GroupVersionConfig, LegacyDocumentConfig, MAX_APISERVERS, RoutingTable,
    SCHEMA_VERSION, TableConfig, TableError,
};

/// What one apiserver serves: its aggregated `/api` and `/apis` documents (legacy discovery
/// converted with [`crate::discovery::core_group_list`] and friends). No documents: it serves
/// nothing (it never answered), but it stays in the table and in the pool.
#[derive(Debug, Clone, Default)]
pub struct ServerApis<'a> {
    /// The table's id for it: a DNS label, so that it can be part of cluster names.
    pub id: &'a str,
    /// What the apiserver reports as its version (informational).
    pub version: &'a str,
    pub documents: Vec<&'a ApiGroupDiscoveryList>,
    /// Its legacy discovery documents as it served them, for the composed ones
    /// ([`build_table_with`]).
    pub legacy: Option<&'a LegacySet>,
    /// The states of the feature gates the edge routes on, as the apiserver reported them
    /// ([`crate::features`]); `None`: not known.
    pub features: Option<&'a BTreeMap<String, bool>>,
}

/// How the Envoy clusters are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNames {
    pub pool: String,
    /// Followed by the apiserver id.
    pub apiserver_prefix: String,
    /// Followed by the member ids, sorted and joined with `_`.
    pub set_prefix: String,
    /// Followed by the pool's or a set's name: its twin for requests without credentials.
    pub anonymous_prefix: String,
}

impl ClusterNames {
    /// The cluster of the apiservers `members` (any order): one name per set, whatever builds it.
    pub fn set_cluster(&self, members: &[String]) -> String {
        set_cluster_name(&self.set_prefix, members)
    }
}

impl Default for ClusterNames {
    fn default() -> Self {
        Self {
            pool: "skewgate-pool".to_owned(),
            apiserver_prefix: "skewgate-apiserver-".to_owned(),
            set_prefix: "skewgate-set-".to_owned(),
            anonymous_prefix: "skewgate-anonymous-".to_owned(),
        }
    }
}

/// Why no table could be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    NoServers,
    TooManyServers(usize),
    /// Position in the input and the offending id.
    InvalidId {
        index: usize,
        id: String,
    },
    DuplicateId {
        id: String,
        first: usize,
        second: usize,
    },
    /// The merged discovery document could not be serialised.
    Serialize(String),
    /// The built table does not compile, e.g. because a cluster prefix has characters Envoy
    /// cluster names cannot have.
    Table(TableError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoServers => write!(f, "cannot build a routing table without apiservers"),
            BuildError::TooManyServers(n) => {
                write!(f, "{n} apiservers: a routing table holds at most {MAX_APISERVERS}")
            }
            BuildError::InvalidId { index, id } => write!(
                f,
                "apiserver {index}: id {id:?} is not a DNS label (1-63 of [a-z0-9-], alphanumeric at both ends)"
            ),
            BuildError::DuplicateId { id, first, second } => {
                write!(f, "apiservers {first} and {second} have the same id {id:?}")
            }
            BuildError::Serialize(detail) => write!(f, "cannot serialise the merged discovery: {detail}"),
            BuildError::Table(error) => write!(f, "built table is refused: {error}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Table(error) => Some(error),
            _ => None,
        }
    }
}

/// Cluster names must stay within what the table accepts; a long member list is hashed instead.
const MAX_CLUSTER_NAME: usize = 200;

/// The routing table for `servers`, apiservers in the given order.
///
/// Identical inputs give identical tables (and `generation`). The result always compiles:
/// entries whose group, version or resource could not appear in a request path (empty, `/`,
/// characters to escape) are left out, since no request could name them, rather than letting
/// one odd entry stop every table update.
pub fn build_table(servers: &[ServerApis<'_>], names: &ClusterNames) -> Result<TableConfig, BuildError> {
    build_table_with(servers, names, &Extensions::default())
}

/// The routing table, with what the sidecar knows beyond discovery:
/// - each server's legacy discovery set, for the composed legacy documents ([`compose_legacy`]);
///   nothing is composed unless every server that serves something has its set: a merge without one of them could lack what only it serves, and the apiservers then
///   answer legacy discovery themselves, as without skewgate;
/// - CRD- and APIService-backed group/versions ([`Extensions`]): routed to the pool (every
///   apiserver serves them, whichever lists them now) and kept from one server only in the merged
///   `/apis`.
pub fn build_table_with(
    servers: &[ServerApis<'_>],
    names: &ClusterNames,
    extensions: &Extensions,
) -> Result<TableConfig, BuildError> {
    check_ids(servers)?;
    let mut table = TableConfig {
        schema: SCHEMA_VERSION,
        generation: String::new(),
        clusters: Vec::new(),
        apiservers: servers
            .iter()
            .map(|s| ApiserverConfig {
                id: s.id.to_owned(),
                cluster: format!("{}{}", names.apiserver_prefix, s.id),
                version: s.version.to_owned(),
                features: s.features.cloned().unwrap_or_default(),
            })
            .collect(),
        pool_cluster: names.pool.clone(),
        sets: Vec::new(),
        group_versions: group_versions(servers, extensions),
        discovery: Some(merged_discovery(servers, extensions)?),
        legacy_discovery: Vec::new(),
        policy: PolicyConfig::default(),
        anonymous_cluster_prefix: Some(names.anonymous_prefix.clone()),
        openapi_cluster: None,
    };
    table.legacy_discovery = legacy_discovery(servers, &table.group_versions)?;
    table.assign_sets(|members| names.set_cluster(members));
    table.generation = generation(&table)?;
    // Cheap next to a sync, and it turns a table Envoy would refuse into an error here.
    RoutingTable::compile(table.clone()).map_err(BuildError::Table)?;
    Ok(table)
}

fn legacy_discovery(
    servers: &[ServerApis<'_>],
    group_versions: &[GroupVersionConfig],
) -> Result<Vec<LegacyDocumentConfig>, BuildError> {
    let mut inputs: Vec<(&str, &LegacySet)> = Vec::new();
    for server in servers {
        if server.documents.iter().all(|d| d.items.is_empty()) {
            continue;
        }
        match server.legacy {
            Some(set) => inputs.push((server.id, set)),
            None => return Ok(Vec::new()),
        }
    }
    let known = |group: &str, version: Option<&str>| {
        group_versions.iter().any(|gv| gv.group == group && version.is_none_or(|v| gv.version == v))
    };
    compose_legacy(&inputs, known).map_err(|e| BuildError::Serialize(e.to_string()))
}

fn check_ids(servers: &[ServerApis<'_>]) -> Result<(), BuildError> {
    if servers.is_empty() {
        return Err(BuildError::NoServers);
    }
    if servers.len() > MAX_APISERVERS {
        return Err(BuildError::TooManyServers(servers.len()));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, server) in servers.iter().enumerate() {
        if !is_valid_apiserver_id(server.id) {
            return Err(BuildError::InvalidId { index, id: server.id.to_owned() });
        }
        if let Some(first) = seen.insert(server.id, index) {
            return Err(BuildError::DuplicateId { id: server.id.to_owned(), first, second: index });
        }
    }
    Ok(())
}

/// Whether `id` can name an apiserver: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters,
/// because ids end up in cluster names and metrics labels.
pub fn is_valid_apiserver_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    bytes.len() <= 63
        && edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// Who lists a group/version, and who serves each of its resources: bit i = `servers[i]`.
#[derive(Default)]
struct Listing<'a> {
    served_by: u64,
    resources: BTreeMap<&'a str, u64>,
}

fn group_versions(servers: &[ServerApis<'_>], extensions: &Extensions) -> Vec<GroupVersionConfig> {
    let mut listings: BTreeMap<(&str, &str), Listing<'_>> = BTreeMap::new();
    for (index, server) in servers.iter().enumerate() {
        let bit = 1u64 << index;
        for group in server.documents.iter().flat_map(|document| &document.items) {
            if !group.name().is_empty() && !is_path_segment(group.name()) {
                continue;
            }
            for version in group.versions.iter().filter(|v| is_path_segment(&v.version)) {
                let listing = listings.entry((group.name(), &version.version)).or_default();
                listing.served_by |= bit;
                for resource in version.resources.iter().filter(|r| is_path_segment(&r.resource)) {
                    *listing.resources.entry(&resource.resource).or_default() |= bit;
                }
            }
        }
    }
    let ids_of = |mask: u64| -> Vec<String> {
        servers
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1u64 << i) != 0)
            .map(|(_, s)| s.id.to_owned())
            .collect()
    };
    let everyone = u64::MAX >> (64 - servers.len().clamp(1, 64));
    listings
        .into_iter()
        .map(|((group, version), listing)| {
            let extension = extensions.contains(group, version);
            let mask = |m: u64| if extension { everyone } else { m };
            GroupVersionConfig {
                group: group.to_owned(),
                version: version.to_owned(),
                served_by: ids_of(mask(listing.served_by)),
                resources: listing
                    .resources
                    .into_iter()
                    .map(|(r, m)| (r.to_owned(), ids_of(mask(m))))
                    .collect(),
                extension,
            }
        })
        .collect()
}

/// The rule `RoutingTable::compile` applies to groups, versions and resources.
fn is_path_segment(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// The peer-aggregated `/apis`: each server contributes the non-core groups of all its
/// documents as one list, which is what upstream's peer cache holds for it.
fn merged_discovery(
    servers: &[ServerApis<'_>],
    extensions: &Extensions,
) -> Result<DiscoveryConfig, BuildError> {
    let mut by_id: Vec<(&str, ApiGroupDiscoveryList)> =
        servers.iter().map(|s| (s.id, ApiGroupDiscoveryList::v2(non_core_groups(&s.documents)))).collect();
    // The merge visits servers in id order; so does the choice of who keeps an extension.
    by_id.sort_by(|a, b| a.0.cmp(b.0));
    let (ids, mut lists): (Vec<&str>, Vec<ApiGroupDiscoveryList>) = by_id.into_iter().unzip();
    extensions.keep_first_listing(&mut lists);
    let servers: Vec<&str> = ids;
    let peers: Vec<(&str, &ApiGroupDiscoveryList)> = servers.into_iter().zip(&lists).collect();
    let merged = merge_peer_discovery(&peers);
    let document = serde_json::to_string(&merged).map_err(|e| BuildError::Serialize(e.to_string()))?;
    Ok(DiscoveryConfig { etag: etag(&merged), document })
}

/// A group listed in two documents of one server counts once, as first listed.
fn non_core_groups(documents: &[&ApiGroupDiscoveryList]) -> Vec<ApiGroupDiscovery> {
    let mut groups: Vec<ApiGroupDiscovery> = Vec::new();
    for group in documents.iter().flat_map(|document| &document.items) {
        if !group.name().is_empty() && groups.iter().all(|g| g.name() != group.name()) {
            groups.push(group.clone());
        }
    }
    groups
}

/// Sorted ids, so that the name (and the CDS cluster behind it) survives a reordering of the
/// apiservers; `_` cannot occur in an id, so the join is unambiguous.
fn set_cluster_name(prefix: &str, members: &[String]) -> String {
    let mut ids: Vec<&str> = members.iter().map(String::as_str).collect();
    ids.sort_unstable();
    let joined = ids.join("_");
    if prefix.len() + joined.len() <= MAX_CLUSTER_NAME {
        format!("{prefix}{joined}")
    } else {
        format!("{prefix}{}", short_hash(joined.as_bytes()))
    }
}

/// A content hash of the table without its generation.
fn generation(table: &TableConfig) -> Result<String, BuildError> {
    let bytes = serde_json::to_vec(table).map_err(|e| BuildError::Serialize(e.to_string()))?;
    Ok(short_hash(&bytes))
}

#[cfg(test)]
mod tests {

    use std::collections::BTreeSet;

    use super::*;
    use crate::discovery::{ApiResourceList, core_group_list};
    use crate::table::{Serving, SetConfig};

    const V1_33: &str =
        include_str!("../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json");
    const V1_36: &str = include_str!("../../testdata/discovery/k8s-1.36-era_resource-v1/aggregated_v2.json");
    const API_V1: &str = include_str!("../../testdata/discovery/legacy_core-v1/api__v1.json");

    struct Docs {
        core: ApiGroupDiscoveryList,
        old: ApiGroupDiscoveryList,
        new: ApiGroupDiscoveryList,
    }

    fn docs() -> Docs {
        let parse = |text: &str| ApiGroupDiscoveryList::from_json(text.as_bytes()).unwrap();
        Docs {
            core: core_group_list(&ApiResourceList::from_json(API_V1.as_bytes()).unwrap()),
            old: parse(V1_33),
            new: parse(V1_36),
        }
    }

    /// An apiserver with these documents and nothing else known of it.
    fn server<'a>(
        id: &'a str,
        version: &'a str,
        documents: Vec<&'a ApiGroupDiscoveryList>,
    ) -> ServerApis<'a> {
        ServerApis { id, version, documents, ..ServerApis::default() }
    }

    /// a and b run the 1.33 era, c the 1.36 era.
    fn skewed(d: &Docs) -> Vec<ServerApis<'_>> {
        vec![
            server("a", "v1.33.0", vec![&d.core, &d.old]),
            server("b", "v1.33.0", vec![&d.core, &d.old]),
            server("c", "v1.36.0", vec![&d.core, &d.new]),
        ]
    }

    fn build(servers: &[ServerApis<'_>]) -> TableConfig {
        build_table(servers, &ClusterNames::default()).unwrap()
    }

    fn resource_servers<'t>(
        table: &'t TableConfig,
        group: &str,
        version: &str,
        resource: &str,
    ) -> &'t [String] {
        let gv = table.group_versions.iter().find(|gv| gv.group == group && gv.version == version).unwrap();
        &gv.resources[resource]
    }

    fn sorted(ids: &[String]) -> Vec<String> {
        let mut ids = ids.to_vec();
        ids.sort();
        ids
    }

    /// Expands the fixture README's `group/version/{r1,r2}` notation.
    fn expand(list: &str) -> Vec<String> {
        let mut out: Vec<String> = list
            .split("; ")
            .flat_map(|item| match item.split_once('{') {
                Some((prefix, names)) => {
                    names.trim_end_matches('}').split(',').map(|r| format!("{prefix}{r}")).collect()
                }
                None => vec![item.to_string()],
            })
            .collect();
        out.sort();
        out
    }

    /// The 1.33 → 1.36 differences listed in testdata/discovery/README.md (computed there from
    /// the same fixtures by an independent script) are exactly the GVRs the table reroutes.
    #[test]
    fn rerouted_gvrs_are_the_documented_era_differences() {
        let only_133 = expand(
            "admissionregistration.k8s.io/v1beta1/{validatingadmissionpolicies,validatingadmissionpolicybindings}; certificates.k8s.io/v1alpha1/clustertrustbundles; networking.k8s.io/v1beta1/{ipaddresses,servicecidrs}; resource.k8s.io/v1alpha3/{deviceclasses,resourceclaims,resourceclaimtemplates,resourceslices}; storage.k8s.io/v1alpha1/volumeattributesclasses; storage.k8s.io/v1beta1/volumeattributesclasses; storagemigration.k8s.io/v1alpha1/storageversionmigrations",
        );
        let only_136 = expand(
            "admissionregistration.k8s.io/v1/{mutatingadmissionpolicies,mutatingadmissionpolicybindings}; admissionregistration.k8s.io/v1beta1/{mutatingadmissionpolicies,mutatingadmissionpolicybindings}; certificates.k8s.io/v1/{clustertrustbundles,podcertificaterequests}; certificates.k8s.io/v1beta1/podcertificaterequests; lifecycle.k8s.io/v1alpha1/{evictionrequests,evictions}; resource.k8s.io/v1/{deviceclasses,devicetaintrules,resourceclaims,resourceclaimtemplates,resourceslices}; resource.k8s.io/v1alpha3/resourcepoolstatusrequests; resource.k8s.io/v1beta2/devicetaintrules; scheduling.k8s.io/v1alpha3/{compositepodgroups,podgroups,workloads}; scheduling.k8s.io/v1beta1/{podgroups,workloads}; storage.k8s.io/v1/volumeattributesclasses; storagemigration.k8s.io/v1/storageversionmigrations; storagemigration.k8s.io/v1beta1/storageversionmigrations",
        );
        let d = docs();
        let config = build(&skewed(&d));
        let served_by = |ids: &[&str]| -> Vec<String> {
            let mut out: Vec<String> = config
                .group_versions
                .iter()
                .flat_map(|gv| {
                    gv.resources
                        .iter()
                        .filter(|(_, by)| by.iter().map(String::as_str).eq(ids.iter().copied()))
                        .map(move |(r, _)| format!("{}/{}/{r}", gv.group, gv.version))
                })
                .collect();
            out.sort();
            out
        };
        assert_eq!(served_by(&["a", "b"]), only_133);
        assert_eq!(served_by(&["c"]), only_136);
        assert_eq!(only_133.len() + only_136.len(), 36, "the 36 GVRs `skewgate table` reports");
    }

    #[test]
    fn skewed_cluster_routes_each_gvr_to_its_servers() {
        let d = docs();
        let config = build(&skewed(&d));
        assert_eq!(resource_servers(&config, "resource.k8s.io", "v1", "resourceclaims"), ["c"]);
        assert_eq!(resource_servers(&config, "resource.k8s.io", "v1alpha3", "deviceclasses"), ["a", "b"]);
        assert_eq!(resource_servers(&config, "networking.k8s.io", "v1beta1", "ipaddresses"), ["a", "b"]);
        assert_eq!(resource_servers(&config, "", "v1", "pods"), ["a", "b", "c"]);

        let table = RoutingTable::compile(config).unwrap();
        let claims = table.gvr("resource.k8s.io", "v1", "resourceclaims").unwrap();
        assert_eq!(table.cluster(claims.serving), "skewgate-set-c");
        let classes = table.gvr("resource.k8s.io", "v1alpha3", "deviceclasses").unwrap();
        assert_eq!(table.cluster(classes.serving), "skewgate-set-a_b");
        let addresses = table.gvr("networking.k8s.io", "v1beta1", "ipaddresses").unwrap();
        assert_eq!(table.members(addresses.serving).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(table.gvr("", "v1", "pods").unwrap().serving, Serving::All);
        assert_eq!(table.cluster(Serving::All), "skewgate-pool");
        assert_eq!(table.group("lifecycle.k8s.io").map(|s| table.cluster(s)), Some("skewgate-set-c"));
        assert_eq!(table.group("resource.k8s.io"), Some(Serving::All));
        assert_eq!(table.group_version("resource.k8s.io", "v1beta2"), Some(Serving::All));
    }

    #[test]
    fn apiservers_sets_and_gvr_count() {
        let d = docs();
        let config = build(&skewed(&d));
        let clusters: Vec<(&str, &str, &str)> = config
            .apiservers
            .iter()
            .map(|a| (a.id.as_str(), a.cluster.as_str(), a.version.as_str()))
            .collect();
        assert_eq!(
            clusters,
            [
                ("a", "skewgate-apiserver-a", "v1.33.0"),
                ("b", "skewgate-apiserver-b", "v1.33.0"),
                ("c", "skewgate-apiserver-c", "v1.36.0")
            ]
        );
        assert_eq!(config.pool_cluster, "skewgate-pool");
        assert_eq!(
            config.sets,
            [
                SetConfig { cluster: "skewgate-set-a_b".into(), members: vec!["a".into(), "b".into()] },
                SetConfig { cluster: "skewgate-set-c".into(), members: vec!["c".into()] },
            ]
        );
        // 1.33's 71 GVRs, the 24 that only 1.36 has, and 17 core resources.
        let gvrs: usize = config.group_versions.iter().map(|gv| gv.resources.len()).sum();
        assert_eq!(gvrs, 71 + 24 + 17);
        assert_eq!(RoutingTable::compile(config).unwrap().gvrs().len(), 112);
    }

    #[test]
    fn group_versions_are_sorted_and_served_by_follows_apiserver_order() {
        let d = docs();
        let servers = vec![server("z", "", vec![&d.core, &d.new]), server("m", "", vec![&d.core, &d.old])];
        let config = build(&servers);
        let keys: Vec<(&str, &str)> =
            config.group_versions.iter().map(|gv| (gv.group.as_str(), gv.version.as_str())).collect();
        let mut expected = keys.clone();
        expected.sort();
        assert_eq!(keys, expected);
        assert_eq!(keys[0], ("", "v1"));
        assert_eq!(resource_servers(&config, "", "v1", "pods"), ["z", "m"]);
        assert_eq!(config.sets[0].members, ["z"]);
        assert_eq!(config.sets[0].cluster, "skewgate-set-z");
        assert_eq!(config.sets[1].cluster, "skewgate-set-m");
    }

    #[test]
    fn building_twice_gives_the_same_table() {
        let d = docs();
        let first = serde_json::to_string(&build(&skewed(&d))).unwrap();
        let second = serde_json::to_string(&build(&skewed(&d))).unwrap();
        assert_eq!(first, second);
        let table = build(&skewed(&d));
        assert_eq!(table.generation.len(), 16);
        assert!(table.generation.chars().all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)));
    }

    #[test]
    fn server_order_does_not_change_what_is_served_by_whom() {
        let d = docs();
        let reference = build(&skewed(&d));
        let mut permuted = skewed(&d);
        permuted.rotate_left(1);
        permuted.swap(0, 1);
        let other = build(&permuted);
        assert_eq!(other.apiservers.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["c", "b", "a"]);
        let normalise = |t: &TableConfig| {
            let gvs: Vec<_> = t
                .group_versions
                .iter()
                .map(|gv| {
                    let resources: BTreeMap<_, _> =
                        gv.resources.iter().map(|(r, ids)| (r.clone(), sorted(ids))).collect();
                    (gv.group.clone(), gv.version.clone(), sorted(&gv.served_by), resources)
                })
                .collect();
            let sets: BTreeSet<_> = t.sets.iter().map(|s| (s.cluster.clone(), sorted(&s.members))).collect();
            (gvs, sets, t.discovery.clone())
        };
        assert_eq!(normalise(&reference), normalise(&other));
        assert_ne!(reference.generation, other.generation);
    }

    #[test]
    fn merged_discovery_is_the_union_without_core() {
        let d = docs();
        let config = build(&skewed(&d));
        let discovery = config.discovery.unwrap();
        let merged = ApiGroupDiscoveryList::from_json(discovery.document.as_bytes()).unwrap();
        assert!(merged.items.iter().all(|g| !g.name().is_empty()));
        assert!(merged.gvrs().any(|gvr| gvr == ("resource.k8s.io", "v1", "resourceclaims")));
        assert!(merged.gvrs().any(|gvr| gvr == ("networking.k8s.io", "v1beta1", "ipaddresses")));
        assert_eq!(discovery.etag, etag(&merged));
        let direct = merge_peer_discovery(&[("a", &d.old), ("b", &d.old), ("c", &d.new)]);
        assert_eq!(merged, direct);
        assert!(!discovery.document.contains('\n'));
    }

    #[test]
    fn a_single_server_gets_its_own_document_and_no_sets() {
        let d = docs();
        let config = build(&[server("solo", "v1.36.0", vec![&d.core, &d.new])]);
        assert!(config.sets.is_empty());
        let discovery = config.discovery.clone().unwrap();
        assert_eq!(discovery.etag, etag(&d.new));
        RoutingTable::compile(config).unwrap();
    }

    #[test]
    fn a_server_with_only_core_still_counts() {
        let d = docs();
        let config = build(&[server("a", "", vec![&d.core, &d.old]), server("b", "", vec![&d.core])]);
        assert_eq!(resource_servers(&config, "", "v1", "pods"), ["a", "b"]);
        assert_eq!(resource_servers(&config, "apps", "v1", "deployments"), ["a"]);
        let table = RoutingTable::compile(config).unwrap();
        assert_eq!(table.group("apps").map(|s| table.cluster(s)), Some("skewgate-set-a"));
    }

    /// One that never answered stays in the table and the pool, serving nothing: every GVR is
    /// rerouted to the one that answered.
    #[test]
    fn a_silent_server_stays_but_serves_nothing() {
        let d = docs();
        let config = build(&[
            server("a", "v1.33.0", vec![&d.core, &d.old]),
            ServerApis { id: "b", ..ServerApis::default() },
        ]);
        assert_eq!(config.apiservers.len(), 2);
        let counts = config.counts();
        assert!(counts.gvrs > 10, "{counts:?}");
        assert_eq!(counts.gvrs, counts.rerouted);
        assert!(config.group_versions.iter().all(|gv| gv.served_by == ["a"]));
        let both = build(&[server("a", "", vec![&d.core, &d.old]), server("b", "", vec![&d.core])]);
        let counts = both.counts();
        assert!(counts.rerouted > 0 && counts.rerouted < counts.gvrs, "pods are served by both: {counts:?}");
    }

    #[test]
    fn entries_no_path_can_name_are_left_out() {
        let d = docs();
        let mut odd = d.old.clone();
        odd.items[0].versions[0].resources[0].resource = "a b".into();
        odd.items[1].versions[0].version = String::new();
        odd.items[2].metadata.name = "x/y".into();
        let config = build(&[server("a", "", vec![&odd])]);
        let names: Vec<&str> =
            config.group_versions.iter().flat_map(|gv| gv.resources.keys()).map(String::as_str).collect();
        assert!(!names.contains(&"a b"));
        assert!(config.group_versions.iter().all(|gv| !gv.version.is_empty() && gv.group != "x/y"));
        RoutingTable::compile(config).unwrap();
    }

    #[test]
    fn ids_are_checked() {
        let d = docs();
        let server = |id| server(id, "", vec![&d.core]);
        let names = ClusterNames::default();
        assert_eq!(build_table(&[], &names).unwrap_err(), BuildError::NoServers);
        let (long, longest) = ("x".repeat(63), "x".repeat(64));
        for bad in ["", "A", "-a", "a-", "a_b", "a.b", &longest] {
            let error = build_table(&[server("a"), server(bad)], &names).unwrap_err();
            assert_eq!(error, BuildError::InvalidId { index: 1, id: bad.to_owned() });
            assert!(error.to_string().contains("DNS label"), "{error}");
        }
        for good in ["a", "0", "a-b-1", &long] {
            assert!(build_table(&[server(good)], &names).is_ok(), "{good}");
        }
        let error = build_table(&[server("a"), server("b"), server("a")], &names).unwrap_err();
        assert_eq!(error, BuildError::DuplicateId { id: "a".into(), first: 0, second: 2 });
        assert_eq!(error.to_string(), "apiservers 0 and 2 have the same id \"a\"");
        let ids: Vec<String> = (0..65).map(|i| format!("s{i}")).collect();
        let many: Vec<ServerApis<'_>> = ids.iter().map(|id| server(id)).collect();
        assert_eq!(build_table(&many, &names).unwrap_err(), BuildError::TooManyServers(65));
    }

    #[test]
    fn bad_cluster_prefix_is_a_table_error() {
        let d = docs();
        let names = ClusterNames { pool: "a pool".into(), ..ClusterNames::default() };
        let error = build_table(&[server("a", "", vec![&d.core])], &names).unwrap_err();
        assert!(matches!(&error, BuildError::Table(e) if e.field == "poolCluster"), "{error:?}");
        assert!(std::error::Error::source(&error).is_some());
    }

    #[test]
    fn long_member_lists_get_a_hashed_set_name() {
        let d = docs();
        // Three 63-character ids joined make 191 characters: with the prefix, over 200.
        let ids: Vec<String> = ["a", "b", "c", "d"].iter().map(|c| c.repeat(63)).collect();
        let mut servers: Vec<ServerApis<'_>> =
            ids.iter().map(|id| server(id, "", vec![&d.core, &d.old])).collect();
        servers[3].documents = vec![&d.core, &d.new];
        let config = build(&servers);
        let three = config.sets.iter().find(|s| s.members.len() == 3).unwrap();
        assert_eq!(three.cluster.len(), "skewgate-set-".len() + 16);
        let one = config.sets.iter().find(|s| s.members.len() == 1).unwrap();
        assert_eq!(one.cluster, format!("skewgate-set-{}", "d".repeat(63)));
        RoutingTable::compile(config).unwrap();
    }

    #[test]
    fn set_names_sort_their_ids() {
        assert_eq!(set_cluster_name("s-", &["b".into(), "a".into()]), "s-a_b");
    }

    /// c lags a CRD's discovery (it lists only v1 of two): both versions still go to the pool,
    /// and the merged `/apis` takes each from the first server (in id order) that lists it.
    #[test]
    fn extensions_go_to_the_pool_and_merge_from_one_server() {
        let crd = |versions: &[(&str, &str)]| {
            let versions: Vec<serde_json::Value> = versions
                .iter()
                .map(|(v, freshness)| {
                    serde_json::json!({"version": v, "freshness": freshness, "resources": [{
                        "resource": "widgets", "responseKind": {"group": "", "version": "", "kind": "Widget"},
                        "scope": "Namespaced", "singularResource": "widget", "verbs": ["get", "list"]}]})
                })
                .collect();
            ApiGroupDiscoveryList::from_json(
                serde_json::json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                    "metadata": {}, "items": [{"metadata": {"name": "example.com"}, "versions": versions}]})
                .to_string()
                .as_bytes(),
            )
            .unwrap()
        };
        let d = docs();
        let (both, stale, none) =
            (crd(&[("v2", "Current"), ("v1", "Current")]), crd(&[("v1", "Stale")]), crd(&[]));
        let servers = vec![
            server("c", "v1.36.0", vec![&d.core, &d.new, &stale]),
            server("b", "v1.36.0", vec![&d.core, &d.new, &both]),
            server("a", "v1.36.0", vec![&d.core, &d.new, &none]),
        ];
        let extensions = Extensions::new([
            ("example.com".to_owned(), "v1".to_owned()),
            ("example.com".to_owned(), "v2".to_owned()),
        ]);
        let plain = build(&servers);
        assert_eq!(resource_servers(&plain, "example.com", "v2", "widgets"), ["b"]);
        let config = build_table_with(&servers, &ClusterNames::default(), &extensions).unwrap();
        for version in ["v1", "v2"] {
            let gv =
                config.group_versions.iter().find(|gv| gv.group == "example.com" && gv.version == version);
            let gv = gv.unwrap();
            assert!(gv.extension);
            assert_eq!(gv.served_by, ["c", "b", "a"]);
            assert_eq!(gv.resources["widgets"], ["c", "b", "a"]);
        }
        assert!(config.group_versions.iter().filter(|gv| gv.group != "example.com").all(|gv| !gv.extension));
        let table = RoutingTable::compile(config.clone()).unwrap();
        assert_eq!(table.gvr("example.com", "v1", "widgets").unwrap().serving, Serving::All);
        let merged: serde_json::Value = serde_json::from_str(&config.discovery.unwrap().document).unwrap();
        let group =
            merged["items"].as_array().unwrap().iter().find(|g| g["metadata"]["name"] == "example.com");
        let versions: Vec<(&str, &str)> = group.unwrap()["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["version"].as_str().unwrap(), v["freshness"].as_str().unwrap()))
            .collect();
        // b (before c) keeps both versions: c's Stale v1 is not merged in.
        assert_eq!(versions, [("v2", "Current"), ("v1", "Current")]);
    }
}
