//! Kubernetes' protobuf encoding of the discovery documents skewgate composes, byte for byte what
//! kube-apiserver writes for the same object: the `k8s\0` magic, then a `runtime.Unknown` whose
//! `raw` is the object as its gogo-protobuf code marshals it (proto2, fields in tag order).
//!
//! gogo writes every scalar field of a Kubernetes type even when it is empty (`""`, `false`, `0`)
//! and every embedded struct, but a repeated field only when it has elements and a pointer only
//! when it is set. That is why this is written out per type rather than derived: a generic proto2
//! encoder would leave the empty scalars out, and clients that compare bytes (ETags, caches) or
//! decode with the generated code would see a different document.

use serde_json::{Map, Value};

use crate::protowire::{self, Field, Malformed, Writer};

use super::legacy::{
    ApiGroup, ApiGroupList, ApiResource, ApiResourceList, ApiVersions, GroupVersionForDiscovery,
};
use super::model::{
    ApiGroupDiscovery, ApiGroupDiscoveryList, ApiResourceDiscovery, ApiSubresourceDiscovery,
    ApiVersionDiscovery, GroupVersionKind, ListMeta, ObjectMeta,
};

/// The media type of every protobuf document kube-apiserver serves outside aggregated discovery.
pub const MEDIA_TYPE_PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Aggregated discovery v2 in protobuf, as kube-apiserver names it in `Content-Type`.
pub const MEDIA_TYPE_V2_PROTOBUF: &str =
    "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// A document that has a protobuf form: its type meta and its fields.
pub trait ToProtobuf {
    /// `apiVersion` and `kind` as the envelope carries them.
    fn type_meta(&self) -> (&str, &str);
    fn encode_fields(&self, wire: &mut Writer);

    /// The whole body kube-apiserver sends: magic, then the `runtime.Unknown` envelope.
    fn to_protobuf(&self) -> Vec<u8> {
        let (api_version, kind) = self.type_meta();
        crate::envelope::seal(api_version, kind, 1024, |w| self.encode_fields(w))
    }
}

impl ToProtobuf for ApiGroupDiscoveryList {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Writer) {
        w.message(1, |w| list_meta(&self.metadata, w));
        w.messages(2, &self.items, group_discovery);
    }
}

impl ToProtobuf for ApiResourceList {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Writer) {
        w.string(1, &self.group_version);
        w.messages(2, &self.resources, api_resource);
    }
}

impl ToProtobuf for ApiGroupList {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Writer) {
        w.messages(1, &self.groups, api_group);
    }
}

impl ToProtobuf for ApiGroup {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Writer) {
        api_group(self, w);
    }
}

impl ToProtobuf for ApiVersions {
    /// `APIVersions` has no `apiVersion` in JSON, and none in the envelope either.
    fn type_meta(&self) -> (&str, &str) {
        ("", &self.kind)
    }

    fn encode_fields(&self, w: &mut Writer) {
        w.strings(1, &self.versions);
        w.messages(2, &self.server_address_by_client_cidrs, server_address);
    }
}

fn list_meta(meta: &ListMeta, w: &mut Writer) {
    w.string(1, &meta.self_link);
    w.string(2, &meta.resource_version);
    w.string(3, &meta.continue_token);
    if let Some(count) = meta.remaining_item_count {
        w.int64(4, count);
    }
}

/// `metav1.ObjectMeta` as discovery fills it: a name, and the labels and annotations a peer may
/// have added (the other fields discovery never sets, and the JSON form keeps them only to pass
/// them on).
fn object_meta(meta: &ObjectMeta, w: &mut Writer) {
    w.string(1, &meta.name);
    for field in 2..=6 {
        w.string(field, "");
    }
    w.int64(7, 0);
    // creationTimestamp: a zero time is an empty message.
    w.message(8, |_| {});
    string_map(11, meta.other.get("labels"), w);
    string_map(12, meta.other.get("annotations"), w);
}

/// A `map<string, string>` in gogo's order: entries sorted by key.
fn string_map(field: u32, value: Option<&Value>, w: &mut Writer) {
    let Some(Value::Object(map)) = value else { return };
    let mut entries: Vec<(&String, &str)> =
        map.iter().map(|(k, v)| (k, v.as_str().unwrap_or_default())).collect::<Vec<_>>();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    for (key, value) in entries {
        w.message(field, |w| {
            w.string(1, key);
            w.string(2, value);
        });
    }
}

fn group_discovery(group: &ApiGroupDiscovery, w: &mut Writer) {
    w.message(1, |w| object_meta(&group.metadata, w));
    w.messages(2, &group.versions, version_discovery);
}

fn version_discovery(version: &ApiVersionDiscovery, w: &mut Writer) {
    w.string(1, &version.version);
    w.messages(2, &version.resources, resource_discovery);
    w.string(3, version.freshness.as_ref().map(|f| f.as_str()).unwrap_or_default());
}

fn resource_discovery(resource: &ApiResourceDiscovery, w: &mut Writer) {
    w.string(1, &resource.resource);
    if let Some(kind) = &resource.response_kind {
        w.message(2, |w| group_version_kind(kind, w));
    }
    w.string(3, &resource.scope);
    w.string(4, &resource.singular_resource);
    w.strings(5, &resource.verbs);
    w.strings(6, &resource.short_names);
    w.strings(7, &resource.categories);
    w.messages(8, &resource.subresources, subresource_discovery);
}

fn subresource_discovery(subresource: &ApiSubresourceDiscovery, w: &mut Writer) {
    w.string(1, &subresource.subresource);
    if let Some(kind) = &subresource.response_kind {
        w.message(2, |w| group_version_kind(kind, w));
    }
    w.messages(3, &subresource.accepted_types, group_version_kind);
    w.strings(4, &subresource.verbs);
}

fn group_version_kind(gvk: &GroupVersionKind, w: &mut Writer) {
    w.string(1, &gvk.group);
    w.string(2, &gvk.version);
    w.string(3, &gvk.kind);
}

fn api_resource(resource: &ApiResource, w: &mut Writer) {
    w.string(1, &resource.name);
    w.bool(2, resource.namespaced);
    w.string(3, &resource.kind);
    // `Verbs` is a message of its own; Go leaves it out only when the slice is nil, which JSON
    // writes as `null` and no apiserver sends.
    w.message(4, |w| w.strings(1, &resource.verbs));
    w.strings(5, &resource.short_names);
    w.string(6, &resource.singular_name);
    w.strings(7, &resource.categories);
    w.string(8, &resource.group);
    w.string(9, &resource.version);
    w.string(10, &resource.storage_version_hash);
}

fn api_group(group: &ApiGroup, w: &mut Writer) {
    w.string(1, &group.name);
    w.messages(2, &group.versions, group_version_for_discovery);
    w.message(3, |w| group_version_for_discovery(&group.preferred_version, w));
    w.messages(4, &group.server_address_by_client_cidrs, server_address);
}

fn group_version_for_discovery(version: &GroupVersionForDiscovery, w: &mut Writer) {
    w.string(1, &version.group_version);
    w.string(2, &version.version);
}

fn server_address(address: &Map<String, Value>, w: &mut Writer) {
    let text = |key| address.get(key).and_then(Value::as_str).unwrap_or_default();
    w.string(1, text("clientCIDR"));
    w.string(2, text("serverAddress"));
}

/// The `apiVersion` and `kind` of a Kubernetes protobuf body, for what shows and counts a
/// document (`skewgate explain`, tests); `None` if it is not one.
pub fn type_meta(body: &[u8]) -> Option<(&str, &str)> {
    let envelope = bytes_of(protowire::fields(body.strip_prefix(crate::envelope::MAGIC)?).next(), 1)?;
    let mut type_meta = protowire::fields(envelope);
    let api_version = std::str::from_utf8(bytes_of(type_meta.next(), 1)?).ok()?;
    let kind = std::str::from_utf8(bytes_of(type_meta.next(), 2)?).ok()?;
    Some((api_version, kind))
}

/// The content of `field` if it is field `number`, length-delimited.
fn bytes_of(field: Option<Result<Field<'_>, Malformed>>, number: u32) -> Option<&[u8]> {
    match field?.ok()? {
        Field { number: n, value: protowire::Value::Bytes(bytes), .. } if n == number => Some(bytes),
        _ => None,
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn an_empty_list_is_its_envelope() {
        let list = ApiGroupList { kind: "APIGroupList".into(), api_version: "v1".into(), groups: Vec::new() };
        let mut want = b"k8s\x00\x0a\x12\x0a\x02v1\x12\x0cAPIGroupList".to_vec();
        // raw (present, empty), contentEncoding, contentType
        want.extend_from_slice(b"\x12\x00\x1a\x00\x22\x00");
        assert_eq!(list.to_protobuf(), want);
        assert_eq!(type_meta(&want), Some(("v1", "APIGroupList")));
    }

    #[test]
    fn every_scalar_is_written_even_when_empty() {
        let list = ApiResourceList {
            kind: "APIResourceList".into(),
            api_version: "v1".into(),
            group_version: "v1".into(),
            resources: vec![ApiResource::default()],
        };
        let body = list.to_protobuf();
        // name, namespaced, kind, verbs (an empty message), singularName, group, version,
        // storageVersionHash: eight fields, none of them set.
        let resource = b"\x0a\x00\x10\x00\x1a\x00\x22\x00\x32\x00\x42\x00\x4a\x00\x52\x00";
        let raw = [b"\x0a\x02v1\x12\x10".as_slice(), resource].concat();
        assert!(body.windows(raw.len()).any(|w| w == raw.as_slice()), "{body:?}");
    }

    #[test]
    fn type_meta_refuses_what_is_not_an_envelope() {
        assert_eq!(type_meta(b"{\"kind\":\"APIGroupList\"}"), None);
        assert_eq!(type_meta(b"k8s\x00"), None);
        assert_eq!(type_meta(b"k8s\x00\x0a\x7f\x0a\x02v1"), None);
        assert_eq!(type_meta(b"k8s\x00\x0a\x04\x12\x02v1"), None);
    }
}
