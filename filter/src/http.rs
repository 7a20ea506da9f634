//! One HTTP stream: request → parse → decide → act, then the 503 rewrite of Envoy's own
//! upstream-failure replies.

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use skewgate_core::bypass::{self, ConnectionIdentity};
use skewgate_core::certificate;
use skewgate_core::decision::{self, GatedWrite, RequestHead};
use skewgate_core::edits::{self, Carrier, Edit, Reply, Routed};
use skewgate_core::identity::{self, Identity};
use skewgate_core::pretty;
use skewgate_core::table::Serving;

use crate::active::Active;
use crate::hold::{Holding, Release};
use crate::host::Host;
use crate::metrics::Gated;
use crate::openapi::Pending;

pub struct Http<H: Host> {
    host: H,
    active: Option<Rc<Active<H>>>,
    /// Where the request went, for the 503 if Envoy cannot get it there.
    routed: Routed,
    /// The response is ours (merged discovery or a rewritten 503): leave it alone.
    replied: bool,
    /// The composed answer (its status and document) that replaces an authorized upstream one.
    compose: Option<(u16, decision::Composed)>,
    /// The apiserver authorized the composed answer; its body is being replaced.
    replacing: bool,
    /// An OpenAPI document composed at the edge, once an apiserver has let the request through.
    openapi: Option<Pending>,
    /// The stream's context id, which the root context releases a held request by.
    id: u32,
    holding: Rc<Holding<H>>,
    /// Held at the edge while its cluster was down: where it stands.
    held: Option<Rc<Cell<Release>>>,
    /// A write whose body decides where it goes, waiting for its body in Envoy's buffer.
    gated: Option<GatedWrite>,
}

/// The largest body of a gated write read to decide where it goes: a longer one goes to the
/// apiservers that keep every gated field, without being read. Well within the listener's
/// buffer (1 MiB), past which Envoy would answer 413; the objects with gated fields are small.
const MAX_GATED_BODY: usize = 256 * 1024;

impl<H: Host> Http<H> {
    pub fn new(host: H, active: Option<Rc<Active<H>>>, id: u32, holding: Rc<Holding<H>>) -> Self {
        Self {
            host,
            active,
            routed: Routed::default(),
            replied: false,
            compose: None,
            replacing: false,
            openapi: None,
            id,
            holding,
            held: None,
            gated: None,
        }
    }

    fn reply(&mut self, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) -> Action {
        self.replied = true;
        self.host.send_response(status, headers, body);
        Action::Pause
    }

    fn reply_status(&mut self, reply: &Reply) -> Action {
        let headers = reply.headers();
        let headers = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.reply(reply.status, headers, Some(reply.body.as_bytes()))
    }
}

impl<H: Host> Context for Http<H> {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        let Some(pending) = self.openapi.take() else { return };
        let (status, headers, body) = pending.answer(&self.host, body_size);
        let headers = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.reply(status, headers, (!body.is_empty()).then_some(&body[..]));
    }
}

impl<H: Host> HttpContext for Http<H> {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let Some(active) = self.active.clone() else {
            return self.reply_status(&edits::unconfigured());
        };
        active.metrics.seen();
        let table = &active.table;
        let headers = self.host.request_headers();
        let mut head = RequestHead::default();
        let (mut method, mut target, mut accept, mut if_none_match) = (None, None, None, None);
        let mut certificate = None;
        for (name, value) in &headers {
            match name.as_str() {
                ":method" => method = Some(String::from_utf8_lossy(value)),
                ":path" => target = Some(String::from_utf8_lossy(value)),
                "accept" => accept = Some(String::from_utf8_lossy(value)),
                "if-none-match" => if_none_match = Some(String::from_utf8_lossy(value)),
                "user-agent" => head.pretty_agent = pretty::agent_wants(value),
                // Set by the bootstrap's header mutation ahead of this filter, over anything a
                // client sent, whenever the connection has a certificate; read only then.
                certificate::PEER_CERTIFICATE_HEADER => certificate = Some(value),
                other => head.token |= identity::carries_token(other, value),
            }
        }
        head.method = method.as_deref().unwrap_or("");
        head.target = target.as_deref().unwrap_or("");
        head.accept = accept.as_deref();
        head.if_none_match = if_none_match.as_deref();
        // From the verified connection, never from a header: a client's own
        // x-forwarded-client-cert is dropped by Envoy and read by nobody.
        let subject = self.host.property(&["connection", "subject_peer_certificate"]);
        let subject = subject.as_deref().map(String::from_utf8_lossy);
        head.client_subject = identity::client_subject(subject.as_deref());
        // A connection that carries a mapped identity had its certificate checked on its
        // first request; the others' is checked on each (a refused one is never mapped).
        if head.client_subject.is_some() {
            head.certificate_checked =
                active.connection_identity && self.host.property(&[bypass::MARKER]).is_some();
            head.client_certificate = certificate.map(|c| &c[..]);
        }

        let decision = decision::decide(table, &head);
        self.routed = Routed::of(&decision, &head);
        // Envoy's digest is the lower-case hex SHA-256 of the certificate's DER, which is what
        // kube-apiserver's x509 authenticator records.
        let credential_id = match (&decision.identity, table.policy().x509_credential_id) {
            (Some(_), true) => self
                .host
                .property(&["connection", "sha256_peer_certificate_digest"])
                .as_deref()
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(identity::x509_credential_id),
            _ => None,
        };
        let names = headers.iter().map(|(name, _)| name.as_str());
        self.edit(edits::request_edits(&decision, names, Carrier::Filter, credential_id.as_deref()));
        if let Some((status, body)) = edits::refusal(&decision) {
            active.metrics.refused();
            return self.reply(status, vec![("content-type", "application/json")], Some(body.as_bytes()));
        }
        let Some(route) = decision.route() else { return Action::Continue };
        if let Some(reply) = route.compose {
            self.compose = Some((reply.status, reply.source));
        }
        if let Some(cluster) = decision.openapi {
            self.openapi =
                Some(Pending::start(&self.host, cluster, head.target, head.accept, head.if_none_match));
        }
        if let (true, Some(gvr)) = (route.rerouted, decision.gvr) {
            active.metrics.rerouted(gvr.id);
        }
        if let (Some(identity), false) = (&decision.identity, head.certificate_checked) {
            self.leave_on_connection(&active, identity, credential_id.as_deref());
        }
        if let Some(gated) = route.gated.filter(|_| !end_of_stream) {
            self.gated = Some(gated);
            return Action::Pause;
        }
        match decision.openapi {
            None => self.admit(&active, route.cluster, 0),
            Some(_) => Action::Continue,
        }
    }

    /// A held request's body waits with it, in Envoy's buffer: left to Envoy's default, the
    /// first piece of it would send the request on while its cluster is still down. A gated
    /// write's body is read whole before it goes anywhere.
    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(gated) = self.gated {
            if !end_of_stream && body_size <= MAX_GATED_BODY {
                return Action::Pause;
            }
            self.gated = None;
            let body = end_of_stream.then_some(body_size);
            return self.route_by_body(gated, body);
        }
        match self.held.as_ref().map(|r| r.get()) {
            Some(Release::Waiting) => {
                self.holding.body_grew(self.id, body_size);
                Action::Pause
            }
            Some(Release::Answered) => Action::Pause,
            Some(Release::Resumed) | None => Action::Continue,
        }
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        if let Some(gated) = self.gated.take() {
            return self.route_by_body(gated, None);
        }
        match self.held.as_ref().map(|r| r.get()) {
            Some(Release::Waiting | Release::Answered) => Action::Pause,
            Some(Release::Resumed) | None => Action::Continue,
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.replacing {
            return self.on_openapi_body(body_size).unwrap_or(Action::Continue);
        }
        if !end_of_stream {
            // Dropped as it arrives: the apiserver's documents can be several MB.
            self.host.drop_response_body(body_size);
            return Action::Pause;
        }
        self.replace(body_size);
        Action::Continue
    }

    /// An apiserver's answer that ends with trailers: the composed body goes in before them.
    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        if self.replacing {
            self.replace(0);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.replied || self.held.as_ref().is_some_and(|r| r.get() == Release::Answered) {
            return Action::Continue;
        }
        let status = self
            .host
            .response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok().and_then(|s| s.parse::<u16>().ok()))
            .unwrap_or(0);
        if let Some(pending) = self.openapi.as_mut().filter(|_| skewgate_core::openapi::authorized(status)) {
            return match pending.dispatch(&self.host) {
                Ok(()) => Action::Pause,
                Err(reply) => {
                    self.openapi = None;
                    self.reply_status(&reply)
                }
            };
        }
        if self.compose.is_some() && ((200..300).contains(&status) || status == 304) {
            if end_of_stream {
                return self.compose_reply();
            }
            // The apiserver's body is still coming: a local reply now would reset the upstream
            // stream, and an HTTP/1.1 upstream connection with it (measured: one new connection
            // and mTLS handshake per composed answer). Its body is dropped as it arrives and the
            // composed answer put in its place at the end.
            self.replacing = self.active.as_deref().and_then(|a| self.composed(a)).is_some();
            return if self.replacing { Action::Pause } else { Action::Continue };
        }
        if status < 500 {
            return Action::Continue;
        }
        let details = self.host.property(&["response", "code_details"]).unwrap_or_default();
        if details == b"via_upstream" {
            // The apiserver's own answer: never rewritten.
            return Action::Continue;
        }
        let Some(active) = self.active.clone() else { return Action::Continue };
        let table = &active.table;
        active.metrics.unavailable(self.routed.serving);
        let details = String::from_utf8_lossy(&details);
        let members = table.members(self.routed.serving.unwrap_or(Serving::All)).count();
        if edits::no_apiserver_took_it(&details, members) {
            // The requests that follow wait for the cluster to come back, this one is answered:
            // it is under way in Envoy and cannot be sent again from here.
            if let Some(cluster) = self.host.property(&["xds", "cluster_name"]) {
                self.holding.failed(&String::from_utf8_lossy(&cluster));
            }
        }
        let reply = self.routed.unavailable(table, &details);
        self.reply_status(&reply)
    }
}

impl<H: Host> Drop for Http<H> {
    /// A held stream Envoy ended (its client left) is no longer waited for.
    fn drop(&mut self) {
        if self.held.as_ref().is_some_and(|r| r.get() == Release::Waiting) {
            self.holding.forget(self.id);
        }
    }
}

impl<H: Host> Http<H> {
    fn edit(&self, edits: Vec<Edit<'_>>) {
        for edit in edits {
            match edit {
                Edit::Remove(name) => self.host.set_request_header(name, None),
                Edit::Set(name, value) => self.host.set_request_header(name, Some(&value)),
                Edit::Add(name, value) => self.host.add_request_header(name, &value),
            }
        }
    }

    /// Last: everything the request carries is decided, only when it leaves is not. A request
    /// whose cluster is down waits for it ([`crate::hold`]), its body (`body_size` bytes so far)
    /// counted against the room.
    fn admit(&mut self, active: &Rc<Active<H>>, cluster: &str, body_size: usize) -> Action {
        self.held = self.holding.admit(cluster, self.id, active, &self.routed);
        if self.held.is_none() {
            return Action::Continue;
        }
        if body_size > 0 {
            self.holding.body_grew(self.id, body_size);
        }
        Action::Pause
    }

    /// A gated write, its body complete (`Some(size)`) or not to be read (too long, or followed
    /// by trailers): to the apiservers that have the gates of the fields it sets, which a body
    /// not read is taken to set all of.
    fn route_by_body(&mut self, gated: GatedWrite, body_size: Option<usize>) -> Action {
        let Some(active) = self.active.clone() else { return Action::Continue };
        let gates = match body_size {
            Some(size) => {
                let headers = self.host.request_headers();
                let header = |name: &str| {
                    headers.iter().find(|(n, _)| n == name).map(|(_, v)| String::from_utf8_lossy(v))
                };
                match self.host.request_body(size) {
                    Some(body) => gated.used(
                        header("content-type").as_deref(),
                        header("content-encoding").as_deref(),
                        &body,
                    ),
                    None if size == 0 => 0,
                    // Envoy did not hand the body over: read as setting every field.
                    None => gated.gates,
                }
            }
            None => gated.gates,
        };
        let outcome = match (gated.route(&active.table, gates), body_size) {
            (Some((serving, route)), _) => {
                self.edit(edits::reroute_edits(&route));
                self.routed.serving = Some(serving);
                if body_size.is_some() { Gated::Narrowed } else { Gated::Unread }
            }
            (None, _) => Gated::AsRouted,
        };
        active.metrics.gated_write(outcome);
        let cluster = active.table.cluster(self.routed.serving.unwrap_or(gated.serving)).to_owned();
        self.admit(&active, &cluster, body_size.unwrap_or(0))
    }

    /// Leaves a mapped certificate identity on the connection, for the bypass routes to forward
    /// on its later requests ([`skewgate_core::bypass`]). Read-only there, and a second set would
    /// trap the VM: only for a connection without the marker.
    fn leave_on_connection(&self, active: &Active<H>, identity: &Identity<'_>, credential_id: Option<&str>) {
        if !active.connection_identity {
            return;
        }
        let Some(state) = ConnectionIdentity::new(identity, credential_id) else { return };
        // In order, the marker last: a refused set leaves the marker unset, so no route takes a
        // partial identity.
        for (name, value) in &state.properties {
            if !self.host.set_connection_property(name, value) {
                return;
            }
        }
    }

    /// The apiserver's body while the composed answer is on its way: dropped chunk by chunk, so
    /// that a multi-megabyte document never fills Envoy's buffer.
    fn on_openapi_body(&mut self, body_size: usize) -> Option<Action> {
        if self.replied || !self.openapi.as_ref().is_some_and(|p| p.dispatched) {
            return None;
        }
        self.host.drop_response_body(body_size);
        Some(Action::Pause)
    }

    /// The composed document (or 304, or 406) in place of an answer an apiserver authorized.
    /// Read from the table the request was decided on, so a table swap in between cannot mix two
    /// documents.
    fn composed<'t>(&self, active: &'t Active<H>) -> Option<decision::Reply<'t>> {
        let (status, source) = self.compose?;
        decision::composed_reply(&active.table, source, status)
    }

    /// The composed answer as a local reply: the apiserver's answer is complete (or it would be
    /// reset).
    fn compose_reply(&mut self) -> Action {
        let Some(active) = self.active.clone() else { return Action::Continue };
        let Some(reply) = self.composed(&active) else { return Action::Continue };
        count(&active, &reply);
        let headers = reply.headers().into_iter().filter(|(_, v)| !v.is_empty()).collect();
        let body = (!reply.body.is_empty()).then_some(reply.body);
        self.reply(u32::from(reply.status), headers, body)
    }

    /// The apiserver's answer, whose body the filter dropped (`size` bytes are left), turned into
    /// the composed one: its status, headers and body.
    fn replace(&mut self, size: usize) {
        self.replacing = false;
        let Some(active) = self.active.clone() else { return };
        let Some(reply) = self.composed(&active) else { return };
        if !self.host.replace_response_body(size, reply.body) {
            // No body to put it in: the answer, complete, no longer holds an upstream stream.
            self.compose_reply();
            return;
        }
        count(&active, &reply);
        self.replied = true;
        // The apiserver's headers describe its body (length, encoding, its own ETag): none
        // stays but the date, as in a local reply.
        for (name, _) in self.host.response_headers() {
            if !name.starts_with(':') && name != "date" {
                self.host.set_response_header(&name, None);
            }
        }
        self.host.set_response_header(":status", Some(&reply.status.to_string()));
        for (name, value) in reply.headers() {
            self.host.set_response_header(name, (!value.is_empty()).then_some(value));
        }
        self.host.set_response_header("content-length", Some(&reply.body.len().to_string()));
    }
}

/// Every composed answer sent, counted once.
fn count<H: Host>(active: &Active<H>, reply: &decision::Reply) {
    if matches!(reply.source, decision::Composed::MergedDiscovery(_)) {
        active.metrics.merged_discovery(reply.status);
    }
}
