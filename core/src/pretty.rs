//! kube-apiserver's pretty JSON: what it writes for `?pretty=true`, and for clients whose
//! `User-Agent` starts with `curl`, `Wget` or `Mozilla/5.0` (negotiation's `isPrettyPrint`):
//! Go's `json.MarshalIndent(obj, "", "  ")`, which is its compact form indented, with no newline at
//! the end.

/// Whether a request from this `User-Agent` gets pretty JSON, unless its query says otherwise:
/// read by the filter and the module as the header goes by, without keeping it.
pub fn agent_wants(user_agent: &[u8]) -> bool {
    [&b"curl"[..], b"Wget", b"Mozilla/5.0"].iter().any(|p| user_agent.starts_with(p))
}

/// Whether kube-apiserver answers this request in pretty JSON: `pretty` in the query, when
/// given a value, decides (Go's `strconv.ParseBool`; anything else is false); otherwise the
/// user agent ([`agent_wants`]).
pub fn wanted(query: &str, agent_wants: bool) -> bool {
    if query.contains("pretty") {
        let value = query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decoded(key) == "pretty").then(|| decoded(value))
        });
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            return matches!(value.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True");
        }
    }
    agent_wants
}

/// A query key or value as Go's `url.ParseQuery` reads it (`+` is a space).
fn decoded(part: &str) -> String {
    let spaced = part.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).decode_utf8_lossy().into_owned()
}

/// `json` (a JSON document, compact or not) as Go's `json.Indent(dst, src, "", "  ")` writes it:
/// a newline and two spaces a level after each `{`, `[` and `,`, `": "` between key and value,
/// empty objects and arrays left as `{}` and `[]`, strings as they are. Whitespace outside
/// strings is dropped, the final newline of an encoder's output with it.
pub fn indent(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + json.len() / 2);
    let (mut depth, mut opened, mut in_string, mut escaped) = (0usize, false, false, false);
    let newline = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.extend(std::iter::repeat_n(b' ', 2 * depth));
    };
    for &c in json {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        if opened && c != b'}' && c != b']' {
            opened = false;
            depth += 1;
            newline(&mut out, depth);
        }
        match c {
            b'"' => {
                in_string = true;
                out.push(c);
            }
            b'{' | b'[' => {
                opened = true;
                out.push(c);
            }
            b',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            b':' => out.extend_from_slice(b": "),
            b'}' | b']' => {
                if opened {
                    opened = false;
                } else {
                    depth = depth.saturating_sub(1);
                    newline(&mut out, depth);
                }
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indents_as_go_does() {
        let compact = br#"{"kind":"APIGroupList","groups":[{"name":"apps","versions":[],"x":{}},{"name":"a\"b,:{}"}],"n":1}
"#;
        let want = "{\n  \"kind\": \"APIGroupList\",\n  \"groups\": [\n    {\n      \"name\": \"apps\",\n      \"versions\": [],\n      \"x\": {}\n    },\n    {\n      \"name\": \"a\\\"b,:{}\"\n    }\n  ],\n  \"n\": 1\n}";
        assert_eq!(String::from_utf8(indent(compact)).unwrap(), want);
        assert_eq!(indent(&indent(compact)), indent(compact), "indenting pretty JSON changes nothing");
        assert_eq!(indent(b"[]\n"), b"[]");
    }

    /// What a real kube-apiserver v1.36.2 wrote for the same documents, for kubectl and for curl.
    #[test]
    fn indents_as_a_real_kube_apiserver_does() {
        let documents: [(&[u8], &[u8]); 3] = [
            (
                include_bytes!("../../testdata/real-apiserver/pretty/api.json"),
                include_bytes!("../../testdata/real-apiserver/pretty/api.pretty.json"),
            ),
            (
                include_bytes!("../../testdata/real-apiserver/pretty/apis_apps_v1.json"),
                include_bytes!("../../testdata/real-apiserver/pretty/apis_apps_v1.pretty.json"),
            ),
            (
                include_bytes!("../../testdata/real-apiserver/pretty/apis_v2.json"),
                include_bytes!("../../testdata/real-apiserver/pretty/apis_v2.pretty.json"),
            ),
        ];
        for (compact, pretty) in documents {
            assert_ne!(compact, pretty);
            assert_eq!(String::from_utf8_lossy(&indent(compact)), String::from_utf8_lossy(pretty));
        }
    }

    #[test]
    fn wanted_as_kube_apiserver_decides() {
        assert!(agent_wants(b"curl/8.5.0") && agent_wants(b"Wget/1.21") && agent_wants(b"Mozilla/5.0 (X11)"));
        assert!(
            !agent_wants(b"kubectl/v1.36.2 (linux/amd64) kubernetes/abc") && !agent_wants(b"Mozilla/4.0")
        );
        let wanted = |query: &str, agent: Option<&str>| {
            wanted(query, agent.is_some_and(|a| agent_wants(a.as_bytes())))
        };
        assert!(wanted("", Some("curl/8.5.0")));
        assert!(!wanted("", None));
        assert!(wanted("pretty=true", None));
        assert!(wanted("a=b&pretty=1", Some("kubectl")));
        assert!(!wanted("pretty=false", Some("curl/8.5.0")), "the query decides");
        assert!(!wanted("pretty=yes", Some("curl/8.5.0")), "not a Go bool: false");
        assert!(wanted("pretty=", Some("curl/8.5.0")), "empty: the user agent decides");
        assert!(wanted("pretty", Some("curl/8.5.0")));
        // Go looks for "pretty" in the raw query first: an escaped key is not seen.
        assert!(!wanted("%70retty=true", None));
        assert!(wanted("pretty=%74rue", None));
        assert!(!wanted("prettyish=true", None));
    }
}
