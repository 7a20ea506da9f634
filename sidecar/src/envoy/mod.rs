//! Everything skewgate knows about Envoy, in one place; the sidecar, `skewgate table`, the
//! harness and the tests all go through it:
//!
//! - [`resources`]: the JSON of the clusters (CDS), of the routes (RDS) and of the filter
//!   configurations (ECDS: the proxy-wasm filter's and the native module's);
//! - [`render`](mod@render): a routing table → the three resources, refusing a table the filter
//!   would refuse;
//! - [`files`]: where the resources live on disk and how they are replaced;
//! - [`admin`]: what the sidecar asks Envoy's admin API (a trait, faked in tests);
//! - [`push`]: handing a rendered table to a running Envoy in an order that never routes to a
//!   cluster Envoy lacks.

pub mod admin;
pub mod files;
pub mod push;
pub mod render;
pub mod resources;

pub use admin::{AdminError, EnvoyAdmin, HttpAdmin, LiveTable};
pub use files::{Files, module_ecds_path, write_atomic};
pub use push::{PushError, PushOutcome, Pusher, Step};
pub use render::{RenderError, Resources, render};
pub use resources::{
    BYPASS_CERTIFICATE_ROUTE, BYPASS_CERTIFICATE_WATCH_ROUTE, BYPASS_TOKEN_ROUTE, BYPASS_TOKEN_WATCH_ROUTE,
    CdsError, DYNAMIC_MODULE_FILTER_TYPE, Endpoint, FILTER_NAME, Health, MODULE_FILTER_NAME, MODULE_NAME,
    REROUTED_STAT_PREFIX, ROUTE_CONFIG_NAME, UpstreamTls, cds, draining_in, ecds, envoy_duration,
    module_ecds, rds, rds_version, route_configuration, table_from_ecds, table_of_filter, with_draining,
};
