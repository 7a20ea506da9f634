//! The `skewgate` command and library: `explain` a routing decision, build and show routing
//! tables, and `sync` — the discovery sidecar that keeps Envoy's table current.

pub mod cluster;
pub mod config;
pub mod eligibility;
pub mod envoy;
pub mod explain;
pub mod fetch;
pub mod guard;
pub mod metrics;
pub mod offline;
pub mod openapi;
pub mod peers;
pub mod plan;
pub mod serve;
pub mod skew;
pub mod sync;
#[cfg(test)]
pub mod testing;
pub mod tether;
