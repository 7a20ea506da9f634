//! Talking to a running Envoy: what the sidecar asks its admin API ([`admin`], a trait faked in
//! tests) and how a rendered table reaches it ([`push`]: in an order that never routes to a
//! cluster Envoy lacks). What the files say is `skewgate_envoy`'s.

pub mod admin;
pub mod push;

pub use admin::{AdminError, EnvoyAdmin, HttpAdmin, LiveTable};
pub use push::{PushError, PushOutcome, Pusher, Step};
