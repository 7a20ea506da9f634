//! The one way to turn a routing table into `cds.json`, `rds.json` and `ecds.json`.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use skewgate_core::table::{RoutingTable, TableConfig, TableError};

use crate::resources::{self, CdsError, Endpoint, Health, UpstreamTls};

/// The three files, ready to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    /// The table `ecds` carries, typed: what the push needs to know about it (which clusters it
    /// routes to) without reading it back out of the JSON.
    pub table: TableConfig,
    pub generation: String,
    pub cds: Value,
    pub rds: Value,
    pub ecds: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot serialise the table: {0}")]
    Serialize(String),
    /// The filter would refuse it; never written.
    #[error("{0}")]
    Invalid(TableError),
    #[error("cds: {0}")]
    Cds(CdsError),
}

/// `cds.json`, `rds.json` (`route_timeout` on every route that is not long-running) and
/// `ecds.json` for `table`, `more` adding clusters of the sidecar's own. The
/// table is sealed with the clusters of that `cds.json` ([`skewgate_core::seal`]: its
/// generation becomes its content hash), then compiled exactly as the filter's `on_configure`
/// will compile it, so a table Envoy would reject never leaves this function.
pub fn render(
    table: &mut TableConfig,
    endpoints: &[Endpoint],
    tls: &UpstreamTls,
    health: Health,
    wasm: &Path,
    route_timeout: Duration,
    more: impl FnOnce(&mut Value),
) -> Result<Resources, RenderError> {
    let mut cds = resources::cds(table, endpoints, tls, health).map_err(RenderError::Cds)?;
    more(&mut cds);
    skewgate_core::seal::seal(table, resources::cluster_names(Some(&cds)));
    let json = serde_json::to_string(table).map_err(|e| RenderError::Serialize(e.to_string()))?;
    let compiled = RoutingTable::from_sealed_json(json.as_bytes()).map_err(RenderError::Invalid)?;
    let rds = resources::rds(Some(&compiled), &resources::envoy_duration(route_timeout));
    let ecds = resources::ecds(&json, wasm);
    Ok(Resources { table: table.clone(), generation: table.generation.clone(), cds, rds, ecds })
}
