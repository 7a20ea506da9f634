//! OpenAPI documents composed at the edge: the request goes to an apiserver first (path without
//! `?hash=`, JSON, unconditional), so that the apiserver authenticates and authorizes it; only
//! when it lets the request through does the filter fetch the composed answer from the
//! composer cluster (the sidecar's Unix socket), asking as the client asked.

use std::time::Duration;

use skewgate_core::edits::{self, Reply};
use skewgate_core::openapi::{AUTHORIZE_ACCEPT, AUTHORIZE_RANGE, PASSED_HEADERS, authorize_target};

use crate::host::Host;

/// The composer answers from memory; a slow answer means it is stuck.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the client asked, kept until the apiserver has answered.
pub struct Pending {
    cluster: String,
    target: String,
    accept: Option<String>,
    if_none_match: Option<String>,
    /// The composer's answer is on its way: the apiserver's body is dropped meanwhile.
    pub dispatched: bool,
}

impl Pending {
    /// Rewrites the request for the authorizing apiserver and remembers the client's.
    pub fn start(
        host: &impl Host,
        cluster: &str,
        target: &str,
        accept: Option<&str>,
        if_none_match: Option<&str>,
    ) -> Pending {
        host.set_request_header(":path", Some(authorize_target(target)));
        host.set_request_header("accept", Some(AUTHORIZE_ACCEPT));
        host.remove_request_header("if-none-match");
        host.remove_request_header("if-modified-since");
        host.remove_request_header("if-range");
        // The apiserver's body is dropped: one byte of it is enough (kube-openapi serves
        // documents with Go's ServeContent, which answers a range with 206).
        host.set_request_header("range", Some(AUTHORIZE_RANGE));
        Pending {
            cluster: cluster.to_string(),
            target: target.to_string(),
            accept: accept.map(str::to_string),
            if_none_match: if_none_match.map(str::to_string),
            dispatched: false,
        }
    }

    /// Asks the composer; Err carries the 503 to answer instead.
    pub fn dispatch(&mut self, host: &impl Host) -> Result<(), Reply> {
        let mut headers =
            vec![(":method", "GET"), (":path", self.target.as_str()), (":authority", "skewgate-openapi")];
        if let Some(accept) = &self.accept {
            headers.push(("accept", accept));
        }
        if let Some(tag) = &self.if_none_match {
            headers.push(("if-none-match", tag));
        }
        match host.dispatch_call(&self.cluster, headers, CALL_TIMEOUT) {
            Ok(_) => {
                self.dispatched = true;
                Ok(())
            }
            Err(e) => Err(self.unavailable(&format!("cannot call it: {e:?}"))),
        }
    }

    /// The composer's answer as (status, headers, body), or the 503 to send instead.
    pub fn answer(&self, host: &impl Host, body_size: usize) -> (u32, Vec<(String, String)>, Vec<u8>) {
        let headers = host.call_response_headers();
        let status = headers
            .iter()
            .find(|(n, _)| n == ":status")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u32>().ok());
        let json = headers.iter().any(|(n, v)| n == "content-type" && v.starts_with(b"application/json"));
        let body = host.call_response_body(body_size).unwrap_or_default();
        match status {
            // Envoy's own failure (socket gone, timeout): not the composer's answer.
            None => self.failed("no answer"),
            Some(s) if s >= 500 && !json => self.failed(&String::from_utf8_lossy(&body)),
            Some(s) => {
                let passed = headers
                    .into_iter()
                    .filter(|(n, _)| PASSED_HEADERS.contains(&n.as_str()))
                    .map(|(n, v)| (n, String::from_utf8_lossy(&v).into_owned()))
                    .collect();
                (s, passed, body.to_vec())
            }
        }
    }

    fn failed(&self, detail: &str) -> (u32, Vec<(String, String)>, Vec<u8>) {
        let reply = self.unavailable(detail);
        let headers = reply.headers().into_iter().map(|(n, v)| (n.to_owned(), v)).collect();
        (reply.status, headers, reply.body.into_bytes())
    }

    fn unavailable(&self, detail: &str) -> Reply {
        edits::composer_unavailable(&self.cluster, detail)
    }
}
