//! One HTTP stream: core's pipeline ([`skewgate_core::stream`]) over proxy-wasm, with what only
//! the filter does around it: OpenAPI documents composed from callouts, the hold, and writes
//! whose body decides where they go.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use skewgate_core::bypass::{self, ConnectionIdentity};
use skewgate_core::decision::{Composed, GatedWrite};
use skewgate_core::edits::{self, Carrier, Reply};
use skewgate_core::hold::Standing;
use skewgate_core::identity::Identity;
use skewgate_core::stream::{self, Next, Pipeline, Request, Sent, Unrouted};

use crate::active::Active;
use crate::hold::Holding;
use crate::host::{Envoy, Host};
use crate::metrics::Gated;
use crate::openapi::Pending;

pub struct Http<H: Host> {
    host: H,
    active: Option<Rc<Active<H>>>,
    pipeline: Pipeline,
    /// An OpenAPI document composed at the edge, once an apiserver has let the request through.
    openapi: Option<Pending>,
    /// The stream's context id, which the root context releases a held request by.
    id: u32,
    holding: Rc<Holding<H>>,
    /// Held at the edge while its cluster was down: [`Holding::standing`] says where it stands.
    held: bool,
    /// A write whose body decides where it goes, waiting for its body in Envoy's buffer.
    gated: Option<GatedWrite>,
}

/// The largest body of a gated write read to decide where it goes: a longer one goes to the
/// apiservers that keep every gated field, without being read. Well within the listener's
/// buffer (1 MiB), past which Envoy would answer 413; the objects with gated fields are small.
const MAX_GATED_BODY: usize = 256 * 1024;

fn action(next: Next) -> Action {
    match next {
        Next::Continue => Action::Continue,
        Next::Pause => Action::Pause,
    }
}

impl<H: Host> Http<H> {
    pub fn new(host: H, active: Option<Rc<Active<H>>>, id: u32, holding: Rc<Holding<H>>) -> Self {
        Self {
            host,
            active,
            pipeline: Pipeline::default(),
            openapi: None,
            id,
            holding,
            held: false,
            gated: None,
        }
    }

    fn reply_status(&mut self, reply: &Reply) -> Action {
        let headers = reply.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.pipeline.reply(&mut Envoy(&self.host), reply.status, &headers, reply.body.as_bytes(), "");
        Action::Pause
    }

    /// Where the stream stands in the hold, if it was held.
    fn standing(&self) -> Option<Standing> {
        if self.held { self.holding.standing(self.id) } else { None }
    }

    /// Counts an answer the pipeline sent, and tells the hold of a cluster found down.
    fn sent(&self, sent: Option<Sent>) {
        let (Some(sent), Some(active)) = (sent, self.active.as_deref()) else { return };
        match sent {
            Sent::Composed { source: Composed::MergedDiscovery(_), status } => {
                active.metrics.merged_discovery(status)
            }
            Sent::Composed { .. } => {}
            Sent::Unavailable { serving, no_apiserver_took_it } => {
                active.metrics.unavailable(serving);
                if no_apiserver_took_it {
                    // The requests that follow wait for the cluster to come back, this one is
                    // answered: it is under way in Envoy and cannot be sent again from here.
                    if let Some(cluster) = self.host.property(&["xds", "cluster_name"]) {
                        self.holding.failed(&String::from_utf8_lossy(&cluster));
                    }
                }
            }
        }
    }
}

impl<H: Host> Context for Http<H> {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        let Some(pending) = self.openapi.take() else { return };
        let (status, headers, body) = pending.answer(&self.host, body_size);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.pipeline.reply(&mut Envoy(&self.host), status, &headers, &body, "");
    }
}

impl<H: Host> HttpContext for Http<H> {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let Some(active) = self.active.clone() else {
            return self.reply_status(&edits::unconfigured());
        };
        active.metrics.seen();
        let headers = self.host.request_headers();
        let mut request = Request::read(headers.iter().map(|(name, value)| (name.as_bytes(), &value[..])));
        // A connection that carries a mapped identity had its certificate checked on its first
        // request; the others' is checked on each (a refused one is never mapped).
        let host = &self.host;
        request.read_connection(&Envoy(host), |_| {
            active.connection_identity && host.property(&[bypass::MARKER]).is_some()
        });
        let routing = match self.pipeline.on_request_headers(
            &mut Envoy(host),
            &active.table,
            &request,
            Carrier::Filter,
        ) {
            Ok(routing) => routing,
            Err(Unrouted::Refused) => {
                active.metrics.refused();
                return Action::Pause;
            }
            Err(Unrouted::HandedOff) => return Action::Continue,
        };
        let decision = &routing.decision;
        let Some(route) = decision.route() else { return Action::Continue };
        if let Some(cluster) = decision.openapi {
            let pending =
                Pending::start(host, cluster, request.target(), request.accept(), request.if_none_match());
            self.openapi = Some(pending);
        }
        if let (true, Some(gvr)) = (route.rerouted, decision.gvr) {
            active.metrics.rerouted(gvr.id);
        }
        if let (Some(identity), false) = (&decision.identity, routing.certificate_checked) {
            self.leave_on_connection(&active, identity, routing.credential_id.as_deref());
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
        match self.standing() {
            Some(Standing::Waiting) => {
                self.holding.body_grew(self.id, body_size);
                Action::Pause
            }
            Some(Standing::Answered) => Action::Pause,
            Some(Standing::Resumed) | None => Action::Continue,
        }
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        if let Some(gated) = self.gated.take() {
            return self.route_by_body(gated, None);
        }
        match self.standing() {
            Some(Standing::Waiting | Standing::Answered) => Action::Pause,
            Some(Standing::Resumed) | None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.standing() == Some(Standing::Answered) {
            return Action::Continue;
        }
        if let (Some(pending), false) = (self.openapi.as_mut(), self.pipeline.replied()) {
            if skewgate_core::openapi::authorized(stream::response_status(&Envoy(&self.host))) {
                return match pending.dispatch(&self.host) {
                    Ok(()) => Action::Pause,
                    Err(reply) => {
                        self.openapi = None;
                        self.reply_status(&reply)
                    }
                };
            }
        }
        let Some(active) = self.active.as_deref() else { return Action::Continue };
        let (next, sent) =
            self.pipeline.on_response_headers(&mut Envoy(&self.host), &active.table, end_of_stream);
        self.sent(sent);
        action(next)
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(active) = self.active.as_deref() else { return Action::Continue };
        let stream = &mut Envoy(&self.host);
        match self.pipeline.on_response_body(stream, &active.table, body_size, end_of_stream) {
            Some((next, sent)) => {
                self.sent(sent);
                action(next)
            }
            None => self.on_openapi_body(body_size).unwrap_or(Action::Continue),
        }
    }

    /// An apiserver's answer that ends with trailers: the composed body goes in before them.
    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        if let Some(active) = self.active.as_deref() {
            let sent = self.pipeline.on_response_trailers(&mut Envoy(&self.host), &active.table);
            self.sent(sent);
        }
        Action::Continue
    }
}

impl<H: Host> Drop for Http<H> {
    /// A held stream Envoy ended (its client left, or it is done) is no longer waited for.
    fn drop(&mut self) {
        if self.held {
            self.holding.forget(self.id);
        }
    }
}

impl<H: Host> Http<H> {
    /// Last: everything the request carries is decided, only when it leaves is not. A request
    /// whose cluster is down waits for it ([`crate::hold`]), its body (`body_size` bytes so far)
    /// counted against the room.
    fn admit(&mut self, active: &Rc<Active<H>>, cluster: &str, body_size: usize) -> Action {
        let Some(routed) = self.pipeline.routed() else { return Action::Continue };
        self.held = self.holding.admit(cluster, self.id, active, routed);
        if !self.held {
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
                stream::carry_out(&mut Envoy(&self.host), edits::reroute_edits(&route));
                self.pipeline.reroute(serving);
                if body_size.is_some() { Gated::Narrowed } else { Gated::Unread }
            }
            (None, _) => Gated::AsRouted,
        };
        active.metrics.gated_write(outcome);
        let serving = self.pipeline.routed().and_then(|r| r.serving).unwrap_or(gated.serving);
        let cluster = active.table.cluster(serving).to_owned();
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
        if self.pipeline.replied() || !self.openapi.as_ref().is_some_and(|p| p.dispatched) {
            return None;
        }
        self.host.drop_response_body(body_size);
        Some(Action::Pause)
    }
}
