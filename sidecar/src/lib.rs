//! The `skewgate` command: `explain` a routing decision, and the Envoy resources the sidecar
//! writes.

pub mod envoy;
pub mod explain;
