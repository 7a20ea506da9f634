//! The one way to turn a routing table into `cds.json` and `ecds.json`.

use std::path::Path;

use serde_json::Value;
use skewgate_core::table::{RoutingTable, TableConfig, TableError};

use super::resources::{self, CdsError, Endpoint, Health, UpstreamTls};

/// The two files, ready to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    /// The table `ecds` carries, typed: what the push needs to know about it (which clusters it
    /// routes to) without reading it back out of the JSON.
    pub table: TableConfig,
    pub generation: String,
    pub cds: Value,
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

/// `cds.json` and `ecds.json` for `table`. The table JSON is compiled exactly as the filter's
/// `on_configure` will compile it, so a table Envoy would reject never leaves this function.
pub fn render(
    table: &TableConfig,
    endpoints: &[Endpoint],
    tls: &UpstreamTls,
    health: Health,
    wasm: &Path,
) -> Result<Resources, RenderError> {
    let json = serde_json::to_string(table).map_err(|e| RenderError::Serialize(e.to_string()))?;
    RoutingTable::from_json(json.as_bytes()).map_err(RenderError::Invalid)?;
    let cds = resources::cds(table, endpoints, tls, health).map_err(RenderError::Cds)?;
    let ecds = resources::ecds(&json, wasm);
    Ok(Resources { table: table.clone(), generation: table.generation.clone(), cds, ecds })
}
