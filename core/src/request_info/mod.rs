//! The Kubernetes request-path grammar: a port of kube-apiserver's `NewRequestInfo`
//! (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`), docs/upstream-facts.md, "Request-path grammar".
//!
//! The routing decision must read a request exactly as the apiserver behind us would, so the
//! port keeps Go's quirks, including the ones in the helpers it calls (`url.ParseQuery`,
//! `fields.ParseSelector`, `labels.Parse`, `strconv.ParseInt`). Those quirks are noted where
//! they happen.
//!
//! The filter parses every request, so parsing borrows from its inputs and allocates only when
//! a value has to be unescaped.

mod escape;
mod field_selector;
mod label_selector;
mod path;
mod query;

use std::borrow::Cow;
use std::fmt;

use serde::ser::{Serialize, SerializeStruct, Serializer};

use path::Segments;
pub use path::{decode_path, split_target};
pub use query::has_send_initial_events;

/// What kube-apiserver reads from a request's method, path and query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    /// True for `/api/{version}/…` and `/apis/{group}/{version}/…` with a resource part.
    pub is_resource_request: bool,
    /// The decoded path, as given to [`RequestInfo::parse`].
    pub path: &'a str,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`, `proxy` or `""`) for resource requests; the lowercase HTTP method
    /// otherwise, and also for the error case.
    pub verb: Cow<'a, str>,
    /// `api` or `apis`; also set for non-resource `apis` paths with too few segments.
    pub api_prefix: &'a str,
    pub api_group: &'a str,
    pub api_version: &'a str,
    pub namespace: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    /// From the path, or from a `metadata.name` field selector on a list or watch.
    pub name: Cow<'a, str>,
    /// The first `fieldSelector` value of a list, watch or deletecollection (AuthorizeWithSelectors).
    pub field_selector: Cow<'a, str>,
    /// The first `labelSelector` value of a list, watch or deletecollection (AuthorizeWithSelectors).
    pub label_selector: Cow<'a, str>,
    /// Set when a legacy `watch`/`proxy` path segment has nothing after it; the apiserver
    /// answers such requests with a 500.
    pub error: Option<RequestInfoError>,
    /// The segments from the resource on, still joined by '/': a suffix of the trimmed path.
    /// The trimmed path never ends with an empty segment, so "" means no parts.
    parts: &'a str,
}

/// The one error `NewRequestInfo` returns: a legacy `watch`/`proxy` verb segment with nothing
/// after it. The message shows the decoded path where Go shows the re-escaped URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfoError {
    url: String,
}

/// A '%' not followed by two hex digits. Go's server rejects such a request target with a 400
/// before any handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidEscape {
    sequence: String,
}

impl RequestInfoError {
    fn new(path: &str, query: &str) -> Self {
        let mut url = String::with_capacity(path.len() + query.len() + 1);
        url.push_str(path);
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        RequestInfoError { url }
    }
}

impl fmt::Display for RequestInfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unable to determine kind and namespace from url, {}", self.url)
    }
}

impl std::error::Error for RequestInfoError {}

impl fmt::Display for InvalidEscape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid URL escape {:?}", self.sequence)
    }
}

impl std::error::Error for InvalidEscape {}

/// Something Go's list-options decoding rejects (the query and the selectors it decodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Invalid;

/// `strconv.ParseInt(v, 10, 64)` succeeds: an optional sign, ASCII digits, in range.
fn is_go_int64(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| s.parse::<i64>().is_ok())
}

impl Serialize for RequestInfo<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = if self.error.is_some() { 14 } else { 13 };
        let mut s = serializer.serialize_struct("RequestInfo", len)?;
        s.serialize_field("isResourceRequest", &self.is_resource_request)?;
        s.serialize_field("path", self.path)?;
        s.serialize_field("verb", &*self.verb)?;
        s.serialize_field("apiPrefix", self.api_prefix)?;
        s.serialize_field("apiGroup", self.api_group)?;
        s.serialize_field("apiVersion", self.api_version)?;
        s.serialize_field("namespace", self.namespace)?;
        s.serialize_field("resource", self.resource)?;
        s.serialize_field("subresource", self.subresource)?;
        s.serialize_field("name", &*self.name)?;
        s.serialize_field("parts", &Segments(self.parts))?;
        s.serialize_field("fieldSelector", &*self.field_selector)?;
        s.serialize_field("labelSelector", &*self.label_selector)?;
        if let Some(error) = &self.error {
            s.serialize_field("error", error)?;
        }
        s.end()
    }
}

impl Serialize for RequestInfoError {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop;
