//! The composed legacy discovery documents a routing table carries: for each legacy discovery
//! path where the apiservers serving it answer differently, the merged document the filter sends
//! in place of an authorized apiserver's answer. Paths where every serving apiserver's document
//! is the same are not here: an apiserver among them answers as is (and the table stays small).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::discovery::protobuf::ToProtobuf;
use crate::discovery::{ApiGroup, ApiGroupList, ApiResourceList, ApiVersions};

/// One composed document, as the table's JSON carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LegacyDocumentConfig {
    /// `/api`, `/api/v1`, `/apis`, `/apis/<group>` or `/apis/<group>/<version>`.
    pub path: String,
    /// The apiservers whose documents were merged, in ID order (what `skewgate explain` shows).
    pub inputs: Vec<String>,
    /// The serialised document (`APIVersions`, `APIGroupList`, `APIGroup` or `APIResourceList`).
    pub document: String,
}

/// A legacy discovery path, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyPath<'a> {
    /// `/api`
    Versions,
    /// `/apis`
    GroupList,
    /// `/apis/<group>`
    Group(&'a str),
    /// `/apis/<group>/<version>`, or `/api/<version>` with group "".
    GroupVersion(&'a str, &'a str),
}

impl<'a> LegacyPath<'a> {
    /// The path a table entry names; `None` for anything else (no trailing slash, no empty segment).
    pub fn parse(path: &'a str) -> Option<Self> {
        let mut segments = path.strip_prefix('/')?.split('/');
        let parsed = match (segments.next(), segments.next(), segments.next(), segments.next()) {
            (Some("api"), None, ..) => LegacyPath::Versions,
            (Some("apis"), None, ..) => LegacyPath::GroupList,
            (Some("api"), Some(v), None, _) => LegacyPath::GroupVersion("", v),
            (Some("apis"), Some(g), None, _) => LegacyPath::Group(g),
            (Some("apis"), Some(g), Some(v), None) => LegacyPath::GroupVersion(g, v),
            _ => return None,
        };
        let segments_ok = match parsed {
            LegacyPath::Group(g) => !g.is_empty(),
            LegacyPath::GroupVersion(g, v) => !v.is_empty() && (g.is_empty() == path.starts_with("/api/")),
            _ => true,
        };
        segments_ok.then_some(parsed)
    }

    pub fn render(&self) -> String {
        match self {
            LegacyPath::Versions => "/api".to_owned(),
            LegacyPath::GroupList => "/apis".to_owned(),
            LegacyPath::Group(g) => format!("/apis/{g}"),
            LegacyPath::GroupVersion("", v) => format!("/api/{v}"),
            LegacyPath::GroupVersion(g, v) => format!("/apis/{g}/{v}"),
        }
    }
}

/// A composed document, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyDocument {
    pub path: String,
    pub inputs: Vec<String>,
    pub document: String,
    /// The document in protobuf, encoded the first time a client asks for it: most tables are
    /// never asked, and a reload should not pay for it. `None`: the JSON is not a document of the
    /// kind its path serves, so there is nothing faithful to encode.
    protobuf: OnceLock<Option<Vec<u8>>>,
    /// The JSON indented ([`crate::pretty`]), on first use.
    pretty: OnceLock<Vec<u8>>,
}

impl LegacyDocument {
    pub fn new(path: String, inputs: Vec<String>, document: String) -> Self {
        LegacyDocument { path, inputs, document, protobuf: OnceLock::new(), pretty: OnceLock::new() }
    }

    /// The document as kube-apiserver writes it for a pretty request.
    pub fn pretty(&self) -> &[u8] {
        self.pretty.get_or_init(|| crate::pretty::indent(self.document.as_bytes()))
    }

    /// The document as kube-apiserver writes it in `application/vnd.kubernetes.protobuf`.
    pub fn protobuf(&self) -> Option<&[u8]> {
        self.protobuf.get_or_init(|| legacy_protobuf(&self.path, self.document.as_bytes())).as_deref()
    }
}

/// The protobuf form of the legacy document `json` served at `path` (its kind follows from the
/// path); `None` if `json` is not a document of that kind.
pub fn legacy_protobuf(path: &str, json: &[u8]) -> Option<Vec<u8>> {
    let encoded = match LegacyPath::parse(path)? {
        LegacyPath::Versions => ApiVersions::from_json(json).ok()?.to_protobuf(),
        LegacyPath::GroupList => ApiGroupList::from_json(json).ok()?.to_protobuf(),
        LegacyPath::Group(_) => ApiGroup::from_json(json).ok()?.to_protobuf(),
        LegacyPath::GroupVersion(..) => ApiResourceList::from_json(json).ok()?.to_protobuf(),
    };
    Some(encoded)
}

/// The composed documents with their look-ups by path.
#[derive(Debug, Default)]
pub struct LegacyDocuments {
    documents: Vec<LegacyDocument>,
    versions: Option<usize>,
    group_list: Option<usize>,
    groups: HashMap<String, usize>,
    group_versions: HashMap<String, HashMap<String, usize>>,
}

impl LegacyDocuments {
    /// Indexes `configs`; the error is (field, reason). `known` says whether the table has the
    /// group (version "") or group/version a path names: a composed document for something no
    /// apiserver serves would contradict the rest of the table.
    pub fn compile(
        configs: Vec<LegacyDocumentConfig>,
        known: impl Fn(&str, Option<&str>) -> bool,
    ) -> Result<Self, (String, String)> {
        let mut out = LegacyDocuments::default();
        for (index, config) in configs.into_iter().enumerate() {
            let field = format!("legacyDiscovery[{index}]");
            let Some(path) = LegacyPath::parse(&config.path) else {
                return Err((
                    format!("{field}.path"),
                    format!("{:?} is not a legacy discovery path", config.path),
                ));
            };
            let listed = match path {
                LegacyPath::Versions | LegacyPath::GroupList => true,
                LegacyPath::Group(g) => known(g, None),
                LegacyPath::GroupVersion(g, v) => known(g, Some(v)),
            };
            if !listed {
                return Err((
                    format!("{field}.path"),
                    format!("{} is not served by any apiserver in the table", config.path),
                ));
            }
            if config.inputs.len() < 2 {
                return Err((
                    format!("{field}.inputs"),
                    "a composed document merges at least two apiservers' documents".to_owned(),
                ));
            }
            if serde_json::from_str::<serde::de::IgnoredAny>(&config.document).is_err() {
                return Err((format!("{field}.document"), "is not a JSON document".to_owned()));
            }
            let slot = out.documents.len();
            let previous = match path {
                LegacyPath::Versions => out.versions.replace(slot),
                LegacyPath::GroupList => out.group_list.replace(slot),
                LegacyPath::Group(g) => out.groups.insert(g.to_owned(), slot),
                LegacyPath::GroupVersion(g, v) => {
                    out.group_versions.entry(g.to_owned()).or_default().insert(v.to_owned(), slot)
                }
            };
            if previous.is_some() {
                return Err((format!("{field}.path"), format!("{} is listed twice", config.path)));
            }
            out.documents.push(LegacyDocument::new(config.path, config.inputs, config.document));
        }
        Ok(out)
    }

    /// The composed document for `path` and its index (for [`LegacyDocuments::at`]).
    pub fn get(&self, path: LegacyPath<'_>) -> Option<(usize, &LegacyDocument)> {
        let index = match path {
            LegacyPath::Versions => self.versions?,
            LegacyPath::GroupList => self.group_list?,
            LegacyPath::Group(g) => *self.groups.get(g)?,
            LegacyPath::GroupVersion(g, v) => *self.group_versions.get(g)?.get(v)?,
        };
        Some((index, self.documents.get(index)?))
    }

    pub fn at(&self, index: usize) -> Option<&LegacyDocument> {
        self.documents.get(index)
    }

    pub fn all(&self) -> &[LegacyDocument] {
        &self.documents
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn paths_parse_and_render_back() {
        for (path, parsed) in [
            ("/api", LegacyPath::Versions),
            ("/apis", LegacyPath::GroupList),
            ("/api/v1", LegacyPath::GroupVersion("", "v1")),
            ("/apis/apps", LegacyPath::Group("apps")),
            ("/apis/apps/v1", LegacyPath::GroupVersion("apps", "v1")),
        ] {
            assert_eq!(LegacyPath::parse(path), Some(parsed), "{path}");
            assert_eq!(parsed.render(), path);
        }
        for bad in [
            "",
            "api",
            "/",
            "/apis/",
            "/api/",
            "/apis//v1",
            "/apis/g/",
            "/apis/g/v/x",
            "/api/v1/pods",
            "/version",
        ] {
            assert_eq!(LegacyPath::parse(bad), None, "{bad}");
        }
    }

    fn config(path: &str) -> LegacyDocumentConfig {
        LegacyDocumentConfig {
            path: path.into(),
            inputs: vec!["a".into(), "b".into()],
            document: "{}".into(),
        }
    }

    #[test]
    fn compile_indexes_and_validates() {
        let known = |g: &str, v: Option<&str>| g == "apps" && v.is_none_or(|v| v == "v1") || g.is_empty();
        let docs = LegacyDocuments::compile(
            vec![config("/apis"), config("/apis/apps/v1"), config("/api/v1")],
            known,
        )
        .unwrap();
        assert_eq!(docs.get(LegacyPath::GroupList).map(|(i, _)| i), Some(0));
        assert_eq!(
            docs.get(LegacyPath::GroupVersion("apps", "v1")).map(|(i, d)| (i, d.path.as_str())),
            Some((1, "/apis/apps/v1"))
        );
        assert_eq!(docs.get(LegacyPath::GroupVersion("", "v1")).map(|(i, _)| i), Some(2));
        assert!(docs.get(LegacyPath::Group("apps")).is_none() && docs.get(LegacyPath::Versions).is_none());
        assert_eq!(docs.at(1).map(|d| d.inputs.len()), Some(2));

        let error =
            |configs: Vec<LegacyDocumentConfig>| LegacyDocuments::compile(configs, known).unwrap_err();
        assert_eq!(error(vec![config("/apis/x")]).0, "legacyDiscovery[0].path");
        assert!(error(vec![config("/apis/apps/v2")]).1.contains("not served"));
        assert!(error(vec![config("/apis"), config("/apis")]).1.contains("twice"));
        assert!(error(vec![config("/healthz")]).1.contains("not a legacy discovery path"));
        assert_eq!(
            error(vec![LegacyDocumentConfig { document: "{".into(), ..config("/apis") }]).0,
            "legacyDiscovery[0].document"
        );
        assert_eq!(
            error(vec![LegacyDocumentConfig { inputs: vec!["a".into()], ..config("/apis") }]).0,
            "legacyDiscovery[0].inputs"
        );
    }
}
