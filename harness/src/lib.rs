//! Test harness for skewgate: certificates, a real Envoy process with the built filter, and
//! loopback apiserver doubles. Used by the integration tests, the local cluster and benchmarks.

pub mod bench;
pub mod clients;
pub mod cluster;
pub mod drill;
pub mod echo;
pub mod envoy;
pub mod kubectl;
pub mod load;
pub mod mvp;
pub mod native;
pub mod paths;
pub mod pki;
pub mod probe;
pub mod real;
pub mod standin;
