//! A [`Host`] that keeps Envoy's side of the conversation in memory: the request headers the
//! filter edits, the local reply it sends, the calls it dispatches and the counters it bumps.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::types::{Bytes, Status};

use super::Host;

#[derive(Debug, Clone, Default)]
pub struct Fake(Rc<RefCell<State>>);

/// A local reply: status, headers, body.
pub type Reply = (u32, Vec<(String, String)>, Vec<u8>);

#[derive(Debug, Default)]
pub struct State {
    pub plugin_configuration: Option<Vec<u8>>,
    /// In order, as Envoy hands them to the filter; edited by the filter's set/add/remove.
    pub request_headers: Vec<(String, Vec<u8>)>,
    /// Edited by the filter's set, once it paused them.
    pub response_headers: Vec<(String, Vec<u8>)>,
    /// The request body Envoy buffered for the filter.
    pub request_body: Vec<u8>,
    /// The response body Envoy holds for the filter: what came and the filter left or put there.
    pub response_body: Vec<u8>,
    /// Envoy holds no response body to edit (an answer ended with trailers and no data).
    pub no_response_body: bool,
    /// Envoy attributes by path (`connection.subject_peer_certificate`, ...).
    pub properties: BTreeMap<Vec<String>, Vec<u8>>,
    /// Every attribute the filter asked for, found or not.
    pub property_reads: Vec<Vec<String>>,
    pub replies: Vec<Reply>,
    /// Bytes of response body the filter dropped or replaced.
    pub dropped_body: usize,
    /// (cluster, headers) of every call dispatched.
    pub dispatched: Vec<(String, Vec<(String, String)>)>,
    /// What `dispatch_call` answers instead of a token.
    pub dispatch_error: Option<Status>,
    pub call_response_headers: Vec<(String, Vec<u8>)>,
    pub call_response_body: Vec<u8>,
    /// Counter names in definition order: a counter's id is its index.
    pub counters: Vec<String>,
    pub counts: BTreeMap<u32, u64>,
    pub tick_period: Option<Duration>,
    /// Properties declared with the connection's lifespan, in order.
    pub declared: Vec<String>,
    /// Envoy refuses declarations.
    pub refuse_declarations: bool,
    /// The connection's properties in the order they were set (read-only: set once; readable
    /// through `property` too).
    pub connection: Vec<(String, String)>,
    /// Every property set attempt, accepted or not.
    pub connection_sets: usize,
    /// Envoy refuses a set of this property.
    pub refuse_set: Option<String>,
    /// Envoy's clock, moved by the test.
    pub now: Duration,
    /// Streams resumed by the root context, in order.
    pub resumed: Vec<u32>,
    /// Local replies the root context sent on streams, in order.
    pub replies_to: Vec<(u32, Reply)>,
    /// Histogram names in definition order (ids from 1000 on), and the values recorded.
    pub histograms: Vec<String>,
    pub recorded: Vec<(u32, u64)>,
    /// Shared data by key: value and version.
    pub shared: BTreeMap<String, (Vec<u8>, u32)>,
}

impl Fake {
    pub fn state(&self) -> std::cell::RefMut<'_, State> {
        self.0.borrow_mut()
    }

    /// Starts a new stream: the request headers Envoy hands over, the reply and calls cleared.
    pub fn request(&self, headers: &[(&str, &str)]) {
        let mut s = self.state();
        s.request_headers = headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
        s.response_headers.clear();
        s.replies.clear();
        s.dispatched.clear();
        s.property_reads.clear();
        s.dropped_body = 0;
        s.response_body.clear();
        s.request_body.clear();
        s.no_response_body = false;
    }

    pub fn respond(&self, headers: &[(&str, &str)]) {
        self.state().response_headers =
            headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
    }

    /// A chunk of the upstream response body arrives (the filter's body callback follows).
    pub fn body_chunk(&self, chunk: &[u8]) {
        self.state().response_body.extend_from_slice(chunk);
    }

    /// A chunk of the request body arrives (the filter's body callback follows).
    pub fn request_chunk(&self, chunk: &[u8]) {
        self.state().request_body.extend_from_slice(chunk);
    }

    pub fn set_property(&self, path: &[&str], value: &str) {
        self.state()
            .properties
            .insert(path.iter().map(|p| p.to_string()).collect(), value.as_bytes().to_vec());
    }

    /// Every value of a request header, as upstream would receive it.
    pub fn header(&self, name: &str) -> Vec<String> {
        let s = self.0.borrow();
        s.request_headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    pub fn header_names(&self) -> Vec<String> {
        self.0.borrow().request_headers.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The one local reply of the stream, if any (two would be a bug).
    pub fn reply(&self) -> Option<Reply> {
        let s = self.0.borrow();
        assert!(s.replies.len() <= 1, "more than one local reply: {:?}", s.replies);
        s.replies.first().cloned()
    }

    /// A counter's value as Envoy holds it (what has been handed over, not what the VM keeps).
    pub fn counter(&self, name: &str) -> u64 {
        let s = self.0.borrow();
        let id = s.counters.iter().position(|c| c == name);
        let id = id.unwrap_or_else(|| panic!("no counter {name:?} defined; defined: {:?}", s.counters));
        s.counts.get(&(id as u32)).copied().unwrap_or(0)
    }
}

impl Host for Fake {
    fn plugin_configuration(&self) -> Option<Bytes> {
        self.0.borrow().plugin_configuration.clone()
    }

    fn request_headers(&self) -> Vec<(String, Bytes)> {
        self.0.borrow().request_headers.clone()
    }

    fn request_body(&self, size: usize) -> Option<Bytes> {
        let s = self.0.borrow();
        (!s.request_body.is_empty()).then(|| s.request_body[..size.min(s.request_body.len())].to_vec())
    }

    fn response_header(&self, name: &str) -> Option<Bytes> {
        let s = self.0.borrow();
        s.response_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    fn property(&self, path: &[&str]) -> Option<Bytes> {
        let path: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        let mut s = self.state();
        s.property_reads.push(path.clone());
        s.properties.get(&path).cloned()
    }

    fn response_headers(&self) -> Vec<(String, Bytes)> {
        self.0.borrow().response_headers.clone()
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) {
        set(&mut self.state().request_headers, name, value);
    }

    fn set_response_header(&self, name: &str, value: Option<&str>) {
        set(&mut self.state().response_headers, name, value);
    }

    fn replace_response_body(&self, size: usize, with: &[u8]) -> bool {
        let mut s = self.state();
        if s.no_response_body {
            return false;
        }
        s.dropped_body += size;
        let held = size.min(s.response_body.len());
        s.response_body.splice(..held, with.iter().copied());
        true
    }

    fn add_request_header(&self, name: &str, value: &str) {
        self.state().request_headers.push((name.to_string(), value.as_bytes().to_vec()));
    }

    fn send_response(&self, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) {
        let headers = headers.into_iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        self.state().replies.push((status, headers, body.unwrap_or_default().to_vec()));
    }

    fn dispatch_call(
        &self,
        cluster: &str,
        headers: Vec<(&str, &str)>,
        _timeout: Duration,
    ) -> Result<u32, Status> {
        let mut s = self.state();
        if let Some(e) = s.dispatch_error {
            return Err(e);
        }
        let headers = headers.into_iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        s.dispatched.push((cluster.to_string(), headers));
        Ok(s.dispatched.len() as u32)
    }

    fn call_response_headers(&self) -> Vec<(String, Bytes)> {
        self.0.borrow().call_response_headers.clone()
    }

    fn call_response_body(&self, size: usize) -> Option<Bytes> {
        let s = self.0.borrow();
        let body = &s.call_response_body;
        (!body.is_empty()).then(|| body[..size.min(body.len())].to_vec())
    }

    fn declare_connection_property(&self, name: &str) -> bool {
        let mut s = self.state();
        if !s.refuse_declarations {
            s.declared.push(name.to_owned());
        }
        !s.refuse_declarations
    }

    fn set_connection_property(&self, name: &str, value: &str) -> bool {
        let mut s = self.state();
        s.connection_sets += 1;
        // Envoy refuses a second set of a read-only property, and the SDK traps on it.
        assert!(!s.connection.iter().any(|(n, _)| n == name), "{name} set twice: the VM would trap");
        let refused = !s.declared.iter().any(|d| d == name) || s.refuse_set.as_deref() == Some(name);
        if !refused {
            s.connection.push((name.to_owned(), value.to_owned()));
            s.properties.insert(vec![name.to_owned()], value.as_bytes().to_vec());
        }
        !refused
    }

    fn define_counter(&self, name: &str) -> Option<u32> {
        let mut s = self.state();
        let id = match s.counters.iter().position(|c| c == name) {
            Some(id) => id,
            None => {
                s.counters.push(name.to_string());
                s.counters.len() - 1
            }
        };
        Some(id as u32)
    }

    fn increment_metric(&self, id: u32, by: u64) {
        *self.state().counts.entry(id).or_default() += by;
    }

    fn set_tick_period(&self, period: Duration) {
        self.state().tick_period = Some(period);
    }

    fn now(&self) -> Duration {
        self.0.borrow().now
    }

    fn resume_request(&self, id: u32) {
        self.state().resumed.push(id);
    }

    fn send_response_to(&self, id: u32, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) {
        let headers = headers.into_iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        self.state().replies_to.push((id, (status, headers, body.unwrap_or_default().to_vec())));
    }

    fn shared_data(&self, key: &str) -> (Option<Bytes>, Option<u32>) {
        match self.0.borrow().shared.get(key) {
            Some((value, cas)) => (Some(value.clone()), Some(*cas)),
            None => (None, None),
        }
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        let mut s = self.state();
        let current = s.shared.get(key).map(|(_, c)| *c);
        if cas.is_some_and(|c| current.is_some_and(|now| now != c)) {
            return false;
        }
        let next = current.unwrap_or(0) + 1;
        s.shared.insert(key.to_owned(), (value.to_vec(), next));
        true
    }

    fn define_histogram(&self, name: &str) -> Option<u32> {
        let mut s = self.state();
        let id = match s.histograms.iter().position(|c| c == name) {
            Some(id) => id,
            None => {
                s.histograms.push(name.to_string());
                s.histograms.len() - 1
            }
        };
        Some(1000 + id as u32)
    }

    fn record_metric(&self, id: u32, value: u64) {
        self.state().recorded.push((id, value));
    }
}

/// Envoy's `replace`: every value of `name` goes, the new one in the first one's place.
fn set(headers: &mut Vec<(String, Vec<u8>)>, name: &str, value: Option<&str>) {
    let at = headers.iter().position(|(n, _)| n.eq_ignore_ascii_case(name));
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    if let Some(value) = value {
        let entry = (name.to_string(), value.as_bytes().to_vec());
        match at {
            Some(i) => headers.insert(i, entry),
            None => headers.push(entry),
        }
    }
}
