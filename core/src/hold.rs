//! Requests that wait at the edge while every apiserver that serves them is away (an apiserver
//! restarting, the only one of its API): a restart is a few seconds, and a request that waits
//! them out is a slow request rather than a failed one, for clients that never retry too.
//!
//! Plain data, one per Envoy worker (each runs its own VM): the filter says what happened (a
//! request for a cluster, a failure Envoy reported, a probe's answer, the time) and carries out
//! what comes back (hold, resume, answer). A cluster is "down" from the moment Envoy answered
//! for it that no apiserver could take a request ([`crate::edits::no_apiserver_took_it`]) until a
//! probe through the same cluster reaches an apiserver: Envoy's own health checks decide when
//! it takes requests again, the probe only asks whether they have.
//!
//! A held request has reached no apiserver, so releasing it later cannot apply anything twice.

use std::time::Duration;

use crate::table::{RoutingTable, Serving};

/// How long, and how many, requests may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldPolicy {
    /// The longest a request waits before the 503 it would have had at once (with
    /// `Retry-After`).
    pub max_wait: Duration,
    /// Requests waiting at once, per worker; past it a request is not held (it gets the 503 at
    /// once), so that an outage cannot make Envoy keep an unbounded number of streams.
    pub max_held: usize,
}

impl Default for HoldPolicy {
    /// A real kube-apiserver restart (SIGTERM, then the same binary again) is refused for 0.9 to
    /// 2.2 s and ready 2.0 to 4.2 s after its start; Envoy's health check finds it within one
    /// interval (2 s) more, and the probe within [`PROBE_PERIOD`]. 10 s covers that twice over
    /// and stays far below every client's and the apiserver's own request timeout (60 s).
    fn default() -> Self {
        Self { max_wait: Duration::from_secs(10), max_held: 1024 }
    }
}

/// How often a down cluster is asked again.
pub const PROBE_PERIOD: Duration = Duration::from_millis(200);
/// The probe's request. Whatever the apiserver answers (its readiness, or 401: the probe carries
/// no identity), an answer means Envoy had an apiserver to send it to; only Envoy's own 503 says
/// it had none.
pub const PROBE_PATH: &str = "/readyz?exclude=shutdown";
/// Longer than Envoy's connect timeout: a probe that hangs is a down cluster.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests released per cluster and tick, once it is back: all of a thousand at once to an
/// apiserver that has just started means a thousand new upstream connections in a moment
/// (measured with a stand-in: Envoy then found connections failing, ejected the apiserver and
/// answered 1,331 of 1,823 released requests 503; 50 a tick, none failed on a quiet machine,
/// while on one busy with other tests 1,219 still did). At the filter's 100 ms tick, 500 a
/// second per worker.
pub const RELEASE_PER_TICK: usize = 50;

/// The largest request body a waiting request keeps. Envoy buffers what the client of a paused
/// request sends, up to its connection's buffer limit (1 MiB in the shipped bootstraps), and
/// answers 413 past it: an answer no client sends again. A request whose body grows past this
/// stops waiting and gets the 503 with `Retry-After` at once, which client-go sends again, body
/// and all. kube-apiserver takes bodies up to 3 MiB; a write is a few KiB.
pub const MAX_HELD_BODY: usize = 512 * 1024;

/// Whether requests for `serving` (`rerouted`: a serving set, not the pool) must meet the
/// proxy-wasm filter, the one part that holds requests: the set of one apiserver, the only
/// server of its APIs, has nobody to take them while that apiserver restarts, and a route that
/// skips the filter (a bypass route, the native module's) would answer 503 at once. Without a
/// hold, a route does as well.
pub fn needs_the_filter(table: &RoutingTable, serving: Serving, rerouted: bool) -> bool {
    rerouted && table.policy().max_hold_ms != 0 && table.members(serving).count() == 1
}

/// The bodies all waiting requests of a worker keep, together, at most: past it a request whose
/// body grows stops waiting and gets the 503 with `Retry-After` at once. Without it a hold full
/// of large writes (anyone can send one: the apiserver authenticates, not the edge) would cost
/// Envoy `max_held` × [`MAX_HELD_BODY`], 512 MiB per worker.
pub const MAX_HELD_BODIES: usize = 32 * 1024 * 1024;

/// Whether a waiting request's body, grown to some size, still waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRoom {
    Kept,
    /// Over [`MAX_HELD_BODY`].
    TooLarge,
    /// The worker's waiting bodies would pass [`MAX_HELD_BODIES`].
    NoRoom,
}

/// Where one worker tells the others which clusters it found down (Envoy's shared data, one key
/// for all workers' VMs), so that each does not find it out with a failed request of its own.
pub const BOARD_KEY: &str = "skewgate.hold.down";

/// The board's entries: `cluster=millis;` each, when a worker found the cluster down (its
/// clock, in milliseconds). Garbage parses to nothing.
pub fn board_entries(board: &[u8]) -> Vec<(&str, u64)> {
    let Ok(text) = std::str::from_utf8(board) else { return Vec::new() };
    text.split(';')
        .filter_map(|entry| entry.split_once('='))
        .filter_map(|(cluster, at)| Some((cluster, at.parse().ok()?)))
        .filter(|(cluster, _)| !cluster.is_empty())
        .collect()
}

/// `board` with `cluster` found down at `now_ms`, and without entries older than `keep_ms`.
pub fn board_with(board: &[u8], cluster: &str, now_ms: u64, keep_ms: u64) -> Vec<u8> {
    let mut out = String::new();
    for (other, at) in board_entries(board) {
        if other != cluster && now_ms.saturating_sub(at) < keep_ms {
            out.push_str(&format!("{other}={at};"));
        }
    }
    out.push_str(&format!("{cluster}={now_ms};"));
    out.into_bytes()
}

/// Whether a request is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Its cluster is not known to be down: on its way.
    Forward,
    /// It waits.
    Held,
    /// Its cluster is down but too many wait already: it goes on, to Envoy's 503 (`Retry-After`).
    Full,
}

/// A request waiting: the stream (its context id), since when, and what answering it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<T> {
    pub id: u32,
    pub since: Duration,
    pub payload: T,
    /// The bytes of its body Envoy keeps for it so far.
    pub body: usize,
}

#[derive(Debug)]
struct Down<T> {
    cluster: String,
    /// A probe reached an apiserver: the waiting requests are being released.
    up: bool,
    /// Since when nothing tells it is up: the failure that marked it, or the last request held.
    active: Duration,
    last_probe: Option<Duration>,
    probe: Option<u32>,
    waiting: Vec<Held<T>>,
}

/// Every down cluster of one worker, and the requests waiting for each. Times are any clock
/// that does not go back (Envoy's, in the filter).
#[derive(Debug)]
pub struct Holds<T> {
    policy: HoldPolicy,
    down: Vec<Down<T>>,
    held: usize,
}

impl<T> Holds<T> {
    pub fn new(policy: HoldPolicy) -> Self {
        Self { policy, down: Vec::new(), held: 0 }
    }

    pub fn policy(&self) -> HoldPolicy {
        self.policy
    }

    /// A new table's policy. Requests already waiting keep waiting, under its bounds.
    pub fn set_policy(&mut self, policy: HoldPolicy) {
        self.policy = policy;
    }

    /// Nothing down: every request goes on. The one check on the path of a request.
    pub fn is_empty(&self) -> bool {
        self.down.is_empty()
    }

    /// Requests waiting, all clusters together.
    pub fn held(&self) -> usize {
        self.held
    }

    /// A request for `cluster`, stream `id`.
    pub fn admit(&mut self, cluster: &str, id: u32, payload: T, now: Duration) -> Admission {
        let Some(down) = self.down.iter_mut().find(|d| d.cluster == cluster) else {
            return Admission::Forward;
        };
        if self.held >= self.policy.max_held || self.policy.max_wait.is_zero() {
            return Admission::Full;
        }
        down.active = now;
        down.waiting.push(Held { id, since: now, payload, body: 0 });
        self.held += 1;
        Admission::Held
    }

    /// Envoy found no apiserver of `cluster` to take a request.
    pub fn failed(&mut self, cluster: &str, now: Duration) {
        if self.policy.max_wait.is_zero() {
            return;
        }
        match self.down.iter_mut().find(|d| d.cluster == cluster) {
            Some(down) => {
                down.active = now;
                down.up = false;
            }
            None => self.down.push(Down {
                cluster: cluster.to_owned(),
                up: false,
                active: now,
                last_probe: None,
                probe: None,
                waiting: Vec::new(),
            }),
        }
    }

    /// The clusters to probe now: down, with no probe under way, not probed for
    /// [`PROBE_PERIOD`]. Each is then [`Holds::probing`] or, when the probe could not be sent,
    /// left to the next period.
    pub fn probes_due(&mut self, now: Duration) -> Vec<String> {
        let due = |d: &&mut Down<T>| {
            !d.up && d.probe.is_none() && d.last_probe.is_none_or(|at| now.saturating_sub(at) >= PROBE_PERIOD)
        };
        self.down
            .iter_mut()
            .filter(due)
            .map(|d| {
                d.last_probe = Some(now);
                d.cluster.clone()
            })
            .collect()
    }

    /// A probe of `cluster` is under way with `token`.
    pub fn probing(&mut self, cluster: &str, token: u32) {
        if let Some(down) = self.down.iter_mut().find(|d| d.cluster == cluster) {
            down.probe = Some(token);
        }
    }

    /// The answer to probe `token`: when an apiserver answered (`up`), its cluster is up again
    /// and the requests waiting for it go on, in the order they came, the first
    /// [`RELEASE_PER_TICK`] now and as many at each [`Holds::releases`] after; requests that come
    /// meanwhile queue behind them.
    pub fn probed(&mut self, token: u32, up: bool) -> Vec<(String, Held<T>)> {
        let Some(down) = self.down.iter_mut().find(|d| d.probe == Some(token)) else { return Vec::new() };
        down.probe = None;
        down.up = up;
        if !up {
            return Vec::new();
        }
        self.releases()
    }

    /// The next requests of every cluster that is back, at most [`RELEASE_PER_TICK`] each; a
    /// cluster with none left waiting is up for good.
    pub fn releases(&mut self) -> Vec<(String, Held<T>)> {
        let mut out = Vec::new();
        for down in self.down.iter_mut().filter(|d| d.up) {
            let n = down.waiting.len().min(RELEASE_PER_TICK);
            out.extend(down.waiting.drain(..n).map(|h| (down.cluster.clone(), h)));
        }
        self.held -= out.len();
        self.down.retain(|d| !(d.up && d.waiting.is_empty()));
        out
    }

    /// The requests that waited `max_wait`, with their cluster, to answer now. A cluster nobody
    /// waited for in that time is forgotten: a request for it goes on again (and finds it down
    /// again, if it still is).
    pub fn expired(&mut self, now: Duration) -> Vec<(String, Held<T>)> {
        let max_wait = self.policy.max_wait;
        let mut out = Vec::new();
        for down in &mut self.down {
            let (gone, kept) = std::mem::take(&mut down.waiting)
                .into_iter()
                .partition::<Vec<_>, _>(|h| now.saturating_sub(h.since) >= max_wait);
            down.waiting = kept;
            out.extend(gone.into_iter().map(|h| (down.cluster.clone(), h)));
        }
        self.held -= out.len();
        self.down.retain(|d| !d.waiting.is_empty() || now.saturating_sub(d.active) < max_wait);
        out
    }

    /// The waiting requests `stale` picks (a new table sends them elsewhere), taken out to be
    /// answered now rather than left to wait for a cluster they no longer belong to.
    pub fn take_where(&mut self, mut stale: impl FnMut(&T) -> bool) -> Vec<(String, Held<T>)> {
        let mut out = Vec::new();
        for down in &mut self.down {
            let (gone, kept) =
                std::mem::take(&mut down.waiting).into_iter().partition::<Vec<_>, _>(|h| stale(&h.payload));
            down.waiting = kept;
            out.extend(gone.into_iter().map(|h| (down.cluster.clone(), h)));
        }
        self.held -= out.len();
        out
    }

    /// Forgets the down clusters `known` says no longer exist (a new table without them), with
    /// whatever waits for them: nothing would probe or release them again.
    pub fn retain_clusters(&mut self, mut known: impl FnMut(&str) -> bool) -> Vec<(String, Held<T>)> {
        let mut out = Vec::new();
        for down in self.down.iter_mut().filter(|d| !known(&d.cluster)) {
            out.extend(std::mem::take(&mut down.waiting).into_iter().map(|h| (down.cluster.clone(), h)));
        }
        self.held -= out.len();
        self.down.retain(|d| known(&d.cluster));
        out
    }

    /// Stream `id`, if it waits, taken out (to be answered now), with its cluster.
    pub fn take(&mut self, id: u32) -> Option<(String, Held<T>)> {
        for down in &mut self.down {
            if let Some(at) = down.waiting.iter().position(|h| h.id == id) {
                self.held -= 1;
                return Some((down.cluster.clone(), down.waiting.remove(at)));
            }
        }
        None
    }

    /// Waiting stream `id`'s body has grown to `size` bytes: whether it may keep waiting, within
    /// [`MAX_HELD_BODY`] and [`MAX_HELD_BODIES`]. A stream not waiting has room.
    pub fn body_grew(&mut self, id: u32, size: usize) -> BodyRoom {
        let all = self.bodies();
        let Some(held) = self.down.iter_mut().flat_map(|d| d.waiting.iter_mut()).find(|h| h.id == id) else {
            return BodyRoom::Kept;
        };
        let others = all - held.body;
        if size > MAX_HELD_BODY {
            return BodyRoom::TooLarge;
        }
        if others + size > MAX_HELD_BODIES {
            return BodyRoom::NoRoom;
        }
        held.body = size;
        BodyRoom::Kept
    }

    /// The bytes the waiting requests' bodies take: counted only when a body grows, a few
    /// hundred additions at most.
    pub fn bodies(&self) -> usize {
        self.waiting().map(|h| h.body).sum()
    }

    fn waiting(&self) -> impl Iterator<Item = &Held<T>> {
        self.down.iter().flat_map(|d| d.waiting.iter())
    }

    /// Stream `id` ended while it waited (the client went away): nothing to answer.
    pub fn forget(&mut self, id: u32) -> bool {
        self.take(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn holds() -> Holds<&'static str> {
        Holds::new(HoldPolicy { max_wait: ms(1000), max_held: 2 })
    }

    #[test]
    fn nothing_is_held_until_envoy_finds_a_cluster_down() {
        let mut h = holds();
        assert!(h.is_empty());
        assert_eq!(h.admit("c", 1, "r1", ms(0)), Admission::Forward);
        h.failed("c", ms(10));
        assert!(!h.is_empty());
        assert_eq!(h.admit("c", 2, "r2", ms(20)), Admission::Held);
        assert_eq!(h.admit("other", 3, "r3", ms(20)), Admission::Forward, "only that cluster");
        assert_eq!(h.held(), 1);
    }

    #[test]
    fn an_answered_probe_releases_every_waiting_request_in_order() {
        let mut h = holds();
        h.failed("c", ms(0));
        h.admit("c", 1, "first", ms(1));
        h.admit("c", 2, "second", ms(2));
        assert_eq!(h.probes_due(ms(5)), vec!["c".to_string()]);
        h.probing("c", 7);
        assert_eq!(h.probes_due(ms(500)), Vec::<String>::new(), "one probe at a time");
        assert!(h.probed(7, false).is_empty(), "still down");
        assert_eq!(h.probes_due(ms(100)), Vec::<String>::new(), "not before the period");
        assert_eq!(h.probes_due(ms(205)), vec!["c".to_string()]);
        h.probing("c", 8);
        let released: Vec<_> = h.probed(8, true).into_iter().map(|(c, r)| (c, r.id, r.payload)).collect();
        assert_eq!(released, [("c".into(), 1, "first"), ("c".into(), 2, "second")]);
        assert!(h.is_empty() && h.held() == 0);
        assert_eq!(h.admit("c", 3, "r", ms(300)), Admission::Forward, "up again");
        assert!(h.probed(8, true).is_empty(), "an answer to a forgotten probe releases nothing");
    }

    #[test]
    fn a_cluster_no_longer_known_is_forgotten_with_its_waiting_requests() {
        let mut h = holds();
        h.failed("c", ms(0));
        h.failed("d", ms(0));
        assert_eq!(h.admit("c", 1, "r1", ms(0)), Admission::Held);
        assert_eq!(h.admit("d", 2, "r2", ms(0)), Admission::Held);
        let gone = h.retain_clusters(|c| c == "d");
        assert_eq!(gone, [("c".to_string(), Held { id: 1, since: ms(0), payload: "r1", body: 0 })]);
        assert_eq!(h.held(), 1);
        assert_eq!(h.probes_due(ms(0)), ["d"], "only the known one is probed");
        assert_eq!(h.admit("c", 3, "r3", ms(0)), Admission::Forward);
        assert_eq!(h.take(2).map(|(c, held)| (c, held.payload)), Some(("d".to_string(), "r2")));
        assert_eq!(h.held(), 0);
        assert!(h.take(2).is_none());
    }

    #[test]
    fn waiting_bodies_are_bounded_each_and_together() {
        let mut h = Holds::new(HoldPolicy { max_wait: ms(1000), max_held: 1000 });
        h.failed("c", ms(0));
        let n = MAX_HELD_BODIES / MAX_HELD_BODY;
        for id in 0..n as u32 {
            assert_eq!(h.admit("c", id, "w", ms(0)), Admission::Held);
            assert_eq!(h.body_grew(id, MAX_HELD_BODY / 2), BodyRoom::Kept);
            assert_eq!(h.body_grew(id, MAX_HELD_BODY), BodyRoom::Kept, "a body grows in place");
        }
        assert_eq!(h.bodies(), MAX_HELD_BODIES);
        let next = n as u32;
        assert_eq!(h.admit("c", next, "w", ms(0)), Admission::Held, "a request without a body still waits");
        assert_eq!(h.body_grew(next, 1), BodyRoom::NoRoom);
        assert_eq!(h.body_grew(0, MAX_HELD_BODY + 1), BodyRoom::TooLarge);
        assert_eq!(h.body_grew(99_999, 1 << 30), BodyRoom::Kept, "not waiting: not ours to bound");
        // A body that leaves frees its room, however it leaves.
        assert!(h.take(0).is_some());
        assert_eq!(h.body_grew(next, MAX_HELD_BODY), BodyRoom::Kept);
        assert!(h.forget(1));
        assert_eq!(h.expired(ms(1000)).len(), n - 1);
        assert_eq!((h.held(), h.bodies()), (0, 0));
    }

    #[test]
    fn past_the_bound_a_request_goes_on_to_its_503() {
        let mut h = holds();
        h.failed("c", ms(0));
        assert_eq!(h.admit("c", 1, "a", ms(0)), Admission::Held);
        assert_eq!(h.admit("c", 2, "b", ms(0)), Admission::Held);
        assert_eq!(h.admit("c", 3, "c", ms(0)), Admission::Full);
        assert_eq!(h.held(), 2);
        assert!(h.forget(1));
        assert!(!h.forget(1), "forgotten once");
        assert_eq!(h.admit("c", 4, "d", ms(0)), Admission::Held, "room again");
    }

    #[test]
    fn a_request_waits_at_most_max_wait() {
        let mut h = holds();
        h.failed("c", ms(0));
        h.admit("c", 1, "early", ms(100));
        h.admit("c", 2, "late", ms(600));
        assert!(h.expired(ms(1099)).is_empty());
        let gone: Vec<_> = h.expired(ms(1100)).into_iter().map(|(c, r)| (c, r.id)).collect();
        assert_eq!(gone, [("c".to_string(), 1)]);
        assert_eq!(h.held(), 1);
        assert!(!h.is_empty(), "still down: a request waits");
        assert_eq!(h.expired(ms(1600)).len(), 1);
        assert_eq!(h.held(), 0);
        assert!(h.is_empty(), "a cluster nobody waited for in max_wait is forgotten");
    }

    #[test]
    fn a_zero_wait_holds_nothing() {
        let mut h: Holds<()> = Holds::new(HoldPolicy { max_wait: Duration::ZERO, max_held: 10 });
        h.failed("c", ms(0));
        assert!(h.is_empty());
        assert_eq!(h.admit("c", 1, (), ms(0)), Admission::Forward);
    }

    #[test]
    fn a_failure_while_down_keeps_the_cluster_down() {
        let mut h = holds();
        h.failed("c", ms(0));
        h.failed("c", ms(900));
        assert!(h.expired(ms(1500)).is_empty());
        assert!(!h.is_empty(), "the later failure counts");
        assert_eq!(h.probes_due(ms(1500)).len(), 1, "one cluster, not two");
    }

    #[test]
    fn a_cluster_back_gets_its_requests_a_batch_at_a_time_and_newcomers_queue_behind() {
        let mut h: Holds<u32> = Holds::new(HoldPolicy { max_wait: ms(10_000), max_held: 1000 });
        h.failed("c", ms(0));
        for id in 0..120 {
            assert_eq!(h.admit("c", id, id, ms(1)), Admission::Held);
        }
        h.probes_due(ms(2));
        h.probing("c", 1);
        let first: Vec<u32> = h.probed(1, true).into_iter().map(|(_, r)| r.id).collect();
        assert_eq!(first, (0..50).collect::<Vec<_>>());
        assert_eq!(h.admit("c", 500, 500, ms(3)), Admission::Held, "behind the others");
        assert!(h.probes_due(ms(1000)).is_empty(), "up: no probe");
        let second: Vec<u32> = h.releases().into_iter().map(|(_, r)| r.id).collect();
        assert_eq!(second, (50..100).collect::<Vec<_>>());
        // Down again before the rest went: they wait for the next probe.
        h.failed("c", ms(4));
        assert!(h.releases().is_empty());
        assert_eq!(h.probes_due(ms(1000)), vec!["c".to_string()]);
        h.probing("c", 2);
        let rest: Vec<u32> = h.probed(2, true).into_iter().map(|(_, r)| r.id).collect();
        assert_eq!(rest, (100..120).chain([500]).collect::<Vec<_>>());
        assert!(h.is_empty() && h.held() == 0);
    }

    #[test]
    fn the_board_keeps_the_latest_finding_per_cluster_and_forgets_old_ones() {
        let board = board_with(b"", "c", 1000, 10_000);
        let board = board_with(&board, "set-a", 5000, 10_000);
        let board = board_with(&board, "c", 9000, 10_000);
        assert_eq!(board_entries(&board), [("set-a", 5000), ("c", 9000)]);
        let board = board_with(&board, "x", 16_000, 10_000);
        assert_eq!(board_entries(&board), [("c", 9000), ("x", 16_000)], "set-a found 11 s ago: gone");
        assert!(board_entries(b"\xff\xfe").is_empty());
        assert_eq!(board_entries(b"=1;c=x;d=2;junk"), [("d", 2)]);
    }

    #[test]
    fn requests_a_new_table_sends_elsewhere_are_taken_out() {
        let mut h = holds();
        h.failed("c", ms(0));
        h.admit("c", 1, "stays", ms(0));
        h.admit("c", 2, "goes", ms(0));
        let taken: Vec<_> = h.take_where(|p| *p == "goes").into_iter().map(|(c, r)| (c, r.id)).collect();
        assert_eq!(taken, [("c".to_string(), 2)]);
        assert_eq!(h.held(), 1);
    }
}
