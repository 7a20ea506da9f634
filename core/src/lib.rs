//! skewgate's routing logic. Its users: the proxy-wasm filter (`filter/`) and the native
//! dynamic module (`module/`) decide every request with it; the `skewgate` binary builds and
//! seals tables and explains decisions with it; `skewgate-envoy` renders a table into Envoy's
//! files with it; the stand-in apiservers
//! (`standin/`) parse requests and serve discovery with its grammar and documents; the test kit,
//! the benchmarks and the end-to-end suites build their tables and check answers with it.
//!
//! Nothing here does I/O or knows about proxy-wasm: the data flows request → parse
//! ([`request_info`]) → decide ([`decision`], against a [`table`]) and the caller acts.

pub mod accept;
pub mod build;
pub mod bypass;
pub mod certificate;
pub mod decision;
pub mod digest;
pub mod discovery;
pub mod duration;
pub mod edits;
pub mod envelope;
pub mod extensions;
pub mod features;
pub mod field_use;
pub mod hold;
pub mod identity;
pub mod legacy_build;
pub mod legacy_documents;
mod load;
pub mod native;
pub mod openapi;
pub mod policy;
pub mod pretty;
pub mod protowire;
pub mod request_info;
pub mod seal;
pub mod status;
pub mod stream;
pub mod table;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
