//! skewgate's routing logic, shared by the proxy-wasm filter, `skewgate explain` and the sidecar.
//!
//! Nothing here does I/O or knows about proxy-wasm: the data flows request → parse
//! ([`request_info`]) → decide ([`decision`], against a [`table`]) and the caller acts.

pub mod accept;
pub mod build;
pub mod bypass;
pub mod certificate;
pub mod decision;
pub mod discovery;
pub mod extensions;
pub mod identity;
pub mod legacy_build;
pub mod legacy_documents;
pub mod native;
pub mod openapi;
pub mod request_info;
pub mod seal;
pub mod status;
pub mod table;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
