//! Field selectors: Go's `fields.ParseSelector`, reduced to what routing reads (is it valid,
//! and the `metadata.name` it requires, if any).

use std::borrow::Cow;
use std::ops::Range;

use super::Invalid;
use super::escape::into_str;

/// `fields.ParseSelector(s).RequiresExactMatch("metadata.name")`: `Ok(None)` when the selector
/// is valid but names nothing, `Err` when it does not parse. The range is the raw value.
pub(super) fn field_selector_exact_name(selector: &[u8]) -> Result<Option<Range<usize>>, Invalid> {
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
pub(super) fn check_field_value(raw: &[u8]) -> Result<(), Invalid> {
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
pub(super) fn unescape_field_value(raw: &[u8]) -> Cow<'_, [u8]> {
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
pub(super) fn field_value<'a>(selector: &Cow<'a, [u8]>, raw: Range<usize>) -> Cow<'a, str> {
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
