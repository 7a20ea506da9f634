//! An Envoy stream in memory, for the tests of the pipeline and of its carriers (feature
//! `testing`).

use std::borrow::Cow;

use serde_json::Value;

use super::{Attribute, Stream};

/// A local reply a [`FakeStream`] was asked to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub body: Vec<u8>,
    /// What Envoy's access log would record.
    pub details: String,
    pub headers: Vec<(String, String)>,
}

/// An Envoy stream as [`Stream`] sees it: its headers, the attributes it answers,
/// a response body that arrives in pieces, and what the pipeline did to all of it.
#[derive(Debug, Default)]
pub struct FakeStream {
    pub request: Vec<(Vec<u8>, Vec<u8>)>,
    pub response: Vec<(Vec<u8>, Vec<u8>)>,
    pub attributes: Vec<(Attribute, Vec<u8>)>,
    /// The response body Envoy holds for the stream: what the hooks received and kept.
    pub body: Vec<u8>,
    /// The answer ended with trailers and no data: no body to put anything in.
    pub bodiless: bool,
    pub reply: Option<LocalReply>,
    pub route_cleared: usize,
}

impl FakeStream {
    pub fn request(headers: &[(&str, &str)]) -> Self {
        let request = headers.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect();
        FakeStream { request, ..FakeStream::default() }
    }

    pub fn request_headers(&self) -> Vec<(&[u8], &[u8])> {
        self.request.iter().map(|(n, v)| (&n[..], &v[..])).collect()
    }

    /// Every value of a request header.
    pub fn header(&self, name: &str) -> Vec<String> {
        let values = self.request.iter().filter(|(n, _)| n == name.as_bytes());
        values.map(|(_, v)| String::from_utf8_lossy(v).into_owned()).collect()
    }

    pub fn response_value(&self, name: &str) -> Option<String> {
        let value = self.response.iter().find(|(n, _)| n == name.as_bytes());
        value.map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn attribute_is(mut self, which: Attribute, value: &[u8]) -> Self {
        self.attributes.push((which, value.to_vec()));
        self
    }

    /// The local reply's status and JSON body.
    pub fn reply_json(&self) -> Option<(u32, Value)> {
        let reply = self.reply.as_ref()?;
        Some((reply.status, serde_json::from_slice(&reply.body).ok()?))
    }

    pub fn reply_header(&self, name: &str) -> Option<&str> {
        self.reply.as_ref()?.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Stream for FakeStream {
    fn attribute(&self, which: Attribute) -> Option<Cow<'_, [u8]>> {
        self.attributes.iter().find(|(a, _)| *a == which).map(|(_, v)| Cow::Borrowed(&v[..]))
    }
    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value = self.response.iter().find(|(n, _)| n == name.as_bytes());
        value.map(|(_, v)| Cow::Borrowed(&v[..]))
    }
    fn response_header_names(&self) -> Vec<String> {
        self.response.iter().map(|(n, _)| String::from_utf8_lossy(n).into_owned()).collect()
    }
    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        self.request.retain(|(n, _)| n != name.as_bytes());
        if let Some(value) = value {
            self.request.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.request.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
    }
    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        self.response.retain(|(n, _)| n != name.as_bytes());
        if let Some(value) = value {
            self.response.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
    }
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str) {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        self.reply = Some(LocalReply { status, body: body.to_vec(), details: details.to_owned(), headers });
    }
    fn drop_response_body(&mut self, size: usize) {
        let kept = self.body.len().saturating_sub(size);
        self.body.truncate(kept);
    }
    fn end_response_body(&mut self, size: usize, body: &[u8], _at_trailers: bool) -> bool {
        if self.bodiless {
            return false;
        }
        self.drop_response_body(size);
        self.body.extend_from_slice(body);
        true
    }
    fn clear_route_cache(&mut self) {
        self.route_cleared += 1;
    }
}
