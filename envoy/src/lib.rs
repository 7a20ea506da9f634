//! What skewgate tells Envoy, as data: the one place that knows the shape of Envoy's
//! configuration. Its users: the `skewgate` binary (the sidecar renders and pushes with it,
//! `skewgate table` writes with it, `skewgate explain` normalises paths with it), the test kit
//! and the benchmarks (which start Envoys on the same files) and the end-to-end suites.
//!
//! - [`resources`]: the JSON of the clusters (CDS), of the routes (RDS) and of the filter
//!   configurations (ECDS: the proxy-wasm filter's and the native module's);
//! - [`render`](mod@render): a routing table → the three resources, refusing a table the filter
//!   would refuse;
//! - [`eds`]: the endpoints of the clusters of apiservers' addresses in files of their own, so
//!   that marking an apiserver rebuilds no cluster;
//! - [`files`]: where the resources live on disk and how one is replaced (the only I/O here:
//!   Envoy's file watch needs the rename);
//! - [`path`]: what Envoy does to a request target before any filter sees it.
//!
//! Talking to a running Envoy (its admin API, the order of a push) is the sidecar's.

pub mod eds;
pub mod files;
pub mod path;
pub mod render;
pub mod resources;

pub use files::{Files, module_ecds_path, write_atomic};
pub use render::{RenderError, Resources, render};
pub use resources::{
    BYPASS_ANONYMOUS_HEALTH_ROUTE, BYPASS_ANONYMOUS_ROUTE, BYPASS_ANONYMOUS_WATCH_ROUTE,
    BYPASS_CERTIFICATE_ROUTE, BYPASS_CERTIFICATE_WATCH_ROUTE, BYPASS_TOKEN_ROUTE, BYPASS_TOKEN_WATCH_ROUTE,
    CERTIFICATE_FILTER_NAME, CdsError, DEFAULT_ROUTE_TIMEOUT, DYNAMIC_MODULE_FILTER_TYPE, Endpoint,
    FILTER_NAME, Health, MODULE_FILTER_NAME, MODULE_NAME, Overlay, READINESS_PATH, REROUTED_STAT_PREFIX,
    ROUTE_CONFIG_NAME, UpstreamTls, cds, cluster_names, draining_in, ecds, envoy_duration, module_ecds, rds,
    rds_version, rds_with_overlay, route_configuration, routes_base_version, table_from_ecds,
    table_of_filter, union_cds, with_draining,
};
