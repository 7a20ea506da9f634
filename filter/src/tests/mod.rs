//! The filter's behaviour against a fake Envoy ([`Fake`]): what a stream does to the request
//! headers, which local replies it sends, what the root context makes of a configuration.

mod gated;
mod hold;
mod http;
mod root;

// Links the native definitions of Envoy's host functions (see that crate).
#[cfg(not(target_arch = "wasm32"))]
use skewgate_hostcall_stubs as _;

use proxy_wasm::traits::{HttpContext, RootContext};
use serde_json::{Value, json};

use crate::host::fake::Fake;
use crate::root::Root;

/// Core's sample table ([`skewgate_core::testing::sample`]), with a composer for OpenAPI
/// documents.
fn sample() -> Value {
    let mut table = skewgate_core::testing::sample();
    table["openapiCluster"] = json!("openapi-composer");
    table
}

/// The root context of a VM of its own (another Envoy worker's), its id 1000.
fn new_vm(fake: &Fake) -> Root<Fake> {
    Root::new(1000, fake.clone(), std::rc::Rc::new(crate::hold::Holding::new(fake.clone())))
}

/// A root context that has taken `table`, sealed (asserted), and the fake it talks to.
fn configured(table: &Value) -> (Fake, Root<Fake>) {
    let fake = Fake::default();
    let mut root = new_vm(&fake);
    assert!(configure(&fake, &mut root, sealed(table)), "sample table refused");
    (fake, root)
}

/// `table` as Envoy hands it to the filter: sealed with the clusters it names.
fn sealed(table: &Value) -> Vec<u8> {
    skewgate_core::testing::sealed(table).to_string().into_bytes()
}

fn configure(fake: &Fake, root: &mut Root<Fake>, bytes: Vec<u8>) -> bool {
    let size = bytes.len();
    fake.state().plugin_configuration = Some(bytes);
    root.on_configure(size)
}

/// A new stream on `root` whose request head is `headers`.
fn stream(fake: &Fake, root: &Root<Fake>, headers: &[(&str, &str)]) -> Box<dyn HttpContext> {
    fake.request(headers);
    root.create_http_context(1).expect("an HTTP context")
}

/// A GET with a token (so no anonymous twin).
fn get(path: &str) -> Vec<(&str, &str)> {
    vec![(":method", "GET"), (":path", path), ("authorization", "Bearer t")]
}

/// The local reply's body as JSON, with its status.
fn reply_json(fake: &Fake) -> (u32, Value) {
    let (status, _, body) = fake.reply().expect("a local reply");
    (status, serde_json::from_slice(&body).expect("a JSON body"))
}
