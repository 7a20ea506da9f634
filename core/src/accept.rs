//! Content negotiation for the discovery documents skewgate composes, as kube-apiserver does it
//! (`negotiation.NegotiateMediaTypeOptions` over `goautoneg.ParseAccept`, with the discovery
//! wrapper's and the legacy handlers' endpoint restrictions), so that a client gets from the edge
//! the representation it would get from an apiserver.
//!
//! Go's parser is followed to the letter, including what a reader of RFC 9110 would not expect:
//! parameters are not unquoted and their names are case-sensitive (`Q=0.5` is not a quality),
//! a quality of 0 does not refuse a type, ranges are ordered by quality and then by specificity
//! with Go's insertion sort, and `/apis` serves aggregated discovery when *any* acceptable range
//! asks for it, even one of lower quality than a plain `application/json`.

/// The serializations kube-apiserver offers for discovery, in the order it tries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Yaml,
    Protobuf,
}

/// What the client gets for a discovery request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryAccept {
    /// Aggregated discovery v2, peer-aggregated: the document the edge merges.
    MergedV2(Encoding),
    /// Aggregated discovery v2 with `profile=nopeer`: one apiserver's own document.
    NoPeerV2(Encoding),
    /// The legacy (unaggregated) document.
    Legacy(Encoding),
    /// Nothing the apiserver would produce: every apiserver answers 406 alike, or the header has
    /// more ranges than this mirror of Go's sort is exact for. An apiserver decides.
    Local,
}

use crate::legacy_documents::LegacyPath;

const DISCOVERY_GROUP: &str = "apidiscovery.k8s.io";
const DISCOVERY_KIND: &str = "APIGroupDiscoveryList";

/// Go sorts up to this many ranges with insertion sort (stable, so exact to mirror); longer
/// headers go through pdqsort, whose order of equal ranges is not worth mirroring.
const MAX_RANGES: usize = 12;

/// What a `GET` of the discovery path `path` with `accept` gets: at `/api` and `/apis`, the
/// aggregated document if a range asks for it in a form the apiserver serves, else the legacy
/// one; elsewhere the legacy one, ranges that ask for a conversion (`g`, `v`, `as`) passed over.
pub fn negotiate(path: LegacyPath<'_>, accept: Option<&str>) -> DiscoveryAccept {
    let accept = accept.unwrap_or_default();
    // `/api` and every group/version are go-restful routes, which first look for a range that
    // names one of their media types exactly, or `*/*`: `application/*` alone is refused there.
    let restful = matches!(path, LegacyPath::Versions | LegacyPath::GroupVersion(..));
    if restful && !restful_accepts(accept) {
        return DiscoveryAccept::Local;
    }
    let Some(ranges) = Ranges::parse(accept) else { return DiscoveryAccept::Local };
    if matches!(path, LegacyPath::Versions | LegacyPath::GroupList)
        && let Some(chosen) = ranges.choose(Restriction::AggregatedDiscovery)
    {
        return if chosen.profile == "nopeer" {
            DiscoveryAccept::NoPeerV2(chosen.encoding)
        } else {
            DiscoveryAccept::MergedV2(chosen.encoding)
        };
    }
    match ranges.choose(Restriction::Plain) {
        Some(chosen) => DiscoveryAccept::Legacy(chosen.encoding),
        None => DiscoveryAccept::Local,
    }
}

/// go-restful's `Route.matchesAccept` for a route that produces the three serializers' types:
/// a missing Accept is `*/*`; each range's type is taken up to its first `;`, trimmed of spaces.
fn restful_accepts(accept: &str) -> bool {
    accept.is_empty()
        || accept.split(',').any(|range| {
            let media = trim_spaces(range.split(';').next().unwrap_or_default());
            media == "*/*"
                || SERIALIZERS.iter().any(|(ty, sub, ..)| {
                    media.strip_prefix(ty).and_then(|m| m.strip_prefix('/')) == Some(sub)
                })
        })
}

/// kube-apiserver's endpoint restrictions, as far as discovery meets them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Restriction {
    /// The `/api` and `/apis` wrapper: only `g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`
    /// (v2beta1 is gone from 1.33 on, so a range asking for it is passed over).
    AggregatedDiscovery,
    /// Every other discovery handler: no conversion at all.
    Plain,
}

/// One media range as `goautoneg` parses it.
#[derive(Clone, Copy, Default)]
struct Range<'a> {
    quality: f64,
    media_type: &'a str,
    subtype: &'a str,
    /// The parameters, still joined by `;`.
    params: &'a str,
}

struct Ranges<'a> {
    ranges: [Range<'a>; MAX_RANGES],
    len: usize,
}

/// A serializer that a range matched, with the options the range carried.
struct Chosen<'a> {
    encoding: Encoding,
    profile: &'a str,
}

/// The serializers in kube-apiserver's order: type, subtype, whether it streams (watch).
const SERIALIZERS: [(&str, &str, bool, Encoding); 3] = [
    ("application", "json", true, Encoding::Json),
    ("application", "yaml", false, Encoding::Yaml),
    ("application", "vnd.kubernetes.protobuf", true, Encoding::Protobuf),
];

impl<'a> Ranges<'a> {
    /// `None` when there are more ranges than [`MAX_RANGES`].
    fn parse(header: &'a str) -> Option<Self> {
        let mut ranges = Ranges { ranges: [Range::default(); MAX_RANGES], len: 0 };
        if header.is_empty() {
            // No Accept at all is the first serializer, JSON, without conversion.
            ranges.push(Range { quality: 1.0, media_type: "application", subtype: "json", params: "" })?;
            return Some(ranges);
        }
        let mut remaining = header;
        while !remaining.is_empty() {
            let (part, rest) = next_split(remaining, ',');
            remaining = rest;
            let part = trim_spaces(part);
            let (media, params) = next_split(part, ';');
            let (media_type, rest) = next_split(media, '/');
            let media_type = trim_spaces(media_type);
            let subtype = if rest.is_empty() {
                if media_type != "*" {
                    continue;
                }
                "*"
            } else {
                let (subtype, rest) = next_split(rest, '/');
                if !rest.is_empty() {
                    continue;
                }
                trim_spaces(subtype)
            };
            let mut quality = 1.0;
            for (name, raw) in params_of(params) {
                if name == "q" {
                    // Go parses the value untrimmed, ignores the error and keeps its zero value.
                    quality = raw.parse::<f32>().map(f64::from).unwrap_or(0.0);
                }
            }
            ranges.push(Range { quality, media_type, subtype, params })?;
        }
        ranges.sort();
        Some(ranges)
    }

    fn push(&mut self, range: Range<'a>) -> Option<()> {
        *self.ranges.get_mut(self.len)? = range;
        self.len += 1;
        Some(())
    }

    /// Go's `sort.Sort` on at most 12 elements: insertion sort with goautoneg's `Less`.
    fn sort(&mut self) {
        let ranges = self.ranges.get_mut(..self.len).unwrap_or_default();
        for i in 1..ranges.len() {
            let mut j = i;
            while j > 0 && less(&ranges[j], &ranges[j - 1]) {
                ranges.swap(j, j - 1);
                j -= 1;
            }
        }
    }

    /// `NegotiateMediaTypeOptions`: the first range, in sorted order, that one of the
    /// serializers (in their order) accepts under `restriction`.
    fn choose(&self, restriction: Restriction) -> Option<Chosen<'a>> {
        self.ranges.get(..self.len).unwrap_or_default().iter().find_map(|range| {
            SERIALIZERS.iter().find_map(|&(media_type, subtype, streams, encoding)| {
                let matches = (range.media_type == media_type
                    && (range.subtype == subtype || range.subtype == "*"))
                    || (range.media_type == "*" && range.subtype == "*");
                if !matches {
                    return None;
                }
                accept_options(range.params, streams, restriction).map(|profile| Chosen { encoding, profile })
            })
        })
    }
}

/// goautoneg's `Less`, which is not a strict order: a more specific range sorts first even when
/// its quality is lower, as long as the insertion sort compares the two.
fn less(a: &Range<'_>, b: &Range<'_>) -> bool {
    a.quality > b.quality
        || (a.media_type != "*" && b.media_type == "*")
        || (a.subtype != "*" && b.subtype == "*")
}

/// `acceptMediaTypeOptions`: the range's `profile` if the serializer may answer it, `None` if
/// a parameter rules it out.
fn accept_options(params: &str, streams: bool, restriction: Restriction) -> Option<&str> {
    let (mut group, mut version, mut kind, mut convert) = ("", "", "", false);
    let (mut stream, mut server_version, mut profile) = ("", "", "");
    // A later parameter of the same name wins, as it does in Go's map.
    for (name, raw) in params_of(params) {
        let value = trim_spaces(raw);
        match name {
            "as" => (kind, convert) = (value, true),
            "g" => (group, convert) = (value, true),
            "v" => (version, convert) = (value, true),
            "stream" => stream = value,
            "sv" => server_version = value,
            "profile" => profile = value,
            _ => {}
        }
    }
    // Discovery streams nothing but watch, which it does not serve either; no endpoint here
    // allows a server version.
    if (!stream.is_empty() && (!streams || stream != "watch")) || !server_version.is_empty() {
        return None;
    }
    let allowed = match restriction {
        Restriction::AggregatedDiscovery => {
            convert && group == DISCOVERY_GROUP && version == "v2" && kind == DISCOVERY_KIND
        }
        Restriction::Plain => !convert,
    };
    allowed.then_some(profile)
}

/// A range's parameters as Go reads them: `name=value` pieces split on `;` (a piece without
/// `=`, or with two, is skipped), the name trimmed of spaces, the value as it is (quotes kept).
fn params_of(params: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut remaining = params;
    std::iter::from_fn(move || {
        while !remaining.is_empty() {
            let (piece, rest) = next_split(remaining, ';');
            remaining = rest;
            let (name, value) = next_split(piece, '=');
            if !piece.contains('=') || value.contains('=') {
                continue;
            }
            return Some((trim_spaces(name), value));
        }
        None
    })
}

/// goautoneg's `nextSplitElement`: up to the first `sep`, and what follows it ("" if none).
fn next_split(s: &str, sep: char) -> (&str, &str) {
    s.split_once(sep).unwrap_or((s, ""))
}

/// Go trims only the space character here, not tabs.
fn trim_spaces(s: &str) -> &str {
    s.trim_matches(' ')
}

#[cfg(test)]
mod tests {

    use super::DiscoveryAccept::*;
    use super::Encoding::*;
    use super::*;

    const APIS: LegacyPath<'static> = LegacyPath::GroupList;
    const GROUP: LegacyPath<'static> = LegacyPath::Group("apps");
    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const V2_PROTOBUF: &str =
        "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

    #[test]
    fn kubernetes_clients() {
        let cases = [
            // client-go's default for discovery
            (
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
                MergedV2(Json),
            ),
            // protobuf first, as a client built for protobuf asks
            (
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
                MergedV2(Protobuf),
            ),
            // the apiservers' own peer fetch (docs/upstream-facts.md, "Peer discovery fetch")
            (
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
                NoPeerV2(Json),
            ),
            (&format!("{V2_PROTOBUF};profile=nopeer"), NoPeerV2(Protobuf)),
            (&format!("{V2};profile=foo"), MergedV2(Json)),
            // Go keeps the quotes: this is not the nopeer profile
            (&format!("{V2};profile=\"nopeer\""), MergedV2(Json)),
            ("application/json", Legacy(Json)),
            ("*/*", Legacy(Json)),
            ("*", Legacy(Json)),
            ("application/*", Legacy(Json)),
            ("application/json, */*", Legacy(Json)),
            ("application/yaml", Legacy(Yaml)),
            ("application/vnd.kubernetes.protobuf", Legacy(Protobuf)),
            // client-go's Accept for a protobuf client without AcceptContentTypes
            ("application/vnd.kubernetes.protobuf, */*", Legacy(Protobuf)),
            ("application/vnd.kubernetes.protobuf;q=0.5,application/json", Legacy(Json)),
            // v2beta1 is gone: the range is passed over for the next, and alone it is refused (406)
            ("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList", Local),
            (
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/yaml",
                Legacy(Yaml),
            ),
            (&format!("{V2};v=v3,application/yaml"), Legacy(Yaml)),
            ("application/json;g=apps;v=v1;as=Deployment", Local),
            ("text/html", Local),
            ("application/JSON", Local),
            ("", Legacy(Json)),
            // not empty, so not the default: nothing parses, and kube-apiserver answers 406
            (" ", Local),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(APIS, Some(accept)), want, "{accept}");
        }
        assert_eq!(negotiate(APIS, None), Legacy(Json));
    }

    #[test]
    fn an_aggregated_range_wins_over_any_plain_one() {
        // The wrapper looks only for an aggregated range; quality matters only among those.
        assert_eq!(negotiate(APIS, Some(&format!("application/json, {V2};q=0.1"))), MergedV2(Json));
        assert_eq!(negotiate(APIS, Some(&format!("{V2};q=0, application/json"))), MergedV2(Json));
        assert_eq!(negotiate(APIS, Some(&format!("{V2};q=0.4, {V2_PROTOBUF};q=0.5"))), MergedV2(Protobuf));
    }

    #[test]
    fn goautoneg_order() {
        // quality first
        assert_eq!(negotiate(GROUP, Some("application/yaml;q=0.5, application/json;q=0.9")), Legacy(Json));
        // a wildcard after a specific type of the same quality
        assert_eq!(negotiate(GROUP, Some("*/*, application/yaml")), Legacy(Yaml));
        assert_eq!(
            negotiate(GROUP, Some("application/*, application/vnd.kubernetes.protobuf")),
            Legacy(Protobuf)
        );
        // Go's Less puts a specific type before a wildcard even at a lower quality
        assert_eq!(negotiate(GROUP, Some("*/*;q=0.9, application/yaml;q=0.1")), Legacy(Yaml));
        // ties keep the client's order
        assert_eq!(negotiate(GROUP, Some("application/yaml, application/json")), Legacy(Yaml));
        // a quality that does not parse is 0, and q>1 sorts first
        assert_eq!(negotiate(GROUP, Some("application/yaml;q=x, application/json;q=0.001")), Legacy(Json));
        assert_eq!(negotiate(GROUP, Some("application/yaml, application/json;q=2")), Legacy(Json));
        // parameter names are case-sensitive: Q is no quality
        assert_eq!(negotiate(GROUP, Some("application/yaml;Q=0.1, application/json;q=0.5")), Legacy(Yaml));
        // a space before the value makes it unparsable
        assert_eq!(negotiate(GROUP, Some("application/yaml;q= 0.9, application/json;q=0.5")), Legacy(Json));
    }

    #[test]
    fn parameters_that_rule_a_serializer_out() {
        assert_eq!(negotiate(GROUP, Some("application/json;stream=watch")), Legacy(Json));
        assert_eq!(negotiate(GROUP, Some("application/yaml;stream=watch, application/json")), Legacy(Json));
        assert_eq!(negotiate(GROUP, Some("application/json;stream=other")), Local);
        assert_eq!(negotiate(GROUP, Some("application/json;sv=v1")), Local);
        assert_eq!(negotiate(GROUP, Some("*/*;stream=watch")), Legacy(Json));
        // malformed pieces are skipped, not fatal
        assert_eq!(negotiate(GROUP, Some("application/json;foo;a=b=c")), Legacy(Json));
        assert_eq!(negotiate(GROUP, Some("application/json/x, application/yaml")), Legacy(Yaml));
        assert_eq!(negotiate(GROUP, Some(",,application/yaml")), Legacy(Yaml));
    }

    #[test]
    fn legacy_only_paths_pass_over_conversions() {
        let cases = [
            (format!("{V2},application/json"), Legacy(Json)),
            (V2.to_owned(), Local),
            ("application/vnd.kubernetes.protobuf,application/json".to_owned(), Legacy(Protobuf)),
            ("application/json, */*".to_owned(), Legacy(Json)),
            ("text/plain".to_owned(), Local),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(GROUP, Some(&accept)), want, "{accept}");
        }
        assert_eq!(negotiate(GROUP, None), Legacy(Json));
    }

    #[test]
    fn restful_routes_want_a_type_they_name() {
        let api = LegacyPath::Versions;
        let group_version = LegacyPath::GroupVersion("apps", "v1");
        for path in [api, group_version] {
            assert_eq!(negotiate(path, Some("application/*")), Local);
            assert_eq!(negotiate(path, Some("*")), Local);
            assert_eq!(negotiate(path, Some("application/*, */*")), Legacy(Json));
            assert_eq!(negotiate(path, Some("application/*;q=0.1, application/yaml")), Legacy(Yaml));
            assert_eq!(negotiate(path, None), Legacy(Json));
        }
        assert_eq!(negotiate(api, Some(V2)), MergedV2(Json));
        assert_eq!(negotiate(group_version, Some(V2)), Local);
        assert_eq!(negotiate(APIS, Some("application/*")), Legacy(Json));
        assert_eq!(negotiate(GROUP, Some("application/*")), Legacy(Json));
    }

    #[test]
    fn too_many_ranges_go_to_an_apiserver() {
        let many = ["text/plain"; 12].join(",") + "," + V2;
        assert_eq!(negotiate(APIS, Some(&many)), Local);
        let twelve = ["text/plain"; 11].join(",") + "," + V2;
        assert_eq!(negotiate(APIS, Some(&twelve)), MergedV2(Json));
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_panics(accept in ".{0,300}") {
            let _ = negotiate(LegacyPath::GroupList, Some(&accept));
            let _ = negotiate(LegacyPath::GroupVersion("", "v1"), Some(&accept));
        }

        #[test]
        fn never_panics_on_media_like_input(accept in "([a-z*]{0,12}/[a-z*.]{0,24}(;[a-zA-Z]{0,3}=\"?[a-z0-9.=]{0,12}\"?){0,4},?){0,6}") {
            let _ = negotiate(LegacyPath::GroupList, Some(&accept));
        }
    }
}
