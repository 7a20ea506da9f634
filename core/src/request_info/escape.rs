//! Percent-decoding as Go's `net/url` does it, for the path and for query parameters.

use std::borrow::Cow;

use super::InvalidEscape;

/// Percent-decoding as Go's `unescape`, in path mode or, with `plus_is_space`, query mode.
pub(super) fn unescape(raw: &str, plus_is_space: bool) -> Result<Cow<'_, [u8]>, InvalidEscape> {
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
pub(super) fn into_str(bytes: Cow<'_, [u8]>) -> Cow<'_, str> {
    match bytes {
        Cow::Borrowed(b) => String::from_utf8_lossy(b),
        Cow::Owned(v) => Cow::Owned(
            String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ),
    }
}
