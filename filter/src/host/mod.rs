//! Everything the filter asks of Envoy, behind one trait: [`ProxyWasm`] forwards to the proxy-wasm
//! ABI, and a fake (tests only) records what the filter did, so that `http.rs` and `root.rs` are
//! tested without a running Envoy.
//!
//! Every call reports failure as a value or logs it: the SDK's `Context` helpers `unwrap()` host
//! results (e.g. `get_property` on a property Envoy cannot serialise), which would trap the VM.
//! Logging stays on the `log` facade, which proxy-wasm's logger serves inside Envoy.

#[cfg(test)]
pub mod fake;
mod sdk;

use std::borrow::Cow;
use std::time::Duration;

use proxy_wasm::types::{Bytes, Status};
use skewgate_core::stream::{Attribute, Stream};

pub use sdk::ProxyWasm;

/// Cheap to clone (a zero-sized handle in Envoy): each context and each table's metrics keep one.
pub trait Host: Clone + 'static {
    /// The plugin configuration (the routing table), as `on_configure` sees it.
    fn plugin_configuration(&self) -> Option<Bytes>;
    fn request_headers(&self) -> Vec<(String, Bytes)>;
    /// The first `size` bytes of the request body Envoy buffered for the filter.
    fn request_body(&self, size: usize) -> Option<Bytes>;
    fn response_header(&self, name: &str) -> Option<Bytes>;
    fn response_headers(&self) -> Vec<(String, Bytes)>;
    /// An Envoy attribute (`connection.subject_peer_certificate`, `response.code_details`, ...).
    fn property(&self, path: &[&str]) -> Option<Bytes>;
    /// Replaces every value of `name`; `None` removes the header.
    fn set_request_header(&self, name: &str, value: Option<&str>);
    fn add_request_header(&self, name: &str, value: &str);
    fn remove_request_header(&self, name: &str) {
        self.set_request_header(name, None);
    }
    /// A local reply in place of the upstream's.
    fn send_response(&self, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>);
    /// Replaces every value of a response header; `None` removes it. Only before the response
    /// headers went on (the filter paused them).
    fn set_response_header(&self, name: &str, value: Option<&str>);
    /// Puts `with` in place of the first `size` bytes of the response body Envoy holds; false
    /// when there is no body to edit (the answer ended with trailers and no data).
    fn replace_response_body(&self, size: usize, with: &[u8]) -> bool;
    /// Drops the response body received so far (what the filter replaces anyway).
    fn drop_response_body(&self, size: usize) {
        self.replace_response_body(size, &[]);
    }
    fn dispatch_call(
        &self,
        cluster: &str,
        headers: Vec<(&str, &str)>,
        timeout: Duration,
    ) -> Result<u32, Status>;
    fn call_response_headers(&self) -> Vec<(String, Bytes)>;
    fn call_response_body(&self, size: usize) -> Option<Bytes>;
    /// Declares a read-only property with the downstream connection's lifespan (Envoy filter
    /// state `wasm.<name>`): once set by one stream, later streams of the connection and Envoy's
    /// routes see it, and no stream can change it. False when Envoy refused.
    fn declare_connection_property(&self, name: &str) -> bool;
    /// Sets a declared property on the stream's connection (read back with [`Host::property`]).
    /// Only for one not set yet: Envoy refuses a second set, which proxy-wasm 0.2.5 turns into a
    /// trap of the VM. False when Envoy reports another failure.
    fn set_connection_property(&self, name: &str, value: &str) -> bool;
    /// A counter's id; Envoy hands out the same id for the same name.
    fn define_counter(&self, name: &str) -> Option<u32>;
    fn increment_metric(&self, id: u32, by: u64);
    fn set_tick_period(&self, period: Duration);
    /// Envoy's clock (wall time, as proxy-wasm has no other).
    fn now(&self) -> Duration;
    /// Lets stream `id`, paused at its request headers, go on (from the root context).
    fn resume_request(&self, id: u32);
    /// A local reply on stream `id` (from the root context).
    fn send_response_to(&self, id: u32, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>);
    /// A value every worker's VM shares, with its version for [`Host::set_shared_data`].
    fn shared_data(&self, key: &str) -> (Option<Bytes>, Option<u32>);
    /// Sets it if it is still at version `cas` (none: whatever it is); false when it was not.
    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool;
    fn define_histogram(&self, name: &str) -> Option<u32>;
    fn record_metric(&self, id: u32, value: u64);
}

/// One stream's host calls as the pipeline ([`skewgate_core::stream`]) asks for them.
pub struct Envoy<'h, H>(pub &'h H);

impl<H: Host> Stream for Envoy<'_, H> {
    fn attribute(&self, which: Attribute) -> Option<Cow<'_, [u8]>> {
        let path: &[&str] = match which {
            Attribute::ClientSubject => &["connection", "subject_peer_certificate"],
            Attribute::ClientCertificateDigest => &["connection", "sha256_peer_certificate_digest"],
            Attribute::ResponseDetails => &["response", "code_details"],
        };
        self.0.property(path).map(Cow::Owned)
    }
    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.0.response_header(name).map(Cow::Owned)
    }
    fn response_header_names(&self) -> Vec<String> {
        self.0.response_headers().into_iter().map(|(name, _)| name).collect()
    }
    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        self.0.set_request_header(name, value);
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.0.add_request_header(name, value);
    }
    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        self.0.set_response_header(name, value);
    }
    /// proxy-wasm's local reply records no details of ours.
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], _details: &str) {
        self.0.send_response(status, headers.to_vec(), (!body.is_empty()).then_some(body));
    }
    fn drop_response_body(&mut self, size: usize) {
        self.0.drop_response_body(size);
    }
    fn end_response_body(&mut self, size: usize, body: &[u8], _at_trailers: bool) -> bool {
        self.0.replace_response_body(size, body)
    }
}
