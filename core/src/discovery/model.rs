//! Typed `apidiscovery.k8s.io/v2` (and v2beta1, same shape) aggregated discovery.
//!
//! Field order and `omitempty` follow `k8s.io/api/apidiscovery/v2/types.go`, so that serde_json's
//! compact output is what Go's `json.Marshal` writes for the same object; the ETag depends on it.
//! Decoding is as lenient as Go's: a missing or `null` field becomes its zero value.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{API_VERSION_V2, API_VERSION_V2BETA1, KIND_GROUP_DISCOVERY_LIST};

/// Declares the Rust form of a Go API struct, decoded as leniently as Go decodes it: every field
/// takes its zero value when it is missing or `null`. Field attributes (renames, `omitempty` as
/// `skip_serializing_if`) are kept; a field that needs a decoder of its own cannot be in one.
macro_rules! go_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                #[serde(default, deserialize_with = "crate::discovery::model::null_as_default")]
                pub $field: $ty,
            )*
        }
    };
}
pub(super) use go_struct;

go_struct! {
    /// The document served at `/api` and `/apis` for aggregated discovery.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiGroupDiscoveryList {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub kind: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub api_version: String,
        // Go's omitempty never drops a struct, so `"metadata":{}` is always written.
        pub metadata: ListMeta,
        /// Groups in priority order.
        pub items: Vec<ApiGroupDiscovery>,
    }
}

go_struct! {
    /// `metav1.ListMeta`; discovery never fills it, but a peer could.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ListMeta {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub self_link: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub resource_version: String,
        #[serde(rename = "continue", skip_serializing_if = "String::is_empty")]
        pub continue_token: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub remaining_item_count: Option<i64>,
    }
}

go_struct! {
    /// One API group and the versions it serves, preferred version first.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiGroupDiscovery {
        #[serde(skip_serializing_if = "String::is_empty")]
        pub kind: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        pub api_version: String,
        pub metadata: ObjectMeta,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub versions: Vec<ApiVersionDiscovery>,
    }
}

/// The part of `metav1.ObjectMeta` that discovery uses.
///
/// Servers built with older Go libraries write `"creationTimestamp": null`, newer ones leave it
/// out; keeping whichever form arrived keeps the document (and so its ETag) as the server sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The group name; "" is the core group.
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `Some(Value::Null)` when the server sent an explicit `null`, `None` when it sent nothing.
    #[serde(default, deserialize_with = "present_even_if_null", skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Value>,
    /// Any other metadata, kept so that nothing a peer sent is lost. Written after the two
    /// fields above, which is not Go's order; discovery servers never fill these.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The resources of one group-version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiVersionDiscovery {
    #[serde(default, deserialize_with = "null_as_default")]
    pub version: String,
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ApiResourceDiscovery>,
    /// `None` when the server sent no (or an empty) freshness, which Go also leaves out.
    #[serde(default, deserialize_with = "freshness_if_set", skip_serializing_if = "Option::is_none")]
    pub freshness: Option<Freshness>,
}

/// Whether a group-version's discovery is up to date. Clients skip `Stale` versions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Freshness {
    Current,
    Stale,
    /// A value this code does not know, written back unchanged.
    Other(String),
}

go_struct! {
    /// One top-level resource of a group-version.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiResourceDiscovery {
        /// Plural name, the URL path segment.
        pub resource: String,
        /// Absent when an APIService serves subresources only.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub response_kind: Option<GroupVersionKind>,
        /// `Cluster` or `Namespaced`.
        pub scope: String,
        pub singular_resource: String,
        pub verbs: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub short_names: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub categories: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub subresources: Vec<ApiSubresourceDiscovery>,
    }
}

go_struct! {
    /// One subresource (`status`, `scale`, ...) of a resource.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApiSubresourceDiscovery {
        pub subresource: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub response_kind: Option<GroupVersionKind>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub accepted_types: Vec<GroupVersionKind>,
        pub verbs: Vec<String>,
    }
}

go_struct! {
    /// `metav1.GroupVersionKind`; empty group and version mean "the containing group-version".
    #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub struct GroupVersionKind {
        pub group: String,
        pub version: String,
        pub kind: String,
    }
}

/// Why a body is not a usable aggregated discovery list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryError {
    Empty,
    NotJson(String),
    Truncated(String),
    WrongShape(String),
    /// The `kind` found; "" when it was missing.
    WrongKind(String),
    /// The `apiVersion` found; "" when it was missing.
    WrongApiVersion(String),
}

impl ApiGroupDiscoveryList {
    /// An `apidiscovery.k8s.io/v2` list of `items`.
    pub fn v2(items: Vec<ApiGroupDiscovery>) -> Self {
        Self {
            kind: KIND_GROUP_DISCOVERY_LIST.to_owned(),
            api_version: API_VERSION_V2.to_owned(),
            metadata: ListMeta::default(),
            items,
        }
    }

    /// Decodes a `/api` or `/apis` aggregated discovery body (v2 or v2beta1).
    pub fn from_json(bytes: &[u8]) -> Result<Self, DiscoveryError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(DiscoveryError::Empty);
        }
        match serde_json::from_slice::<Self>(bytes) {
            // serde also fills a struct from a JSON array, which Go never does.
            Ok(_) if !starts_with_object(bytes) => {
                Err(DiscoveryError::WrongShape("expected a JSON object at the top level".to_owned()))
            }
            Ok(list) => {
                check_type_meta(&list.kind, &list.api_version)?;
                Ok(list)
            }
            Err(decode_error) => {
                // Another kind of document (a legacy APIGroupList, a Status) usually also fails
                // the shape check; naming its kind tells the operator far more than a type error.
                if let Ok(object) = serde_json::from_slice::<Map<String, Value>>(bytes) {
                    check_type_meta(&text_of(&object, "kind"), &text_of(&object, "apiVersion"))?;
                }
                Err(DiscoveryError::from_decode_error(&decode_error))
            }
        }
    }

    /// Every (group, version, top-level resource) in the document; core is group "".
    pub fn gvrs(&self) -> impl Iterator<Item = (&str, &str, &str)> + '_ {
        self.items.iter().flat_map(|group| {
            group.versions.iter().flat_map(move |version| {
                version
                    .resources
                    .iter()
                    .map(move |resource| (group.name(), version.version.as_str(), resource.resource.as_str()))
            })
        })
    }
}

impl ApiGroupDiscovery {
    /// The group name; "" is the core group.
    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}

impl Freshness {
    pub fn as_str(&self) -> &str {
        match self {
            Freshness::Current => "Current",
            Freshness::Stale => "Stale",
            Freshness::Other(raw) => raw,
        }
    }

    fn from_wire(raw: String) -> Self {
        match raw.as_str() {
            "Current" => Freshness::Current,
            "Stale" => Freshness::Stale,
            _ => Freshness::Other(raw),
        }
    }
}

impl Serialize for Freshness {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Freshness {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Freshness::from_wire)
    }
}

impl DiscoveryError {
    fn from_decode_error(error: &serde_json::Error) -> Self {
        let message = error.to_string();
        match error.classify() {
            serde_json::error::Category::Eof => DiscoveryError::Truncated(message),
            serde_json::error::Category::Data => DiscoveryError::WrongShape(message),
            serde_json::error::Category::Syntax | serde_json::error::Category::Io => {
                DiscoveryError::NotJson(message)
            }
        }
    }
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoveryError::Empty => write!(f, "discovery document is empty"),
            DiscoveryError::NotJson(detail) => write!(f, "discovery document is not JSON: {detail}"),
            DiscoveryError::Truncated(detail) => {
                write!(f, "discovery document is truncated JSON: {detail}")
            }
            DiscoveryError::WrongShape(detail) => {
                write!(f, "discovery document is not a valid {KIND_GROUP_DISCOVERY_LIST}: {detail}")
            }
            DiscoveryError::WrongKind(found) if found.is_empty() => {
                write!(f, "discovery document has no kind, expected {KIND_GROUP_DISCOVERY_LIST:?}")
            }
            DiscoveryError::WrongKind(found) => {
                write!(f, "discovery document has kind {found:?}, expected {KIND_GROUP_DISCOVERY_LIST:?}")
            }
            DiscoveryError::WrongApiVersion(found) if found.is_empty() => write!(
                f,
                "discovery document has no apiVersion, expected {API_VERSION_V2:?} or {API_VERSION_V2BETA1:?}"
            ),
            DiscoveryError::WrongApiVersion(found) => write!(
                f,
                "discovery document has apiVersion {found:?}, expected {API_VERSION_V2:?} or {API_VERSION_V2BETA1:?}"
            ),
        }
    }
}

impl std::error::Error for DiscoveryError {}

fn check_type_meta(kind: &str, api_version: &str) -> Result<(), DiscoveryError> {
    if kind != KIND_GROUP_DISCOVERY_LIST {
        return Err(DiscoveryError::WrongKind(kind.to_owned()));
    }
    if api_version != API_VERSION_V2 && api_version != API_VERSION_V2BETA1 {
        return Err(DiscoveryError::WrongApiVersion(api_version.to_owned()));
    }
    Ok(())
}

fn starts_with_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'{')
}

/// A string field as itself, a missing one as "", anything else as its JSON text, so that a
/// non-string kind still shows up in the error.
fn text_of(object: &Map<String, Value>, field: &str) -> String {
    match object.get(field) {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Go decodes `null` into the zero value; serde would reject it for non-Option fields.
pub(super) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// serde maps an explicit `null` to `None` for `Option<Value>`; this keeps it as `Some(Null)`.
fn present_even_if_null<'de, D>(deserializer: D) -> Result<Option<Value>, D::Error>
where
    D: Deserializer<'de>,
{
    Value::deserialize(deserializer).map(Some)
}

/// Go treats an empty freshness as unset and omits it on output.
fn freshness_if_set<'de, D>(deserializer: D) -> Result<Option<Freshness>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw = Option::<String>::deserialize(deserializer)?;
    Ok(raw.filter(|text| !text.is_empty()).map(Freshness::from_wire))
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::discovery::fixtures::{self, LEGACY_API_GROUP, V1_30, V1_33, V1_36};

    /// Keys sorted as in the fixtures, i.e. not Go's order.
    const SORTED_KEYS_DOC: &str = r#"{"apiVersion":"apidiscovery.k8s.io/v2","items":[{"metadata":{"creationTimestamp":null,"name":"apps"},"versions":[{"freshness":"Stale","resources":[{"categories":["all"],"resource":"deployments","responseKind":{"group":"","kind":"Deployment","version":""},"scope":"Namespaced","shortNames":["deploy"],"singularResource":"deployment","subresources":[{"acceptedTypes":[{"group":"autoscaling","kind":"Scale","version":"v1"}],"responseKind":{"group":"autoscaling","kind":"Scale","version":"v1"},"subresource":"scale","verbs":["get","patch","update"]}],"verbs":["get","list"]}],"version":"v1"}]}],"kind":"APIGroupDiscoveryList","metadata":{}}"#;

    /// The same document as Go's json.Marshal writes it (struct field order).
    const GO_ORDER_DOC: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"apps","creationTimestamp":null},"versions":[{"version":"v1","resources":[{"resource":"deployments","responseKind":{"group":"","version":"","kind":"Deployment"},"scope":"Namespaced","singularResource":"deployment","verbs":["get","list"],"shortNames":["deploy"],"categories":["all"],"subresources":[{"subresource":"scale","responseKind":{"group":"autoscaling","version":"v1","kind":"Scale"},"acceptedTypes":[{"group":"autoscaling","version":"v1","kind":"Scale"}],"verbs":["get","patch","update"]}]}],"freshness":"Stale"}]}]}"#;

    fn assert_round_trips(fixture: &str) {
        let parsed = fixtures::parse(fixture);
        let compact = serde_json::to_string(&parsed).unwrap();
        let reparsed = ApiGroupDiscoveryList::from_json(compact.as_bytes()).unwrap();
        assert_eq!(parsed, reparsed);
        let ours: Value = serde_json::from_str(&compact).unwrap();
        let original: Value = serde_json::from_str(fixture).unwrap();
        assert_eq!(ours, original, "serialization lost or invented content");
    }

    #[test]
    fn fixture_1_30_round_trips() {
        assert_round_trips(V1_30);
    }

    #[test]
    fn fixture_1_33_round_trips() {
        assert_round_trips(V1_33);
    }

    #[test]
    fn fixture_1_36_round_trips() {
        assert_round_trips(V1_36);
    }

    #[test]
    fn serialization_uses_go_field_order() {
        let parsed = fixtures::parse(SORTED_KEYS_DOC);
        assert_eq!(serde_json::to_string(&parsed).unwrap(), GO_ORDER_DOC);
    }

    #[test]
    fn fixture_group_serializes_in_go_order_with_creation_timestamp_kept() {
        let parsed = fixtures::parse(V1_33);
        let compact = serde_json::to_string(&parsed).unwrap();
        let expected_start = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"apiregistration.k8s.io","creationTimestamp":null},"versions":[{"version":"v1","resources":[{"resource":"apiservices","responseKind":{"group":"","version":"","kind":"APIService"},"scope":"Cluster","singularResource":"apiservice","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"categories":["api-extensions"],"subresources":[{"subresource":"status","responseKind":{"group":"","version":"","kind":"APIService"},"verbs":["get","patch","update"]}]}],"freshness":"Current"}]}"#;
        assert!(compact.starts_with(expected_start), "{}", &compact[..600]);
    }

    #[test]
    fn newer_group_metadata_without_creation_timestamp_stays_without() {
        let parsed = fixtures::parse(V1_36);
        let first = &parsed.items[0];
        assert_eq!(first.metadata.creation_timestamp, None);
        let compact = serde_json::to_string(first).unwrap();
        assert!(compact.starts_with(r#"{"metadata":{"name":"apiregistration.k8s.io"},"#));
    }

    #[test]
    fn unknown_metadata_and_freshness_survive_a_round_trip() {
        let doc = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"g","labels":{"a":"b"}},"versions":[{"version":"v1","freshness":"Unknown"},{"version":"v2","freshness":""}]}]}"#;
        let parsed = fixtures::parse(doc);
        let versions = &parsed.items[0].versions;
        assert_eq!(versions[0].freshness, Some(Freshness::Other("Unknown".into())));
        assert_eq!(versions[1].freshness, None);
        assert_eq!(parsed.metadata.resource_version, "7");
        let compact = serde_json::to_string(&parsed).unwrap();
        assert_eq!(
            compact,
            r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"g","labels":{"a":"b"}},"versions":[{"version":"v1","freshness":"Unknown"},{"version":"v2"}]}]}"#
        );
    }

    #[test]
    fn nulls_decode_as_zero_values_like_go() {
        let doc = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":null,"items":[{"metadata":{"name":"g"},"versions":[{"version":"v1","resources":[{"resource":"r","responseKind":null,"scope":"Cluster","singularResource":"","verbs":null,"shortNames":null}]}]}]}"#;
        let parsed = fixtures::parse(doc);
        let resource = &parsed.items[0].versions[0].resources[0];
        assert_eq!(resource.response_kind, None);
        assert!(resource.verbs.is_empty());
    }

    #[test]
    fn v2beta1_documents_are_accepted() {
        let doc = V1_33.replacen("apidiscovery.k8s.io/v2", "apidiscovery.k8s.io/v2beta1", 1);
        let parsed = fixtures::parse(&doc);
        assert_eq!(parsed.api_version, API_VERSION_V2BETA1);
        assert_eq!(parsed.gvrs().count(), 71);
    }

    #[test]
    fn gvrs_counts_match_the_fixture_readme() {
        assert_eq!(fixtures::parse(V1_30).gvrs().count(), 67);
        assert_eq!(fixtures::parse(V1_33).gvrs().count(), 71);
        assert_eq!(fixtures::parse(V1_36).gvrs().count(), 83);
    }

    #[test]
    fn gvrs_yield_group_version_resource_triples() {
        let parsed = fixtures::parse(V1_36);
        assert!(parsed.gvrs().any(|gvr| gvr == ("resource.k8s.io", "v1", "resourceclaims")));
        assert!(parsed.gvrs().all(|(group, _, _)| !group.is_empty()));
        let core = fixtures::parse(
            r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[{"metadata":{},"versions":[{"version":"v1","resources":[{"resource":"pods"}]}]}]}"#,
        );
        assert_eq!(core.gvrs().collect::<Vec<_>>(), vec![("", "v1", "pods")]);
    }

    #[test]
    fn garbage_is_not_json() {
        let error = ApiGroupDiscoveryList::from_json(b"<html>503</html>").unwrap_err();
        assert!(matches!(error, DiscoveryError::NotJson(_)), "{error:?}");
        assert!(error.to_string().starts_with("discovery document is not JSON"));
    }

    #[test]
    fn empty_body_is_reported_as_empty() {
        assert_eq!(ApiGroupDiscoveryList::from_json(b" \n").unwrap_err(), DiscoveryError::Empty);
    }

    #[test]
    fn truncated_document_is_reported_as_truncated() {
        let truncated = &V1_33.as_bytes()[..V1_33.len() / 2];
        let error = ApiGroupDiscoveryList::from_json(truncated).unwrap_err();
        assert!(matches!(error, DiscoveryError::Truncated(_)), "{error:?}");
        assert!(error.to_string().contains("truncated"));
    }

    #[test]
    fn legacy_api_group_is_rejected_by_kind() {
        let error = ApiGroupDiscoveryList::from_json(LEGACY_API_GROUP.as_bytes()).unwrap_err();
        assert_eq!(error, DiscoveryError::WrongKind("APIGroup".into()));
        assert_eq!(
            error.to_string(),
            r#"discovery document has kind "APIGroup", expected "APIGroupDiscoveryList""#
        );
    }

    #[test]
    fn missing_kind_is_named_in_the_error() {
        let error = ApiGroupDiscoveryList::from_json(br#"{"items":[]}"#).unwrap_err();
        assert_eq!(error, DiscoveryError::WrongKind(String::new()));
        assert!(error.to_string().contains("no kind"));
    }

    #[test]
    fn wrong_api_version_is_rejected() {
        let doc = V1_33.replacen("apidiscovery.k8s.io/v2", "v1", 1);
        let error = ApiGroupDiscoveryList::from_json(doc.as_bytes()).unwrap_err();
        assert_eq!(error, DiscoveryError::WrongApiVersion("v1".into()));
        assert!(error.to_string().contains(r#"apiVersion "v1""#));
    }

    #[test]
    fn wrong_field_types_are_a_shape_error() {
        let doc = br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[{"metadata":{"name":"g"},"versions":[{"version":"v1","resources":[{"resource":"r","verbs":3}]}]}]}"#;
        let error = ApiGroupDiscoveryList::from_json(doc).unwrap_err();
        assert!(matches!(error, DiscoveryError::WrongShape(_)), "{error:?}");
        assert!(error.to_string().contains("APIGroupDiscoveryList"));
        for not_an_object in [
            &b"[1,2]"[..],
            br#"["APIGroupDiscoveryList","apidiscovery.k8s.io/v2",{},[]]"#,
            b"\"APIGroupDiscoveryList\"",
        ] {
            let error = ApiGroupDiscoveryList::from_json(not_an_object).unwrap_err();
            assert!(matches!(error, DiscoveryError::WrongShape(_)), "{error:?}");
        }
    }

    #[test]
    fn wrong_kind_wins_over_a_shape_error() {
        let status = br#"{"kind":"Status","apiVersion":"v1","items":"nope","code":503}"#;
        let error = ApiGroupDiscoveryList::from_json(status).unwrap_err();
        assert_eq!(error, DiscoveryError::WrongKind("Status".into()));
        let numeric_kind = ApiGroupDiscoveryList::from_json(br#"{"kind":5}"#).unwrap_err();
        assert_eq!(numeric_kind, DiscoveryError::WrongKind("5".into()));
    }

    #[test]
    fn discovery_error_is_a_std_error() {
        let error: Box<dyn std::error::Error> = Box::new(DiscoveryError::Empty);
        assert_eq!(error.to_string(), "discovery document is empty");
    }
}
