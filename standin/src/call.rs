//! One resource request as the dispatcher read it, its target, and its decoded body: what the
//! resource handlers and the create-only reviews both work on.

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::CONTENT_TYPE;
use serde_json::Value;
use skewgate_core::request_info::RequestInfo;

use super::auth::Identity;
use super::catalog::Resource;
use super::objects::check_type;
use super::params::Params;
use super::proto;
use super::status::{Errors, Status, Target};
use super::store::Key;

/// One resource request, as the dispatcher read it.
pub struct Call<'a> {
    pub info: &'a RequestInfo<'a>,
    pub params: &'a Params,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    pub identity: &'a Identity,
}

/// Everything a handler needs about the request target.
pub(crate) struct Addressed<'a> {
    pub r: &'a Resource,
    pub namespace: &'a str,
    /// From the path only (a `metadata.name` field selector on a list does not set it).
    pub name: &'a str,
    /// The status subresource, not the whole object: writes change only `status`.
    pub status: bool,
}

impl Addressed<'_> {
    pub fn target(&self) -> Target<'_> {
        Target { group: &self.r.group, resource: &self.r.name }
    }

    pub fn key(&self) -> Key {
        Key::new(&self.r.group, &self.r.name, self.namespace, self.name)
    }

    /// The namespace that must exist for a write.
    pub fn required_namespace(&self) -> Option<&str> {
        (self.r.namespaced && !self.namespace.is_empty()).then_some(self.namespace)
    }
}

pub(crate) fn body_object(call: &Call<'_>, r: &Resource) -> Result<Value, Status> {
    let object = decode_body(call)?;
    if !object.is_object() {
        return Err(Status::bad_request("the object provided is unrecognized: not a JSON object"));
    }
    check_type(&object, r)?;
    Ok(object)
}

/// A JSON or (for the kinds kubectl's typed clients send) protobuf body.
pub(crate) fn decode_body(call: &Call<'_>) -> Result<Value, Status> {
    let content_type =
        call.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    if proto::is_protobuf(content_type) {
        return proto::decode(&call.body);
    }
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if !matches!(media.as_str(), "application/json" | "" | "*/*") {
        return Err(Status::unsupported_media_type(content_type, &["application/json", proto::MEDIA_TYPE]));
    }
    serde_json::from_slice(&call.body)
        .map_err(|e| Status::bad_request(format!("the object provided is unrecognized: {e}")))
}
