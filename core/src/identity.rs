//! Identity forwarded to the apiservers by front-proxy (requestheader) authentication, and the
//! downstream headers that could forge it.

use std::borrow::Cow;

pub const REMOTE_USER: &str = "x-remote-user";
pub const REMOTE_GROUP: &str = "x-remote-group";
pub const PEER_PROXIED: &str = "x-kubernetes-peer-proxied";

/// Headers an apiserver's requestheader authenticator reads (kube-apiserver's defaults, spec §7).
/// A client must never get to set them: Envoy's front-proxy certificate vouches for every request.
pub fn is_identity_header(name: &str) -> bool {
    let lower_prefix =
        |p: &str| name.as_bytes().get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p.as_bytes()));
    name.eq_ignore_ascii_case(REMOTE_USER)
        || name.eq_ignore_ascii_case(REMOTE_GROUP)
        || name.eq_ignore_ascii_case("x-remote-uid")
        || lower_prefix("x-remote-extra-")
}

/// The user a verified client certificate names, the way kube-apiserver's x509 authenticator
/// reads it: user = subject CN, groups = subject O values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity<'a> {
    pub user: Cow<'a, str>,
    pub groups: Vec<Cow<'a, str>>,
}

/// Parses Envoy's `connection.subject_peer_certificate` (RFC 2253: most specific RDN first,
/// `\`-escapes). `None` when there is no usable user: no CN, an empty CN (the x509 authenticator
/// refuses those too), or a value that cannot travel in an HTTP header.
pub fn from_subject(subject: &str) -> Option<Identity<'_>> {
    let mut user = None;
    let mut groups = Vec::new();
    for (kind, value) in attributes(subject) {
        if kind.eq_ignore_ascii_case("CN") {
            // RFC 2253 reverses the DER order and Go keeps the last CN of the DER sequence.
            user.get_or_insert(value);
        } else if kind.eq_ignore_ascii_case("O") {
            groups.push(value);
        }
    }
    groups.reverse();
    let user = user?;
    if user.is_empty() || !header_safe(&user) || !groups.iter().all(|g| header_safe(g)) {
        return None;
    }
    Some(Identity { user, groups })
}

fn header_safe(value: &str) -> bool {
    !value.chars().any(|c| c.is_control())
}

/// `TYPE=value` pairs, split on unescaped `,` and `+`, values unescaped.
fn attributes(subject: &str) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
    let bytes = subject.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        while start < bytes.len() {
            let mut i = start;
            while let Some(&b) = bytes.get(i) {
                match b {
                    b'\\' => i += 2,
                    b',' | b'+' => break,
                    _ => i += 1,
                }
            }
            let end = i.min(bytes.len());
            let rdn = subject.get(start..end).unwrap_or("");
            start = end + 1;
            if let Some((kind, value)) = rdn.split_once('=') {
                return Some((kind.trim(), unescape(value.trim_start())));
            }
        }
        None
    })
}

fn unescape(value: &str) -> Cow<'_, str> {
    if !value.contains('\\') {
        return Cow::Borrowed(value);
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (hex, bytes.get(i + 1)) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, Some(&next)) => {
                out.push(next);
                i += 2;
            }
            (None, None) => i += 1,
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn id(subject: &str) -> Option<(String, Vec<String>)> {
        from_subject(subject)
            .map(|i| (i.user.into_owned(), i.groups.into_iter().map(Cow::into_owned).collect()))
    }

    #[test]
    fn envoy_subjects() {
        assert_eq!(id("CN=alice,O=devs"), Some(("alice".into(), vec!["devs".into()])));
        // RFC 2253 lists the DER sequence backwards; groups come back in DER order.
        assert_eq!(id("CN=bob,O=ops,O=devs"), Some(("bob".into(), vec!["devs".into(), "ops".into()])));
        assert_eq!(id("O=system:masters,CN=admin"), Some(("admin".into(), vec!["system:masters".into()])));
        assert_eq!(id("CN=svc\\, inc.,O=a\\+b"), Some(("svc, inc.".into(), vec!["a+b".into()])));
        assert_eq!(id("CN=caf\\C3\\A9"), Some(("café".into(), vec![])));
        assert_eq!(id("CN=first+O=multi,CN=second"), Some(("first".into(), vec!["multi".into()])));
        assert_eq!(id("serialNumber=1,CN=x,OU=unit,O=g"), Some(("x".into(), vec!["g".into()])));
    }

    #[test]
    fn no_identity() {
        assert_eq!(id(""), None);
        assert_eq!(id("O=devs"), None);
        assert_eq!(id("CN=,O=devs"), None);
        assert_eq!(id("CN=evil\\0Aname"), None);
        assert_eq!(id("CN=ok,O=bad\\0D"), None);
        assert_eq!(id("garbage"), None);
        assert_eq!(id("CN=trailing\\"), Some(("trailing".into(), vec![])));
    }

    #[test]
    fn identity_headers() {
        for h in [
            "x-remote-user",
            "X-Remote-User",
            "x-remote-group",
            "X-REMOTE-UID",
            "x-remote-extra-scopes",
            "X-Remote-Extra-",
        ] {
            assert!(is_identity_header(h), "{h}");
        }
        for h in
            ["x-remote", "x-remote-users", "x-remote-extra", "authorization", "x-kubernetes-peer-proxied", ""]
        {
            assert!(!is_identity_header(h), "{h}");
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_panics_and_never_yields_unsafe_values(subject in "([A-Za-z]{1,3}=[^,+]{0,10}[,+]?|\\\\.{0,3}){0,8}") {
            if let Some(i) = from_subject(&subject) {
                prop_assert!(!i.user.is_empty());
                prop_assert!(header_safe(&i.user));
                prop_assert!(i.groups.iter().all(|g| header_safe(g)));
            }
        }

        #[test]
        fn header_check_never_panics(name in ".{0,40}") {
            let _ = is_identity_header(&name);
        }
    }
}
