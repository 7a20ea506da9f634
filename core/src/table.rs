//! The routing table (filter configuration, schema v1): its JSON form, its validation and the
//! compiled form that answers "who serves this GVR?" with hash look-ups that borrow the request's
//! strings.
//!
//! The sidecar writes the JSON form; the filter's `on_configure` and `skewgate explain` compile it.
//! Compilation is the validation: a table that compiles is safe to route with.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::OnceLock;

use crate::discovery::ApiGroupDiscoveryList;
use crate::discovery::protobuf::ToProtobuf;
use crate::policy::PolicyConfig;
use serde::{Deserialize, Serialize};

pub use crate::legacy_documents::{
    LegacyDocument, LegacyDocumentConfig, LegacyDocuments, LegacyPath, legacy_protobuf,
};

/// The only schema this build understands.
pub const SCHEMA_VERSION: u32 = 1;

/// Each apiserver is one bit of a `u64` membership mask.
pub const MAX_APISERVERS: usize = 64;

// Bounds on one table. The filter compiles a table in every Wasm VM (the main thread's and each
// worker's), and a VM's memory never shrinks: without bounds one oversized `ecds.json` keeps
// Envoy large for good. A real control plane has ~25 groups, ~60 group/versions and ~120 GVRs
// built in; a few thousand CRDs add about as many GVRs and ~0.5 KB of table each (mostly the
// merged discovery document). The bounds leave ten times that room.

/// Serialised size of a table, merged and legacy discovery documents included: the filter refuses a bigger
/// configuration by its length alone, before reading it.
pub const MAX_TABLE_BYTES: usize = 16 * 1024 * 1024;
/// Group/versions (`groupVersions` entries).
pub const MAX_GROUP_VERSIONS: usize = 10_000;
/// Group/version/resources over all group/versions.
pub const MAX_GVRS: usize = 50_000;
/// Set clusters: each is one Envoy cluster (two with anonymous twins). A rolling upgrade needs a
/// handful (old-only, new-only).
pub const MAX_SETS: usize = 256;

/// The routing table as JSON (what the sidecar writes and `ecds.json` carries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TableConfig {
    pub schema: u32,
    /// Free-form label of this table (the sidecar puts a content hash here); shown in logs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generation: String,
    /// When set, the clusters of the `cds.json` written with this table, and `generation` must
    /// be the table's content hash ([`crate::seal`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    pub apiservers: Vec<ApiserverConfig>,
    /// The Envoy cluster holding every apiserver.
    pub pool_cluster: String,
    /// One Envoy cluster per proper subset of apiservers that serves something.
    #[serde(default)]
    pub sets: Vec<SetConfig>,
    /// Every group/version some apiserver serves, with its resources.
    #[serde(default)]
    pub group_versions: Vec<GroupVersionConfig>,
    /// The peer-aggregated `/apis` document, served by the filter itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoveryConfig>,
    /// Legacy discovery documents composed from apiservers that answer them differently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legacy_discovery: Vec<LegacyDocumentConfig>,
    #[serde(default)]
    pub policy: PolicyConfig,
    /// When set, the pool and every set cluster have a twin named with this prefix that reaches
    /// the same apiservers without the front-proxy client certificate: requests that carry no
    /// credential go there, so each apiserver decides about anonymous access exactly as it does
    /// for a direct request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymous_cluster_prefix: Option<String>,
    /// The cluster that answers OpenAPI documents composed from every apiserver's (the
    /// sidecar's Unix socket). Without it, OpenAPI requests go to an apiserver as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openapi_cluster: Option<String>,
}

/// How big the skew is: what the sidecar's `/metrics` and logs report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub gvrs: usize,
    /// GVRs that some apiserver does not serve: the filter sends them to a set cluster.
    pub rerouted: usize,
}

impl TableConfig {
    /// Its GVRs, and how many of them some apiserver does not serve.
    pub fn counts(&self) -> Counts {
        let all = self.apiservers.len();
        let resources = self.group_versions.iter().flat_map(|gv| gv.resources.values());
        let (gvrs, rerouted) =
            resources.fold((0, 0), |(n, r), ids| (n + 1, r + usize::from(ids.len() != all)));
        Counts { gvrs, rerouted }
    }

    /// The twin of `cluster` for requests without credentials, if the table has twins.
    pub fn anonymous_cluster(&self, cluster: &str) -> Option<String> {
        self.anonymous_cluster_prefix.as_ref().map(|prefix| format!("{prefix}{cluster}"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiserverConfig {
    pub id: String,
    /// The Envoy cluster that holds only this apiserver.
    pub cluster: String,
    /// What the apiserver reports as its version (informational).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The states of the feature gates the edge routes on ([`crate::features::ROUTED`]), as the
    /// apiserver reports them. A gate not listed is unknown and taken as enabled: the edge never
    /// narrows where an apiserver goes on a guess.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, bool>,
}

impl ApiserverConfig {
    /// Whether the apiserver has `gate`, or may have it (not reported).
    pub fn may_have(&self, gate: &str) -> bool {
        self.features.get(gate) != Some(&false)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetConfig {
    pub cluster: String,
    pub members: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupVersionConfig {
    /// "" for the core group.
    pub group: String,
    pub version: String,
    /// The apiservers whose discovery lists this group/version.
    pub served_by: Vec<String>,
    /// Resource (plural) → the apiservers that serve it.
    pub resources: BTreeMap<String, Vec<String>>,
    /// Backed by a CRD or an aggregated APIService ([`crate::extensions`]): every apiserver
    /// serves it, whatever its discovery says, so `served_by` is every apiserver.
    #[serde(default, skip_serializing_if = "is_false")]
    pub extension: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Upper-case hex, without quotes.
    pub etag: String,
    /// The serialised `APIGroupDiscoveryList`, answered as is.
    pub document: String,
}

/// Why a table was refused: the JSON path of the offending field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError {
    pub field: String,
    pub reason: String,
    /// The table is well-formed but over one of the size limits (`MAX_*`).
    pub over_limit: bool,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.over_limit { "routing table over a size limit" } else { "invalid routing table" };
        write!(f, "{what}: {}: {}", self.field, self.reason)
    }
}

impl std::error::Error for TableError {}

fn err(field: impl Into<String>, reason: impl Into<String>) -> TableError {
    TableError { field: field.into(), reason: reason.into(), over_limit: false }
}

fn over_limit(field: &str, what: &str, count: usize, limit: usize, name: &str) -> TableError {
    TableError {
        field: field.into(),
        reason: format!("{count} {what}, over the limit of {limit} ({name})"),
        over_limit: true,
    }
}

/// Refuses a table by its size alone, before anything is allocated for it: the filter calls this
/// with the configuration's length before reading it.
pub fn check_table_bytes(len: usize) -> Result<(), TableError> {
    if len > MAX_TABLE_BYTES {
        return Err(over_limit("(document)", "bytes", len, MAX_TABLE_BYTES, "MAX_TABLE_BYTES"));
    }
    Ok(())
}

/// Refuses a parsed table whose counts are over the limits, before any look-up map is built.
fn check_counts(config: &TableConfig) -> Result<(), TableError> {
    let group_versions = config.group_versions.len();
    if group_versions > MAX_GROUP_VERSIONS {
        return Err(over_limit(
            "groupVersions",
            "group/versions",
            group_versions,
            MAX_GROUP_VERSIONS,
            "MAX_GROUP_VERSIONS",
        ));
    }
    let gvrs: usize = config.group_versions.iter().map(|gv| gv.resources.len()).sum();
    if gvrs > MAX_GVRS {
        return Err(over_limit("groupVersions[*].resources", "GVRs", gvrs, MAX_GVRS, "MAX_GVRS"));
    }
    if config.sets.len() > MAX_SETS {
        return Err(over_limit("sets", "set clusters", config.sets.len(), MAX_SETS, "MAX_SETS"));
    }
    // A table compiled without its JSON (the sidecar's own checks) is bounded by the documents
    // it carries, which are most of its size.
    let merged = config.discovery.as_ref().map_or(0, |d| d.document.len());
    check_table_bytes(merged).map_err(|e| TableError { field: "discovery.document".into(), ..e })?;
    let legacy: usize = config.legacy_discovery.iter().map(|d| d.document.len() + d.path.len()).sum();
    check_table_bytes(merged + legacy)
        .map_err(|e| TableError { field: "legacyDiscovery[*].document".into(), ..e })
}

/// Which apiservers serve something, as the cluster that reaches exactly them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// Every apiserver: the pool.
    All,
    /// A proper subset: index into [`RoutingTable::sets`].
    Set(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Apiserver {
    pub id: String,
    pub cluster: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingSet {
    pub cluster: String,
    /// The twin for requests without credentials (see [`TableConfig::anonymous_cluster_prefix`]).
    pub anonymous_cluster: Option<String>,
    /// Apiserver ids, in table order.
    pub members: Vec<String>,
    mask: u64,
}

/// One (group, version, resource) the table knows, with a dense id for per-GVR metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gvr {
    pub id: usize,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub serving: Serving,
}

#[derive(Debug)]
struct GroupEntry {
    serving: Serving,
    versions: HashMap<String, VersionEntry>,
}

#[derive(Debug)]
struct VersionEntry {
    serving: Serving,
    /// Resource → index into `RoutingTable::gvrs`.
    resources: HashMap<String, usize>,
}

/// A validated table, ready for per-request look-ups.
#[derive(Debug)]
pub struct RoutingTable {
    generation: String,
    apiservers: Vec<Apiserver>,
    pool_cluster: String,
    anonymous_pool_cluster: Option<String>,
    sets: Vec<ServingSet>,
    gvrs: Vec<Gvr>,
    groups: HashMap<String, GroupEntry>,
    merged: Option<MergedDiscovery>,
    legacy: LegacyDocuments,
    policy: PolicyConfig,
    openapi_cluster: Option<String>,
    /// For each of [`crate::features::ROUTED`], the apiservers that have (or may have) it, as a
    /// member mask.
    gate_members: [u64; crate::features::ROUTED.len()],
}

/// The peer-aggregated `/apis` answer, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedDiscovery {
    /// With the quotes the `ETag` header and `If-None-Match` carry. kube-apiserver computes it
    /// from the JSON form and sends the same one with every encoding.
    pub quoted_etag: String,
    pub document: String,
    /// The protobuf form, encoded on first use (see [`LegacyDocument`](crate::legacy_documents::LegacyDocument)).
    protobuf: OnceLock<Option<Vec<u8>>>,
    /// The JSON indented ([`crate::pretty`]), on first use.
    pretty: OnceLock<Vec<u8>>,
}

impl MergedDiscovery {
    pub fn new(quoted_etag: String, document: String) -> Self {
        MergedDiscovery { quoted_etag, document, protobuf: OnceLock::new(), pretty: OnceLock::new() }
    }

    /// The document as kube-apiserver writes it for a pretty request.
    pub fn pretty(&self) -> &[u8] {
        self.pretty.get_or_init(|| crate::pretty::indent(self.document.as_bytes()))
    }

    /// The document as kube-apiserver writes it for
    /// `application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`.
    pub fn protobuf(&self) -> Option<&[u8]> {
        self.protobuf
            .get_or_init(|| {
                let list = ApiGroupDiscoveryList::from_json(self.document.as_bytes()).ok()?;
                Some(list.to_protobuf())
            })
            .as_deref()
    }
}

pub(crate) fn parse(bytes: &[u8]) -> Result<TableConfig, TableError> {
    check_table_bytes(bytes.len())?;
    serde_json::from_slice(bytes).map_err(|e| {
        let field = if e.is_syntax() || e.is_eof() { "(document)" } else { "(schema)" };
        err(field, e.to_string())
    })
}

/// Refuses a parsed table of another schema or over the limits, before its seal is hashed or
/// any look-up map is built.
pub(crate) fn check_shape(config: &TableConfig) -> Result<(), TableError> {
    if config.schema != SCHEMA_VERSION {
        return Err(err(
            "schema",
            format!("unsupported schema {} (this build reads schema {SCHEMA_VERSION})", config.schema),
        ));
    }
    check_counts(config)
}

impl RoutingTable {
    /// Validates a table [`check_shape`] and its seal have passed and builds the look-up maps;
    /// every way in is [`RoutingTable::compile`] (`load.rs`).
    pub(crate) fn from_checked(config: TableConfig) -> Result<Self, TableError> {
        let apiservers = compile_apiservers(&config.apiservers)?;
        let mut clusters: HashMap<String, String> = HashMap::new();
        for (i, a) in config.apiservers.iter().enumerate() {
            claim_cluster(&mut clusters, &a.cluster, format!("apiservers[{i}].cluster"))?;
        }
        claim_cluster(&mut clusters, &config.pool_cluster, "poolCluster".to_string())?;
        let anonymous_pool_cluster = config.anonymous_cluster(&config.pool_cluster);
        if let Some(name) = &anonymous_pool_cluster {
            claim_cluster(&mut clusters, name, "anonymousClusterPrefix (pool twin)".to_string())?;
        }
        if let Some(name) = &config.openapi_cluster {
            claim_cluster(&mut clusters, name, "openapiCluster".to_string())?;
        }
        let all_mask = full_mask(apiservers.len());
        let ids: HashMap<&str, usize> =
            config.apiservers.iter().enumerate().map(|(i, a)| (a.id.as_str(), i)).collect();

        let mut sets = Vec::with_capacity(config.sets.len());
        let mut set_by_mask: HashMap<u64, usize> = HashMap::new();
        for (i, s) in config.sets.iter().enumerate() {
            let field = format!("sets[{i}]");
            claim_cluster(&mut clusters, &s.cluster, format!("{field}.cluster"))?;
            let mask = member_mask(&ids, &s.members, &format!("{field}.members"))?;
            if mask == all_mask {
                return Err(err(
                    format!("{field}.members"),
                    "names every apiserver: that is the pool, use poolCluster",
                ));
            }
            if let Some(prev) = set_by_mask.insert(mask, i) {
                return Err(err(format!("{field}.members"), format!("same members as sets[{prev}]")));
            }
            let anonymous_cluster = config.anonymous_cluster(&s.cluster);
            if let Some(name) = &anonymous_cluster {
                claim_cluster(&mut clusters, name, format!("anonymousClusterPrefix (twin of {field})"))?;
            }
            sets.push(ServingSet {
                cluster: s.cluster.clone(),
                anonymous_cluster,
                members: s.members.clone(),
                mask,
            });
        }
        let serving_for = |mask: u64, field: &str| -> Result<Serving, TableError> {
            if mask == all_mask {
                return Ok(Serving::All);
            }
            set_by_mask.get(&mask).map(|&i| Serving::Set(i)).ok_or_else(|| {
                err(
                    field,
                    format!("no set cluster has exactly the members {}", describe_mask(&apiservers, mask)),
                )
            })
        };

        let mut gvrs = Vec::new();
        let mut groups: HashMap<String, (u64, HashMap<String, VersionEntry>)> = HashMap::new();
        for (i, gv) in config.group_versions.iter().enumerate() {
            let field = format!("groupVersions[{i}]");
            check_group(&gv.group, &format!("{field}.group"))?;
            check_segment(&gv.version, &format!("{field}.version"))?;
            let gv_mask = member_mask(&ids, &gv.served_by, &format!("{field}.servedBy"))?;
            let mut resources = HashMap::with_capacity(gv.resources.len());
            for (resource, served_by) in &gv.resources {
                let rfield = format!("{field}.resources[{resource:?}]");
                check_segment(resource, &rfield)?;
                let mask = member_mask(&ids, served_by, &rfield)?;
                if mask & !gv_mask != 0 {
                    return Err(err(
                        rfield,
                        format!(
                            "served by {} but the group/version is only served by {}",
                            describe_mask(&apiservers, mask),
                            describe_mask(&apiservers, gv_mask)
                        ),
                    ));
                }
                let serving = serving_for(mask, &rfield)?;
                resources.insert(resource.clone(), gvrs.len());
                gvrs.push(Gvr {
                    id: gvrs.len(),
                    group: gv.group.clone(),
                    version: gv.version.clone(),
                    resource: resource.clone(),
                    serving,
                });
            }
            let entry =
                VersionEntry { serving: serving_for(gv_mask, &format!("{field}.servedBy"))?, resources };
            let (group_mask, versions) = groups.entry(gv.group.clone()).or_default();
            *group_mask |= gv_mask;
            if versions.insert(gv.version.clone(), entry).is_some() {
                return Err(err(
                    format!("{field}.version"),
                    format!("{}/{} is listed twice", display_group(&gv.group), gv.version),
                ));
            }
        }
        let groups = groups
            .into_iter()
            .map(|(name, (mask, versions))| {
                let field = format!("groupVersions (group {})", display_group(&name));
                Ok((name, GroupEntry { serving: serving_for(mask, &field)?, versions }))
            })
            .collect::<Result<HashMap<_, _>, TableError>>()?;

        let merged = match config.discovery {
            Some(d) => {
                check_etag(&d.etag)?;
                if serde_json::from_str::<serde::de::IgnoredAny>(&d.document).is_err() {
                    return Err(err("discovery.document", "is not a JSON document"));
                }
                Some(MergedDiscovery::new(format!("\"{}\"", d.etag), d.document))
            }
            None => None,
        };

        let gate_members = crate::features::ROUTED.map(|gate| feature_mask(&config.apiservers, gate));
        let legacy = LegacyDocuments::compile(config.legacy_discovery, |g, v| {
            groups.get(g).is_some_and(|entry| v.is_none_or(|v| entry.versions.contains_key(v)))
        })
        .map_err(|(field, reason)| err(field, reason))?;

        Ok(Self {
            generation: config.generation,
            apiservers,
            pool_cluster: config.pool_cluster,
            anonymous_pool_cluster,
            sets,
            gvrs,
            groups,
            merged,
            legacy,
            policy: config.policy,
            openapi_cluster: config.openapi_cluster,
            gate_members,
        })
    }

    /// Where a request of a resource served by `serving` that uses the features `gates` (a mask
    /// of [`crate::features::bit`]s) goes: the members that have them all, when only some of them
    /// do and the table has their set. `None`: as any other request, since they all have them, or
    /// none does (each answers alike: a streaming list's 422, a gated field refused or dropped).
    pub fn with_features(&self, serving: Serving, gates: u32) -> Option<Serving> {
        let members = self.mask(serving);
        let narrowed = with_gates(members, &self.gate_members, gates);
        if narrowed == members || narrowed == 0 {
            return None;
        }
        self.sets.iter().position(|s| s.mask == narrowed).map(Serving::Set)
    }

    fn mask(&self, serving: Serving) -> u64 {
        match serving {
            Serving::All => full_mask(self.apiservers.len()),
            Serving::Set(i) => self.sets.get(i).map_or(0, |s| s.mask),
        }
    }

    pub fn generation(&self) -> &str {
        &self.generation
    }

    pub fn apiservers(&self) -> &[Apiserver] {
        &self.apiservers
    }

    pub fn pool_cluster(&self) -> &str {
        &self.pool_cluster
    }

    pub fn sets(&self) -> &[ServingSet] {
        &self.sets
    }

    /// Every GVR in the table, indexed by [`Gvr::id`].
    pub fn gvrs(&self) -> &[Gvr] {
        &self.gvrs
    }

    pub fn merged_discovery(&self) -> Option<&MergedDiscovery> {
        self.merged.as_ref()
    }

    /// The composed legacy discovery documents.
    pub fn legacy_discovery(&self) -> &LegacyDocuments {
        &self.legacy
    }

    /// Where composed OpenAPI documents come from, if the edge composes them.
    pub fn openapi_cluster(&self) -> Option<&str> {
        self.openapi_cluster.as_deref()
    }

    pub fn policy(&self) -> PolicyConfig {
        self.policy
    }

    /// The GVR entry, if any apiserver serves it.
    pub fn gvr(&self, group: &str, version: &str, resource: &str) -> Option<&Gvr> {
        let id = *self.groups.get(group)?.versions.get(version)?.resources.get(resource)?;
        self.gvrs.get(id)
    }

    /// Who lists `/apis/<group>/<version>` in discovery.
    pub fn group_version(&self, group: &str, version: &str) -> Option<Serving> {
        Some(self.groups.get(group)?.versions.get(version)?.serving)
    }

    /// Who lists `/apis/<group>` in discovery (the union over its versions).
    pub fn group(&self, group: &str) -> Option<Serving> {
        Some(self.groups.get(group)?.serving)
    }

    /// The cluster for a request without credentials: the twin of [`RoutingTable::cluster`]
    /// without the front-proxy certificate, or that cluster itself when the table has no twins.
    pub fn anonymous_cluster(&self, serving: Serving) -> &str {
        let twin = match serving {
            Serving::All => self.anonymous_pool_cluster.as_deref(),
            Serving::Set(i) => self.sets.get(i).and_then(|s| s.anonymous_cluster.as_deref()),
        };
        twin.unwrap_or_else(|| self.cluster(serving))
    }

    /// Whether `name` is one of the table's clusters (a serving set's, the pool's, or their
    /// anonymous twins).
    pub fn has_cluster(&self, name: &str) -> bool {
        let pool = [Some(self.pool_cluster.as_str()), self.anonymous_pool_cluster.as_deref()];
        let sets = self.sets.iter().flat_map(|s| [Some(s.cluster.as_str()), s.anonymous_cluster.as_deref()]);
        pool.into_iter().chain(sets).flatten().any(|c| c == name)
    }

    /// The cluster that reaches exactly the apiservers of `serving`.
    pub fn cluster(&self, serving: Serving) -> &str {
        match serving {
            Serving::All => &self.pool_cluster,
            Serving::Set(i) => self.sets.get(i).map_or(&self.pool_cluster, |s| &s.cluster),
        }
    }

    /// The apiserver ids of `serving`, in table order.
    pub fn members(&self, serving: Serving) -> impl Iterator<Item = &str> {
        let mask = self.mask(serving);
        self.apiservers
            .iter()
            .enumerate()
            .filter(move |(i, _)| mask & (1u64 << i) != 0)
            .map(|(_, a)| a.id.as_str())
    }
}

impl TableConfig {
    /// Member lists (in apiserver order) of every proper subset of apiservers that some entry of
    /// the table is served by: each needs a set cluster. Resources, group/versions and the
    /// union over each group's versions (for `/apis/<group>`) all count.
    pub fn needed_sets(&self) -> Vec<Vec<String>> {
        self.sets_needed(true)
    }

    /// [`TableConfig::needed_sets`] but those only requests that use a feature go to (streaming
    /// lists, writes of gated fields): the sets ordinary requests are routed to.
    pub fn serving_sets(&self) -> Vec<Vec<String>> {
        self.sets_needed(false)
    }

    fn sets_needed(&self, featured: bool) -> Vec<Vec<String>> {
        let index: HashMap<&str, usize> =
            self.apiservers.iter().enumerate().map(|(i, a)| (a.id.as_str(), i)).collect();
        let mask_of = |ids: &[String]| {
            ids.iter().filter_map(|id| index.get(id.as_str())).fold(0u64, |m, &i| m | (1u64 << (i % 64)))
        };
        let all = full_mask(self.apiservers.len());
        let mut masks = std::collections::BTreeSet::new();
        let mut groups: BTreeMap<&str, u64> = BTreeMap::new();
        // Who serves each gated resource (in any version), cut down below for its fields' gates.
        let mut gated: Vec<(u32, u64)> = Vec::new();
        for gv in &self.group_versions {
            let gv_mask = mask_of(&gv.served_by);
            masks.insert(gv_mask);
            *groups.entry(gv.group.as_str()).or_default() |= gv_mask;
            masks.extend(gv.resources.values().map(|ids| mask_of(ids)));
            for gated_resource in crate::features::GATED.iter().filter(|g| g.group == gv.group) {
                if let Some(ids) = gv.resources.get(gated_resource.resource) {
                    gated.push((gated_resource.gates(), mask_of(ids)));
                }
            }
        }
        masks.extend(groups.into_values());
        if !featured {
            return sets_of(&self.apiservers, masks, all);
        }
        let gate_members = crate::features::ROUTED.map(|gate| feature_mask(&self.apiservers, gate));
        // A streaming list goes to the apiservers of its resource that have the feature: each
        // serving set (and the pool) cut down to them is a set too.
        let watch_list = crate::features::bit(crate::features::WATCH_LIST);
        let mut narrowed: Vec<u64> =
            masks.iter().chain([&all]).map(|&m| with_gates(m, &gate_members, watch_list)).collect();
        // A write that sets gated fields goes to the apiservers of its resource that have every
        // gate it uses: any combination of its fields' gates (each non-empty subset of `gates`).
        for (gates, serving) in gated {
            let mut combination = gates;
            while combination != 0 {
                narrowed.push(with_gates(serving, &gate_members, combination));
                combination = (combination - 1) & gates;
            }
        }
        masks.extend(narrowed);
        sets_of(&self.apiservers, masks, all)
    }

    /// Replaces `sets` with exactly the needed ones, named by `cluster_name(members)`.
    pub fn assign_sets(&mut self, cluster_name: impl Fn(&[String]) -> String) {
        self.sets = self
            .needed_sets()
            .into_iter()
            .map(|members| SetConfig { cluster: cluster_name(&members), members })
            .collect();
    }
}

/// The member lists (in apiserver order) of `masks`, but none and all.
fn sets_of(
    apiservers: &[ApiserverConfig],
    masks: std::collections::BTreeSet<u64>,
    all: u64,
) -> Vec<Vec<String>> {
    masks
        .into_iter()
        .filter(|&m| m != 0 && m != all)
        .map(|m| {
            apiservers
                .iter()
                .enumerate()
                .filter(|(i, _)| m & (1u64 << i) != 0)
                .map(|(_, a)| a.id.clone())
                .collect()
        })
        .collect()
}

/// The apiservers of `members` that have (or may have) every gate of `gates` (a mask of
/// [`crate::features::bit`]s), by the apiservers each gate has (`gate_members`, in
/// [`crate::features::ROUTED`]'s order).
fn with_gates(members: u64, gate_members: &[u64], gates: u32) -> u64 {
    gate_members
        .iter()
        .enumerate()
        .filter(|(i, _)| gates & (1 << i) != 0)
        .fold(members, |m, (_, have)| m & have)
}

/// The apiservers that have (or may have) `gate`, as a member mask.
fn feature_mask(apiservers: &[ApiserverConfig], gate: &str) -> u64 {
    apiservers
        .iter()
        .enumerate()
        .filter(|(_, a)| a.may_have(gate))
        .fold(0u64, |m, (i, _)| m | (1u64 << (i % 64)))
}

fn compile_apiservers(configs: &[ApiserverConfig]) -> Result<Vec<Apiserver>, TableError> {
    if configs.is_empty() {
        return Err(err("apiservers", "must name at least one apiserver"));
    }
    if configs.len() > MAX_APISERVERS {
        return Err(err("apiservers", format!("at most {MAX_APISERVERS} apiservers are supported")));
    }
    let mut seen = HashMap::new();
    for (i, a) in configs.iter().enumerate() {
        let field = format!("apiservers[{i}].id");
        if a.id.is_empty() || a.id.chars().any(|c| c.is_control() || c == ',') {
            return Err(err(field, "must be non-empty, without commas or control characters"));
        }
        if let Some(prev) = seen.insert(a.id.as_str(), i) {
            return Err(err(field, format!("{:?} is also apiservers[{prev}].id", a.id)));
        }
    }
    Ok(configs
        .iter()
        .map(|a| Apiserver { id: a.id.clone(), cluster: a.cluster.clone(), version: a.version.clone() })
        .collect())
}

/// Cluster names travel in a request header and name Envoy clusters: keep them to Envoy's
/// conventional charset and make sure no two roles share one.
fn claim_cluster(
    clusters: &mut HashMap<String, String>,
    name: &str,
    field: String,
) -> Result<(), TableError> {
    let valid = !name.is_empty()
        && name.len() <= 200
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !valid {
        return Err(err(field, format!("{name:?} is not a cluster name (1-200 of [A-Za-z0-9._-])")));
    }
    if let Some(prev) = clusters.insert(name.to_owned(), field.clone()) {
        return Err(err(field, format!("cluster {name:?} is already used by {prev}")));
    }
    Ok(())
}

fn member_mask(ids: &HashMap<&str, usize>, members: &[String], field: &str) -> Result<u64, TableError> {
    if members.is_empty() {
        return Err(err(field, "must name at least one apiserver"));
    }
    let mut mask = 0u64;
    for m in members {
        let bit = ids
            .get(m.as_str())
            .map(|&i| 1u64 << i)
            .ok_or_else(|| err(field, format!("unknown apiserver {m:?}")))?;
        if mask & bit != 0 {
            return Err(err(field, format!("apiserver {m:?} is named twice")));
        }
        mask |= bit;
    }
    Ok(mask)
}

fn full_mask(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

fn describe_mask(apiservers: &[Apiserver], mask: u64) -> String {
    let ids: Vec<&str> = apiservers
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1u64 << i) != 0)
        .map(|(_, a)| a.id.as_str())
        .collect();
    format!("[{}]", ids.join(","))
}

fn display_group(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

/// A path segment as it can appear in a request path: non-empty, no '/', nothing to escape.
fn check_segment(value: &str, field: &str) -> Result<(), TableError> {
    let valid = !value.is_empty()
        && value.len() <= 253
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if valid { Ok(()) } else { Err(err(field, format!("{value:?} is not a valid path segment"))) }
}

fn check_group(group: &str, field: &str) -> Result<(), TableError> {
    if group.is_empty() { Ok(()) } else { check_segment(group, field) }
}

fn check_etag(etag: &str) -> Result<(), TableError> {
    let valid = !etag.is_empty() && etag.len() <= 256 && etag.bytes().all(|b| b.is_ascii_hexdigit());
    if valid { Ok(()) } else { Err(err("discovery.etag", "must be hex digits, without quotes")) }
}

#[cfg(test)]
pub(crate) mod tests {

    use super::*;
    use crate::testing::sample;
    use serde_json::{Value, json};

    fn compile(v: &Value) -> Result<RoutingTable, TableError> {
        RoutingTable::from_json(v.to_string().as_bytes())
    }

    #[test]
    fn sample_compiles_and_answers_lookups() {
        let t = compile(&sample()).unwrap();
        assert_eq!(t.gvrs().len(), 7);
        let rc = t.gvr("resource.k8s.io", "v1", "resourceclaims").unwrap();
        assert_eq!(t.cluster(rc.serving), "set-c");
        let dc = t.gvr("resource.k8s.io", "v1alpha3", "deviceclasses").unwrap();
        assert_eq!(t.cluster(dc.serving), "set-a-b");
        assert_eq!(t.members(dc.serving).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(t.gvr("", "v1", "pods").unwrap().serving, Serving::All);
        assert!(t.gvr("", "v1", "nodes").is_none());
        assert!(t.gvr("nope", "v1", "pods").is_none());
        assert_eq!(t.group("resource.k8s.io"), Some(Serving::All));
        assert_eq!(t.group("lifecycle.k8s.io").map(|s| t.cluster(s)), Some("set-c"));
        assert_eq!(t.group_version("resource.k8s.io", "v1").map(|s| t.cluster(s)), Some("set-c"));
        assert_eq!(t.members(Serving::All).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(t.policy().strip_downstream_peer_proxied && t.policy().client_cert_identity);
        assert!(["pool", "set-c", "set-a-b"].iter().all(|c| t.has_cluster(c)));
        assert!(!t.has_cluster("set-a") && !t.has_cluster(""));
        for (i, g) in t.gvrs().iter().enumerate() {
            assert_eq!(g.id, i);
        }
    }

    /// Each malformed field is refused with its own field path and reason.
    #[test]
    fn validation_names_the_field() {
        type Edit = fn(&mut Value);
        let cases: Vec<(&str, Edit, &str, &str)> = vec![
            ("schema", |v| v["schema"] = json!(2), "schema", "unsupported schema 2"),
            ("no apiservers", |v| v["apiservers"] = json!([]), "apiservers", "at least one"),
            ("dup id", |v| v["apiservers"][1]["id"] = json!("a"), "apiservers[1].id", "also apiservers[0]"),
            ("empty id", |v| v["apiservers"][0]["id"] = json!(""), "apiservers[0].id", "non-empty"),
            (
                "bad cluster",
                |v| v["apiservers"][0]["cluster"] = json!("a b"),
                "apiservers[0].cluster",
                "not a cluster name",
            ),
            (
                "pool clash",
                |v| v["poolCluster"] = json!("apiserver-a"),
                "poolCluster",
                "already used by apiservers[0].cluster",
            ),
            (
                "set clash",
                |v| v["sets"][0]["cluster"] = json!("pool"),
                "sets[0].cluster",
                "already used by poolCluster",
            ),
            (
                "set unknown",
                |v| v["sets"][0]["members"] = json!(["z"]),
                "sets[0].members",
                "unknown apiserver \"z\"",
            ),
            ("set empty", |v| v["sets"][0]["members"] = json!([]), "sets[0].members", "at least one"),
            ("set twice", |v| v["sets"][1]["members"] = json!(["a", "a"]), "sets[1].members", "named twice"),
            (
                "set all",
                |v| v["sets"][1]["members"] = json!(["a", "b", "c"]),
                "sets[1].members",
                "that is the pool",
            ),
            (
                "set dup",
                |v| v["sets"][1]["members"] = json!(["c"]),
                "sets[1].members",
                "same members as sets[0]",
            ),
            (
                "missing set",
                |v| v["sets"] = json!([{"cluster": "set-c", "members": ["c"]}]),
                "groupVersions[3].resources[\"deviceclasses\"]",
                "no set cluster has exactly the members [a,b]",
            ),
            (
                "bad group",
                |v| v["groupVersions"][1]["group"] = json!("resource/k8s"),
                "groupVersions[1].group",
                "not a valid path segment",
            ),
            (
                "bad version",
                |v| v["groupVersions"][1]["version"] = json!(""),
                "groupVersions[1].version",
                "not a valid path segment",
            ),
            (
                "bad resource",
                |v| v["groupVersions"][1]["resources"] = json!({"a b": ["c"]}),
                "groupVersions[1].resources[\"a b\"]",
                "not a valid path segment",
            ),
            (
                "resource outside gv",
                |v| v["groupVersions"][1]["resources"]["resourceclaims"] = json!(["a"]),
                "groupVersions[1].resources[\"resourceclaims\"]",
                "only served by [c]",
            ),
            (
                "gv twice",
                |v| v["groupVersions"][2]["version"] = json!("v1"),
                "groupVersions[2].version",
                "listed twice",
            ),
            (
                "gv unknown",
                |v| v["groupVersions"][0]["servedBy"] = json!(["x"]),
                "groupVersions[0].servedBy",
                "unknown apiserver",
            ),
            ("etag quoted", |v| v["discovery"]["etag"] = json!("\"AB\""), "discovery.etag", "hex digits"),
            (
                "doc garbage",
                |v| v["discovery"]["document"] = json!("{nope"),
                "discovery.document",
                "not a JSON document",
            ),
            ("unknown field", |v| v["surprise"] = json!(1), "(schema)", "unknown field `surprise`"),
            ("wrong type", |v| v["schema"] = json!("one"), "(schema)", "invalid type"),
            (
                "missing pool",
                |v| {
                    v.as_object_mut().unwrap().remove("poolCluster");
                },
                "(schema)",
                "missing field `poolCluster`",
            ),
        ];
        for (name, edit, field, reason) in cases {
            let mut v = sample();
            edit(&mut v);
            let e = compile(&v).expect_err(name);
            assert_eq!(e.field, field, "{name}: {e}");
            assert!(e.reason.contains(reason), "{name}: {e}");
        }
        let e = RoutingTable::from_json(b"{\"schema\": 1,").unwrap_err();
        assert_eq!(e.field, "(document)");
        assert!(e.to_string().starts_with("invalid routing table: (document): "));
    }

    /// A table of `gvs` group/versions with `per_gv` resources each, all served by "a".
    fn wide(gvs: usize, per_gv: usize) -> TableConfig {
        let mut config: TableConfig = serde_json::from_value(sample()).unwrap();
        config.sets.clear();
        config.discovery = None;
        let a = vec!["a".to_string()];
        config.apiservers.truncate(1);
        config.group_versions = (0..gvs)
            .map(|g| GroupVersionConfig {
                group: format!("g{g}.example.com"),
                version: "v1".into(),
                served_by: a.clone(),
                resources: (0..per_gv).map(|r| (format!("r{r}"), a.clone())).collect(),
                extension: false,
            })
            .collect();
        config
    }

    /// A small valid table, padded with whitespace to `len` bytes.
    fn padded_table(len: usize) -> String {
        let mut json = serde_json::to_string(&wide(2, 1)).unwrap();
        json.push_str(&" ".repeat(len - json.len()));
        json
    }

    #[test]
    fn a_table_at_the_limits_compiles() {
        let t = RoutingTable::compile(wide(MAX_GROUP_VERSIONS, MAX_GVRS / MAX_GROUP_VERSIONS)).unwrap();
        assert_eq!(t.gvrs().len(), MAX_GVRS);
        let padded = padded_table(MAX_TABLE_BYTES);
        assert_eq!(padded.len(), MAX_TABLE_BYTES);
        RoutingTable::from_json(padded.as_bytes()).unwrap();
    }

    /// Each limit refuses the table one past it, names itself, and is told apart from a malformed
    /// table.
    #[test]
    fn each_limit_refuses_a_table_past_it() {
        let padded = padded_table(MAX_TABLE_BYTES + 1);
        let e = RoutingTable::from_json(padded.as_bytes()).unwrap_err();
        assert_eq!(e.field, "(document)");
        assert!(e.over_limit && e.reason.contains("MAX_TABLE_BYTES"), "{e}");
        assert!(
            e.to_string().starts_with("routing table over a size limit: (document): 16777217 bytes"),
            "{e}"
        );
        // By length alone: the same bytes need not even be JSON.
        assert!(check_table_bytes(MAX_TABLE_BYTES + 1).unwrap_err().over_limit);
        assert!(check_table_bytes(MAX_TABLE_BYTES).is_ok());

        let e = RoutingTable::compile(wide(MAX_GROUP_VERSIONS + 1, 1)).unwrap_err();
        assert_eq!((e.field.as_str(), e.over_limit), ("groupVersions", true), "{e}");
        assert!(e.reason.contains("10001 group/versions") && e.reason.contains("MAX_GROUP_VERSIONS"), "{e}");

        let e = RoutingTable::compile(wide(10, MAX_GVRS / 10 + 1)).unwrap_err();
        assert_eq!((e.field.as_str(), e.over_limit), ("groupVersions[*].resources", true), "{e}");
        assert!(e.reason.contains("50010 GVRs") && e.reason.contains("MAX_GVRS"), "{e}");

        let mut sets = wide(1, 1);
        sets.sets = (0..=MAX_SETS)
            .map(|i| SetConfig { cluster: format!("set-{i}"), members: vec!["a".into()] })
            .collect();
        let e = RoutingTable::compile(sets).unwrap_err();
        assert_eq!((e.field.as_str(), e.over_limit), ("sets", true), "{e}");

        let mut doc = wide(1, 1);
        doc.discovery =
            Some(DiscoveryConfig { etag: "AB".into(), document: " ".repeat(MAX_TABLE_BYTES + 1) });
        let e = RoutingTable::compile(doc).unwrap_err();
        assert_eq!((e.field.as_str(), e.over_limit), ("discovery.document", true), "{e}");

        // Legacy documents count with the merged one: each half fits, together they do not.
        let mut doc = wide(1, 1);
        let half = MAX_TABLE_BYTES / 2;
        doc.discovery = Some(DiscoveryConfig { etag: "AB".into(), document: " ".repeat(half) });
        doc.legacy_discovery = vec![crate::legacy_documents::LegacyDocumentConfig {
            path: "/apis".into(),
            inputs: vec!["a".into()],
            document: " ".repeat(half),
        }];
        let e = RoutingTable::compile(doc).unwrap_err();
        assert_eq!((e.field.as_str(), e.over_limit), ("legacyDiscovery[*].document", true), "{e}");

        let malformed = compile(&json!({"schema": 1})).unwrap_err();
        assert!(!malformed.over_limit);
    }

    #[test]
    fn group_union_needs_a_set() {
        let mut v = sample();
        // lifecycle.k8s.io now spans a and c: that union needs its own set.
        v["groupVersions"][4]["servedBy"] = json!(["a", "c"]);
        v["groupVersions"][4]["resources"]["evictions"] = json!(["a", "c"]);
        let e = compile(&v).unwrap_err();
        assert!(e.reason.contains("[a,c]"), "{e}");
        v["sets"].as_array_mut().unwrap().push(json!({"cluster": "set-a-c", "members": ["a", "c"]}));
        let t = compile(&v).unwrap();
        assert_eq!(t.group("lifecycle.k8s.io").map(|s| t.cluster(s)), Some("set-a-c"));
    }

    #[test]
    fn streaming_lists_need_each_set_cut_to_the_apiservers_with_the_feature() {
        let mut config: TableConfig = serde_json::from_value(sample()).unwrap();
        config.apiservers[1].features = BTreeMap::from([(crate::features::WATCH_LIST.to_owned(), false)]);
        let sets = config.needed_sets();
        // a and c: the pool and the sets of every-but-b cut down; a alone from {a, b}.
        for members in [vec!["a", "c"], vec!["a"], vec!["c"], vec!["a", "b"]] {
            assert!(sets.iter().any(|s| *s == members), "{members:?} in {sets:?}");
        }
        config.apiservers[1].features.clear();
        assert!(!config.needed_sets().iter().any(|s| *s == ["a", "c"]));
    }

    #[test]
    fn writes_of_gated_fields_need_their_resources_sets_cut_to_the_apiservers_with_the_gate() {
        let mut config: TableConfig = serde_json::from_value(sample()).unwrap();
        config.apiservers[1].features =
            BTreeMap::from([(crate::features::VOLUME_ATTRIBUTES_CLASS.to_owned(), false)]);
        // No gated resource served: no set for the gate.
        assert!(!config.needed_sets().iter().any(|s| *s == ["a", "c"]));
        config.group_versions[0].resources.insert(
            "persistentvolumeclaims".to_owned(),
            vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
        );
        assert!(config.needed_sets().iter().any(|s| *s == ["a", "c"]));
        // Only writes that set the field go there: not a set ordinary requests are routed to.
        assert!(!config.serving_sets().iter().any(|s| *s == ["a", "c"]));
    }

    #[test]
    fn needed_sets_cover_resources_versions_and_groups() {
        let mut config: TableConfig = serde_json::from_value(sample()).unwrap();
        config.sets.clear();
        assert_eq!(config.needed_sets(), [vec!["a", "b"], vec!["c"]]);
        config.group_versions[4].served_by = vec!["a".into(), "c".into()];
        config.group_versions[4].resources.insert("evictions".into(), vec!["a".into(), "c".into()]);
        config.assign_sets(|m| format!("set-{}", m.join("_")));
        let clusters: Vec<&str> = config.sets.iter().map(|s| s.cluster.as_str()).collect();
        assert_eq!(clusters, ["set-a_b", "set-c", "set-a_c"]);
        RoutingTable::compile(config).unwrap();
    }

    #[test]
    fn policy_defaults_and_round_trip() {
        let mut v = sample();
        v["policy"] = json!({"stripDownstreamPeerProxied": false});
        let t = compile(&v).unwrap();
        assert!(!t.policy().strip_downstream_peer_proxied);
        assert!(t.policy().client_cert_identity);
        let config: TableConfig = serde_json::from_value(sample()).unwrap();
        let again: TableConfig = serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
        assert_eq!(config, again);
    }
}
