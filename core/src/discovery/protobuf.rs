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

/// Every protobuf body kube-apiserver writes starts with these four bytes.
const MAGIC: &[u8] = b"k8s\x00";

/// A document that has a protobuf form: its type meta and its fields.
pub trait ToProtobuf {
    /// `apiVersion` and `kind` as the envelope carries them.
    fn type_meta(&self) -> (&str, &str);
    fn encode_fields(&self, wire: &mut Wire);

    /// The whole body kube-apiserver sends: magic, then the `runtime.Unknown` envelope.
    fn to_protobuf(&self) -> Vec<u8> {
        let (api_version, kind) = self.type_meta();
        let mut wire = Wire(Vec::with_capacity(1024));
        wire.0.extend_from_slice(MAGIC);
        // runtime.Unknown: typeMeta, raw, contentEncoding, contentType.
        wire.message(1, |w| {
            w.string(1, api_version);
            w.string(2, kind);
        });
        wire.message(2, |w| self.encode_fields(w));
        wire.string(3, "");
        wire.string(4, "");
        wire.0
    }
}

/// A protobuf writer for the few wire types discovery uses.
pub struct Wire(Vec<u8>);

impl Wire {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint(u64::from(field << 3) | u64::from(wire_type));
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, 2);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn string(&mut self, field: u32, text: &str) {
        self.bytes(field, text.as_bytes());
    }

    fn strings(&mut self, field: u32, items: &[String]) {
        for item in items {
            self.string(field, item);
        }
    }

    fn bool(&mut self, field: u32, value: bool) {
        self.key(field, 0);
        self.0.push(u8::from(value));
    }

    fn int64(&mut self, field: u32, value: i64) {
        self.key(field, 0);
        // Negative numbers are ten bytes, as Go's uint64 conversion makes them.
        self.varint(value as u64);
    }

    /// A length-delimited message; its length is known only once its fields are written, so the
    /// key and length go in front of them afterwards.
    fn message(&mut self, field: u32, fields: impl FnOnce(&mut Wire)) {
        let start = self.0.len();
        fields(self);
        let len = self.0.len() - start;
        let mut head = Wire(Vec::with_capacity(6));
        head.key(field, 2);
        head.varint(len as u64);
        self.0.splice(start..start, head.0);
    }

    fn messages<T>(&mut self, field: u32, items: &[T], encode: impl Fn(&T, &mut Wire)) {
        for item in items {
            self.message(field, |w| encode(item, w));
        }
    }
}

impl ToProtobuf for ApiGroupDiscoveryList {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Wire) {
        w.message(1, |w| list_meta(&self.metadata, w));
        w.messages(2, &self.items, group_discovery);
    }
}

impl ToProtobuf for ApiResourceList {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Wire) {
        w.string(1, &self.group_version);
        w.messages(2, &self.resources, api_resource);
    }
}

impl ToProtobuf for ApiGroupList {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Wire) {
        w.messages(1, &self.groups, api_group);
    }
}

impl ToProtobuf for ApiGroup {
    fn type_meta(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }

    fn encode_fields(&self, w: &mut Wire) {
        api_group(self, w);
    }
}

impl ToProtobuf for ApiVersions {
    /// `APIVersions` has no `apiVersion` in JSON, and none in the envelope either.
    fn type_meta(&self) -> (&str, &str) {
        ("", &self.kind)
    }

    fn encode_fields(&self, w: &mut Wire) {
        w.strings(1, &self.versions);
        w.messages(2, &self.server_address_by_client_cidrs, server_address);
    }
}

fn list_meta(meta: &ListMeta, w: &mut Wire) {
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
fn object_meta(meta: &ObjectMeta, w: &mut Wire) {
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
fn string_map(field: u32, value: Option<&Value>, w: &mut Wire) {
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

fn group_discovery(group: &ApiGroupDiscovery, w: &mut Wire) {
    w.message(1, |w| object_meta(&group.metadata, w));
    w.messages(2, &group.versions, version_discovery);
}

fn version_discovery(version: &ApiVersionDiscovery, w: &mut Wire) {
    w.string(1, &version.version);
    w.messages(2, &version.resources, resource_discovery);
    w.string(3, version.freshness.as_ref().map(|f| f.as_str()).unwrap_or_default());
}

fn resource_discovery(resource: &ApiResourceDiscovery, w: &mut Wire) {
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

fn subresource_discovery(subresource: &ApiSubresourceDiscovery, w: &mut Wire) {
    w.string(1, &subresource.subresource);
    if let Some(kind) = &subresource.response_kind {
        w.message(2, |w| group_version_kind(kind, w));
    }
    w.messages(3, &subresource.accepted_types, group_version_kind);
    w.strings(4, &subresource.verbs);
}

fn group_version_kind(gvk: &GroupVersionKind, w: &mut Wire) {
    w.string(1, &gvk.group);
    w.string(2, &gvk.version);
    w.string(3, &gvk.kind);
}

fn api_resource(resource: &ApiResource, w: &mut Wire) {
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

fn api_group(group: &ApiGroup, w: &mut Wire) {
    w.string(1, &group.name);
    w.messages(2, &group.versions, group_version_for_discovery);
    w.message(3, |w| group_version_for_discovery(&group.preferred_version, w));
    w.messages(4, &group.server_address_by_client_cidrs, server_address);
}

fn group_version_for_discovery(version: &GroupVersionForDiscovery, w: &mut Wire) {
    w.string(1, &version.group_version);
    w.string(2, &version.version);
}

fn server_address(address: &Map<String, Value>, w: &mut Wire) {
    let text = |key| address.get(key).and_then(Value::as_str).unwrap_or_default();
    w.string(1, text("clientCIDR"));
    w.string(2, text("serverAddress"));
}

/// The `apiVersion` and `kind` of a Kubernetes protobuf body, for what shows and counts a
/// document (`skewgate explain`, tests); `None` if it is not one.
pub fn type_meta(body: &[u8]) -> Option<(&str, &str)> {
    let mut reader = Reader(body.strip_prefix(MAGIC)?);
    let envelope = reader.field(1)?;
    let mut type_meta = Reader(envelope);
    let api_version = std::str::from_utf8(type_meta.field(1)?).ok()?;
    let kind = std::str::from_utf8(type_meta.field(2)?).ok()?;
    Some((api_version, kind))
}

/// Reads the length-delimited fields of a message in order.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.0.split_first()?;
            self.0 = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// The next field, if it is `field` and length-delimited.
    fn field(&mut self, field: u32) -> Option<&'a [u8]> {
        if self.varint()? != u64::from(field << 3 | 2) {
            return None;
        }
        let len = usize::try_from(self.varint()?).ok()?;
        let (value, rest) = (self.0.get(..len)?, self.0.get(len..)?);
        self.0 = rest;
        Some(value)
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
    fn lengths_and_numbers_take_several_bytes() {
        let mut wire = Wire(Vec::new());
        wire.string(1, &"x".repeat(300));
        assert_eq!(wire.0.get(..3), Some(&b"\x0a\xac\x02"[..]));
        let mut wire = Wire(Vec::new());
        wire.int64(4, -1);
        assert_eq!(wire.0, b"\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
        let mut wire = Wire(Vec::new());
        wire.message(2, |w| w.string(1, &"y".repeat(200)));
        assert_eq!(wire.0.get(..5), Some(&b"\x12\xcb\x01\x0a\xc8"[..]));
    }

    #[test]
    fn type_meta_refuses_what_is_not_an_envelope() {
        assert_eq!(type_meta(b"{\"kind\":\"APIGroupList\"}"), None);
        assert_eq!(type_meta(b"k8s\x00"), None);
        assert_eq!(type_meta(b"k8s\x00\x0a\x7f\x0a\x02v1"), None);
        assert_eq!(type_meta(b"k8s\x00\x0a\x04\x12\x02v1"), None);
    }
}
