//! The query: Go's `url.ParseQuery`, and the parts of `DecodeParameters` into `ListOptions`
//! that can fail or that the verb and the name depend on.

use std::borrow::Cow;
use std::ops::Range;

use super::escape::unescape;
use super::field_selector::field_selector_exact_name;
use super::label_selector::is_valid_label_selector;
use super::{Invalid, is_go_int64};

/// Go's `url.ParseQuery` gives up on a query with more parameters than this and the apiserver
/// then sees none (GODEBUG `urlmaxqueryparams`, a default in Go's recent security releases).
pub(super) const MAX_QUERY_PARAMS: usize = 10_000;

/// The first value of each query parameter that `DecodeParameters` into `ListOptions` can fail
/// on, or that the verb and selectors depend on. Other parameters cannot make decoding fail.
#[derive(Debug, Default)]
pub(super) struct ListParams<'a> {
    pub(super) watch: Option<Cow<'a, [u8]>>,
    pub(super) field_selector: Option<Cow<'a, [u8]>>,
    pub(super) label_selector: Option<Cow<'a, [u8]>>,
    limit: Option<Cow<'a, [u8]>>,
    timeout_seconds: Option<Cow<'a, [u8]>>,
}

/// What a successful `DecodeParameters` yields that matters here.
pub(super) struct Decoded {
    pub(super) watch: bool,
    /// The raw (still escaped) value of the `metadata.name` term, within the field selector.
    pub(super) name: Option<Range<usize>>,
}

impl<'a> ListParams<'a> {
    /// Go's `url.ParseQuery`, keeping the first value of the parameters of interest.
    pub(super) fn from_query(query: &'a str) -> Self {
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
    pub(super) fn decode(&self) -> Result<Decoded, Invalid> {
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

/// Whether the query has a `sendInitialEvents` parameter, whatever its value: kube-apiserver
/// decodes any into a set `*bool`, and a watch with it set is a streaming list
/// (`validateWatchOptions`), refused without the `WatchList` feature even for `false`.
pub fn has_send_initial_events(query: &str) -> bool {
    if query.bytes().filter(|&b| b == b'&').count() >= MAX_QUERY_PARAMS {
        return false;
    }
    query.split('&').any(|pair| {
        let raw_key = pair.split_once('=').map_or(pair, |(k, _)| k);
        !pair.contains(';')
            && unescape(raw_key, true).is_ok_and(|key| &*key == b"sendInitialEvents")
            && pair.split_once('=').is_none_or(|(_, v)| unescape(v, true).is_ok())
    })
}

/// `runtime.Convert_Slice_string_To_bool`: "0" and, by Unicode case folding, "false".
fn converts_to_false(v: &[u8]) -> bool {
    v == b"0" || equal_fold_false(v)
}

/// The fallback after a decode error lowercases instead of case-folding, so "falſe" (long s)
/// is false on the normal path but a watch on the fallback one.
pub(super) fn lowercases_to_false(v: &[u8]) -> bool {
    v == b"0" || v.eq_ignore_ascii_case(b"false")
}

/// Go's `strings.EqualFold(v, "false")`. Besides ASCII case, simple folding equates 's' with
/// U+017F LATIN SMALL LETTER LONG S; no other rune folds to a letter of "false".
pub(super) fn equal_fold_false(v: &[u8]) -> bool {
    let Some((head, rest)) = v.split_at_checked(3) else {
        return false;
    };
    let rest = rest
        .strip_prefix("\u{17F}".as_bytes())
        .or_else(|| rest.strip_prefix(b"s"))
        .or_else(|| rest.strip_prefix(b"S"));
    head.eq_ignore_ascii_case(b"fal") && rest.is_some_and(|e| e.eq_ignore_ascii_case(b"e"))
}
