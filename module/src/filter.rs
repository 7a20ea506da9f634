//! The module's filter: the proxy-wasm filter (filter/src/http.rs) over the same
//! `skewgate_core::decision::decide`, natively, composed discovery included. Requests whose
//! decision needs an OpenAPI document composed at the edge, or that the hold may keep waiting
//! (`skewgate_core::native::module_handles`), are left to the proxy-wasm filter behind it;
//! every other request is routed here, marked with the `native` route class, and the routes for
//! that class disable the proxy-wasm filter (envoy-config/bootstrap-native.yaml).

use std::sync::Arc;

use skewgate_core::certificate::PEER_CERTIFICATE_HEADER;
use skewgate_core::decision::{self, RequestHead};
use skewgate_core::edits::{self, Carrier, Edit, Routed};
use skewgate_core::identity;
use skewgate_core::native::module_handles;
use skewgate_core::pretty;
use skewgate_core::table::RoutingTable;

use crate::stream::{Attribute, Body, Stream};

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

thread_local! {
    /// The digests (Envoy's SHA-256 of the DER) of client certificates whose names passed
    /// [`skewgate_core::certificate`]: reading Envoy's PEM of one costs ~21k instructions, and a
    /// client sends the same certificate with every request. Per worker, so without a lock;
    /// emptied when full.
    static NAMES_PASSED: std::cell::RefCell<std::collections::HashSet<Vec<u8>>> = Default::default();
}

/// Certificates remembered per worker, at most.
const NAMES_PASSED_MAX: usize = 4096;

fn names_passed(digest: &[u8]) -> bool {
    NAMES_PASSED.with(|set| set.borrow().contains(digest))
}

fn remember_names_passed(digest: &[u8]) {
    NAMES_PASSED.with(|set| {
        let mut set = set.borrow_mut();
        if set.len() >= NAMES_PASSED_MAX {
            set.clear();
        }
        set.insert(digest.to_vec());
    });
}

/// What Envoy does after a hook.
pub enum Next {
    Continue,
    Stop,
}

/// What Envoy does after a body hook.
pub enum BodyNext {
    Continue,
    /// Wait for more, without buffering what came (the filter took it).
    StopNoBuffer,
}

pub struct Filter {
    table: Arc<RoutingTable>,
    /// The module routed the request (else the proxy-wasm filter does, or did not need to):
    /// what answering Envoy's failure of it needs.
    routed: Option<Routed>,
    replied: bool,
    /// The apiserver authorized a composed answer; its body is being replaced.
    replacing: bool,
    /// The composed answer (its status and document) that replaces an authorized upstream one.
    compose: Option<(u16, decision::Composed)>,
}

impl Filter {
    pub fn new(config: &Config) -> Filter {
        Filter { table: config.table.clone(), routed: None, replied: false, replacing: false, compose: None }
    }

    pub fn on_request_headers(&mut self, stream: &mut impl Stream) -> Next {
        let table = self.table.clone();
        // Owned copies of what the decision reads and of the names it may strip (all `x-...`):
        // Envoy's header buffers may move once a header is set, and the decision borrows from
        // what it read. Everything else is looked at in place.
        let mut head = RequestHead::default();
        let (mut method, mut target, mut accept, mut if_none_match) = (None, None, None, None);
        let mut candidates: Vec<String> = Vec::new();
        let mut certificate = None;
        for (name, value) in stream.request_headers() {
            let owned = || Some(String::from_utf8_lossy(value).into_owned());
            match name {
                b":method" => method = owned(),
                b":path" => target = owned(),
                b"accept" => accept = owned(),
                b"if-none-match" => if_none_match = owned(),
                b"user-agent" => head.pretty_agent = pretty::agent_wants(value),
                // Set by the bootstrap's header mutation ahead of this module whenever the
                // connection has a certificate; stripped with the other x-skewgate-* headers.
                n if n == PEER_CERTIFICATE_HEADER.as_bytes() => {
                    certificate = Some(value.to_vec());
                    candidates.push(PEER_CERTIFICATE_HEADER.to_owned());
                }
                n if n.starts_with(b"x-") => candidates.extend(std::str::from_utf8(n).ok().map(String::from)),
                n => head.token |= std::str::from_utf8(n).is_ok_and(|n| identity::carries_token(n, value)),
            }
        }
        head.method = method.as_deref().unwrap_or("");
        head.target = target.as_deref().unwrap_or("");
        head.accept = accept.as_deref();
        head.if_none_match = if_none_match.as_deref();
        // As in the proxy-wasm filter: from the verified connection, never from a header.
        let subject = stream
            .attribute(Attribute::ConnectionSubjectPeerCertificate)
            .map(|s| String::from_utf8_lossy(s).into_owned());
        head.client_subject = identity::client_subject(subject.as_deref());
        // The module keeps nothing on the connection: a certificate whose names passed is
        // remembered by its digest instead, on this worker.
        let digest = head
            .client_subject
            .and_then(|_| stream.attribute(Attribute::ConnectionSha256PeerCertificateDigest))
            .map(<[u8]>::to_vec);
        if head.client_subject.is_some() {
            head.certificate_checked = digest.as_deref().is_some_and(names_passed);
            head.client_certificate = certificate.as_deref();
        }

        let decision = decision::decide(&table, &head);
        if !module_handles(&table, &decision) {
            let strip: Vec<&str> =
                candidates.iter().map(String::as_str).filter(|n| decision.strips(n)).collect();
            // An OpenAPI composition, or a request the hold may keep waiting: the proxy-wasm
            // filter decides it again and does all of it. A client's own x-skewgate-route must
            // not pick a route that skips it, so what the decision strips goes here already.
            if !strip.is_empty() {
                for name in &strip {
                    stream.set_request_header(name.as_bytes(), None);
                }
                stream.clear_route_cache();
            }
            return Next::Continue;
        }
        if let (Some(_), false, Some(digest)) =
            (&decision.identity, head.certificate_checked, digest.as_deref())
        {
            remember_names_passed(digest);
        }
        let credential_id = match (&decision.identity, table.policy().x509_credential_id) {
            (Some(_), true) => digest
                .as_deref()
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(identity::x509_credential_id),
            _ => None,
        };
        let names = candidates.iter().map(String::as_str);
        for edit in edits::request_edits(&decision, names, Carrier::Module, credential_id.as_deref()) {
            match edit {
                Edit::Remove(name) => stream.set_request_header(name.as_bytes(), None),
                Edit::Set(name, value) => stream.set_request_header(name.as_bytes(), Some(value.as_bytes())),
                Edit::Add(name, value) => stream.add_request_header(name.as_bytes(), value.as_bytes()),
            }
        }
        if let Some((status, body)) = edits::refusal(&decision) {
            self.replied = true;
            stream.send_response(
                status,
                &[("content-type", "application/json")],
                body.as_bytes(),
                "skewgate_refused",
            );
            return Next::Stop;
        }
        if let Some(route) = decision.route() {
            self.routed = Some(Routed::of(&decision, &head));
            self.compose = route.compose.map(|reply| (reply.status, reply.source));
        }
        stream.clear_route_cache();
        Next::Continue
    }

    /// Envoy's own failure (no healthy upstream, connect failure, ...) for a request the module
    /// routed: the same Status document the proxy-wasm filter answers.
    pub fn on_response_headers(&mut self, stream: &mut impl Stream, end_of_stream: bool) -> Next {
        if self.routed.is_none() || self.replied {
            return Next::Continue;
        }
        let status = stream
            .response_header(":status")
            .and_then(|s| std::str::from_utf8(s).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        if let (Some((compose, source)), true) = (self.compose, (200..300).contains(&status) || status == 304)
        {
            let Some(reply) = decision::composed_reply(&self.table, source, compose) else {
                return Next::Continue;
            };
            if end_of_stream {
                let headers: Vec<(&str, &str)> =
                    reply.headers().into_iter().filter(|(_, v)| !v.is_empty()).collect();
                self.replied = true;
                stream.send_response(u32::from(reply.status), &headers, reply.body, "skewgate_composed");
                return Next::Stop;
            }
            // The apiserver's body is still coming: answering now would reset the upstream
            // stream, and an HTTP/1.1 upstream connection with it (a new mTLS handshake for the
            // next request, measured: one connection per composed answer). Its body is dropped
            // as it arrives and the composed one put in its place at the end.
            self.replacing = true;
            return Next::Stop;
        }
        if status < 500 {
            return Next::Continue;
        }
        let details = stream.attribute(Attribute::ResponseCodeDetails).unwrap_or_default();
        if details == b"via_upstream" {
            return Next::Continue;
        }
        let Some(routed) = &self.routed else { return Next::Continue };
        let reply = routed.unavailable(&self.table, &String::from_utf8_lossy(details));
        let headers = reply.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.replied = true;
        stream.send_response(reply.status, &headers, reply.body.as_bytes(), "skewgate_unavailable");
        Next::Stop
    }
}

impl Filter {
    /// The apiserver's body, while a composed answer replaces it: dropped, and at its end the
    /// composed answer's status, headers and body in its place.
    pub fn on_response_body(&mut self, stream: &mut impl Stream, end_of_stream: bool) -> BodyNext {
        if !self.replacing {
            return BodyNext::Continue;
        }
        stream.drain_response_body(Body::Received);
        if !end_of_stream {
            return BodyNext::StopNoBuffer;
        }
        self.replace(stream, Body::Received);
        BodyNext::Continue
    }

    /// An apiserver's answer that ends with trailers (HTTP/2): the composed body goes in before them.
    pub fn on_response_trailers(&mut self, stream: &mut impl Stream) -> Next {
        if self.replacing {
            self.replace(stream, Body::Buffered);
        }
        Next::Continue
    }

    fn replace(&mut self, stream: &mut impl Stream, body: Body) {
        self.replacing = false;
        self.replied = true;
        let Some((compose, source)) = self.compose else { return };
        let Some(reply) = decision::composed_reply(&self.table, source, compose) else { return };
        // The apiserver's headers describe its body (length, encoding, its own ETag): none
        // stays but the date, as in the answer the filter composes.
        let upstream: Vec<Vec<u8>> = stream
            .response_headers()
            .into_iter()
            .filter(|(name, _)| !name.starts_with(b":") && *name != b"date")
            .map(|(name, _)| name.to_vec())
            .collect();
        for name in &upstream {
            stream.set_response_header(name, None);
        }
        stream.set_response_header(b":status", Some(reply.status.to_string().as_bytes()));
        for (name, value) in reply.headers() {
            stream.set_response_header(name.as_bytes(), (!value.is_empty()).then_some(value.as_bytes()));
        }
        stream.set_response_header(b"content-length", Some(reply.body.len().to_string().as_bytes()));
        stream.append_response_body(body, reply.body);
    }
}
