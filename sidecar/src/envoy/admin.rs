//! What the sidecar asks Envoy's admin API while it changes the table: which clusters Envoy
//! has (and whether they have a healthy host), which routes and which table it runs, and
//! whether Envoy refused either. A trait, so that the write ordering can be tested against a fake Envoy.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use skewgate_core::table::TableConfig;

use skewgate_envoy::{FILTER_NAME, MODULE_FILTER_NAME, ROUTE_CONFIG_NAME, table_of_filter};

/// The `stat_prefix` of the bootstrap's HTTP connection manager, which roots its RDS stats.
const HCM_STAT_PREFIX: &str = "apiserver";

/// One cluster as `/clusters` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterHealth {
    /// The addresses (`ip:port`) of the hosts Envoy counts healthy here.
    pub healthy: BTreeSet<String>,
    /// ... of those it checked and counts unhealthy.
    pub failing: BTreeSet<String>,
    /// Hosts Envoy has not health-checked yet (`pending_active_hc`): a new cluster warming up.
    pub pending: usize,
}

impl ClusterHealth {
    pub fn hosts(&self) -> usize {
        self.healthy.len() + self.failing.len() + self.pending
    }
}

/// The routing table the filter runs now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveTable {
    pub generation: String,
    /// Every cluster it names: pool, apiservers, sets.
    pub clusters: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("envoy admin: {0}")]
pub struct AdminError(pub String);

pub trait EnvoyAdmin: Send + Sync {
    /// Every cluster Envoy has, warming ones included.
    fn clusters(&self) -> impl Future<Output = Result<BTreeMap<String, ClusterHealth>, AdminError>> + Send;
    /// The table of the skewgate filter's active ECDS config; `None` before the first one.
    fn live_table(&self) -> impl Future<Output = Result<Option<LiveTable>, AdminError>> + Send;
    /// `extension_config_discovery.http_filter.skewgate.update_rejected`.
    fn ecds_rejections(&self) -> impl Future<Output = Result<u64, AdminError>> + Send;
    /// The `version_info` of the route configuration Envoy runs (`rds.json`'s); `None` before
    /// the first one.
    fn live_routes(&self) -> impl Future<Output = Result<Option<String>, AdminError>> + Send;
    /// `http.apiserver.rds.apiservers.update_rejected`.
    fn rds_rejections(&self) -> impl Future<Output = Result<u64, AdminError>> + Send;
}

/// The real admin API over HTTP.
#[derive(Debug, Clone)]
pub struct HttpAdmin {
    base: String,
    client: reqwest::Client,
}

impl HttpAdmin {
    pub fn new(base: &str, timeout: Duration) -> Result<Self, AdminError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .build()
            .map_err(|e| AdminError(e.to_string()))?;
        Ok(Self { base: base.trim_end_matches('/').to_owned(), client })
    }

    async fn text(&self, path: &str, query: &[(&str, &str)]) -> Result<String, AdminError> {
        let url = format!("{}{path}", self.base);
        let response = self
            .client
            .get(&url)
            .query(query)
            .send()
            .await
            .map_err(|e| AdminError(format!("GET {url}: {}", crate::fetch::describe(&e))))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| AdminError(format!("GET {url}: {e}")))?;
        if !status.is_success() {
            return Err(AdminError(format!("GET {url}: {status}: {}", body.trim())));
        }
        Ok(body)
    }
}

impl EnvoyAdmin for HttpAdmin {
    async fn clusters(&self) -> Result<BTreeMap<String, ClusterHealth>, AdminError> {
        Ok(parse_clusters(&self.text("/clusters", &[]).await?))
    }

    async fn live_table(&self) -> Result<Option<LiveTable>, AdminError> {
        let text = self.text("/config_dump", &[("resource", "ecds_filters")]).await?;
        let dump: Value = serde_json::from_str(&text).map_err(|e| AdminError(format!("config_dump: {e}")))?;
        Ok(live_table_of(&dump))
    }

    async fn ecds_rejections(&self) -> Result<u64, AdminError> {
        self.counter(&format!("extension_config_discovery.http_filter.{FILTER_NAME}.update_rejected")).await
    }

    async fn live_routes(&self) -> Result<Option<String>, AdminError> {
        let text = self.text("/config_dump", &[("resource", "dynamic_route_configs")]).await?;
        let dump: Value = serde_json::from_str(&text).map_err(|e| AdminError(format!("config_dump: {e}")))?;
        Ok(live_routes_of(&dump))
    }

    async fn rds_rejections(&self) -> Result<u64, AdminError> {
        self.counter(&format!("http.{HCM_STAT_PREFIX}.rds.{ROUTE_CONFIG_NAME}.update_rejected")).await
    }
}

impl HttpAdmin {
    /// A counter by its full name; 0 while Envoy does not have it yet.
    async fn counter(&self, name: &str) -> Result<u64, AdminError> {
        let filter = format!("^{}$", name.replace('.', "\\."));
        let text = self.text("/stats", &[("filter", &filter)]).await?;
        Ok(parse_stats(&text).get(name).copied().unwrap_or(0))
    }
}

/// The `version_info` of the skewgate route configuration in
/// `/config_dump?resource=dynamic_route_configs`.
pub fn live_routes_of(dump: &Value) -> Option<String> {
    dump.get("configs")?
        .as_array()?
        .iter()
        .find(|c| c.pointer("/route_config/name").and_then(Value::as_str) == Some(ROUTE_CONFIG_NAME))?
        .get("version_info")?
        .as_str()
        .map(str::to_owned)
}

/// `/clusters` text: `name::host:port::health_flags::healthy` per host, plus per-cluster lines
/// such as `name::added_via_api::true` that show a cluster without hosts. An IPv6 host has `::`
/// of its own (`[fd00::1]:6443`), so the fields are taken from both ends.
pub fn parse_clusters(text: &str) -> BTreeMap<String, ClusterHealth> {
    let mut clusters: BTreeMap<String, ClusterHealth> = BTreeMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once("::").filter(|(n, _)| !n.is_empty()) else { continue };
        let entry = clusters.entry(name.to_owned()).or_default();
        let mut fields = rest.rsplitn(3, "::");
        let (value, field, host) = (fields.next(), fields.next(), fields.next());
        if let (Some(flags), Some("health_flags"), Some(host)) = (value, field, host) {
            if flags == "healthy" {
                entry.healthy.insert(host.to_owned());
            } else if flags.contains("pending_active_hc") {
                entry.pending += 1;
            } else {
                entry.failing.insert(host.to_owned());
            }
        }
    }
    clusters
}

/// `name: value` lines of `/stats`, numbers only.
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| l.rsplit_once(": "))
        .filter_map(|(k, v)| v.trim().parse().ok().map(|v| (k.trim().to_owned(), v)))
        .collect()
}

/// The skewgate filter's table in `/config_dump?resource=ecds_filters`. With the native module
/// (docs/native-module.md), the module's table where it differs: a table is live once both run
/// it, since either may route to its clusters.
pub fn live_table_of(dump: &Value) -> Option<LiveTable> {
    let configs = dump.get("configs")?.as_array()?;
    // A dumped filter has the shape of one ECDS resource.
    let table_of = |name: &str| {
        let filter = configs
            .iter()
            .filter_map(|c| c.get("ecds_filter"))
            .find(|f| f.get("name").and_then(Value::as_str) == Some(name))?;
        table_summary(table_of_filter(filter)?)
    };
    let filter = table_of(FILTER_NAME)?;
    match table_of(MODULE_FILTER_NAME) {
        Some(module) if module.generation != filter.generation => Some(module),
        _ => Some(filter),
    }
}

impl LiveTable {
    /// What the filter will run once `table` is live.
    pub fn of(table: &TableConfig) -> Self {
        let clusters = std::iter::once(&table.pool_cluster)
            .chain(table.apiservers.iter().map(|a| &a.cluster))
            .chain(table.sets.iter().map(|s| &s.cluster))
            .cloned()
            .collect();
        Self { generation: table.generation.clone(), clusters }
    }
}

/// The fields of a table [`LiveTable`] needs, read from whatever table Envoy runs: a table of
/// another skewgate version (fields this one does not know) still says which clusters it uses.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Routed {
    #[serde(default)]
    generation: String,
    pool_cluster: String,
    #[serde(default)]
    apiservers: Vec<Named>,
    #[serde(default)]
    sets: Vec<Named>,
}

#[derive(Deserialize)]
struct Named {
    cluster: String,
}

/// Generation and cluster names of a table's JSON, as Envoy holds it.
pub fn table_summary(table_json: &str) -> Option<LiveTable> {
    let table: Routed = serde_json::from_str(table_json).ok()?;
    let clusters = std::iter::once(table.pool_cluster)
        .chain(table.apiservers.into_iter().map(|a| a.cluster))
        .chain(table.sets.into_iter().map(|s| s.cluster))
        .collect();
    Some(LiveTable { generation: table.generation, clusters })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clusters_text() {
        let text = "pool::observability_name::pool\npool::added_via_api::true\n\
            pool::127.0.0.1:1::cx_active::0\npool::127.0.0.1:1::health_flags::healthy\n\
            pool::127.0.0.1:2::health_flags::/failed_active_hc\nempty::added_via_api::true\n";
        let c = parse_clusters(text);
        let healthy = BTreeSet::from(["127.0.0.1:1".to_owned()]);
        let failing = BTreeSet::from(["127.0.0.1:2".to_owned()]);
        assert_eq!(c["pool"], ClusterHealth { healthy, failing, pending: 0 });
        assert_eq!(c["empty"], ClusterHealth::default());
        let v6 = parse_clusters(
            "set::[fd00::11]:6443::health_flags::healthy\nset::[fd00::12]:6443::health_flags::/failed_active_hc\n\
             set::[fd00::13]:6443::health_flags::/failed_active_hc/pending_active_hc\n",
        );
        assert_eq!(v6["set"].hosts(), 3);
        assert_eq!(v6["set"].pending, 1);
        assert_eq!(v6["set"].healthy, BTreeSet::from(["[fd00::11]:6443".to_owned()]));
        assert_eq!(v6["set"].failing, BTreeSet::from(["[fd00::12]:6443".to_owned()]));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn stats_text() {
        let s = parse_stats("a.b: 3\nc: No recorded values\nd.e: 17\n");
        assert_eq!(s.get("a.b"), Some(&3));
        assert_eq!(s.get("d.e"), Some(&17));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn live_table_from_config_dump() {
        let table = json!({"schema": 1, "generation": "G1", "apiservers": [{"id": "a", "cluster": "ap-a"}],
            "poolCluster": "pool", "sets": [{"cluster": "set-a", "members": ["a"]}]});
        let ecds = skewgate_envoy::ecds(&table.to_string(), std::path::Path::new("/x.wasm"));
        let typed: TableConfig = serde_json::from_value(table.clone()).unwrap();
        assert_eq!(Some(LiveTable::of(&typed)), table_summary(&table.to_string()));
        let dump = json!({"configs": [{
            "@type": "type.googleapis.com/envoy.admin.v3.EcdsConfigDump.EcdsFilterConfig",
            "ecds_filter": ecds["resources"][0],
            "last_updated": "2026-01-01T00:00:00Z"
        }]});
        let live = live_table_of(&dump).unwrap();
        assert_eq!(live.generation, "G1");
        assert_eq!(live.clusters.iter().map(String::as_str).collect::<Vec<_>>(), ["ap-a", "pool", "set-a"]);
        // With the module: live once it runs the same table.
        let entry = |ecds: &Value| json!({"ecds_filter": ecds["resources"][0]});
        let older = json!({"schema": 1, "generation": "G0", "apiservers": [], "poolCluster": "old-pool"});
        let module = |t: &Value| entry(&skewgate_envoy::module_ecds(&t.to_string()));
        let behind = json!({"configs": [entry(&ecds), module(&older)]});
        assert_eq!(live_table_of(&behind).map(|l| l.generation), Some("G0".to_string()));
        let level = json!({"configs": [module(&table), entry(&ecds)]});
        assert_eq!(live_table_of(&level), Some(live));
        assert_eq!(live_table_of(&json!({"configs": [module(&table)]})), None, "no filter, no table");
        assert_eq!(live_table_of(&json!({})), None);
        assert_eq!(live_table_of(&json!({"configs": []})), None);
    }

    #[test]
    fn live_routes_from_config_dump() {
        let rds = skewgate_envoy::rds(None, "65s");
        let dump = json!({"configs": [
            {"version_info": "other", "route_config": {"name": "elsewhere"}},
            {"version_info": rds["version_info"], "route_config": rds["resources"][0]}
        ]});
        assert_eq!(live_routes_of(&dump).as_deref(), skewgate_envoy::rds_version(&rds));
        assert_eq!(live_routes_of(&json!({"configs": [dump["configs"][0]]})), None);
        assert_eq!(live_routes_of(&json!({})), None);
    }
}
