//! skewgate's test kit: a real Envoy process with the built filter, kubectl, apiserver doubles,
//! load recording, real kube-apiserver and etcd processes, and the local skewed cluster. Used by
//! the integration and end-to-end tests (e2e/), the drill (drill/) and the bench (bench/).

pub mod clients;
pub mod cluster;
pub mod echo;
pub mod envoy;
pub mod kubectl;
pub mod limits;
pub mod load;
pub mod markdown;
pub mod mvp;
pub mod native;
pub mod paths;
mod process;
pub mod real;
pub mod scenario;
pub mod sidecar;

pub use skewgate_pki as pki;
pub use skewgate_standin as standin;
