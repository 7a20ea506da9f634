//! Every way a table is taken in: parsed, its shape checked, its seal checked, compiled. Apart
//! from [`crate::table`], so that the table knows nothing of the seal that ties it to Envoy's
//! clusters ([`crate::seal`]).

use crate::seal;
use crate::table::{self, RoutingTable, TableConfig, TableError};

impl RoutingTable {
    /// Parses and validates a table; the error names the field and the reason. A sealed table's
    /// seal is checked; an unsealed one is taken (tools, tests).
    pub fn from_json(bytes: &[u8]) -> Result<Self, TableError> {
        Self::compile(table::parse(bytes)?)
    }

    /// As [`RoutingTable::from_json`], and the table must be sealed ([`seal::require`]): what the
    /// filter and the native module take from Envoy.
    pub fn from_sealed_json(bytes: &[u8]) -> Result<Self, TableError> {
        let config = table::parse(bytes)?;
        seal::require(&config)?;
        Self::compile(config)
    }

    /// Validates a parsed table (a sealed one's seal too) and builds the look-up maps.
    pub fn compile(mut config: TableConfig) -> Result<Self, TableError> {
        table::check_shape(&config)?;
        seal::check(&mut config)?;
        Self::from_checked(config)
    }
}
