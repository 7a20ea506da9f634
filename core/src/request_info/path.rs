//! The path: `/api/{version}/…` and `/apis/{group}/{version}/…`, segment by segment, and the
//! verb from the method or a legacy `watch`/`proxy` segment (`NewRequestInfo` itself).

use std::borrow::Cow;

use serde::ser::{Serialize, Serializer};

use super::Invalid;
use super::escape::{into_str, unescape};
use super::field_selector::field_value;
use super::query::{ListParams, lowercases_to_false};
use super::{InvalidEscape, RequestInfo, RequestInfoError};

/// Splits a request target at its first '?' into the raw path and the raw query (without '?').
#[must_use]
pub fn split_target(path_and_query: &str) -> (&str, &str) {
    path_and_query.split_once('?').unwrap_or((path_and_query, ""))
}

/// Percent-decodes a raw path as Go's `URL.Path` is (`%2F` becomes '/', '+' stays '+').
/// Borrows when there is no '%'. Bytes that are not UTF-8 become U+FFFD: routing only compares
/// ASCII names, so nothing that matters is lost.
pub fn decode_path(raw: &str) -> Result<Cow<'_, str>, InvalidEscape> {
    unescape(raw, false).map(into_str)
}

impl<'a> RequestInfo<'a> {
    /// Reads a request as kube-apiserver does. `path` is already decoded (see [`decode_path`]);
    /// `query` is raw, without the '?'.
    #[must_use]
    pub fn parse(method: &'a str, path: &'a str, query: &'a str) -> RequestInfo<'a> {
        let mut info = RequestInfo::non_resource(method, path);
        let Some(rest) = info.read_api_version(Segments::of_path(path)) else {
            return info;
        };
        let path_verb = match rest.get(0) {
            Some("watch") => Some("watch"),
            Some("proxy") => Some("proxy"),
            _ => None,
        };
        let rest = match path_verb {
            Some(_) if !rest.has(2) => {
                info.error = Some(RequestInfoError::new(path, query));
                return info;
            }
            Some(verb) => {
                info.verb = Cow::Borrowed(verb);
                rest.skip(1)
            }
            None => {
                info.verb = Cow::Borrowed(verb_for_method(method));
                rest
            }
        };
        let parts = info.read_namespace(rest);
        info.read_parts(parts);
        // Only method verbs reach here as get/delete; the legacy path verbs never read the query.
        if path_verb.is_none() && info.name.is_empty() && matches!(&*info.verb, "get" | "delete") {
            info.read_collection(query);
        }
        info
    }

    /// The path segments from the resource on (`[resource, name, subresource, …]`).
    pub fn parts(&self) -> impl Iterator<Item = &'a str> + '_ {
        Segments(self.parts).iter()
    }

    fn non_resource(method: &'a str, path: &'a str) -> Self {
        RequestInfo {
            is_resource_request: false,
            path,
            verb: lowercase_method(method),
            api_prefix: "",
            api_group: "",
            api_version: "",
            namespace: "",
            resource: "",
            subresource: "",
            name: Cow::Borrowed(""),
            field_selector: Cow::Borrowed(""),
            label_selector: Cow::Borrowed(""),
            error: None,
            parts: "",
        }
    }

    /// Reads prefix, group and version; `None` when the path is not a resource path.
    fn read_api_version(&mut self, segments: Segments<'a>) -> Option<Segments<'a>> {
        if !segments.has(3) {
            return None;
        }
        let prefix = segments.get(0).filter(|p| matches!(*p, "api" | "apis"))?;
        // Go sets the prefix before checking that an `apis` path is long enough.
        self.api_prefix = prefix;
        let mut rest = segments.skip(1);
        if prefix == "apis" {
            if !rest.has(3) {
                return None;
            }
            self.api_group = rest.get(0).unwrap_or_default();
            rest = rest.skip(1);
        }
        self.is_resource_request = true;
        self.api_version = rest.get(0).unwrap_or_default();
        Some(rest.skip(1))
    }

    /// `namespaces/{ns}/…` names the namespace, unless what follows is a namespace subresource,
    /// in which case the namespace object itself is the resource.
    fn read_namespace(&mut self, rest: Segments<'a>) -> Segments<'a> {
        if rest.get(0) != Some("namespaces") {
            return rest;
        }
        let Some(namespace) = rest.get(1) else {
            return rest;
        };
        self.namespace = namespace;
        match rest.get(2) {
            None | Some("status" | "finalize") => rest,
            Some(_) => rest.skip(2),
        }
    }

    fn read_parts(&mut self, parts: Segments<'a>) {
        self.parts = parts.0;
        let mut it = parts.iter();
        self.resource = it.next().unwrap_or_default();
        self.name = Cow::Borrowed(it.next().unwrap_or_default());
        // Everything after a proxied object is the proxied path, not a subresource.
        if self.verb != "proxy" {
            self.subresource = it.next().unwrap_or_default();
        }
    }

    /// A get or delete without a name acts on the collection; the query refines the verb.
    fn read_collection(&mut self, query: &'a str) {
        let params = ListParams::from_query(query);
        if self.verb == "get" {
            self.read_list_or_watch(&params);
        } else {
            self.verb = Cow::Borrowed("deletecollection");
        }
        // AuthorizeWithSelectors (on by default): record the raw selectors, even unparsable ones.
        self.field_selector = params.field_selector.map_or(Cow::Borrowed(""), into_str);
        self.label_selector = params.label_selector.map_or(Cow::Borrowed(""), into_str);
    }

    fn read_list_or_watch(&mut self, params: &ListParams<'a>) {
        match params.decode() {
            Ok(decoded) => {
                self.verb = Cow::Borrowed(if decoded.watch { "watch" } else { "list" });
                let name = decoded.name.zip(params.field_selector.as_ref());
                if let Some((raw, selector)) = name {
                    let name = field_value(selector, raw);
                    if is_valid_path_segment_name(&name) {
                        self.name = name;
                    }
                }
            }
            // Go resets the options on a decode error but still honours `watch`, through its
            // own (slightly different) reading of the value.
            Err(Invalid) => {
                let watch = params.watch.as_deref().is_some_and(|v| !lowercases_to_false(v));
                self.verb = Cow::Borrowed(if watch { "watch" } else { "list" });
            }
        }
    }
}

/// Go's `strings.ToLower(method)`, borrowing whenever the method is already lowercase.
fn lowercase_method(method: &str) -> Cow<'_, str> {
    let known = match method {
        "GET" => "get",
        "POST" => "post",
        "PUT" => "put",
        "PATCH" => "patch",
        "DELETE" => "delete",
        "HEAD" => "head",
        "OPTIONS" => "options",
        "CONNECT" => "connect",
        "TRACE" => "trace",
        _ if method.chars().all(|c| go_to_lower(c) == c) => return Cow::Borrowed(method),
        _ => return Cow::Owned(method.chars().map(go_to_lower).collect()),
    };
    Cow::Borrowed(known)
}

/// Go lowercases rune by rune, without context (no final-sigma rule). The only multi-char
/// lowercase mapping, U+0130 → "i\u{307}", starts with the rune Go produces.
fn go_to_lower(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

/// The verb of a resource request, from the method. Go compares the method case-sensitively.
pub(super) fn verb_for_method(method: &str) -> &'static str {
    match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
}

/// Go's `IsValidPathSegmentName`: whether a selector-given name could have been a path segment.
pub(super) fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// Path segments kept as one joined sub-slice, so that walking them never allocates.
#[derive(Debug, Clone, Copy)]
pub(super) struct Segments<'a>(pub(super) &'a str);

impl<'a> Segments<'a> {
    /// Go's `splitPath`: every leading and trailing '/' goes, empty middle segments stay.
    pub(super) fn of_path(path: &'a str) -> Self {
        Segments(path.trim_matches('/'))
    }

    pub(super) fn iter(self) -> impl Iterator<Item = &'a str> {
        let joined = self.0;
        (!joined.is_empty()).then(|| joined.split('/')).into_iter().flatten()
    }

    pub(super) fn get(self, index: usize) -> Option<&'a str> {
        self.iter().nth(index)
    }

    /// At least `n` segments.
    pub(super) fn has(self, n: usize) -> bool {
        n == 0 || self.iter().nth(n - 1).is_some()
    }

    pub(super) fn skip(self, n: usize) -> Self {
        let mut rest = self.0;
        for _ in 0..n {
            rest = rest.split_once('/').map_or("", |(_, tail)| tail);
        }
        Segments(rest)
    }
}

impl Serialize for Segments<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}
