//! The table a stream is decided on: made by the root context, shared by every HTTP context that
//! started while it was current (so a table swap mid-stream cannot mix two tables).

use skewgate_core::table::RoutingTable;

use crate::host::Host;
use crate::metrics::Metrics;

/// A compiled table and the metric ids that go with it.
pub struct Active<H: Host> {
    pub table: RoutingTable,
    pub metrics: Metrics<H>,
    /// Envoy took the connection properties ([`skewgate_core::bypass`]): a mapped certificate
    /// identity can be left on its connection for the bypass routes.
    pub connection_identity: bool,
}
