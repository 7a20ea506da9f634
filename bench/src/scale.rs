//! `make scale`: the watches and connections of a large cluster through one edge. The parts
//! without I/O live here: what a watch asks for and the event lines the upstream writes and the
//! clients read, each watch's order check, and the arithmetic of the report. The upstream and the
//! clients are [`upstream`] and [`clients`].

pub mod clients;
pub mod upstream;

/// What the watches ask for, by watch index within a client: kubelet- and controller-like
/// watches of resources every apiserver serves (the bypass routes take them), and two in ten of
/// group/versions only some apiservers serve (the example table: resource.k8s.io/v1 only c,
/// networking.k8s.io/v1beta1 a and b), which meet the filter.
const WATCHED: [&str; 10] = [
    "/api/v1/namespaces/{ns}/pods",
    "/api/v1/namespaces/{ns}/configmaps",
    "/api/v1/namespaces/{ns}/secrets",
    "/api/v1/namespaces/{ns}/services",
    "/api/v1/namespaces/{ns}/endpoints",
    "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
    "/apis/networking.k8s.io/v1beta1/ipaddresses",
];

/// The label a watch selects on (an existence selector: `watch-7`), so that every watch has
/// events of its own whichever apiserver serves it. Not `watch=7`: client-go sends that as
/// `watch%3D7`, and a query with an escape meets the filter (the bypass routes leave decoding to
/// it), which kube-proxy's and the kubelet's selectors would, but a benchmark of the bypass must
/// not.
const SELECTOR: &str = "labelSelector=watch-";

/// The request target of watch `index` (across all clients) of a client holding `per_client`,
/// resuming after `resource_version` (0: from the start, which is also now: the upstream writes
/// no events before every watch is open).
pub fn watch_target(index: usize, per_client: usize, resource_version: u64) -> String {
    let client = index / per_client.max(1);
    let path = WATCHED[index % per_client.max(1) % WATCHED.len()].replace("{ns}", &format!("ns-{client}"));
    format!("{path}?allowWatchBookmarks=true&{SELECTOR}{index}&resourceVersion={resource_version}&watch=true")
}

/// Whether watch `index` of a client holding `per_client` meets the filter (see [`WATCHED`]).
pub fn meets_filter(index: usize, per_client: usize) -> bool {
    index % per_client.max(1) % WATCHED.len() >= 8
}

/// A short request of client `client`: a get every apiserver answers.
pub fn short_target(client: usize) -> String {
    format!("/api/v1/namespaces/ns-{client}/configmaps/kube-root-ca.crt")
}

/// What the upstream reads from a watch's query: its index and where to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchQuery {
    pub index: usize,
    pub resource_version: u64,
}

/// `None` unless the query asks to watch (`watch=true`) with a selector of [`watch_target`].
pub fn parse_watch_query(query: &str) -> Option<WatchQuery> {
    let mut watch = false;
    let (mut index, mut resource_version) = (None, 0);
    for pair in query.split('&') {
        if pair == "watch=true" || pair == "watch=1" {
            watch = true;
        } else if let Some(v) = pair.strip_prefix(SELECTOR) {
            index = v.parse().ok();
        } else if let Some(v) = pair.strip_prefix("resourceVersion=") {
            resource_version = v.parse().ok()?;
        }
    }
    Some(WatchQuery { index: index.filter(|_| watch)?, resource_version })
}

/// One event of a watch as the upstream wrote it: its resourceVersion (one counter for all, as
/// etcd's revision), its number within its watch, and when the upstream wrote it (Unix ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub resource_version: u64,
    pub seq: u64,
    pub written_ns: u64,
}

const SEQ: &str = "scale.skewgate.io/seq";
const WRITTEN: &str = "scale.skewgate.io/written";

impl Event {
    /// A watch event as kube-apiserver streams it (one JSON object a line), the sequence number
    /// and the write time in annotations of the object.
    pub fn line(&self, index: usize) -> String {
        format!(
            "{{\"type\":\"MODIFIED\",\"object\":{{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{{\"name\":\"w-{index}\",\"resourceVersion\":\"{}\",\"annotations\":{{\"{SEQ}\":\"{}\",\"{WRITTEN}\":\"{}\"}}}},\"data\":{{\"k\":\"{}\"}}}}}}\n",
            self.resource_version,
            self.seq,
            self.written_ns,
            "v".repeat(64),
        )
    }

    /// The event of one line of [`Event::line`], without a JSON parser: 20,000 watches' events
    /// are read on the clients' one core, whose time must go to the connections.
    pub fn parse(line: &[u8]) -> Option<Event> {
        let line = std::str::from_utf8(line).ok()?;
        Some(Event {
            resource_version: quoted_number(line, "\"resourceVersion\":\"")?,
            seq: quoted_number(line, &format!("\"{SEQ}\":\""))?,
            written_ns: quoted_number(line, &format!("\"{WRITTEN}\":\""))?,
        })
    }
}

fn quoted_number(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest[..rest.find('"')?].parse().ok()
}

/// The complete lines of a body that arrives in chunks of any size (an event may straddle two
/// HTTP/2 DATA frames).
#[derive(Debug, Default)]
pub struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// Calls `each` with every line `chunk` completes, without its newline.
    pub fn push(&mut self, chunk: &[u8], mut each: impl FnMut(&[u8])) {
        let mut rest = chunk;
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            if self.partial.is_empty() {
                each(&rest[..at]);
            } else {
                self.partial.extend_from_slice(&rest[..at]);
                each(&self.partial);
                self.partial.clear();
            }
            rest = &rest[at + 1..];
        }
        self.partial.extend_from_slice(rest);
    }
}

/// One watch's events as its client saw them. Kubernetes delivers a watch's events in order and
/// once; a client that resumes from the last resourceVersion it saw must miss none.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sequence {
    /// The last event number seen.
    pub last: u64,
    /// Events skipped between two seen.
    pub gaps: u64,
    /// Events seen again or out of order.
    pub repeats: u64,
}

impl Sequence {
    pub fn see(&mut self, seq: u64) {
        if seq <= self.last {
            self.repeats += 1;
        } else {
            self.gaps += seq - self.last - 1;
            self.last = seq;
        }
    }

    /// Events lost when the upstream wrote `written` for this watch: skipped ones and those
    /// after the last seen.
    pub fn lost(&self, written: u64) -> u64 {
        self.gaps + written.saturating_sub(self.last)
    }
}

/// The `p`-th percentile (0–100) of `sorted` by nearest rank; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// KiB each of `units` added to a resident set that went from `before` to `after` KiB; what
/// came before them (Envoy's own, the connections) is not theirs. NaN without units.
pub fn kib_each(before: u64, after: u64, units: usize) -> f64 {
    if units == 0 {
        return f64::NAN;
    }
    (after as f64 - before as f64) / units as f64
}

/// µs of CPU per unit of work, with `idle_us_per_s` (what the process spends with nothing to do:
/// health checks, stats flushes) over `seconds` taken off first.
pub fn cpu_each(cpu_us: f64, idle_us_per_s: f64, seconds: f64, units: u64) -> f64 {
    if units == 0 {
        return f64::NAN;
    }
    (cpu_us - idle_us_per_s * seconds).max(0.0) / units as f64
}

/// Clients needed for `watches` at `per_client` each (the last may hold fewer).
pub fn clients_for(watches: usize, per_client: usize) -> usize {
    watches.div_ceil(per_client.max(1))
}

/// Now, in ns since the Unix epoch: the upstream's write time and the clients' receipt, one clock.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_targets_round_trip_through_the_upstream_query_parser() {
        let target = watch_target(29, 10, 4711);
        assert_eq!(
            target,
            "/apis/networking.k8s.io/v1beta1/ipaddresses?allowWatchBookmarks=true&labelSelector=watch-29&resourceVersion=4711&watch=true"
        );
        let query = target.split_once('?').unwrap().1;
        assert_eq!(parse_watch_query(query), Some(WatchQuery { index: 29, resource_version: 4711 }));
        assert!(watch_target(12, 10, 0).starts_with("/api/v1/namespaces/ns-1/secrets?"));
        // A get or a list is not a watch; a watch without the selector is none of ours.
        assert_eq!(parse_watch_query("labelSelector=watch-1&resourceVersion=5"), None);
        assert_eq!(parse_watch_query("watch=true&resourceVersion=5"), None);
        assert_eq!(parse_watch_query("watch=true&labelSelector=watch-1&resourceVersion=x"), None);
    }

    #[test]
    fn two_watches_in_ten_meet_the_filter() {
        let through: Vec<usize> = (0..20).filter(|&i| meets_filter(i, 10)).collect();
        assert_eq!(through, [8, 9, 18, 19]);
        assert!(through.iter().all(|&i| watch_target(i, 10, 0).contains("/apis/resource.k8s.io/v1/")
            || watch_target(i, 10, 0).contains("/apis/networking.k8s.io/v1beta1/")));
        // Fewer watches a client: only the uniform ones.
        assert!((0..40).all(|i| !meets_filter(i, 4)));
    }

    #[test]
    fn events_parse_back_from_their_line() {
        let e = Event { resource_version: 991, seq: 12, written_ns: 1_764_000_000_123_456_789 };
        let line = e.line(7);
        assert!(line.ends_with('\n'));
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["object"]["metadata"]["resourceVersion"], "991");
        assert_eq!(Event::parse(line.trim_end().as_bytes()), Some(e));
        assert_eq!(Event::parse(b"{\"type\":\"BOOKMARK\"}"), None);
        assert_eq!(Event::parse(&line.as_bytes()[..40]), None);
    }

    #[test]
    fn lines_are_whole_however_the_body_is_cut() {
        let body: String =
            (1..=5).map(|i| Event { resource_version: i, seq: i, written_ns: i }.line(0)).collect();
        for cut in [1, 7, 100, body.len()] {
            let mut lines = Lines::default();
            let mut seen = Vec::new();
            for chunk in body.as_bytes().chunks(cut) {
                lines.push(chunk, |l| seen.push(Event::parse(l).unwrap().seq));
            }
            assert_eq!(seen, [1, 2, 3, 4, 5], "chunks of {cut}");
        }
    }

    #[test]
    fn a_sequence_counts_gaps_repeats_and_the_missing_tail() {
        let mut s = Sequence::default();
        for seq in [1, 2, 4, 4, 3, 5] {
            s.see(seq);
        }
        assert_eq!(s, Sequence { last: 5, gaps: 1, repeats: 2 });
        assert_eq!(s.lost(5), 1);
        assert_eq!(s.lost(8), 4);
        assert_eq!(Sequence::default().lost(0), 0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn per_unit_arithmetic() {
        assert_eq!(kib_each(100_000, 157_000, 1_000), 57.0);
        assert_eq!(kib_each(100, 90, 10), -1.0);
        assert!(kib_each(1, 2, 0).is_nan());
        assert_eq!(cpu_each(12_000.0, 100.0, 10.0, 1_000), 11.0);
        assert_eq!(cpu_each(500.0, 100.0, 10.0, 10), 0.0);
        assert!(cpu_each(1.0, 0.0, 1.0, 0).is_nan());
        assert_eq!(clients_for(20_000, 10), 2_000);
        assert_eq!(clients_for(1_001, 10), 101);
    }
}
