//! The module's filter: [`skewgate_core::stream::Pipeline`], natively, composed discovery
//! included. Requests whose decision needs an OpenAPI document composed at the edge, or that the
//! hold may keep waiting (`skewgate_core::native::module_handles`), are left to the proxy-wasm
//! filter behind it; every other request is routed here, marked with the `native` route class,
//! and the routes for that class disable the proxy-wasm filter (envoy-config/bootstrap-native.yaml).

use std::sync::Arc;

use skewgate_core::edits::Carrier;
use skewgate_core::stream::{Attribute, Next, Pipeline, Request, Stream, Unrouted};
use skewgate_core::table::RoutingTable;

/// One filter configuration: a compiled routing table. A new table is a new configuration
/// (ECDS); streams keep the one they started with.
pub struct Config {
    table: Arc<RoutingTable>,
}

impl Config {
    pub fn new(_name: &[u8], config: &[u8]) -> Option<Config> {
        RoutingTable::from_sealed_json(config).ok().map(|table| Config { table: Arc::new(table) })
    }
}

/// The request headers of a stream, as the module's ABI hands them over: slices into Envoy's
/// header map, valid until a header is set.
pub trait RequestHeaders {
    fn request_headers(&self) -> Vec<(&[u8], &[u8])>;
}

thread_local! {
    /// The digests (Envoy's SHA-256 of the DER) of client certificates whose names passed
    /// [`skewgate_core::certificate`]: reading Envoy's PEM of one costs ~21k instructions, and a
    /// client sends the same certificate with every request. Per worker, so without a lock;
    /// emptied when full. The module keeps nothing on the connection, unlike the filter.
    static NAMES_PASSED: std::cell::RefCell<std::collections::HashSet<Vec<u8>>> = Default::default();
}

/// Certificates remembered per worker, at most.
const NAMES_PASSED_MAX: usize = 4096;

fn names_passed(stream: &impl Stream) -> bool {
    let Some(digest) = stream.attribute(Attribute::ClientCertificateDigest) else { return false };
    NAMES_PASSED.with(|set| set.borrow().contains(&*digest))
}

fn remember_names_passed(stream: &impl Stream) {
    let Some(digest) = stream.attribute(Attribute::ClientCertificateDigest) else { return };
    NAMES_PASSED.with(|set| {
        let mut set = set.borrow_mut();
        if set.len() >= NAMES_PASSED_MAX {
            set.clear();
        }
        set.insert(digest.into_owned());
    });
}

pub struct Filter {
    table: Arc<RoutingTable>,
    pipeline: Pipeline,
}

impl Filter {
    pub fn new(config: &Config) -> Filter {
        Filter { table: config.table.clone(), pipeline: Pipeline::default() }
    }

    pub fn on_request_headers<S: Stream + RequestHeaders>(&mut self, stream: &mut S) -> Next {
        // Owned: Envoy's header buffers may move once a header is set, and the decision borrows
        // from what it read.
        let mut request = Request::read(stream.request_headers()).into_owned();
        request.read_connection(stream, names_passed);
        match self.pipeline.on_request_headers(stream, &self.table, &request, Carrier::Module) {
            Err(Unrouted::Refused) => Next::Pause,
            Err(Unrouted::HandedOff) => Next::Continue,
            Ok(routing) => {
                if routing.decision.identity.is_some() && !routing.certificate_checked {
                    remember_names_passed(stream);
                }
                Next::Continue
            }
        }
    }

    /// Envoy's own failure (no healthy upstream, connect failure, ...) for a request the module
    /// routed, and the apiserver's authorization of a composed answer.
    pub fn on_response_headers(&mut self, stream: &mut impl Stream, end_of_stream: bool) -> Next {
        self.pipeline.on_response_headers(stream, &self.table, end_of_stream).0
    }

    pub fn on_response_body(&mut self, stream: &mut impl Stream, size: usize, end_of_stream: bool) -> Next {
        let replaced = self.pipeline.on_response_body(stream, &self.table, size, end_of_stream);
        replaced.map_or(Next::Continue, |(next, _)| next)
    }

    pub fn on_response_trailers(&mut self, stream: &mut impl Stream) -> Next {
        self.pipeline.on_response_trailers(stream, &self.table);
        Next::Continue
    }
}
