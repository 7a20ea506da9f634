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

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::ser::{Serialize, SerializeStruct, Serializer};

/// Go's `url.ParseQuery` gives up on a query with more parameters than this and the apiserver
/// then sees none (GODEBUG `urlmaxqueryparams`, a default in Go's recent security releases).
const MAX_QUERY_PARAMS: usize = 10_000;

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
fn verb_for_method(method: &str) -> &'static str {
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
fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// Path segments kept as one joined sub-slice, so that walking them never allocates.
#[derive(Debug, Clone, Copy)]
struct Segments<'a>(&'a str);

impl<'a> Segments<'a> {
    /// Go's `splitPath`: every leading and trailing '/' goes, empty middle segments stay.
    fn of_path(path: &'a str) -> Self {
        Segments(path.trim_matches('/'))
    }

    fn iter(self) -> impl Iterator<Item = &'a str> {
        let joined = self.0;
        (!joined.is_empty()).then(|| joined.split('/')).into_iter().flatten()
    }

    fn get(self, index: usize) -> Option<&'a str> {
        self.iter().nth(index)
    }

    /// At least `n` segments.
    fn has(self, n: usize) -> bool {
        n == 0 || self.iter().nth(n - 1).is_some()
    }

    fn skip(self, n: usize) -> Self {
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

/// Something Go's list-options decoding rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Invalid;

/// The first value of each query parameter that `DecodeParameters` into `ListOptions` can fail
/// on, or that the verb and selectors depend on. Other parameters cannot make decoding fail.
#[derive(Debug, Default)]
struct ListParams<'a> {
    watch: Option<Cow<'a, [u8]>>,
    field_selector: Option<Cow<'a, [u8]>>,
    label_selector: Option<Cow<'a, [u8]>>,
    limit: Option<Cow<'a, [u8]>>,
    timeout_seconds: Option<Cow<'a, [u8]>>,
}

/// What a successful `DecodeParameters` yields that matters here.
struct Decoded {
    watch: bool,
    /// The raw (still escaped) value of the `metadata.name` term, within the field selector.
    name: Option<Range<usize>>,
}

impl<'a> ListParams<'a> {
    /// Go's `url.ParseQuery`, keeping the first value of the parameters of interest.
    fn from_query(query: &'a str) -> Self {
        let mut params = ListParams::default();
        if query.bytes().filter(|&b| b == b'&').count() >= MAX_QUERY_PARAMS {
            return params;
        }
        for pair in query.split('&') {
            // Go ≥ 1.17 drops pairs with a ';' rather than treating it as a separator.
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let Ok(key) = unescape(raw_key, true) else {
                continue;
            };
            let Some(slot) = params.slot(&key) else {
                continue;
            };
            // A pair whose value does not unescape is dropped whole; a later pair may still count.
            if slot.is_none() {
                *slot = unescape(raw_value, true).ok();
            }
        }
        params
    }

    fn slot(&mut self, key: &[u8]) -> Option<&mut Option<Cow<'a, [u8]>>> {
        match key {
            b"watch" => Some(&mut self.watch),
            b"fieldSelector" => Some(&mut self.field_selector),
            b"labelSelector" => Some(&mut self.label_selector),
            b"limit" => Some(&mut self.limit),
            b"timeoutSeconds" => Some(&mut self.timeout_seconds),
            _ => None,
        }
    }

    /// `metainternalversionscheme.ParameterCodec.DecodeParameters` into `ListOptions`: the
    /// integer conversions, then `fields.ParseSelector` and `labels.Parse`.
    fn decode(&self) -> Result<Decoded, Invalid> {
        let not_int = |v: &Option<Cow<'_, [u8]>>| v.as_deref().is_some_and(|v| !is_go_int64(v));
        if not_int(&self.limit) || not_int(&self.timeout_seconds) {
            return Err(Invalid);
        }
        let name = field_selector_exact_name(self.field_selector.as_deref().unwrap_or_default())?;
        if !is_valid_label_selector(self.label_selector.as_deref().unwrap_or_default()) {
            return Err(Invalid);
        }
        let watch = self.watch.as_deref().is_some_and(|v| !converts_to_false(v));
        Ok(Decoded { watch, name })
    }
}

/// `runtime.Convert_Slice_string_To_bool`: "0" and, by Unicode case folding, "false".
fn converts_to_false(v: &[u8]) -> bool {
    v == b"0" || equal_fold_false(v)
}

/// The fallback after a decode error lowercases instead of case-folding, so "falſe" (long s)
/// is false on the normal path but a watch on the fallback one.
fn lowercases_to_false(v: &[u8]) -> bool {
    v == b"0" || v.eq_ignore_ascii_case(b"false")
}

/// Go's `strings.EqualFold(v, "false")`. Besides ASCII case, simple folding equates 's' with
/// U+017F LATIN SMALL LETTER LONG S; no other rune folds to a letter of "false".
fn equal_fold_false(v: &[u8]) -> bool {
    let Some((head, rest)) = v.split_at_checked(3) else {
        return false;
    };
    let rest = rest
        .strip_prefix("\u{17F}".as_bytes())
        .or_else(|| rest.strip_prefix(b"s"))
        .or_else(|| rest.strip_prefix(b"S"));
    head.eq_ignore_ascii_case(b"fal") && rest.is_some_and(|e| e.eq_ignore_ascii_case(b"e"))
}

/// `strconv.ParseInt(v, 10, 64)` succeeds: an optional sign, ASCII digits, in range.
fn is_go_int64(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| s.parse::<i64>().is_ok())
}

/// Percent-decoding as Go's `unescape`, in path mode or, with `plus_is_space`, query mode.
fn unescape(raw: &str, plus_is_space: bool) -> Result<Cow<'_, [u8]>, InvalidEscape> {
    let bytes = raw.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || (plus_is_space && b == b'+')) {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|&h| hex_value(h));
                let lo = bytes.get(i + 2).and_then(|&l| hex_value(l));
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(InvalidEscape::at(bytes, i));
                };
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(Cow::Owned(out))
}

fn hex_value(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

impl InvalidEscape {
    /// Go reports the '%' and at most the two bytes after it.
    fn at(bytes: &[u8], start: usize) -> Self {
        let end = bytes.len().min(start + 3);
        let sequence = bytes.get(start..end).unwrap_or_default();
        InvalidEscape { sequence: String::from_utf8_lossy(sequence).into_owned() }
    }
}

/// Bytes to text, borrowing when they are UTF-8 and borrowed; invalid UTF-8 becomes U+FFFD.
fn into_str(bytes: Cow<'_, [u8]>) -> Cow<'_, str> {
    match bytes {
        Cow::Borrowed(b) => String::from_utf8_lossy(b),
        Cow::Owned(v) => Cow::Owned(
            String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ),
    }
}

/// `fields.ParseSelector(s).RequiresExactMatch("metadata.name")`: `Ok(None)` when the selector
/// is valid but names nothing, `Err` when it does not parse. The range is the raw value.
fn field_selector_exact_name(selector: &[u8]) -> Result<Option<Range<usize>>, Invalid> {
    let mut best: Option<(&[u8], Range<usize>)> = None;
    for (start, term) in FieldTerms::new(selector) {
        if term.is_empty() {
            continue;
        }
        let (lhs, op, rhs_start) = split_field_term(term).ok_or(Invalid)?;
        check_field_value(term.get(rhs_start..).unwrap_or_default())?;
        // Go sorts the raw terms, then returns the first equality on the field.
        let wins = best.as_ref().is_none_or(|(winner, _)| term < *winner);
        if op != FieldOp::NotEquals && lhs == b"metadata.name" && wins {
            best = Some((term, start + rhs_start..start + term.len()));
        }
    }
    Ok(best.map(|(_, value)| value))
}

/// Go's `splitTerms`: the terms between commas not escaped by a backslash, with their offsets.
struct FieldTerms<'s> {
    selector: &'s [u8],
    start: usize,
    done: bool,
}

impl<'s> FieldTerms<'s> {
    fn new(selector: &'s [u8]) -> Self {
        FieldTerms { selector, start: 0, done: selector.is_empty() }
    }
}

impl<'s> Iterator for FieldTerms<'s> {
    type Item = (usize, &'s [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let start = self.start;
        let rest = self.selector.get(start..).unwrap_or_default();
        let mut escaped = false;
        for (i, &b) in rest.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b',' => {
                    self.start = start + i + 1;
                    return Some((start, rest.get(..i).unwrap_or_default()));
                }
                _ => {}
            }
        }
        self.done = true;
        Some((start, rest))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldOp {
    Equals,
    NotEquals,
}

/// Go's `splitTerm`: the first place where "!=", "==" or "=" starts (in that order of
/// preference) splits the term; no escaping in the field name. Returns where the value starts.
fn split_field_term(term: &[u8]) -> Option<(&[u8], FieldOp, usize)> {
    (0..term.len()).find_map(|i| {
        let lhs = term.get(..i)?;
        let rest = term.get(i..)?;
        if rest.starts_with(b"!=") {
            Some((lhs, FieldOp::NotEquals, i + 2))
        } else if rest.starts_with(b"==") {
            Some((lhs, FieldOp::Equals, i + 2))
        } else if rest.starts_with(b"=") {
            Some((lhs, FieldOp::Equals, i + 1))
        } else {
            None
        }
    })
}

/// Go's `fields.UnescapeValue` succeeds: only `\\`, `\,` and `\=` escapes, and no bare ',' or '='.
fn check_field_value(raw: &[u8]) -> Result<(), Invalid> {
    let mut escaped = false;
    for &b in raw {
        match b {
            b'\\' | b',' | b'=' if escaped => escaped = false,
            _ if escaped => return Err(Invalid),
            b'\\' => escaped = true,
            b',' | b'=' => return Err(Invalid),
            _ => {}
        }
    }
    if escaped { Err(Invalid) } else { Ok(()) }
}

/// Drops the escaping backslashes of a value [`check_field_value`] accepted.
fn unescape_field_value(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut escaped = false;
    for &b in raw {
        if b == b'\\' && !escaped {
            escaped = true;
        } else {
            out.push(b);
            escaped = false;
        }
    }
    Cow::Owned(out)
}

/// The unescaped value at `raw` in a field selector, borrowing whatever can be borrowed.
fn field_value<'a>(selector: &Cow<'a, [u8]>, raw: Range<usize>) -> Cow<'a, str> {
    match selector {
        Cow::Borrowed(bytes) => {
            let bytes: &'a [u8] = bytes;
            into_str(unescape_field_value(bytes.get(raw).unwrap_or_default()))
        }
        Cow::Owned(bytes) => {
            let value = unescape_field_value(bytes.get(raw).unwrap_or_default()).into_owned();
            into_str(Cow::Owned(value))
        }
    }
}

/// Whether Go's `labels.Parse` accepts the selector.
fn is_valid_label_selector(selector: &[u8]) -> bool {
    LabelParser::new(selector).selector().is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'s> {
    End,
    OpenPar,
    ClosedPar,
    Comma,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    /// Keys, values and the keywords `in`/`notin`, which are only keywords where an operator
    /// is expected.
    Ident(&'s [u8]),
}

/// Go's label-selector `Lexer`, byte for byte.
struct Lexer<'s> {
    s: &'s [u8],
    pos: usize,
    ended: bool,
}

impl<'s> Lexer<'s> {
    fn next_token(&mut self) -> Token<'s> {
        if self.ended {
            return Token::End;
        }
        while self.s.get(self.pos).is_some_and(|&b| is_label_whitespace(b)) {
            self.pos += 1;
        }
        let first = match self.s.get(self.pos) {
            // Go's read() returns 0 both at the end and for a NUL byte, so a NUL where a token
            // would start ends the input.
            None | Some(0) => {
                self.ended = true;
                return Token::End;
            }
            Some(&b) => b,
        };
        let token = match single_char_token(first) {
            Some(single) => self.special(first, single),
            None => self.ident(),
        };
        // For the same reason a NUL right after a token is swallowed, not put back.
        if self.s.get(self.pos) == Some(&0) {
            self.pos += 1;
        }
        token
    }

    fn special(&mut self, first: u8, single: Token<'s>) -> Token<'s> {
        self.pos += 1;
        let double = match (first, self.s.get(self.pos)) {
            (b'!', Some(b'=')) => Some(Token::NotEquals),
            (b'=', Some(b'=')) => Some(Token::DoubleEquals),
            _ => None,
        };
        if double.is_some() {
            self.pos += 1;
        }
        double.unwrap_or(single)
    }

    fn ident(&mut self) -> Token<'s> {
        let start = self.pos;
        while self
            .s
            .get(self.pos)
            .is_some_and(|&b| b != 0 && !is_label_whitespace(b) && single_char_token(b).is_none())
        {
            self.pos += 1;
        }
        Token::Ident(self.s.get(start..self.pos).unwrap_or_default())
    }
}

fn is_label_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn single_char_token(b: u8) -> Option<Token<'static>> {
    match b {
        b'(' => Some(Token::OpenPar),
        b')' => Some(Token::ClosedPar),
        b',' => Some(Token::Comma),
        b'!' => Some(Token::Bang),
        b'=' => Some(Token::Equals),
        b'>' => Some(Token::GreaterThan),
        b'<' => Some(Token::LessThan),
        _ => None,
    }
}

/// Go's label-selector `Parser` with `NewRequirement`'s validation, reduced to accept/reject.
struct LabelParser<'s> {
    lexer: Lexer<'s>,
    peeked: Option<Token<'s>>,
}

impl<'s> LabelParser<'s> {
    fn new(selector: &'s [u8]) -> Self {
        LabelParser { lexer: Lexer { s: selector, pos: 0, ended: false }, peeked: None }
    }

    fn peek(&mut self) -> Token<'s> {
        let token = self.peeked.unwrap_or_else(|| self.lexer.next_token());
        self.peeked = Some(token);
        token
    }

    fn next(&mut self) -> Token<'s> {
        self.peeked.take().unwrap_or_else(|| self.lexer.next_token())
    }

    fn selector(&mut self) -> Result<(), Invalid> {
        match self.peek() {
            Token::End => return Ok(()),
            Token::Ident(_) | Token::Bang => {}
            _ => return Err(Invalid),
        }
        loop {
            self.requirement()?;
            match self.next() {
                Token::End => return Ok(()),
                Token::Comma if matches!(self.peek(), Token::Ident(_) | Token::Bang) => {}
                _ => return Err(Invalid),
            }
        }
    }

    fn requirement(&mut self) -> Result<(), Invalid> {
        let mut token = self.next();
        let negated = token == Token::Bang;
        if negated {
            token = self.next();
        }
        let Token::Ident(key) = token else {
            return Err(Invalid);
        };
        if !is_qualified_name(key) {
            return Err(Invalid);
        }
        // `!key` never takes an operator: whatever follows must be ',' or the end.
        if negated || matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(());
        }
        match self.next() {
            Token::Ident(op) if op == b"in" || op == b"notin" => self.value_set(),
            Token::Equals | Token::DoubleEquals | Token::NotEquals => self.exact_value().map(drop),
            Token::GreaterThan | Token::LessThan => {
                let value = self.exact_value()?;
                if is_go_int64(value) { Ok(()) } else { Err(Invalid) }
            }
            _ => Err(Invalid),
        }
    }

    fn exact_value(&mut self) -> Result<&'s [u8], Invalid> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(b"");
        }
        match self.next() {
            Token::Ident(value) if is_label_value(value) => Ok(value),
            _ => Err(Invalid),
        }
    }

    fn value_set(&mut self) -> Result<(), Invalid> {
        if self.next() != Token::OpenPar {
            return Err(Invalid);
        }
        match self.peek() {
            Token::ClosedPar => {
                self.next();
                Ok(())
            }
            Token::Ident(_) | Token::Comma => {
                self.value_list()?;
                if self.next() == Token::ClosedPar { Ok(()) } else { Err(Invalid) }
            }
            _ => Err(Invalid),
        }
    }

    /// Go's `parseIdentifiersList`: values separated by commas, any of them empty. Returns
    /// with the ')' still to be read.
    fn value_list(&mut self) -> Result<(), Invalid> {
        loop {
            match self.next() {
                Token::Ident(value) => {
                    if !is_label_value(value) {
                        return Err(Invalid);
                    }
                    match self.peek() {
                        Token::Comma => {}
                        Token::ClosedPar => return Ok(()),
                        _ => return Err(Invalid),
                    }
                }
                Token::Comma => match self.peek() {
                    Token::ClosedPar => return Ok(()),
                    Token::Comma => {
                        self.next();
                    }
                    _ => {}
                },
                _ => return Err(Invalid),
            }
        }
    }
}

/// `validation.IsQualifiedName`: `[dns-subdomain/]name`, name ≤ 63 of `[-A-Za-z0-9_.]` starting
/// and ending alphanumeric.
fn is_qualified_name(key: &[u8]) -> bool {
    let mut parts = key.split(|&b| b == b'/');
    let (first, second, third) = (parts.next(), parts.next(), parts.next());
    let name = match (first, second, third) {
        (Some(name), None, _) => name,
        (Some(prefix), Some(name), None) if is_dns1123_subdomain(prefix) => name,
        _ => return false,
    };
    !name.is_empty() && name.len() <= 63 && is_qualified_name_part(name)
}

/// `validation.IsValidLabelValue`: empty, or a qualified-name part of at most 63 bytes.
fn is_label_value(value: &[u8]) -> bool {
    value.len() <= 63 && (value.is_empty() || is_qualified_name_part(value))
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(v: &[u8]) -> bool {
    match (v.first(), v.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && v.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `validation.IsDNS1123Subdomain`: ≤ 253 bytes of dot-separated `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns1123_subdomain(v: &[u8]) -> bool {
    let is_label = |l: &[u8]| match (l.first(), l.last()) {
        (Some(first), Some(last)) => {
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            alnum(first) && alnum(last) && l.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    };
    v.len() <= 253 && v.split(|&b| b == b'.').all(is_label)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    /// Expected fields; rows override what they care about.
    #[derive(Debug, Clone, Copy)]
    struct Want {
        resource_request: bool,
        verb: &'static str,
        prefix: &'static str,
        group: &'static str,
        version: &'static str,
        namespace: &'static str,
        resource: &'static str,
        subresource: &'static str,
        name: &'static str,
        parts: &'static [&'static str],
        field_selector: &'static str,
        label_selector: &'static str,
        error: bool,
    }

    const NON_RESOURCE: Want = Want {
        resource_request: false,
        verb: "get",
        prefix: "",
        group: "",
        version: "",
        namespace: "",
        resource: "",
        subresource: "",
        name: "",
        parts: &[],
        field_selector: "",
        label_selector: "",
        error: false,
    };

    const CORE: Want = Want { resource_request: true, prefix: "api", version: "v1", ..NON_RESOURCE };

    /// Parses a request target as Go's server would hand it to `NewRequestInfo`.
    fn with_info<R>(method: &str, target: &str, check: impl FnOnce(&RequestInfo<'_>) -> R) -> R {
        let (raw_path, query) = split_target(target);
        let path = decode_path(raw_path).unwrap();
        check(&RequestInfo::parse(method, &path, query))
    }

    fn assert_want(method: &str, target: &str, want: &Want) {
        with_info(method, target, |info| {
            let ctx = format!("{method} {target}: {info:?}");
            assert_eq!(info.is_resource_request, want.resource_request, "resource request, {ctx}");
            assert_eq!(info.verb, want.verb, "verb, {ctx}");
            assert_eq!(info.api_prefix, want.prefix, "prefix, {ctx}");
            assert_eq!(info.api_group, want.group, "group, {ctx}");
            assert_eq!(info.api_version, want.version, "version, {ctx}");
            assert_eq!(info.namespace, want.namespace, "namespace, {ctx}");
            assert_eq!(info.resource, want.resource, "resource, {ctx}");
            assert_eq!(info.subresource, want.subresource, "subresource, {ctx}");
            assert_eq!(info.name, want.name, "name, {ctx}");
            assert_eq!(info.parts().collect::<Vec<_>>(), want.parts, "parts, {ctx}");
            assert_eq!(info.field_selector, want.field_selector, "fieldSelector, {ctx}");
            assert_eq!(info.label_selector, want.label_selector, "labelSelector, {ctx}");
            assert_eq!(info.error.is_some(), want.error, "error, {ctx}");
        });
    }

    fn assert_rows(rows: &[(&str, &str, Want)]) {
        for (method, url, want) in rows {
            assert_want(method, url, want);
        }
    }

    /// (method, url, verb, group, version, namespace, resource, subresource, name, parts).
    type ApiRow = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static [&'static str],
    );

    /// The shapes of upstream's TestGetAPIRequestInfo, checked on every field.
    #[rustfmt::skip]
    const API_ROWS: &[ApiRow] = &[
        ("GET", "/api/v1/namespaces", "list", "", "v1", "", "namespaces", "", "", &["namespaces"]),
        ("GET", "/api/v1/namespaces/other", "get", "", "v1", "other", "namespaces", "", "other", &["namespaces", "other"]),
        ("GET", "/api/v1/namespaces/other/pods", "list", "", "v1", "other", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/namespaces/other/pods/foo", "get", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        ("HEAD", "/api/v1/namespaces/other/pods/foo", "get", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        ("GET", "/api/v1/pods", "list", "", "v1", "", "pods", "", "", &["pods"]),
        ("HEAD", "/api/v1/pods", "list", "", "v1", "", "pods", "", "", &["pods"]),
        // An old upstream copy expected namespace "" here, against the code; current upstream dropped the row.
        ("PATCH", "/api/v1/namespaces/new-namespace", "patch", "", "v1", "new-namespace", "namespaces", "", "new-namespace", &["namespaces", "new-namespace"]),
        ("GET", "/api/v1/proxy/namespaces/other/pods/foo", "proxy", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        ("GET", "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource", "proxy", "", "v1", "other", "pods", "", "foo", &["pods", "foo", "subpath", "not", "a", "subresource"]),
        ("GET", "/api/v1/watch/pods", "watch", "", "v1", "", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/pods?watch=true", "watch", "", "v1", "", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/pods?watch=false", "list", "", "v1", "", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/watch/namespaces/other/pods", "watch", "", "v1", "other", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/namespaces/other/pods?watch=1", "watch", "", "v1", "other", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/namespaces/other/pods?watch=0", "list", "", "v1", "other", "pods", "", "", &["pods"]),
        ("GET", "/api/v1/namespaces/other/pods/foo/status", "get", "", "v1", "other", "pods", "status", "foo", &["pods", "foo", "status"]),
        ("GET", "/api/v1/namespaces/other/pods/foo/proxy/subpath", "get", "", "v1", "other", "pods", "proxy", "foo", &["pods", "foo", "proxy", "subpath"]),
        ("PUT", "/api/v1/namespaces/other/finalize", "update", "", "v1", "other", "namespaces", "finalize", "other", &["namespaces", "other", "finalize"]),
        ("PUT", "/api/v1/namespaces/other/status", "update", "", "v1", "other", "namespaces", "status", "other", &["namespaces", "other", "status"]),
        ("PATCH", "/api/v1/namespaces/other/pods/foo", "patch", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        ("DELETE", "/api/v1/namespaces/other/pods/foo", "delete", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        ("POST", "/api/v1/namespaces/other/pods", "create", "", "v1", "other", "pods", "", "", &["pods"]),
        ("DELETE", "/api/v1/nodes", "deletecollection", "", "v1", "", "nodes", "", "", &["nodes"]),
        ("DELETE", "/api/v1/namespaces", "deletecollection", "", "v1", "", "namespaces", "", "", &["namespaces"]),
        ("DELETE", "/api/v1/namespaces/other/pods", "deletecollection", "", "v1", "other", "pods", "", "", &["pods"]),
        ("DELETE", "/apis/extensions/v1/namespaces/other/pods", "deletecollection", "extensions", "v1", "other", "pods", "", "", &["pods"]),
        ("POST", "/apis/extensions/v1/namespaces/other/pods", "create", "extensions", "v1", "other", "pods", "", "", &["pods"]),
        ("POST", "/apis/extensions/v1beta3/namespaces/other/pods", "create", "extensions", "v1beta3", "other", "pods", "", "", &["pods"]),
        ("GET", "/apis/batch/v1/job/foo/scale", "get", "batch", "v1", "", "job", "scale", "foo", &["job", "foo", "scale"]),
    ];

    #[test]
    fn api_request_shapes() {
        for &(method, url, verb, group, version, namespace, resource, subresource, name, parts) in API_ROWS {
            let prefix = if url.starts_with("/apis/") { "apis" } else { "api" };
            let want =
                Want { verb, prefix, group, version, namespace, resource, subresource, name, parts, ..CORE };
            assert_want(method, url, &want);
        }
    }

    #[test]
    fn non_resource_paths() {
        // (url, apiPrefix): the prefix sticks for `apis` paths too short to hold a resource.
        let rows: &[(&str, &str)] = &[
            ("", ""),
            ("/", ""),
            ("//", ""),
            ("/api", ""),
            ("/apis", ""),
            ("/api/v1", ""),
            ("/api/v1/", ""),
            ("/api/version/", ""),
            ("/apis/g", ""),
            ("/apis/g/v", "apis"),
            ("/apis/group/version/", "apis"),
            ("/apis/extensions/v1beta1", "apis"),
            ("/apis/extensions/v1beta1/", "apis"),
            ("/apis/version/resource", "apis"),
            ("/badprefix/version/resource", ""),
            ("/not-api/version/resource", ""),
            ("/API/v1/pods", ""),
            ("/healthz", ""),
            ("/openapi/v3/apis/apps/v1", ""),
            ("/livez/etcd", ""),
        ];
        for &(url, prefix) in rows {
            assert_want("GET", url, &Want { prefix, ..NON_RESOURCE });
        }
    }

    #[test]
    fn resource_paths_accepted_by_upstream() {
        for url in [
            "/api/version/resource",
            "/apis/group/version/resource/name/subresource",
            "/api/version/resource/name/subresource",
            "/apis/batch/v1/job",
            "/apis/batch/v1/job/foo",
            "/apis/batch/v1/job/foo/scale",
        ] {
            with_info("GET", url, |info| assert!(info.is_resource_request, "{url}"));
        }
    }

    #[test]
    fn methods_to_verbs() {
        // (method, resource verb, non-resource verb)
        let rows: &[(&str, &str, &str)] = &[
            ("GET", "get", "get"),
            ("HEAD", "get", "head"),
            ("POST", "create", "post"),
            ("PUT", "update", "put"),
            ("PATCH", "patch", "patch"),
            ("DELETE", "delete", "delete"),
            ("OPTIONS", "", "options"),
            ("CONNECT", "", "connect"),
            ("TRACE", "", "trace"),
            ("get", "", "get"),
            ("Post", "", "post"),
            ("PROPFIND", "", "propfind"),
            ("", "", ""),
            ("ÄB", "", "äb"),
            ("\u{130}", "", "i"),
            ("ΣΑΣ", "", "σασ"),
        ];
        for &(method, resource_verb, plain_verb) in rows {
            with_info(method, "/api/v1/pods/p", |info| assert_eq!(info.verb, resource_verb, "{method}"));
            with_info(method, "/healthz", |info| assert_eq!(info.verb, plain_verb, "{method}"));
        }
    }

    #[test]
    #[rustfmt::skip]
    fn legacy_path_verbs() {
        assert_rows(&[
            ("GET", "/api/v1/watch/namespaces", Want { verb: "watch", resource: "namespaces", parts: &["namespaces"], ..CORE }),
            ("GET", "/api/v1/watch/namespaces/ns", Want { verb: "watch", namespace: "ns", resource: "namespaces", name: "ns", parts: &["namespaces", "ns"], ..CORE }),
            ("GET", "/api/v1/watch/pods/p", Want { verb: "watch", resource: "pods", name: "p", parts: &["pods", "p"], ..CORE }),
            ("GET", "/api/v1/watch/pods/p/status", Want { verb: "watch", resource: "pods", name: "p", subresource: "status", parts: &["pods", "p", "status"], ..CORE }),
            ("GET", "/api/v1/watch/pods?watch=false&fieldSelector=metadata.name=x", Want { verb: "watch", resource: "pods", parts: &["pods"], ..CORE }),
            ("DELETE", "/api/v1/proxy/pods", Want { verb: "proxy", resource: "pods", parts: &["pods"], ..CORE }),
            ("POST", "/api/v1/proxy/nodes/n/some/path", Want { verb: "proxy", resource: "nodes", name: "n", parts: &["nodes", "n", "some", "path"], ..CORE }),
            ("GET", "/apis/g/v/watch/things", Want { verb: "watch", prefix: "apis", group: "g", version: "v", resource: "things", parts: &["things"], ..CORE }),
            // Only the segment right after the version is a verb.
            ("GET", "/api/v1/pods/watch", Want { verb: "get", resource: "pods", name: "watch", parts: &["pods", "watch"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/watch/pods", Want { verb: "get", namespace: "ns", resource: "watch", name: "pods", parts: &["watch", "pods"], ..CORE }),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn dangling_path_verb_is_an_error() {
        assert_rows(&[
            ("GET", "/api/v1/watch", Want { error: true, ..CORE }),
            ("GET", "/api/v1/watch/", Want { error: true, ..CORE }),
            ("DELETE", "/api/v1/proxy", Want { error: true, verb: "delete", ..CORE }),
            ("PROPFIND", "/apis/g/v/watch?watch=1", Want { error: true, verb: "propfind", prefix: "apis", group: "g", version: "v", ..CORE }),
        ]);
        let message = |target| with_info("GET", target, |info| info.error.as_ref().map(ToString::to_string));
        let prefix = "unable to determine kind and namespace from url, ";
        assert_eq!(message("/api/v1/watch?x=1"), Some(format!("{prefix}/api/v1/watch?x=1")));
        assert_eq!(message("/api/v1/proxy"), Some(format!("{prefix}/api/v1/proxy")));
    }

    #[test]
    #[rustfmt::skip]
    fn namespaces_and_subresources() {
        assert_rows(&[
            ("GET", "/api/v1/namespaces/ns/status", Want { verb: "get", namespace: "ns", resource: "namespaces", name: "ns", subresource: "status", parts: &["namespaces", "ns", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/status/extra", Want { verb: "get", namespace: "ns", resource: "namespaces", name: "ns", subresource: "status", parts: &["namespaces", "ns", "status", "extra"], ..CORE }),
            ("GET", "/api/v1/namespaces/status", Want { verb: "get", namespace: "status", resource: "namespaces", name: "status", parts: &["namespaces", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/pods/p/status", Want { verb: "get", namespace: "ns", resource: "pods", name: "p", subresource: "status", parts: &["pods", "p", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/pods/p/log/extra/segments", Want { verb: "get", namespace: "ns", resource: "pods", name: "p", subresource: "log", parts: &["pods", "p", "log", "extra", "segments"], ..CORE }),
            ("PUT", "/apis/apps/v1/namespaces/ns/deployments/d/scale", Want { verb: "update", prefix: "apis", group: "apps", namespace: "ns", resource: "deployments", name: "d", subresource: "scale", parts: &["deployments", "d", "scale"], ..CORE }),
            ("GET", "/apis/apps/v1/namespaces", Want { verb: "list", prefix: "apis", group: "apps", resource: "namespaces", parts: &["namespaces"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/namespaces/x", Want { verb: "get", namespace: "ns", resource: "namespaces", name: "x", parts: &["namespaces", "x"], ..CORE }),
            ("GET", "/api/v1/nodes/n/proxy/a/b", Want { verb: "get", resource: "nodes", name: "n", subresource: "proxy", parts: &["nodes", "n", "proxy", "a", "b"], ..CORE }),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn slashes_are_split_like_go() {
        assert_rows(&[
            ("GET", "//api//v1/pods", Want { verb: "get", version: "", resource: "v1", name: "pods", parts: &["v1", "pods"], ..CORE }),
            ("GET", "/api/v1//pods", Want { verb: "get", resource: "", name: "pods", parts: &["", "pods"], ..CORE }),
            ("GET", "///api/v1/pods///", Want { verb: "list", resource: "pods", parts: &["pods"], ..CORE }),
            // An empty name is no name: a list with a subresource.
            ("GET", "/api/v1/pods//status", Want { verb: "list", resource: "pods", subresource: "status", parts: &["pods", "", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces//pods", Want { verb: "list", namespace: "", resource: "pods", parts: &["pods"], ..CORE }),
            ("GET", "/apis//v1/pods", Want { verb: "list", prefix: "apis", group: "", version: "v1", resource: "pods", parts: &["pods"], ..CORE }),
            // %2F is decoded before splitting, as Go's URL.Path is.
            ("GET", "/api/v1/namespaces/a%2Fb/pods", Want { verb: "get", namespace: "a", resource: "b", name: "pods", parts: &["b", "pods"], ..CORE }),
            ("GET", "/api/v1/pods/a+b", Want { verb: "get", resource: "pods", name: "a+b", parts: &["pods", "a+b"], ..CORE }),
            ("GET", "/api/v1/pods/caf%C3%A9", Want { verb: "get", resource: "pods", name: "café", parts: &["pods", "café"], ..CORE }),
            ("GET", "/api/v1/pods/%FF", Want { verb: "get", resource: "pods", name: "\u{FFFD}", parts: &["pods", "\u{FFFD}"], ..CORE }),
        ]);
    }

    #[test]
    fn deletecollection() {
        let list = Want { verb: "deletecollection", resource: "pods", parts: &["pods"], ..CORE };
        assert_want("DELETE", "/api/v1/pods", &list);
        assert_want("DELETE", "/api/v1/pods/", &list);
        assert_want(
            "DELETE",
            "/api/v1/pods/p",
            &Want { verb: "delete", name: "p", parts: &["pods", "p"], ..list },
        );
        // A delete never takes its name from the field selector, but records the selectors.
        let url = "/api/v1/pods?fieldSelector=metadata.name=p&labelSelector=a%3Db&watch=1";
        assert_want(
            "DELETE",
            url,
            &Want { field_selector: "metadata.name=p", label_selector: "a=b", ..list },
        );
    }

    /// (query, expected verb) on `GET /api/v1/pods`.
    const WATCH_ROWS: &[(&str, &str)] = &[
        ("", "list"),
        ("watch", "watch"),
        ("watch=", "watch"),
        ("watch=true", "watch"),
        ("watch=TRUE", "watch"),
        ("watch=1", "watch"),
        ("watch=0", "list"),
        ("watch=00", "watch"),
        ("watch=false", "list"),
        ("watch=FALSE", "list"),
        ("watch=False", "list"),
        ("watch=no", "watch"),
        ("watch=+0", "watch"),
        ("watch=%30", "list"),
        ("watch=false&watch=true", "list"),
        ("watch=true&watch=false", "watch"),
        ("watch=%zz&watch=0", "list"),
        ("watch=0&watch=%zz", "list"),
        ("wat%63h=1", "watch"),
        ("WATCH=1", "list"),
        ("watch=1;x", "list"),
        ("x;y&watch=1", "watch"),
        ("&&watch=1&&", "watch"),
        ("=1&watch=1", "watch"),
        // Case folding makes the long s an 's' on the normal path...
        ("watch=fal%C5%BFe", "list"),
        // ...but the fallback after a decode error only lowercases.
        ("watch=fal%C5%BFe&limit=x", "watch"),
        ("watch=FALSE&limit=x", "list"),
        ("watch=true&limit=x", "watch"),
        ("watch=0&fieldSelector=bad", "list"),
        ("watch=1&labelSelector=%21%21", "watch"),
    ];

    #[test]
    fn watch_parameter() {
        for &(query, verb) in WATCH_ROWS {
            for method in ["GET", "HEAD"] {
                let target = format!("/api/v1/pods?{query}");
                with_info(method, &target, |info| assert_eq!(info.verb, verb, "{method} ?{query}"));
            }
        }
        // A named get ignores ?watch.
        with_info("GET", "/api/v1/pods/p?watch=1", |info| assert_eq!(info.verb, "get"));
    }

    #[test]
    fn query_parameter_limit() {
        let within = format!("watch=1{}", "&".repeat(MAX_QUERY_PARAMS - 1));
        let beyond = format!("watch=1&fieldSelector=a=b{}", "&".repeat(MAX_QUERY_PARAMS - 1));
        with_info("GET", &format!("/api/v1/pods?{within}"), |info| assert_eq!(info.verb, "watch"));
        with_info("GET", &format!("/api/v1/pods?{beyond}"), |info| {
            assert_eq!((&*info.verb, &*info.field_selector), ("list", ""));
        });
    }

    /// (query, name, verb) on `GET /apis/group/version/resource`.
    #[rustfmt::skip]
    const FIELD_NAME_ROWS: &[(&str, &str, &str)] = &[
        ("fieldSelector=metadata.name=name1", "name1", "list"),
        ("watch=true&fieldSelector=metadata.name=name1", "name1", "watch"),
        ("fieldSelector=foo=bar", "", "list"),
        ("fieldSelector=metadata.name=name1,foo", "", "list"),
        ("fieldSelector=metadata.name=name1,foo&watch=true", "", "watch"),
        ("fieldSelector=metadata.name=name1,foo&watch=false", "", "list"),
        ("fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar", "foo", "list"),
        ("fieldSelector=metadata.name==foo", "foo", "list"),
        ("fieldSelector=metadata.name!=foo", "", "list"),
        ("fieldSelector=metadata.name=foo,spec.nodeName=n", "foo", "list"),
        ("fieldSelector=spec.nodeName!=n,metadata.name=foo", "foo", "list"),
        ("fieldSelector=,metadata.name=foo,", "foo", "list"),
        // Go sorts the raw terms and takes the first match: "=a" < "=b", and "==" < "=a".
        ("fieldSelector=metadata.name=b,metadata.name=a", "a", "list"),
        ("fieldSelector=metadata.name=a,metadata.name==b", "b", "list"),
        ("fieldSelector=metadata.name=foo%2Cmetadata.name%3D%3Dbar", "bar", "list"),
        ("fieldSelector=metadata.name%3Dfoo", "foo", "list"),
        ("fieldSelector=metadata.name=a\\,b", "a,b", "list"),
        ("fieldSelector=metadata.name=a%5C%2Cb", "a,b", "list"),
        ("fieldSelector=metadata.name=a\\\\b", "a\\b", "list"),
        ("fieldSelector=metadata.name=a\\=b", "a=b", "list"),
        ("fieldSelector=metadata.name=a\\x", "", "list"),
        ("fieldSelector=metadata.name=a\\", "", "list"),
        ("fieldSelector=metadata.name=a=b", "", "list"),
        ("fieldSelector=metadata.name===a", "", "list"),
        ("fieldSelector=metadata.name", "", "list"),
        ("fieldSelector=metadata.name=a%2Fb", "", "list"),
        ("fieldSelector=metadata.name=a%25b", "", "list"),
        ("fieldSelector=metadata.name=.", "", "list"),
        ("fieldSelector=metadata.name=..", "", "list"),
        ("fieldSelector=metadata.name=...", "...", "list"),
        ("fieldSelector=metadata.name=", "", "list"),
        ("fieldSelector=metadata.name=a+b", "a b", "list"),
        ("fieldSelector=+metadata.name=foo", "", "list"),
        ("fieldSelector=metadata.name=caf%C3%A9", "café", "list"),
        ("fieldSelector=metadata.name!foo", "", "list"),
        ("fieldSelector=metadata.name=foo&fieldSelector=metadata.name=a=b", "foo", "list"),
        ("fieldSelector=metadata.name=%zz&fieldSelector=metadata.name=foo", "foo", "list"),
        // Any parameter that fails to decode loses the name.
        ("fieldSelector=metadata.name=foo&labelSelector=!!", "", "list"),
        ("fieldSelector=metadata.name=foo&labelSelector=a%3Db", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=10", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=-1", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=%2B5", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=9223372036854775807", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=9223372036854775808", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=-9223372036854775808", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=abc", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=1_000", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=10&limit=x", "foo", "list"),
        ("fieldSelector=metadata.name=foo&timeoutSeconds=30", "foo", "list"),
        ("fieldSelector=metadata.name=foo&timeoutSeconds=", "", "list"),
        ("fieldSelector=metadata.name=foo&timeoutSeconds=1.5&watch=1", "", "watch"),
        ("fieldSelector=metadata.name=foo&resourceVersion=x&continue=y&resourceVersionMatch=z", "foo", "list"),
        ("fieldSelector=metadata.name=foo&sendInitialEvents=maybe&allowWatchBookmarks=x", "foo", "list"),
    ];

    #[test]
    fn field_selector_names() {
        for &(query, name, verb) in FIELD_NAME_ROWS {
            with_info("GET", &format!("/apis/group/version/resource?{query}"), |info| {
                assert_eq!((&*info.name, &*info.verb), (name, verb), "?{query}");
                assert_eq!(info.parts().collect::<Vec<_>>(), ["resource"], "?{query}");
            });
        }
    }

    /// (method, url, name, verb, fieldSelector, labelSelector): upstream's TestSelectorParsing
    /// shapes, then more.
    #[rustfmt::skip]
    const SELECTOR_ROWS: &[(&str, &str, &str, &str, &str, &str)] = &[
        ("GET", "/apis/group/version/resource", "", "list", "", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1", "name1", "list", "metadata.name=name1", ""),
        ("GET", "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1", "name1", "watch", "metadata.name=name1", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "list", "foo=bar", "baz=qux"),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo", "", "list", "metadata.name=name1,foo", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true", "", "watch", "metadata.name=name1,foo", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false", "", "list", "metadata.name=name1,foo", ""),
        ("DELETE", "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "deletecollection", "foo=bar", "baz=qux"),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar&labelSelector=foo=bar&labelSelector=foo=baz", "foo", "list", "metadata.name=foo", "foo=bar"),
        ("GET", "/apis/group/version/resource/name?fieldSelector=foo=bar&labelSelector=foo=bar", "name", "get", "", ""),
        ("GET", "/apis/group/version/watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "", "watch", "", ""),
        ("GET", "/apis/group/version/watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "name", "watch", "", ""),
        // Recorded unescaped, and even when they do not parse.
        ("GET", "/api/v1/pods?labelSelector=app+in+%28a%2Cb%29", "", "list", "", "app in (a,b)"),
        ("GET", "/api/v1/pods?labelSelector=!!&fieldSelector=x", "", "list", "x", "!!"),
        ("GET", "/api/v1/pods?fieldSelector=&labelSelector=", "", "list", "", ""),
        ("GET", "/api/v1/pods?fieldSelector=%FF", "", "list", "\u{FFFD}", ""),
        ("GET", "/api/v1/pods?fieldSelector=a%3Db&fieldSelector=c", "", "list", "a=b", ""),
        ("GET", "/api/v1/pods?fieldSelector;=a&fieldSelector=c", "", "list", "c", ""),
        ("POST", "/api/v1/pods?fieldSelector=a=b&labelSelector=c", "", "create", "", ""),
        ("PUT", "/api/v1/pods/p?fieldSelector=a=b", "p", "update", "", ""),
        ("DELETE", "/api/v1/pods/p?fieldSelector=a=b", "p", "delete", "", ""),
        ("GET", "/api/v1/proxy/pods/p?fieldSelector=a=b", "p", "proxy", "", ""),
        ("OPTIONS", "/api/v1/pods?fieldSelector=a=b", "", "", "", ""),
    ];

    #[test]
    fn selectors_are_recorded() {
        for &(method, url, name, verb, field, label) in SELECTOR_ROWS {
            with_info(method, url, |info| {
                let got = (&*info.name, &*info.verb, &*info.field_selector, &*info.label_selector);
                assert_eq!(got, (name, verb, field, label), "{method} {url}");
                assert!(info.error.is_none(), "{method} {url}");
            });
        }
    }

    #[rustfmt::skip]
    const VALID_LABEL_SELECTORS: &[&[u8]] = &[
        b"", b"   ", b"a", b"a=b", b"a==b", b"a!=b", b"a=", b"a==", b" a = b ", b"a=b,c!=d,e",
        b"a in (b,c)", b"a notin (b)", b"a in ()", b"a in (,)", b"a in (b,)", b"a in (,b)", b"a in (b,,c)",
        b"a in(b)", b"x in (in)", b"in", b"notin=x", b"in in (notin)", b"!a", b"! a", b"!a,b", b"a>1",
        b"a<10", b"a>0", b"a>007", b"example.com/a=b", b"a.b-c_d=E.f-G_h", b"k8s.io/app-name", b"a=b\t",
        b"A=B", b"a=9223372036854775807", b"a>9223372036854775807",
        // Go's lexer reads a NUL as the end of input where a token would start, and swallows a
        // NUL right after a token.
        b"\0garbage", b"a=b\0\0!!!", b"a\0", b"a,b\0\0,", b"a \0!", b"a,\0b",
    ];

    #[rustfmt::skip]
    const INVALID_LABEL_SELECTORS: &[&[u8]] = &[
        b",", b"a,", b",a", b"!", b"!!a", b"!a=b", b"!a in (b)", b"a=b=c", b"a b", b"a in", b"a in b",
        b"a in (b", b"a in (b c)", b"a in ((b))", b"a notin", b"a>", b"a>b", b"a>-1", b"a<+1",
        b"a>9223372036854775808", b"a=>b", b"a<=1", b"a>=1", b"-a", b"a-", b"_a", b"a/b/c", b"/a", b"a/",
        b"A.B/c", b"a..b/c", b"-a.com/c", b"a=b c", b"(a)", b"a=(b)", b"a=-b", b"a=b-", b"a!b", b"a=b\tc",
        b"a=\xC3\xA9", b"\xC3\xA9", b"a==b==c", b"a=,", b"a in (b),", b")", b"a=!", b"a in (!)",
        b"a=b\0!!!", b"a,b\0,", b"a,\0\0b",
    ];

    #[test]
    fn label_selector_grammar() {
        for s in VALID_LABEL_SELECTORS {
            assert!(is_valid_label_selector(s), "should parse: {:?}", String::from_utf8_lossy(s));
        }
        for s in INVALID_LABEL_SELECTORS {
            assert!(!is_valid_label_selector(s), "should not parse: {:?}", String::from_utf8_lossy(s));
        }
        let name63 = "a".repeat(63);
        let value63 = "b".repeat(63);
        let prefix253 = format!("{}.{}", "p".repeat(126), "q".repeat(126));
        assert!(is_valid_label_selector(format!("{name63}={value63}").as_bytes()));
        assert!(is_valid_label_selector(format!("{prefix253}/{name63}").as_bytes()));
        assert!(!is_valid_label_selector(format!("{name63}a").as_bytes()));
        assert!(!is_valid_label_selector(format!("a={value63}b").as_bytes()));
        assert!(!is_valid_label_selector(format!("a in (x,{value63}b)").as_bytes()));
        assert!(!is_valid_label_selector(format!("{prefix253}p/a").as_bytes()));
    }

    #[test]
    fn field_selector_grammar() {
        let name = |s: &str| {
            field_selector_exact_name(s.as_bytes()).map(|r| r.and_then(|r| s.get(r)).map(str::to_owned))
        };
        assert_eq!(name(""), Ok(None));
        assert_eq!(name(","), Ok(None));
        assert_eq!(name("a=b"), Ok(None));
        assert_eq!(name("=b"), Ok(None));
        assert_eq!(name("="), Ok(None));
        assert_eq!(name("metadata.name=x"), Ok(Some("x".into())));
        assert_eq!(name("metadata.name=x\\,y"), Ok(Some("x\\,y".into())));
        assert_eq!(name("a!b=c,metadata.name==x"), Ok(Some("x".into())));
        assert_eq!(name("metadata.name!==x"), Err(Invalid));
        assert_eq!(name("metadata.name=x,"), Ok(Some("x".into())));
        assert_eq!(name("a"), Err(Invalid));
        assert_eq!(name("a!b"), Err(Invalid));
        assert_eq!(name("a=\\"), Err(Invalid));
        assert_eq!(name("a=\\\\\\"), Err(Invalid));
        assert_eq!(name("a=\\é"), Err(Invalid));
        assert_eq!(name("a=b\\,c=d"), Err(Invalid));
        assert_eq!(name("a=b\\,c\\=d"), Ok(None));
        assert_eq!(unescape_field_value(b"a\\\\\\,b\\="), Cow::Borrowed(b"a\\,b=".as_slice()));
        assert!(matches!(unescape_field_value(b"plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn path_decoding() {
        assert_eq!(decode_path("/api/v1/pods").unwrap(), "/api/v1/pods");
        assert!(matches!(decode_path("/api/v1/a+b").unwrap(), Cow::Borrowed("/api/v1/a+b")));
        assert_eq!(decode_path("/a%2Fb%2fc").unwrap(), "/a/b/c");
        assert_eq!(decode_path("%41%42").unwrap(), "AB");
        assert_eq!(decode_path("/caf%C3%A9").unwrap(), "/café");
        assert_eq!(decode_path("/%FF%FE").unwrap(), "/\u{FFFD}\u{FFFD}");
        assert_eq!(decode_path("/é").unwrap(), "/é");
        let bad =
            [("/%zz", "%zz"), ("/%4", "%4"), ("%", "%"), ("/a%2", "%2"), ("/%g1x", "%g1"), ("/%%41", "%%4")];
        for (raw, seq) in bad {
            let err = decode_path(raw).unwrap_err();
            assert_eq!(err.to_string(), format!("invalid URL escape {seq:?}"), "{raw}");
        }
    }

    #[test]
    fn target_splitting() {
        assert_eq!(split_target("/a?b=c"), ("/a", "b=c"));
        assert_eq!(split_target("/a"), ("/a", ""));
        assert_eq!(split_target("/a?"), ("/a", ""));
        assert_eq!(split_target("/a?b?c"), ("/a", "b?c"));
        assert_eq!(split_target("?x"), ("", "x"));
        assert_eq!(split_target(""), ("", ""));
    }

    #[test]
    #[rustfmt::skip]
    fn json_shape() {
        let json = |method, target| with_info(method, target, |info| serde_json::to_string(info).unwrap());
        assert_eq!(
            json("GET", "/apis/apps/v1/namespaces/ns/deployments?fieldSelector=metadata.name%3Dd&labelSelector=a"),
            r#"{"isResourceRequest":true,"path":"/apis/apps/v1/namespaces/ns/deployments","verb":"list","apiPrefix":"apis","apiGroup":"apps","apiVersion":"v1","namespace":"ns","resource":"deployments","subresource":"","name":"d","parts":["deployments"],"fieldSelector":"metadata.name=d","labelSelector":"a"}"#
        );
        assert_eq!(
            json("GET", "/healthz"),
            r#"{"isResourceRequest":false,"path":"/healthz","verb":"get","apiPrefix":"","apiGroup":"","apiVersion":"","namespace":"","resource":"","subresource":"","name":"","parts":[],"fieldSelector":"","labelSelector":""}"#
        );
        assert_eq!(
            json("GET", "/api/v1/watch"),
            r#"{"isResourceRequest":true,"path":"/api/v1/watch","verb":"get","apiPrefix":"api","apiGroup":"","apiVersion":"v1","namespace":"","resource":"","subresource":"","name":"","parts":[],"fieldSelector":"","labelSelector":"","error":"unable to determine kind and namespace from url, /api/v1/watch"}"#
        );
    }

    #[test]
    fn common_requests_borrow() {
        let targets = [
            (
                "GET",
                "/api/v1/namespaces/ns/pods?watch=1&fieldSelector=metadata.name=p&labelSelector=a=b&limit=5",
            ),
            ("DELETE", "/apis/apps/v1/namespaces/ns/deployments?labelSelector=x"),
            ("PATCH", "/api/v1/nodes/n/status"),
            ("GET", "/healthz"),
            ("PROPFIND", "/api/v1/pods"),
            ("custom", "/metrics"),
        ];
        for (method, target) in targets {
            with_info(method, target, |info| {
                let borrowed = |c: &Cow<'_, str>| matches!(c, Cow::Borrowed(_));
                assert!(borrowed(&info.verb) && borrowed(&info.name), "{method} {target}");
                assert!(
                    borrowed(&info.field_selector) && borrowed(&info.label_selector),
                    "{method} {target}"
                );
            });
        }
        with_info("GET", "/api/v1/pods?fieldSelector=metadata.name=p", |info| assert_eq!(info.name, "p"));
    }

    #[test]
    fn helper_edge_cases() {
        assert!(equal_fold_false(b"FaLsE"));
        assert!(equal_fold_false("fal\u{17F}e".as_bytes()));
        assert!(!equal_fold_false(b"fals"));
        assert!(!equal_fold_false(b"falsee"));
        assert!(!equal_fold_false(b""));
        assert!(!lowercases_to_false("fal\u{17F}e".as_bytes()));
        assert!(is_go_int64(b"-0") && is_go_int64(b"+12") && is_go_int64(b"007"));
        for bad in [&b""[..], b"+", b"-", b" 1", b"0x1", b"1 "] {
            assert!(!is_go_int64(bad), "{bad:?}");
        }
        assert!(is_valid_path_segment_name("a.b") && is_valid_path_segment_name(""));
        for bad in [".", "..", "a/b", "%", "a%20"] {
            assert!(!is_valid_path_segment_name(bad), "{bad}");
        }
        assert_eq!(Segments("a//b").iter().collect::<Vec<_>>(), ["a", "", "b"]);
        assert_eq!(Segments("").iter().count(), 0);
        assert!(Segments("a/b").has(2) && !Segments("a/b").has(3) && Segments("").has(0));
        assert_eq!(Segments("a/b/c").skip(2).0, "c");
        assert_eq!(Segments("a/b/c").skip(5).0, "");
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop {
    use std::borrow::Cow;

    use proptest::prelude::*;

    use super::{
        RequestInfo, check_field_value, decode_path, field_selector_exact_name, is_valid_label_selector,
        is_valid_path_segment_name, split_target, verb_for_method,
    };

    /// What the path alone decides, owned so a reference model can produce it.
    #[derive(Debug, Default, PartialEq)]
    struct Shape {
        resource_request: bool,
        group: String,
        version: String,
        namespace: String,
        resource: String,
        subresource: String,
        name: String,
        parts: Vec<String>,
        error: bool,
    }

    impl Shape {
        fn of(info: &RequestInfo<'_>) -> Self {
            Shape {
                resource_request: info.is_resource_request,
                group: info.api_group.into(),
                version: info.api_version.into(),
                namespace: info.namespace.into(),
                resource: info.resource.into(),
                subresource: info.subresource.into(),
                name: info.name.to_string(),
                parts: info.parts().map(str::to_owned).collect(),
                error: info.error.is_some(),
            }
        }
    }

    /// Go's structural parse, written naively over an owned segment list, to check the zero-copy
    /// walk against.
    fn reference(method: &str, path: &str) -> Shape {
        let trimmed = path.trim_matches('/');
        let mut parts: Vec<&str> = if trimmed.is_empty() { vec![] } else { trimmed.split('/').collect() };
        if parts.len() < 3 || !(parts[0] == "api" || parts[0] == "apis") {
            return Shape::default();
        }
        let prefix = parts.remove(0);
        let mut shape = Shape { resource_request: true, ..Shape::default() };
        if prefix == "apis" {
            if parts.len() < 3 {
                return Shape::default();
            }
            shape.group = parts.remove(0).into();
        }
        shape.version = parts.remove(0).into();
        let mut verb = verb_for_method(method);
        if parts[0] == "watch" || parts[0] == "proxy" {
            if parts.len() < 2 {
                return Shape { error: true, ..shape };
            }
            verb = if parts[0] == "watch" { "watch" } else { "proxy" };
            parts.remove(0);
        }
        if parts[0] == "namespaces" && parts.len() > 1 {
            shape.namespace = parts[1].into();
            if parts.len() > 2 && parts[2] != "status" && parts[2] != "finalize" {
                parts.drain(..2);
            }
        }
        let part = |i: usize| parts.get(i).copied().unwrap_or("").to_owned();
        shape.resource = part(0);
        shape.name = part(1);
        shape.subresource = if verb == "proxy" { String::new() } else { part(2) };
        shape.parts = parts.iter().map(|p| p.to_string()).collect();
        shape
    }

    const KNOWN_VERBS: &[&str] =
        &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "proxy", ""];

    fn method() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "get", "ÄÖ"
            ])
            .prop_map(str::to_owned),
            "\\PC{0,8}",
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        let segment = prop::sample::select(vec![
            "api",
            "apis",
            "v1",
            "apps",
            "namespaces",
            "ns",
            "pods",
            "p",
            "watch",
            "proxy",
            "status",
            "finalize",
            "",
            "%2F",
            "a%2Fb",
            "%zz",
            "+",
            "é",
        ]);
        prop_oneof![
            prop::collection::vec(segment, 0..8).prop_map(|s| format!("/{}", s.join("/"))),
            "[/a-z0-9%.+]{0,30}",
            "\\PC{0,40}",
        ]
    }

    fn query() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "watch",
            "fieldSelector",
            "labelSelector",
            "limit",
            "timeoutSeconds",
            "wat%63h",
            "x",
            "",
            ";",
        ]);
        let value = prop_oneof![
            prop::sample::select(vec![
                "",
                "0",
                "1",
                "false",
                "TRUE",
                "metadata.name=foo",
                "metadata.name%3Dfoo",
                "a%3Db",
                "a\\,b",
                "!!",
                "a+in+(b,c)",
                "%zz",
                "%FF",
                "10",
                "-1",
                "x,metadata.name==y",
            ])
            .prop_map(str::to_owned),
            "[a-z=!,()\\\\%+.<>0-9 ]{0,12}",
        ];
        prop_oneof![
            prop::collection::vec((key, value), 0..5).prop_map(|pairs| {
                pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
            }),
            "\\PC{0,40}",
            "[a-zA-Z=&;%+,\\\\!()<> ]{0,40}",
        ]
    }

    proptest! {
        #[test]
        fn parse_is_total_and_deterministic(method in method(), path in path(), query in query()) {
            let a = RequestInfo::parse(&method, &path, &query);
            let b = RequestInfo::parse(&method, &path, &query);
            prop_assert_eq!(&a, &b);
            prop_assert!(serde_json::to_string(&a).is_ok());
        }

        #[test]
        fn targets_never_panic(method in method(), target in "\\PC{0,60}") {
            let (raw, query) = split_target(&target);
            if let Ok(path) = decode_path(raw) {
                let _ = RequestInfo::parse(&method, &path, query);
            }
        }

        #[test]
        fn invariants(method in method(), path in path(), query in query()) {
            let info = RequestInfo::parse(&method, &path, &query);
            let lower: String = method.chars().map(|c| c.to_lowercase().next().unwrap_or(c)).collect();
            let parts: Vec<&str> = info.parts().collect();
            if info.is_resource_request {
                prop_assert!(info.api_prefix == "api" || info.api_prefix == "apis");
                prop_assert!(info.api_prefix == "apis" || info.api_group.is_empty());
                if info.error.is_some() {
                    prop_assert_eq!(&*info.verb, lower.as_str());
                    prop_assert!(parts.is_empty() && info.resource.is_empty());
                } else {
                    prop_assert!(KNOWN_VERBS.contains(&&*info.verb), "verb {:?}", info.verb);
                    prop_assert!(!parts.is_empty());
                    prop_assert!(path.trim_matches('/').ends_with(&parts.join("/")));
                    prop_assert_eq!(parts.first().copied(), Some(info.resource));
                }
            } else {
                prop_assert!(info.api_prefix.is_empty() || info.api_prefix == "apis");
                prop_assert_eq!(&*info.verb, lower.as_str());
                prop_assert!(info.api_group.is_empty() && info.api_version.is_empty() && info.resource.is_empty());
                prop_assert!(info.namespace.is_empty() && info.subresource.is_empty() && info.name.is_empty());
                prop_assert!(parts.is_empty() && info.error.is_none());
            }
            if info.verb == "proxy" {
                prop_assert!(info.subresource.is_empty());
            }
            if !info.field_selector.is_empty() || !info.label_selector.is_empty() {
                prop_assert!(matches!(&*info.verb, "list" | "watch" | "deletecollection"));
            }
            if parts.get(1).copied().unwrap_or("") != &*info.name {
                prop_assert!(matches!(&*info.verb, "list" | "watch"));
                prop_assert!(is_valid_path_segment_name(&info.name));
            }
        }

        #[test]
        fn path_walk_matches_reference(method in method(), path in path()) {
            prop_assert_eq!(Shape::of(&RequestInfo::parse(&method, &path, "")), reference(&method, &path));
        }

        #[test]
        fn unescaped_inputs_borrow(
            method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "custom"]),
            path in "[/a-z0-9.]{0,30}",
            query in "[a-zA-Z=&.,!()0-9]{0,40}",
        ) {
            let info = RequestInfo::parse(method, &path, &query);
            let borrowed = |c: &Cow<'_, str>| matches!(c, Cow::Borrowed(_));
            prop_assert!(borrowed(&info.verb) && borrowed(&info.name));
            prop_assert!(borrowed(&info.field_selector) && borrowed(&info.label_selector));
        }

        #[test]
        fn decode_path_round_trips(s in "\\PC{0,40}") {
            let encoded: String = s.bytes().map(|b| format!("%{b:02X}")).collect();
            prop_assert_eq!(decode_path(&encoded).unwrap(), s.as_str());
            let plain = s.replace('%', "");
            prop_assert!(matches!(decode_path(&plain), Ok(Cow::Borrowed(p)) if p == plain));
        }

        #[test]
        fn selector_parsers_are_total(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
            let _ = is_valid_label_selector(&bytes);
            let _ = field_selector_exact_name(&bytes);
            let _ = check_field_value(&bytes);
        }

        #[test]
        fn selector_grammar_fragments(s in "[a-z0-9 ,=!()<>./\\\\-]{0,30}") {
            let _ = is_valid_label_selector(s.as_bytes());
            if let Ok(Some(r)) = field_selector_exact_name(s.as_bytes()) {
                prop_assert!(s.get(r).is_some());
            }
        }
    }
}
