//! Identity forwarded to the apiservers by front-proxy (requestheader) authentication, and the
//! downstream headers that could forge it.

use std::borrow::Cow;

pub const REMOTE_USER: &str = "x-remote-user";
pub const REMOTE_GROUP: &str = "x-remote-group";
pub const PEER_PROXIED: &str = "x-kubernetes-peer-proxied";

/// Headers an apiserver's requestheader authenticator reads (kube-apiserver's defaults, docs/upstream-facts.md, "Front-proxy authentication").
/// A client must never get to set them: Envoy's front-proxy certificate vouches for every request.
pub fn is_identity_header(name: &str) -> bool {
    let lower_prefix =
        |p: &str| name.as_bytes().get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p.as_bytes()));
    name.eq_ignore_ascii_case(REMOTE_USER)
        || name.eq_ignore_ascii_case(REMOTE_GROUP)
        || name.eq_ignore_ascii_case("x-remote-uid")
        || lower_prefix("x-remote-extra-")
}

/// kube-apiserver also takes a bearer token from a WebSocket subprotocol with this prefix.
pub const WEBSOCKET_BEARER: &str = "base64url.bearer.authorization.k8s.io.";

/// Whether a request header carries a token for kube-apiserver's token authenticators
/// (`name` lower-case, as Envoy hands headers to filters).
pub fn carries_token(name: &str, value: &[u8]) -> bool {
    match name {
        "authorization" => true,
        "sec-websocket-protocol" => {
            value.windows(WEBSOCKET_BEARER.len()).any(|w| w == WEBSOCKET_BEARER.as_bytes())
        }
        _ => false,
    }
}

/// The x509 authenticator's user extra, as a requestheader extra header: the key lower-case
/// and path-escaped, as the authenticator unescapes it.
pub const CREDENTIAL_ID_HEADER: &str = "x-remote-extra-authentication.kubernetes.io%2fcredential-id";

/// The credential id kube-apiserver's x509 authenticator records for a certificate, from the
/// lower-case hex SHA-256 of its DER (Envoy's `sha256_peer_certificate_digest`).
pub fn x509_credential_id(sha256_hex: &str) -> Option<String> {
    let valid = sha256_hex.len() == 64
        && sha256_hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    valid.then(|| format!("X509SHA256={sha256_hex}"))
}

/// The user a verified client certificate names, the way kube-apiserver's x509 authenticator
/// reads it: user = subject CN, groups = subject O values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity<'a> {
    pub user: Cow<'a, str>,
    pub groups: Vec<Cow<'a, str>>,
}

/// What a verified client certificate makes of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertIdentity<'a> {
    /// Forwarded as `X-Remote-User` / `X-Remote-Group`.
    User(Identity<'a>),
    /// No CN, or an empty one: kube-apiserver's x509 authenticator yields (it neither accepts nor
    /// rejects), so the request is whatever its other credentials make it, or anonymous.
    NoUser,
    /// Go would read an identity that cannot reach the apiserver unchanged through a header:
    /// the request is refused rather than forwarded as somebody else.
    Refused(Unforwardable),
}

/// Why a certificate's identity cannot be forwarded byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unforwardable {
    /// HTTP strips whitespace around header values: `" system:masters"` would arrive as
    /// `system:masters`.
    SurroundingWhitespace,
    /// Control characters cannot be sent in a header.
    ControlCharacter,
    /// The requestheader authenticator drops empty header values, so an empty O would vanish.
    EmptyGroup,
    /// The bytes are not UTF-8 (Go keeps them; a header through Envoy cannot).
    NotUtf8,
    /// A value Envoy rendered as hex-encoded DER (`#...`), not as the string Go reads.
    EncodedValue,
    /// A user UID attribute (OID 1.3.6.1.4.1.57683.2), which kube-apiserver reads where the
    /// `AllowParsingUserUIDFromCertAuth` gate is on and skewgate does not forward.
    UidAttribute,
    /// kube-apiserver would not read the certificate at all (or skewgate was not shown it).
    Certificate(crate::certificate::Refusal),
}

impl Unforwardable {
    /// Why, for the 401 `Status` ([`crate::status::unauthorized`]).
    pub fn reason(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Unforwardable::SurroundingWhitespace => {
                "its CN or an O begins or ends with whitespace, which HTTP headers cannot carry"
            }
            Unforwardable::ControlCharacter => "its CN or an O contains a control character",
            Unforwardable::EmptyGroup => "it has an empty O, which front-proxy authentication drops",
            Unforwardable::NotUtf8 => "its CN or an O is not valid UTF-8",
            Unforwardable::EncodedValue => "its CN or an O is not a string attribute",
            Unforwardable::UidAttribute => "it carries a user UID attribute (OID 1.3.6.1.4.1.57683.2)",
            Unforwardable::Certificate(why) => return Cow::Owned(why.to_string()),
        })
    }
}

/// The x509 authenticator's user UID attribute (kubernetes#127897), as Envoy renders its OID.
const UID_OID: &str = "1.3.6.1.4.1.57683.2";

/// The client certificate's subject from Envoy's `connection.subject_peer_certificate`, the
/// property the filter reads on every request it sees: absent without a verified certificate
/// (Envoy's listener refuses an unverified one), and for a certificate with an empty subject,
/// from which kube-apiserver's x509 authenticator takes no user either. Reading it costs the
/// filter one host call; Envoy's own `x-forwarded-client-cert` (`SANITIZE_SET`) would say the
/// same for free to the filter but cost every request of a certificate client 12.5k
/// instructions, bypassed ones included (callgrind, BENCHMARKS.md).
pub fn client_subject(peer_subject: Option<&str>) -> Option<&str> {
    peer_subject.filter(|s| !s.is_empty())
}

/// Reads Envoy's `connection.subject_peer_certificate` (RFC 2253: most specific RDN first,
/// `\`-escapes, bytes above 0x7f as `\XX`) as Go's `pkix.Name` reads the DER.
pub fn from_subject(subject: &str) -> CertIdentity<'_> {
    let mut user = None;
    let mut groups = Vec::new();
    for (kind, value) in attributes(subject) {
        let is_name = kind.eq_ignore_ascii_case("CN") || kind.eq_ignore_ascii_case("O");
        if kind == UID_OID {
            return CertIdentity::Refused(Unforwardable::UidAttribute);
        }
        // Attributes Go ignores (OU, C, ...) may be rendered any way.
        let value = match (value, is_name) {
            (Ok(value), _) => value,
            (Err(_), false) => continue,
            (Err(why), true) => return CertIdentity::Refused(why),
        };
        if kind.eq_ignore_ascii_case("CN") {
            // RFC 2253 reverses the DER order and Go keeps the last CN of the DER sequence.
            user.get_or_insert(value);
        } else if kind.eq_ignore_ascii_case("O") {
            groups.push(value);
        }
    }
    groups.reverse();
    let Some(user) = user.filter(|u| !u.is_empty()) else { return CertIdentity::NoUser };
    if let Some(why) = std::iter::once(&user).chain(&groups).find_map(|v| unforwardable(v)) {
        return CertIdentity::Refused(why);
    }
    CertIdentity::User(Identity { user, groups })
}

fn unforwardable(value: &str) -> Option<Unforwardable> {
    if value.is_empty() {
        Some(Unforwardable::EmptyGroup)
    } else if value.chars().any(char::is_control) {
        Some(Unforwardable::ControlCharacter)
    } else if value.starts_with(char::is_whitespace) || value.ends_with(char::is_whitespace) {
        Some(Unforwardable::SurroundingWhitespace)
    } else {
        None
    }
}

/// `TYPE=value` pairs, split on unescaped `,` and `+`, values unescaped.
fn attributes(subject: &str) -> impl Iterator<Item = (&str, Result<Cow<'_, str>, Unforwardable>)> {
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
                // An unescaped leading `#` is OpenSSL's hex dump of the DER value.
                if value.starts_with('#') {
                    return Some((kind, Err(Unforwardable::EncodedValue)));
                }
                return Some((kind, unescape(value)));
            }
        }
        None
    })
}

fn unescape(value: &str) -> Result<Cow<'_, str>, Unforwardable> {
    if !value.contains('\\') {
        return Ok(Cow::Borrowed(value));
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
    String::from_utf8(out).map(Cow::Owned).map_err(|_| Unforwardable::NotUtf8)
}

#[cfg(test)]
mod tests {

    use super::*;

    fn id(subject: &str) -> Option<(String, Vec<String>)> {
        match from_subject(subject) {
            CertIdentity::User(i) => {
                Some((i.user.into_owned(), i.groups.into_iter().map(Cow::into_owned).collect()))
            }
            _ => None,
        }
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
        assert_eq!(id("CN=two words,O=in side"), Some(("two words".into(), vec!["in side".into()])));
    }

    #[test]
    fn no_user_lets_other_credentials_decide() {
        assert_eq!(from_subject("O=devs"), CertIdentity::NoUser);
        assert_eq!(from_subject("CN=,O=devs"), CertIdentity::NoUser);
        assert_eq!(from_subject("garbage"), CertIdentity::NoUser);
        assert_eq!(from_subject(""), CertIdentity::NoUser);
    }

    #[test]
    fn only_a_subject_envoy_rendered_is_a_certificate() {
        assert_eq!(client_subject(Some("CN=alice")), Some("CN=alice"));
        assert_eq!(client_subject(Some("")), None);
        assert_eq!(client_subject(None), None);
    }

    #[test]
    fn values_a_header_would_change_are_refused() {
        use Unforwardable::*;
        let cases = [
            // F1: `O=" system:masters"` must not become group system:masters.
            ("CN=mallory,O=\\ system:masters", SurroundingWhitespace),
            ("CN=admin\\ ", SurroundingWhitespace),
            ("CN=\\ admin", SurroundingWhitespace),
            ("CN=x,O=tab\\09", ControlCharacter),
            ("CN=x,O=nbsp\\C2\\A0", SurroundingWhitespace),
            ("CN=x,O=t\\09b", ControlCharacter),
            ("CN=evil\\0Aname", ControlCharacter),
            ("CN=ok,O=bad\\0D", ControlCharacter),
            ("CN=ok,O=", EmptyGroup),
            ("CN=\\FF\\FE", NotUtf8),
            ("CN=#0c0161", EncodedValue),
            ("1.3.6.1.4.1.57683.2=#0c03616263,CN=alice", UidAttribute),
        ];
        for (subject, why) in cases {
            assert_eq!(from_subject(subject), CertIdentity::Refused(why), "{subject:?}");
            assert!(!why.reason().is_empty());
        }
        assert_eq!(id("CN=trailing\\"), Some(("trailing".into(), vec![])));
    }

    #[test]
    fn tokens_and_credential_ids() {
        assert!(carries_token("authorization", b"Bearer x"));
        assert!(carries_token(
            "sec-websocket-protocol",
            b"v4.channel.k8s.io, base64url.bearer.authorization.k8s.io.dG9r"
        ));
        assert!(!carries_token("sec-websocket-protocol", b"v4.channel.k8s.io"));
        assert!(!carries_token("x-authorization", b"Bearer x"));
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(x509_credential_id(&hex), Some(format!("X509SHA256={hex}")));
        assert_eq!(x509_credential_id(&hex.to_uppercase()), None);
        assert_eq!(x509_credential_id("abc"), None);
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

    /// A subject the way Envoy (BoringSSL, `XN_FLAG_RFC2253`) renders it, from the values Go's
    /// `pkix.Name` would read out of the DER: an oracle independent of the parser.
    fn render(cn: &str, groups: &[String]) -> String {
        fn escape(value: &str) -> String {
            let bytes = value.as_bytes();
            let mut out = String::new();
            for (i, &b) in bytes.iter().enumerate() {
                let edge_space = b == b' ' && (i == 0 || i + 1 == bytes.len());
                match b {
                    b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';' => {
                        out.push('\\');
                        out.push(char::from(b));
                    }
                    b'#' if i == 0 => out.push_str("\\#"),
                    _ if edge_space => out.push_str("\\ "),
                    0..=0x1f | 0x7f..=0xff => out.push_str(&format!("\\{b:02X}")),
                    _ => out.push(char::from(b)),
                }
            }
            out
        }
        // DER order: O values, then CN; RFC 2253 prints them backwards.
        let mut rdns: Vec<String> = groups.iter().map(|g| format!("O={}", escape(g))).collect();
        rdns.push(format!("CN={}", escape(cn)));
        rdns.reverse();
        rdns.join(",")
    }

    /// What an HTTP hop does to a header value: surrounding whitespace goes, control characters
    /// do not pass, and the requestheader authenticator skips empty values.
    fn through_header(value: &str) -> Option<&str> {
        let trimmed = value.trim_matches([' ', '\t']);
        (!trimmed.is_empty() && !trimmed.chars().any(char::is_control)).then_some(trimmed)
    }

    proptest! {
        #[test]
        fn the_apiserver_gets_exactly_gos_reading_or_nothing(
            cn in "[ a-z:#,+\\\\\t\n\u{e9}\u{7f}]{0,8}",
            groups in proptest::collection::vec("[ a-z:#,+\\\\\t\u{e9}]{0,6}", 0..4),
        ) {
            match from_subject(&render(&cn, &groups)) {
                CertIdentity::User(i) => {
                    prop_assert_eq!(&*i.user, cn.as_str());
                    prop_assert_eq!(through_header(&i.user), Some(cn.as_str()));
                    prop_assert_eq!(i.groups.len(), groups.len());
                    for (got, want) in i.groups.iter().zip(&groups) {
                        prop_assert_eq!(&**got, want.as_str());
                        prop_assert_eq!(through_header(got), Some(want.as_str()));
                    }
                }
                // Go yields no user for an empty CN: the request carries no certificate identity.
                CertIdentity::NoUser => prop_assert!(cn.is_empty()),
                CertIdentity::Refused(_) => prop_assert!(
                    through_header(&cn) != Some(cn.as_str())
                        || groups.iter().any(|g| through_header(g) != Some(g.as_str()))
                ),
            }
        }

        #[test]
        fn never_panics(subject in "([A-Za-z0-9.]{1,3}=[^,+]{0,10}[,+]?|\\\\.{0,3}){0,8}") {
            let _ = from_subject(&subject);
        }
    }
}
