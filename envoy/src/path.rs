//! What Envoy 1.40 does to a request target before any filter sees it, with the settings of the
//! shipped bootstrap (`envoy-config/bootstrap.yaml`): `normalize_path: true`,
//! `merge_slashes: false`, `path_with_escaped_slashes_action: KEEP_UNCHANGED`.
//!
//! The filter never needs this: it reads the `:path` Envoy has already normalised. `skewgate
//! explain` takes the path a client sends, so it must first turn it into the one the filter and
//! the apiserver will read, or it explains a request nobody receives.
//!
//! Envoy's `normalize_path` is Chromium's URL path canonicalisation (`PathUtil::canonicalPath`
//! → `url::CanonicalizePath`), in the flavour Envoy 1.40 ships, which still decodes percent-encoded
//! unreserved characters. Each rule below was checked against the real Envoy 1.40
//! (`e2e/tests/envoy_filter.rs`, `explain_predicts_what_envoy_does_with_odd_paths`):
//! - dot segments (`.`, `..`, also spelled `%2e`/`%2E`, ended by `/`, `\` or the end of the path)
//!   are resolved; `..` never climbs above the first `/`; a dot that is not a whole segment
//!   stays, `%2e` decoded to `.`;
//! - `\` is a `/`;
//! - `%XX` of an unreserved character (`A-Z a-z 0-9 - . _ ~`) is decoded; every other valid
//!   escape (`%2F` included) is kept exactly, hex case included; a `%` that starts no valid escape
//!   is kept, and `%25` is put where decoding would otherwise create a new escape (`%%30%30` →
//!   `%2500`);
//! - `"`, `<`, `>`, `` ` ``, `{`, `|`, `}`, `^` are percent-encoded;
//! - the query (after the first `?`) is left alone; slashes are not merged.
//!
//! Envoy refuses some targets before the filter runs: see [`Refusal`].

/// Envoy's answer to a target it does not forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    /// Envoy's `%RESPONSE_CODE_DETAILS%` for it.
    pub details: &'static str,
    pub why: &'static str,
}

/// The target as Envoy forwards it (to the filter, then upstream), or why it answers itself.
pub fn normalize(target: &str) -> Result<String, Refusal> {
    let bytes = target.as_bytes();
    if bytes.iter().any(|&b| b <= b' ' || b >= 0x7f) {
        return Err(Refusal {
            status: 400,
            details: "http1.codec_error",
            why: "the request line has a space, a control character or a non-ASCII byte",
        });
    }
    if bytes.first() != Some(&b'/') {
        return Err(Refusal {
            status: 404,
            details: "absolute_path_rejected",
            why: "the path does not start with '/'",
        });
    }
    if bytes.contains(&b'#') {
        return Err(Refusal {
            status: 400,
            details: "path_normalization_failed",
            why: "the target has a fragment ('#')",
        });
    }
    let (path, query) = match target.find('?') {
        Some(at) => target.split_at(at),
        None => (target, ""),
    };
    let mut out = canonical_path(path.as_bytes()).ok_or(Refusal {
        status: 400,
        details: "path_normalization_failed",
        why: "the path has an escaped NUL (%00)",
    })?;
    out.extend_from_slice(query.as_bytes());
    // Only ASCII goes in and every byte that comes out is ASCII: the conversion cannot fail.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// How a path byte is treated, written out or percent-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Copied as is, and kept escaped when it arrives escaped.
    Keep,
    /// Copied as is, decoded when it arrives escaped.
    Unreserved,
    /// Percent-encoded.
    Encode,
    /// Fails normalisation (NUL).
    Invalid,
}

fn class(b: u8) -> Class {
    match b {
        0 => Class::Invalid,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => Class::Unreserved,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'.' | b'/' | b':' | b';' | b'='
        | b'@' | b'[' | b']' => Class::Keep,
        _ => Class::Encode,
    }
}

/// Length of a dot at the start of `rest`: `.` or `%2e`/`%2E`.
fn dot_len(rest: &[u8]) -> usize {
    match rest {
        [b'.', ..] => 1,
        [b'%', b'2', b'e' | b'E', ..] => 3,
        _ => 0,
    }
}

fn is_slash(b: u8) -> bool {
    b == b'/' || b == b'\\'
}

/// What a dot segment does, and how many bytes after the first dot it takes up.
enum Dots {
    /// Not a dot segment: the dot is a plain character.
    Name,
    /// `.`: the current directory.
    Current(usize),
    /// `..`: one directory up.
    Up(usize),
}

fn after_dot(rest: &[u8]) -> Dots {
    match rest.first() {
        None => return Dots::Current(0),
        Some(&b) if is_slash(b) => return Dots::Current(1),
        Some(_) => {}
    }
    let second = dot_len(rest);
    if second > 0 {
        match rest.get(second) {
            None => return Dots::Up(second),
            Some(&b) if is_slash(b) => return Dots::Up(second + 1),
            Some(_) => {}
        }
    }
    Dots::Name
}

/// `%XX` at the start of `rest`, decoded.
fn escaped(rest: &[u8]) -> Option<u8> {
    match rest {
        [b'%', hi, lo, ..] => Some(hex(*hi)? << 4 | hex(*lo)?),
        _ => None,
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Removes the last segment of `out`, which ends with '/'; never above the first '/'.
fn up_one(out: &mut Vec<u8>) {
    let Some(last) = out.len().checked_sub(1) else { return };
    if last == 0 {
        return;
    }
    let cut = out.get(..last).and_then(|head| head.iter().rposition(|&b| b == b'/')).unwrap_or(0);
    out.truncate(cut + 1);
}

/// The canonical form of a path (without query); `None` when Envoy refuses it.
fn canonical_path(path: &[u8]) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(path.len() + 1);
    if !path.first().is_some_and(|&b| is_slash(b)) {
        out.push(b'/');
    }
    // Where in `out` a '%' that starts no valid escape was written: decoding a later escape
    // right after it could complete a new one, which must not appear.
    let mut stray_percent: Option<usize> = None;
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        let rest = path.get(i..).unwrap_or_default();
        let dot = dot_len(rest);
        if dot > 0 {
            if out.last() == Some(&b'/') {
                match after_dot(rest.get(dot..).unwrap_or_default()) {
                    Dots::Name => {
                        out.push(b'.');
                        i += dot;
                    }
                    Dots::Current(taken) => i += dot + taken,
                    Dots::Up(taken) => {
                        up_one(&mut out);
                        i += dot + taken;
                    }
                }
            } else {
                out.push(b'.');
                i += dot;
            }
            continue;
        }
        match b {
            b'\\' => {
                out.push(b'/');
                i += 1;
            }
            b'%' => match escaped(rest) {
                Some(decoded) => match class(decoded) {
                    Class::Unreserved => {
                        out.push(decoded);
                        i += 3;
                        if let Some(at) = stray_percent {
                            if at + 3 >= out.len() {
                                no_new_escape(&mut out, at, path.get(i).copied());
                            }
                        }
                    }
                    Class::Invalid => return None,
                    Class::Keep | Class::Encode => {
                        out.extend_from_slice(rest.get(..3).unwrap_or_default());
                        i += 3;
                    }
                },
                None => {
                    stray_percent = Some(out.len());
                    out.push(b'%');
                    i += 1;
                }
            },
            _ => {
                match class(b) {
                    Class::Encode | Class::Invalid => out.extend_from_slice(format!("%{b:02X}").as_bytes()),
                    Class::Keep | Class::Unreserved => out.push(b),
                }
                i += 1;
            }
        }
    }
    Some(out)
}

/// `out` ends with the stray '%' at `at` and one or two characters, the last one just decoded.
/// When they (with the next input byte, if only one) would read as an escape, the '%' becomes
/// `%25` so that the output means what the input meant.
fn no_new_escape(out: &mut Vec<u8>, at: usize, next: Option<u8>) {
    let len = out.len();
    let Some(&decoded) = out.last() else { return };
    let short = at + 2 == len;
    if short {
        match next {
            Some(n) if n < 0x80 => out.push(n),
            _ => return,
        }
    }
    if escaped(out.get(at..).unwrap_or_default()).is_some() {
        if !short {
            if let Some(&c) = out.get(at + 1) {
                out.push(c);
            }
        }
        if let Some(slot) = out.get_mut(at + 1) {
            *slot = b'2';
        }
        if let Some(slot) = out.get_mut(at + 2) {
            *slot = b'5';
        }
        out.push(decoded);
    } else if short {
        out.truncate(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each pair was read off a real Envoy 1.40 with the shipped path settings (raw HTTP/1.1
    /// request line in, `%REQ(:PATH)%` of the access log out).
    const ENVOY_1_40: &[(&str, &str)] = &[
        (
            "/apis/../apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        ),
        (
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/..",
            "/apis/resource.k8s.io/v1/namespaces/default/",
        ),
        (
            "/apis/resource.k8s.io/v1/namespaces/x/%2e%2e/resourceclaims",
            "/apis/resource.k8s.io/v1/namespaces/resourceclaims",
        ),
        ("/a/%2e%2E/b", "/b"),
        ("/a/%2e./b", "/b"),
        ("/a/.%2E/b", "/b"),
        ("/a%2eb/c", "/a.b/c"),
        ("/a/%41%7e%2f%2F%5c/b", "/a/A~%2f%2F%5c/b"),
        ("/a\\b/..\\c", "/a/c"),
        ("/a/\"<>`{|}^/x", "/a/%22%3C%3E%60%7B%7C%7D%5E/x"),
        ("/a/%zz/%4/%", "/a/%zz/%4/%"),
        ("/a/%%30%30", "/a/%2500"),
        ("/a/%%41", "/a/%A"),
        ("/a/%4%31", "/a/%2541"),
        ("/a/%%%31%32", "/a/%%2512"),
        ("/..", "/"),
        ("/../..", "/"),
        ("/.", "/"),
        ("/a/./b/.", "/a/b/"),
        ("/a/b/%2e", "/a/b/"),
        ("/a//../b", "/a/b"),
        ("//a/../b", "//b"),
        ("/a/...", "/a/..."),
        ("/a/.../b", "/a/.../b"),
        ("/a/b/..%2f/c", "/a/b/..%2f/c"),
        ("/a/%01/b", "/a/%01/b"),
        ("/a/%7F%7f", "/a/%7F%7f"),
        ("/a/%20%3f%3F%25%23", "/a/%20%3f%3F%25%23"),
        ("/a/%2d%5f%2E%61%5A%30", "/a/-_.aZ0"),
        ("/a/%e2%82%AC", "/a/%e2%82%AC"),
        ("/a/%2e%2e%2fb", "/a/..%2fb"),
        ("/a/b/%2e%2e", "/a/"),
        ("/a/b/.%2e%2f", "/a/b/..%2f"),
        ("/a/%5C..%5c", "/a/%5C..%5c"),
        ("/a/b/.\\", "/a/b/"),
        ("/a/b/..\\", "/a/"),
        ("/%2e%2e/a", "/a"),
        ("/a/%3", "/a/%3"),
        ("/a/%%", "/a/%%"),
        ("/a/%g1", "/a/%g1"),
        ("/a/b/../c?x=/../y&z=%2e%2e", "/a/c?x=/../y&z=%2e%2e"),
    ];

    #[test]
    fn paths_come_out_as_envoy_forwards_them() {
        for (sent, forwarded) in ENVOY_1_40 {
            assert_eq!(normalize(sent).as_deref(), Ok(*forwarded), "{sent}");
        }
    }

    #[test]
    fn targets_envoy_refuses() {
        for (sent, status, details) in [
            ("/a/%00/b", 400, "path_normalization_failed"),
            ("/a/b#frag", 400, "path_normalization_failed"),
            ("/a/b?x=../y#z", 400, "path_normalization_failed"),
            ("/a/b c", 400, "http1.codec_error"),
            ("/a/\tb", 400, "http1.codec_error"),
            ("/a/\u{e9}", 400, "http1.codec_error"),
            ("/a/\u{7f}", 400, "http1.codec_error"),
            ("apis/v1", 404, "absolute_path_rejected"),
        ] {
            let refusal = normalize(sent).expect_err(sent);
            assert_eq!((refusal.status, refusal.details), (status, details), "{sent:?}");
        }
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        for (_, forwarded) in ENVOY_1_40 {
            assert_eq!(normalize(forwarded).as_deref(), Ok(*forwarded), "{forwarded}");
        }
    }
}
