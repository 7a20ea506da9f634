//! Content negotiation for `GET /apis`: does the client want aggregated discovery v2 in JSON,
//! with or without peers? Mirrors kube-apiserver's discovery negotiation (docs/upstream-facts.md, "Peer-aggregated discovery") for the media
//! types skewgate can answer itself; everything else goes to an apiserver.

/// What the filter does with a `GET /apis`, by its Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryAccept {
    /// Aggregated discovery v2 as JSON: the filter answers with the peer-aggregated document.
    MergedV2,
    /// The same with `profile=nopeer`: one apiserver's own document.
    NoPeerV2,
    /// The legacy (unaggregated) document as JSON: plain `application/json`, `application/*`,
    /// `*/*`, or no Accept at all. Composed at the edge where the apiservers' documents differ.
    LegacyJson,
    /// The legacy document in protobuf or YAML only. skewgate composes JSON only: where it
    /// composes, such a request gets 406 Not Acceptable (after an apiserver authorized it), the
    /// answer an apiserver gives for a type it cannot produce.
    LegacyOther,
    /// v2beta1, or nothing acceptable: an apiserver decides.
    Local,
}

const DISCOVERY_GROUP: &str = "apidiscovery.k8s.io";
const DISCOVERY_KIND: &str = "APIGroupDiscoveryList";

/// Media ranges are taken by quality (stable for equal q, so the client's order breaks ties);
/// the first one skewgate can honour decides. Protobuf aggregated discovery cannot be produced
/// from the merged JSON, so such a range is passed over for the client's next choice, as any
/// server does with a type it lacks.
pub fn negotiate_discovery(accept: Option<&str>) -> DiscoveryAccept {
    negotiate(accept, false)
}

/// [`negotiate_discovery`] for the paths that only have the legacy form (`/api/<v>`,
/// `/apis/<g>`, `/apis/<g>/<v>`): aggregated media ranges are passed over, as the apiserver
/// has nothing to answer them with there.
pub fn negotiate_legacy(accept: Option<&str>) -> DiscoveryAccept {
    negotiate(accept, true)
}

fn negotiate(accept: Option<&str>, legacy_only: bool) -> DiscoveryAccept {
    // Go's negotiation takes a missing or empty Accept as anything: the default, JSON.
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else { return DiscoveryAccept::LegacyJson };
    // A header longer than this is not from a Kubernetes client; let an apiserver answer it.
    const MAX_RANGES: usize = 32;
    let mut ranges: [(u16, usize, Option<DiscoveryAccept>); MAX_RANGES] = [(0, 0, None); MAX_RANGES];
    let mut n = 0;
    for (i, range) in split_unquoted(accept, b',').enumerate() {
        let Some(slot) = ranges.get_mut(n) else { return DiscoveryAccept::Local };
        let (q, mut choice) = classify(range);
        if legacy_only {
            choice =
                choice.filter(|c| matches!(c, DiscoveryAccept::LegacyJson | DiscoveryAccept::LegacyOther));
        }
        if q > 0 {
            *slot = (q, i, choice);
            n += 1;
        }
    }
    let ranges = ranges.get_mut(..n).unwrap_or_default();
    ranges.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranges.iter().find_map(|r| r.2).unwrap_or(DiscoveryAccept::Local)
}

/// Quality in thousandths, and what this single media range asks for (`None`: nothing skewgate
/// or an apiserver's discovery endpoint would serve for it, try the next range).
fn classify(range: &str) -> (u16, Option<DiscoveryAccept>) {
    let mut parts = split_unquoted(range, b';');
    let media = parts.next().unwrap_or("").trim();
    let (mut q, mut g, mut v, mut kind, mut profile) = (1000, None, None, None, None);
    for param in parts {
        let Some((name, value)) = param.split_once('=') else { continue };
        let value = value.trim().trim_matches('"');
        match name.trim().to_ascii_lowercase().as_str() {
            "q" => q = parse_quality(value),
            "g" => g = Some(value),
            "v" => v = Some(value),
            "as" => kind = Some(value),
            "profile" => profile = Some(value),
            _ => {}
        }
    }
    let Some((ty, sub)) = media.split_once('/') else { return (q, None) };
    let json = match (ty.trim(), sub.trim()) {
        (t, s) if t.eq_ignore_ascii_case("application") && s.eq_ignore_ascii_case("json") => true,
        ("*", "*") => true,
        (t, "*") if t.eq_ignore_ascii_case("application") => true,
        (t, s)
            if t.eq_ignore_ascii_case("application") && s.eq_ignore_ascii_case("vnd.kubernetes.protobuf") =>
        {
            false
        }
        (t, s) if t.eq_ignore_ascii_case("application") && s.eq_ignore_ascii_case("yaml") => {
            let plain = g.is_none() && v.is_none() && kind.is_none();
            return (q, plain.then_some(DiscoveryAccept::LegacyOther));
        }
        _ => return (q, None),
    };
    if g.is_none() && v.is_none() && kind.is_none() {
        let legacy = if json { DiscoveryAccept::LegacyJson } else { DiscoveryAccept::LegacyOther };
        return (q, Some(legacy));
    }
    if g != Some(DISCOVERY_GROUP) || kind != Some(DISCOVERY_KIND) {
        return (q, None);
    }
    match (v, json) {
        (Some("v2"), true) if profile == Some("nopeer") => (q, Some(DiscoveryAccept::NoPeerV2)),
        (Some("v2"), true) => (q, Some(DiscoveryAccept::MergedV2)),
        (Some("v2beta1"), _) => (q, Some(DiscoveryAccept::Local)),
        _ => (q, None),
    }
}

fn parse_quality(value: &str) -> u16 {
    let Some((int, frac)) = value.split_once('.').or(Some((value, ""))) else { return 0 };
    let int: u16 = match int {
        "1" => 1000,
        "0" | "" => 0,
        _ => return 0,
    };
    let mut thousandths = 0u16;
    for (i, b) in frac.bytes().take(3).enumerate() {
        if !b.is_ascii_digit() {
            return 0;
        }
        thousandths += u16::from(b - b'0') * [100, 10, 1].get(i).copied().unwrap_or(0);
    }
    (int + thousandths).min(1000)
}

/// Splits on `sep` outside double quotes.
fn split_unquoted(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut quoted = false;
        for (i, b) in s.bytes().enumerate() {
            match b {
                b'"' => quoted = !quoted,
                b if b == sep && !quoted => {
                    rest = s.get(i + 1..);
                    return s.get(..i);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

#[cfg(test)]
mod tests {

    use super::DiscoveryAccept::*;
    use super::*;

    #[test]
    fn kubernetes_clients() {
        let cases = [
            // client-go's default for discovery
            (
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
                MergedV2,
            ),
            // client-go with protobuf first: JSON v2 is the next choice we can honour
            (
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
                MergedV2,
            ),
            // the apiservers' own peer fetch (docs/upstream-facts.md, "Peer discovery fetch")
            (
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
                NoPeerV2,
            ),
            ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=foo", MergedV2),
            ("application/json", LegacyJson),
            ("*/*", LegacyJson),
            ("application/json, */*", LegacyJson),
            ("application/yaml", LegacyOther),
            ("application/vnd.kubernetes.protobuf", LegacyOther),
            ("application/vnd.kubernetes.protobuf,application/json", LegacyOther),
            ("application/vnd.kubernetes.protobuf;q=0.5,application/json", LegacyJson),
            ("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList", Local),
            (
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                Local,
            ),
            (
                "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList,application/json",
                LegacyJson,
            ),
            ("application/json;g=apps;v=v1;as=Deployment", Local),
            ("text/html", Local),
            ("", LegacyJson),
            (" ", LegacyJson),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate_discovery(Some(accept)), want, "{accept}");
        }
        assert_eq!(negotiate_discovery(None), LegacyJson);
    }

    #[test]
    fn legacy_only_paths_pass_over_aggregated_ranges() {
        let cases = [
            (
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
                LegacyJson,
            ),
            ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList", Local),
            ("application/vnd.kubernetes.protobuf,application/json", LegacyOther),
            ("application/json, */*", LegacyJson),
            ("text/plain", Local),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate_legacy(Some(accept)), want, "{accept}");
        }
        assert_eq!(negotiate_legacy(None), LegacyJson);
    }

    #[test]
    fn quality_and_spacing() {
        let v2 = "application/json; g=apidiscovery.k8s.io; v=v2; as=APIGroupDiscoveryList";
        assert_eq!(negotiate_discovery(Some(&format!("application/json;q=0.5, {v2}"))), MergedV2);
        assert_eq!(negotiate_discovery(Some(&format!("{v2};q=0.4, application/json;q=0.5"))), LegacyJson);
        assert_eq!(negotiate_discovery(Some(&format!("{v2};q=0, application/json"))), LegacyJson);
        assert_eq!(negotiate_discovery(Some(&format!("{v2};Q=1.0"))), MergedV2);
        assert_eq!(negotiate_discovery(Some(&format!("{v2};q=abc"))), Local);
        assert_eq!(negotiate_discovery(Some(&format!("{v2};profile=\"nopeer\""))), NoPeerV2);
        assert_eq!(parse_quality("0.123"), 123);
        assert_eq!(parse_quality("1.000"), 1000);
        assert_eq!(parse_quality("0.5"), 500);
        assert_eq!(parse_quality("2"), 0);
    }

    #[test]
    fn too_many_ranges_go_to_an_apiserver() {
        let many = vec!["text/plain"; 40].join(",")
            + ",application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(negotiate_discovery(Some(&many)), Local);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_panics(accept in ".{0,300}") {
            let _ = negotiate_discovery(Some(&accept));
        }

        #[test]
        fn never_panics_on_media_like_input(accept in "([a-z*]{0,12}/[a-z*.]{0,24}(;[a-zA-Z]{0,3}=\"?[a-z0-9.=]{0,12}\"?){0,4},?){0,6}") {
            let _ = negotiate_discovery(Some(&accept));
        }
    }
}
