//! One HTTP stream through the edge, written once for both carriers of the decision, the
//! proxy-wasm filter and the native module: read the request's head, decide, carry out the plan
//! (or refuse, or hand the request to the filter behind the module), then answer Envoy's own
//! failure of it and put a composed document in place of the apiserver's answer. What only one
//! carrier does stays with it, around these steps: the filter's OpenAPI callouts, its hold and
//! the gated writes whose body it reads; the module's memory of certificates that passed.
//!
//! Host calls go through [`Stream`], which each carrier implements thinly over its ABI and the
//! tests fake ([`fake::FakeStream`]).

use std::borrow::Cow;

use crate::certificate::PEER_CERTIFICATE_HEADER;
use crate::decision::{self, Composed, Decision, RequestHead};
use crate::edits::{self, Carrier, Edit, Routed};
use crate::identity;
use crate::native::module_handles;
use crate::pretty;
use crate::table::{RoutingTable, Serving};

#[cfg(any(test, feature = "testing"))]
pub mod fake;

/// The attributes of a stream the pipeline reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    /// The verified client certificate's subject, as Envoy renders it (RFC 2253).
    ClientSubject,
    /// The lower-case hex SHA-256 of the client certificate's DER.
    ClientCertificateDigest,
    /// Why Envoy answered as it did: `via_upstream` for an apiserver's own answer.
    ResponseDetails,
}

/// What the pipeline asks of Envoy for one stream, during one of its hooks. Request headers are
/// read by the carrier (each ABI hands them over its own way) into a [`Request`].
pub trait Stream {
    fn attribute(&self, which: Attribute) -> Option<Cow<'_, [u8]>>;
    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    fn response_header_names(&self) -> Vec<String>;
    /// Replaces every value of a request header; `None` removes it.
    fn set_request_header(&mut self, name: &str, value: Option<&str>);
    fn add_request_header(&mut self, name: &str, value: &str);
    /// Replaces every value of a response header; `None` removes it. Only while the response
    /// headers wait (the hook that read them paused).
    fn set_response_header(&mut self, name: &str, value: Option<&str>);
    /// A local reply in place of the upstream's; `details` is what Envoy's access log records.
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str);
    /// Drops the `size` bytes of response body this hook received.
    fn drop_response_body(&mut self, size: usize);
    /// At the response body's end (its last data, `size` bytes still held, or its trailers),
    /// puts `body` in its place; false when there is no body to put it in.
    fn end_response_body(&mut self, size: usize, body: &[u8], at_trailers: bool) -> bool;
    /// Envoy picks the route again, from the headers as the pipeline left them. The proxy-wasm
    /// host does so after any header change by itself.
    fn clear_route_cache(&mut self) {}
}

/// What the edge reads of a request: its head, from one pass over its headers, and who is on
/// the other end of its connection.
#[derive(Debug, Default, Clone)]
pub struct Request<'h> {
    method: Cow<'h, str>,
    target: Cow<'h, str>,
    accept: Option<Cow<'h, str>>,
    if_none_match: Option<Cow<'h, str>>,
    pretty_agent: bool,
    token: bool,
    certificate: Option<Cow<'h, [u8]>>,
    /// The names of its headers some decision strips ([`decision::strippable`]).
    strippable: Vec<Cow<'h, str>>,
    subject: Option<String>,
    certificate_checked: bool,
}

impl<'h> Request<'h> {
    /// The headers as Envoy hands them to filters (names lower-case). Borrows what it can.
    pub fn read(headers: impl IntoIterator<Item = (&'h [u8], &'h [u8])>) -> Self {
        let mut request = Request::default();
        let text = String::from_utf8_lossy;
        for (name, value) in headers {
            match name {
                b":method" => request.method = text(value),
                b":path" => request.target = text(value),
                b"accept" => request.accept = Some(text(value)),
                b"if-none-match" => request.if_none_match = Some(text(value)),
                b"user-agent" => request.pretty_agent = pretty::agent_wants(value),
                // Set by the bootstrap's header mutation ahead of the carrier, over anything a
                // client sent, whenever the connection has a certificate; read only then, and
                // stripped with the other reserved headers.
                n if n == PEER_CERTIFICATE_HEADER.as_bytes() => {
                    request.certificate = Some(Cow::Borrowed(value));
                    request.strippable.push(Cow::Borrowed(PEER_CERTIFICATE_HEADER));
                }
                // Envoy hands names lower-case; a spoofed identity header must go all the same
                // if one ever came otherwise. Only those a decision may strip are kept: the
                // listener has removed most already, so a request rarely keeps any.
                n if n.get(..2).is_some_and(|p| p.eq_ignore_ascii_case(b"x-")) => {
                    let name = std::str::from_utf8(n).ok().filter(|n| decision::strippable(n));
                    request.strippable.extend(name.map(Cow::Borrowed));
                }
                n => request.token |= std::str::from_utf8(n).is_ok_and(|n| identity::carries_token(n, value)),
            }
        }
        request
    }

    /// Its own copy: for a carrier whose host buffers may move once a header is set.
    pub fn into_owned(self) -> Request<'static> {
        let own = |c: Cow<'_, str>| Cow::Owned(c.into_owned());
        Request {
            method: own(self.method),
            target: own(self.target),
            accept: self.accept.map(own),
            if_none_match: self.if_none_match.map(own),
            pretty_agent: self.pretty_agent,
            token: self.token,
            certificate: self.certificate.map(|c| Cow::Owned(c.into_owned())),
            strippable: self.strippable.into_iter().map(own).collect(),
            subject: self.subject,
            certificate_checked: self.certificate_checked,
        }
    }

    /// The client certificate's subject, from the verified connection, never from a header (a
    /// client's own `x-forwarded-client-cert` is dropped by Envoy and read by nobody); and
    /// whether the carrier knows its names passed on an earlier request (`passed_before`, asked
    /// only when there is a certificate).
    pub fn read_connection<S: Stream>(&mut self, stream: &S, passed_before: impl FnOnce(&S) -> bool) {
        self.subject = stream.attribute(Attribute::ClientSubject).map(|s| match s {
            Cow::Owned(bytes) => String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            Cow::Borrowed(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        });
        self.certificate_checked = self.client_subject().is_some() && passed_before(stream);
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    pub fn accept(&self) -> Option<&str> {
        self.accept.as_deref()
    }

    pub fn if_none_match(&self) -> Option<&str> {
        self.if_none_match.as_deref()
    }

    fn client_subject(&self) -> Option<&str> {
        identity::client_subject(self.subject.as_deref())
    }

    /// What [`decision::decide`] reads.
    pub fn head(&self) -> RequestHead<'_> {
        let client_subject = self.client_subject();
        RequestHead {
            method: &self.method,
            target: &self.target,
            accept: self.accept.as_deref(),
            if_none_match: self.if_none_match.as_deref(),
            client_subject,
            certificate_checked: self.certificate_checked,
            client_certificate: self.certificate.as_deref().filter(|_| client_subject.is_some()),
            token: self.token,
            pretty_agent: self.pretty_agent,
        }
    }
}

/// A request this carrier did not route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrouted {
    /// Refused at the edge: the 401 is sent.
    Refused,
    /// Left to the proxy-wasm filter behind the module, with what the decision strips gone.
    HandedOff,
}

/// A routed request, its headers edited as the decision says: what the carrier may still do
/// with it needs its decision.
pub struct Routing<'t, 'r> {
    pub decision: Decision<'t, 'r>,
    /// The connection's certificate was known to have passed: its names were not read again.
    pub certificate_checked: bool,
    /// The x509 credential id sent with a mapped certificate identity, where the policy asks.
    pub credential_id: Option<String>,
}

/// What Envoy does after a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Continue,
    /// Headers: wait. Body: wait for more, keeping nothing of what came (the pipeline took it).
    Pause,
}

/// An answer the pipeline sent, for the carrier to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// A composed document (or its 304 or 406), in place of the apiserver's answer.
    Composed { source: Composed, status: u16 },
    /// Envoy's own failure as a `Status`; `no_apiserver_took_it`: no apiserver of the cluster
    /// could take the request ([`edits::no_apiserver_took_it`]).
    Unavailable { serving: Option<Serving>, no_apiserver_took_it: bool },
}

/// One stream's state between its hooks.
#[derive(Debug, Default)]
pub struct Pipeline {
    /// Where the request went (when this carrier routed it), for the 503 if Envoy cannot get it
    /// there.
    routed: Option<Routed>,
    /// The response is ours (an answer sent at the edge, or the composed one in place): left
    /// alone.
    replied: bool,
    /// The composed answer (its status and document) that replaces an authorized upstream one.
    compose: Option<(u16, Composed)>,
    /// The apiserver authorized the composed answer; its body is being replaced.
    replacing: bool,
}

impl Pipeline {
    /// Decides the request on `table` and carries out the decision's edits; a refusal is
    /// answered, and, for the module, a request it does not apply itself
    /// ([`module_handles`]) goes on to the filter behind it with only the strips made.
    pub fn on_request_headers<'t, 'r>(
        &mut self,
        stream: &mut impl Stream,
        table: &'t RoutingTable,
        request: &'r Request<'_>,
        carrier: Carrier,
    ) -> Result<Routing<'t, 'r>, Unrouted> {
        let head = request.head();
        let decision = decision::decide(table, &head);
        if carrier == Carrier::Module && !module_handles(table, &decision) {
            // The filter decides it again and does all of it; a client's own x-skewgate-route
            // must not pick a route that skips the filter, so the strips are made here already.
            let mut stripped = false;
            for name in request.strippable.iter().filter(|n| decision.strips(n)) {
                stream.set_request_header(name, None);
                stripped = true;
            }
            if stripped {
                stream.clear_route_cache();
            }
            return Err(Unrouted::HandedOff);
        }
        let credential_id = match (&decision.identity, table.policy().x509_credential_id) {
            // Envoy's digest is what kube-apiserver's x509 authenticator records.
            (Some(_), true) => stream
                .attribute(Attribute::ClientCertificateDigest)
                .as_deref()
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(identity::x509_credential_id),
            _ => None,
        };
        let names = request.strippable.iter().map(|n| n.as_ref());
        carry_out(stream, edits::request_edits(&decision, names, carrier, credential_id.as_deref()));
        if let Some((status, body)) = edits::refusal(&decision) {
            let headers = [("content-type", "application/json")];
            self.reply(stream, status, &headers, body.as_bytes(), "skewgate_refused");
            return Err(Unrouted::Refused);
        }
        if let Some(route) = decision.route() {
            self.routed = Some(Routed::of(&decision, &head));
            self.compose = route.compose.map(|reply| (reply.status, reply.source));
        }
        stream.clear_route_cache();
        Ok(Routing { decision, certificate_checked: head.certificate_checked, credential_id })
    }

    /// Where the request went, if this carrier routed it.
    pub fn routed(&self) -> Option<&Routed> {
        self.routed.as_ref()
    }

    /// The carrier sends it elsewhere after all (a gated write, by its body).
    pub fn reroute(&mut self, serving: Serving) {
        if let Some(routed) = &mut self.routed {
            routed.serving = Some(serving);
        }
    }

    /// Whether the response is one the edge answered.
    pub fn replied(&self) -> bool {
        self.replied
    }

    /// A local reply, after which the pipeline leaves the response alone.
    pub fn reply(
        &mut self,
        stream: &mut impl Stream,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        details: &str,
    ) {
        self.replied = true;
        stream.send_response(status, headers, body, details);
    }

    /// The apiserver's answer for a request this carrier routed: a composed answer takes the
    /// place of one it authorized; Envoy's own failure becomes the 503 `Status` naming who serves
    /// the request; an apiserver's own answer passes untouched.
    pub fn on_response_headers(
        &mut self,
        stream: &mut impl Stream,
        table: &RoutingTable,
        end_of_stream: bool,
    ) -> (Next, Option<Sent>) {
        let Some(routed) = self.routed.as_ref().filter(|_| !self.replied) else {
            return (Next::Continue, None);
        };
        let status = response_status(stream);
        if let (Some((compose, source)), true) = (self.compose, (200..300).contains(&status) || status == 304)
        {
            let Some(reply) = decision::composed_reply(table, source, compose) else {
                return (Next::Continue, None);
            };
            if end_of_stream {
                return (Next::Pause, Some(self.send_composed(stream, &reply)));
            }
            // The apiserver's body is still coming: a local reply now would reset the upstream
            // stream, and an HTTP/1.1 upstream connection with it (measured: one new connection
            // and mTLS handshake per composed answer). Its body is dropped as it arrives and the
            // composed answer put in its place at the end.
            self.replacing = true;
            return (Next::Pause, None);
        }
        if status < 500 {
            return (Next::Continue, None);
        }
        let details = stream.attribute(Attribute::ResponseDetails).unwrap_or_default();
        if *details == *b"via_upstream" {
            // The apiserver's own answer: never rewritten.
            return (Next::Continue, None);
        }
        let details = String::from_utf8_lossy(&details).into_owned();
        let reply = routed.unavailable(table, &details);
        let serving = routed.serving;
        let members = table.members(serving.unwrap_or(Serving::All)).count();
        let sent = Sent::Unavailable {
            serving,
            no_apiserver_took_it: edits::no_apiserver_took_it(&details, members),
        };
        let headers = reply.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.reply(stream, reply.status, &headers, reply.body.as_bytes(), "skewgate_unavailable");
        (Next::Pause, Some(sent))
    }

    /// A piece of the apiserver's body. `None` when the pipeline is not replacing it (the
    /// carrier's to handle); otherwise dropped as it arrives, since the apiserver's documents
    /// can be several MB, and the composed body put in its place at the end.
    pub fn on_response_body(
        &mut self,
        stream: &mut impl Stream,
        table: &RoutingTable,
        size: usize,
        end_of_stream: bool,
    ) -> Option<(Next, Option<Sent>)> {
        if !self.replacing {
            return None;
        }
        if !end_of_stream {
            stream.drop_response_body(size);
            return Some((Next::Pause, None));
        }
        Some((Next::Continue, self.replace(stream, table, size, false)))
    }

    /// An apiserver's answer that ends with trailers: the composed body goes in before them.
    pub fn on_response_trailers(&mut self, stream: &mut impl Stream, table: &RoutingTable) -> Option<Sent> {
        if !self.replacing {
            return None;
        }
        self.replace(stream, table, 0, true)
    }

    /// The composed answer as a local reply: the apiserver's answer is complete (or it would be
    /// reset).
    fn send_composed(&mut self, stream: &mut impl Stream, reply: &decision::Reply<'_>) -> Sent {
        let headers: Vec<(&str, &str)> = reply.headers().into_iter().filter(|(_, v)| !v.is_empty()).collect();
        self.reply(stream, u32::from(reply.status), &headers, reply.body, "skewgate_composed");
        Sent::Composed { source: reply.source, status: reply.status }
    }

    /// The apiserver's answer, whose body was dropped (`size` bytes are left), turned into the
    /// composed one: its status, headers and body. Read from the table the request was decided
    /// on, so a table swap in between cannot mix two documents.
    fn replace(
        &mut self,
        stream: &mut impl Stream,
        table: &RoutingTable,
        size: usize,
        at_trailers: bool,
    ) -> Option<Sent> {
        self.replacing = false;
        let (status, source) = self.compose?;
        let reply = decision::composed_reply(table, source, status)?;
        if !stream.end_response_body(size, reply.body, at_trailers) {
            // No body to put it in: the answer, complete, no longer holds an upstream stream.
            return Some(self.send_composed(stream, &reply));
        }
        self.replied = true;
        // The apiserver's headers describe its body (length, encoding, its own ETag): none
        // stays but the date, as in a local reply.
        for name in stream.response_header_names() {
            if !name.starts_with(':') && name != "date" {
                stream.set_response_header(&name, None);
            }
        }
        stream.set_response_header(":status", Some(&reply.status.to_string()));
        for (name, value) in reply.headers() {
            stream.set_response_header(name, (!value.is_empty()).then_some(value));
        }
        stream.set_response_header("content-length", Some(&reply.body.len().to_string()));
        Some(Sent::Composed { source: reply.source, status: reply.status })
    }
}

/// The response's status, 0 when Envoy has none that parses.
pub fn response_status(stream: &impl Stream) -> u16 {
    let status = stream.response_header(":status");
    status.and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok()).unwrap_or(0)
}

/// Makes `edits` to the request, in order.
pub fn carry_out(stream: &mut impl Stream, edits: Vec<Edit<'_>>) {
    for edit in edits {
        match edit {
            Edit::Remove(name) => stream.set_request_header(name, None),
            Edit::Set(name, value) => stream.set_request_header(name, Some(&value)),
            Edit::Add(name, value) => stream.add_request_header(name, &value),
        }
    }
}

#[cfg(test)]
#[cfg(not(target_arch = "wasm32"))]
mod tests {
    use super::fake::FakeStream;
    use super::*;
    use crate::testing::{sample, sealed};
    use serde_json::json;

    const CARRIERS: [Carrier; 2] = [Carrier::Filter, Carrier::Module];
    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    const MERGED: &[u8] = br#"{"kind":"APIGroupDiscoveryList"}"#;

    fn table(hold: bool) -> RoutingTable {
        let mut table = sample();
        if !hold {
            table["policy"] = json!({"hold": {"maxWait": "0s"}});
        }
        RoutingTable::from_sealed_json(sealed(&table).to_string().as_bytes()).expect("the sample table")
    }

    /// Through the request headers of `stream` on `table`; whether it was routed.
    fn requested(
        pipeline: &mut Pipeline,
        stream: &mut FakeStream,
        table: &RoutingTable,
        carrier: Carrier,
    ) -> &'static str {
        let mut request =
            Request::read(stream.request.clone().iter().map(|(n, v)| (&n[..], &v[..])).collect::<Vec<_>>())
                .into_owned();
        request.read_connection(stream, |_| false);
        match pipeline.on_request_headers(stream, table, &request, carrier) {
            Err(Unrouted::Refused) => "refused",
            Err(Unrouted::HandedOff) => "handed off",
            Ok(_) => "routed",
        }
    }

    fn discovery() -> FakeStream {
        FakeStream::request(&[
            (":method", "GET"),
            (":path", "/apis"),
            ("authorization", "Bearer t"),
            ("accept", V2),
        ])
    }

    /// One pass reads the head; what it borrowed, its own copy keeps alike.
    #[test]
    fn the_head_is_read_in_one_pass_and_owned_alike() {
        let headers: &[(&[u8], &[u8])] = &[
            (b":method", b"GET"),
            (b":path", b"/apis?pretty=false"),
            (b"accept", b"application/json"),
            (b"if-none-match", b"\"E\""),
            (b"user-agent", b"curl/8.5"),
            (b"authorization", b"Bearer t"),
            (b"X-Remote-User", b"admin"),
            (b"x-request-id", b"7"),
            (b"x-skewgate-peer-certificate", b"PEM"),
            (b"content-type", b"application/json"),
        ];
        let borrowed = Request::read(headers.iter().copied());
        let owned = borrowed.clone().into_owned();
        for request in [&borrowed, &owned] {
            let head = request.head();
            assert_eq!(
                (head.method, head.target, head.accept, head.if_none_match),
                ("GET", "/apis?pretty=false", Some("application/json"), Some("\"E\""))
            );
            assert!(head.token && head.pretty_agent);
            // No subject on the connection: the certificate header is not read, only stripped.
            assert_eq!((head.client_subject, head.client_certificate), (None, None));
            let names: Vec<&str> = request.strippable.iter().map(|n| n.as_ref()).collect();
            assert_eq!(names, ["X-Remote-User", PEER_CERTIFICATE_HEADER]);
        }
    }

    /// The certificate is read only with a subject on the verified connection, and the carrier is
    /// asked whether its names passed before only then.
    #[test]
    fn the_certificate_counts_only_on_a_verified_connection() {
        let headers: &[(&[u8], &[u8])] = &[(b"x-skewgate-peer-certificate", b"PEM")];
        let mut request = Request::read(headers.iter().copied());
        let bare = FakeStream::default();
        request.read_connection(&bare, |_| panic!("asked without a certificate"));
        assert_eq!(request.head().client_certificate, None);
        let verified = FakeStream::default().attribute_is(Attribute::ClientSubject, b"CN=bob");
        request.read_connection(&verified, |_| true);
        let head = request.head();
        assert_eq!(
            (head.client_subject, head.client_certificate, head.certificate_checked),
            (Some("CN=bob"), Some(&b"PEM"[..]), true)
        );
    }

    /// The same request through either carrier: the same edits but for the route class.
    #[test]
    fn both_carriers_route_alike_but_for_the_route_class() {
        let table = table(false);
        let mut sent = Vec::new();
        for carrier in CARRIERS {
            let mut stream = FakeStream::request(crate::testing::SPOOFED_WATCH);
            assert_eq!(requested(&mut Pipeline::default(), &mut stream, &table, carrier), "routed");
            let mut headers: Vec<(String, Vec<String>)> = [
                "x-skewgate-cluster",
                "x-kubernetes-peer-proxied",
                "x-remote-user",
                "x-remote-group",
                "x-skewgate-route",
            ]
            .iter()
            .map(|n| (n.to_string(), stream.header(n)))
            .collect();
            headers.retain(|(_, v)| !v.is_empty());
            sent.push((headers, stream.route_cleared));
        }
        let class = |c: &str| ("x-skewgate-route".to_string(), vec![c.to_string()]);
        let cluster = ("x-skewgate-cluster".to_string(), vec!["set-c".to_string()]);
        let stamp = ("x-kubernetes-peer-proxied".to_string(), vec!["true".to_string()]);
        assert_eq!(sent[0], (vec![cluster.clone(), stamp.clone(), class(edits::LONG_RUNNING)], 1));
        assert_eq!(sent[1], (vec![cluster, stamp, class(edits::NATIVE_LONG_RUNNING)], 1));
    }

    /// What the module does not apply itself (here: the only server of an API, which the hold
    /// may keep waiting) goes on with only the strips made; the filter routes it.
    #[test]
    fn the_module_hands_off_what_the_filter_must_do_with_the_strips_made() {
        let table = table(true);
        let mut stream = FakeStream::request(crate::testing::SPOOFED_WATCH);
        let mut pipeline = Pipeline::default();
        assert_eq!(requested(&mut pipeline, &mut stream, &table, Carrier::Module), "handed off");
        for reserved in [
            "x-remote-user",
            "x-remote-group",
            "x-remote-extra-scopes",
            "x-kubernetes-peer-proxied",
            "x-skewgate-cluster",
            "x-skewgate-route",
        ] {
            assert!(stream.header(reserved).is_empty(), "{reserved}");
        }
        assert_eq!((stream.route_cleared, pipeline.routed()), (1, None));
        // Nothing of the response is the module's.
        stream.response.push((b":status".to_vec(), b"503".to_vec()));
        assert_eq!(pipeline.on_response_headers(&mut stream, &table, true), (Next::Continue, None));
        assert!(stream.reply.is_none());
        assert_eq!(
            requested(
                &mut Pipeline::default(),
                &mut FakeStream::request(crate::testing::SPOOFED_WATCH),
                &table,
                Carrier::Filter
            ),
            "routed"
        );
    }

    /// A certificate kube-apiserver would not read is refused at the edge by either carrier,
    /// and the response is left alone after.
    #[test]
    fn a_refusal_is_answered_and_nothing_after_it_is_touched() {
        use crate::testing::{CN, certificate_der, url_encoded_pem};
        let universal = url_encoded_pem(&certificate_der(&[(CN, 12, b"ca")], &[(CN, 28, b"\0\0\0a")]));
        let table = table(false);
        for carrier in CARRIERS {
            let mut stream = FakeStream::request(&[
                (":method", "GET"),
                (":path", "/api/v1/pods"),
                (PEER_CERTIFICATE_HEADER, &universal),
            ])
            .attribute_is(Attribute::ClientSubject, b"CN=admin");
            let mut pipeline = Pipeline::default();
            assert_eq!(requested(&mut pipeline, &mut stream, &table, carrier), "refused");
            let (status, body) = stream.reply_json().expect("a 401");
            assert_eq!(status, 401);
            assert!(body["message"].as_str().unwrap_or("").contains("UniversalString"), "{body}");
            assert!(
                stream.header("x-skewgate-cluster").is_empty()
                    && stream.header(PEER_CERTIFICATE_HEADER).is_empty()
            );
            stream.reply = None;
            stream.response.push((b":status".to_vec(), b"503".to_vec()));
            assert_eq!(pipeline.on_response_headers(&mut stream, &table, true), (Next::Continue, None));
            assert!(stream.reply.is_none() && pipeline.replied());
        }
    }

    /// Envoy's own failure becomes the 503 `Status` naming who serves the request, with
    /// whether any apiserver could take it; an apiserver's own 503 passes.
    #[test]
    fn envoys_failure_is_answered_and_the_apiservers_passes() {
        let table = table(false);
        for carrier in CARRIERS {
            let mut stream = FakeStream::request(&[
                (":method", "GET"),
                (":path", "/apis/resource.k8s.io/v1/resourceclaims"),
                ("authorization", "Bearer t"),
            ])
            .attribute_is(Attribute::ResponseDetails, b"no_healthy_upstream");
            let mut pipeline = Pipeline::default();
            requested(&mut pipeline, &mut stream, &table, carrier);
            stream.response.push((b":status".to_vec(), b"503".to_vec()));
            let (next, sent) = pipeline.on_response_headers(&mut stream, &table, true);
            let serving = pipeline.routed().and_then(|r| r.serving);
            assert_eq!(
                (next, sent),
                (Next::Pause, Some(Sent::Unavailable { serving, no_apiserver_took_it: true }))
            );
            assert!(serving.is_some());
            let (status, body) = stream.reply_json().expect("a Status");
            assert_eq!(status, 503);
            assert!(body["message"].as_str().unwrap_or("").contains("set-c"), "{body}");
            assert_eq!(stream.reply_header("retry-after"), Some("1"));
            assert_eq!(stream.reply.as_ref().map(|r| r.details.as_str()), Some("skewgate_unavailable"));

            let mut passed = FakeStream::request(&[
                (":method", "GET"),
                (":path", "/api/v1/pods"),
                ("authorization", "Bearer t"),
            ])
            .attribute_is(Attribute::ResponseDetails, b"via_upstream");
            let mut pipeline = Pipeline::default();
            requested(&mut pipeline, &mut passed, &table, carrier);
            passed.response.push((b":status".to_vec(), b"503".to_vec()));
            assert_eq!(pipeline.on_response_headers(&mut passed, &table, true), (Next::Continue, None));
            assert!(passed.reply.is_none());
        }
    }

    /// The merged document in place of an apiserver's authorized answer: at once when that
    /// answer has no body; otherwise its body dropped piece by piece and the document put in at
    /// its end (or before its trailers), its headers the document's but for the date; a local
    /// reply when there is no body to put it in. The same through either carrier.
    #[test]
    fn a_composed_answer_takes_the_place_of_the_apiservers_body() {
        let table = table(true);
        let head = |stream: &mut FakeStream| {
            stream.response = [
                (":status", "200"),
                ("content-length", "12"),
                ("etag", "\"UPSTREAM\""),
                ("content-encoding", "gzip"),
                ("date", "D"),
            ]
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        };
        for carrier in CARRIERS {
            // The answer's head ends it: a local reply.
            let mut stream = discovery();
            let mut pipeline = Pipeline::default();
            assert_eq!(requested(&mut pipeline, &mut stream, &table, carrier), "routed");
            head(&mut stream);
            let (next, sent) = pipeline.on_response_headers(&mut stream, &table, true);
            assert_eq!(
                (next, sent.map(|s| matches!(s, Sent::Composed { status: 200, .. }))),
                (Next::Pause, Some(true))
            );
            assert_eq!(
                stream.reply.as_ref().map(|r| (r.status, &r.body[..], r.details.as_str())),
                Some((200, MERGED, "skewgate_composed"))
            );

            for trailers in [false, true] {
                let mut stream = discovery();
                let mut pipeline = Pipeline::default();
                requested(&mut pipeline, &mut stream, &table, carrier);
                head(&mut stream);
                assert_eq!(pipeline.on_response_headers(&mut stream, &table, false), (Next::Pause, None));
                stream.body.extend_from_slice(b"{\"items\":");
                assert_eq!(
                    pipeline.on_response_body(&mut stream, &table, 9, false),
                    Some((Next::Pause, None))
                );
                assert!(stream.body.is_empty(), "dropped as it arrives");
                stream.body.extend_from_slice(b"[]}");
                let sent = if trailers {
                    assert_eq!(
                        pipeline.on_response_body(&mut stream, &table, 3, false),
                        Some((Next::Pause, None))
                    );
                    pipeline.on_response_trailers(&mut stream, &table)
                } else {
                    let (next, sent) =
                        pipeline.on_response_body(&mut stream, &table, 3, true).expect("replaced");
                    assert_eq!(next, Next::Continue);
                    sent
                };
                assert_eq!(sent.map(|s| matches!(s, Sent::Composed { status: 200, .. })), Some(true));
                assert!(stream.reply.is_none(), "a local reply would reset the upstream stream");
                assert_eq!(stream.body, MERGED, "{carrier:?} trailers {trailers}");
                assert_eq!(stream.response_value("content-length").as_deref(), Some("32"));
                assert_eq!(stream.response_value("etag").as_deref(), Some("\"ABC123\""));
                assert_eq!(stream.response_value("date").as_deref(), Some("D"));
                assert_eq!(stream.response_value("content-encoding"), None);
                // Done: later pieces are not the pipeline's.
                assert_eq!(pipeline.on_response_body(&mut stream, &table, 0, true), None);
            }

            let mut stream = discovery();
            let mut pipeline = Pipeline::default();
            requested(&mut pipeline, &mut stream, &table, carrier);
            head(&mut stream);
            pipeline.on_response_headers(&mut stream, &table, false);
            stream.bodiless = true;
            assert!(pipeline.on_response_trailers(&mut stream, &table).is_some());
            assert_eq!(stream.reply.as_ref().map(|r| (r.status, &r.body[..])), Some((200, MERGED)));
        }
    }

    /// An apiserver that denies the request: its answer reaches the client as it sent it.
    #[test]
    fn a_denied_composed_request_gets_the_apiservers_answer() {
        let table = table(true);
        for carrier in CARRIERS {
            let mut stream = discovery();
            let mut pipeline = Pipeline::default();
            requested(&mut pipeline, &mut stream, &table, carrier);
            stream.response.push((b":status".to_vec(), b"403".to_vec()));
            assert_eq!(pipeline.on_response_headers(&mut stream, &table, false), (Next::Continue, None));
            assert_eq!(pipeline.on_response_body(&mut stream, &table, 10, true), None);
            assert!(stream.reply.is_none());
        }
    }
}
