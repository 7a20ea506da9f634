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

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::policy::HoldPolicy;
use crate::table::{RoutingTable, Serving};

/// How often a down cluster is asked again.
pub const PROBE_PERIOD: Duration = Duration::from_millis(200);
/// The probe's request. Whatever the apiserver answers (its readiness, or 401: the probe carries
/// no identity), an answer means Envoy had an apiserver to send it to; only Envoy's own 503 says
/// it had none.
pub const PROBE_PATH: &str = "/readyz?exclude=shutdown";
/// Longer than Envoy's connect timeout: a probe that hangs is a down cluster.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests released at once, every [`RELEASE_PERIOD`], once their cluster is back: all of a
/// thousand at once to an apiserver that has just started means a thousand new upstream
/// connections in a moment (measured with a stand-in: Envoy then found connections failing,
/// ejected the apiserver and answered 1,331 of 1,823 released requests 503; 50 every 100 ms, none
/// failed on a quiet machine, while on one busy with other tests 1,219 still did). 500 a second
/// per worker.
pub const RELEASE_PER_TICK: usize = 50;

/// The largest request body a waiting request keeps. Envoy buffers what the client of a paused
/// request sends, up to its connection's buffer limit (1 MiB in the shipped bootstraps), and
/// answers 413 past it: an answer no client sends again. A request whose body grows past this
/// stops waiting and gets the 503 with `Retry-After` at once, which client-go sends again, body
/// and all. kube-apiserver takes bodies up to 3 MiB; a write is a few KiB.
pub const MAX_HELD_BODY: usize = 512 * 1024;

/// Whether requests for `serving` (`rerouted`: a serving set, not the pool) must meet the
/// proxy-wasm filter, the one part that holds requests, once its apiserver is away: the set of
/// one apiserver, the only server of its APIs, has nobody to take them while that apiserver
/// restarts, and a route that skips the filter (a bypass route, the native module's) would
/// answer 503 at once. Its bypass routes are for while it is up
/// ([`crate::bypass::Target::while_up`]); the native module hands them to the filter always.
/// Without a hold, a route does as well.
pub fn needs_the_filter(table: &RoutingTable, serving: Serving, rerouted: bool) -> bool {
    rerouted && !table.policy().hold.is_off() && table.members(serving).count() == 1
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

/// What the board tells a worker that has read its entries up to `seen` (ms, its clock), at
/// `now_ms`: the clusters another worker found down since, no longer ago than `keep_ms` (older
/// findings are stale: the cluster was probed since), and the newest finding now read, which the
/// worker keeps as its next `seen`.
pub fn board_news(board: &[u8], seen: Option<u64>, now_ms: u64, keep_ms: u64) -> (Vec<&str>, Option<u64>) {
    let entries = board_entries(board);
    let newest = entries.iter().map(|(_, at)| *at).chain(seen).max();
    let news = entries
        .into_iter()
        .filter(|(_, at)| seen.is_none_or(|seen| *at > seen) && now_ms.saturating_sub(*at) < keep_ms)
        .map(|(cluster, _)| cluster)
        .collect();
    (news, newest)
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

/// The most stream actions (a waiting request released, or answered at the edge) one call into
/// the filter's VM carries out. Envoy runs what a call asked for once the call returns, each
/// action one inside the one before (an answer runs the filter's response callback, at whose
/// end Envoy runs the remaining actions): measured, a few hundred answers at once overflowed
/// V8's stack, the VM was reloaded and every stream waiting in it hung until its route timed
/// out. [`RELEASE_PER_TICK`] releases and the rest of this in answers, per tick.
pub const ACTIONS_PER_CALL: usize = 64;

/// The filter's tick while answers are queued: [`ACTIONS_PER_CALL`] at each, so that a full
/// waiting room (1,024) is answered within 160 ms of its time rather than in 1.6 s. Releases keep
/// their own pace ([`RELEASE_PERIOD`]).
pub const BUSY_TICK: Duration = Duration::from_millis(10);

/// How often a cluster that is back gets its next [`RELEASE_PER_TICK`] waiting requests.
pub const RELEASE_PERIOD: Duration = Duration::from_millis(100);

/// Who sent a waiting request, as far as the edge can tell before any apiserver authenticated
/// it: its source address without the port. The waiting room is shared between them.
pub type Client = u64;

/// `source` (Envoy's `source.address`: `ip:port`, `[v6]:port`) as a [`Client`]: every connection
/// of one host is one client.
pub fn client(source: &str) -> Client {
    let host = match source.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => source,
    };
    // FNV-1a: stable across VMs and runs, and no dependency for eight bytes of state.
    host.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A request waiting: the stream (its context id), since when, and what answering it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<T> {
    pub id: u32,
    pub since: Duration,
    pub payload: T,
    /// The bytes of its body Envoy keeps for it so far.
    pub body: usize,
    pub client: Client,
}

/// Why a waiting request is answered at the edge rather than released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// It waited the longest wait.
    Expired,
    /// A new table sends it elsewhere, or no longer has its cluster.
    Changed,
    /// The waiting room was full, and a client with fewer waiting needed its place.
    Crowded,
}

/// A waiting request to answer (the 503 with `Retry-After`), with its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<T> {
    pub cluster: String,
    pub held: Held<T>,
    pub why: Why,
}

/// What a tick carries out: at most [`ACTIONS_PER_CALL`] in all.
#[derive(Debug)]
pub struct Due<T> {
    pub released: Vec<(String, Held<T>)>,
    pub answers: Vec<Answer<T>>,
}

#[derive(Debug)]
struct Down<T> {
    cluster: String,
    /// A probe reached an apiserver: the waiting requests are being released.
    up: bool,
    last_probe: Option<Duration>,
    last_release: Option<Duration>,
    probe: Option<u32>,
    waiting: Vec<Held<T>>,
}

/// Where a stream that was held stands: its own callbacks read it (a waiting stream's body waits
/// with it; an answered stream's response is the edge's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Paused at its request headers (or taken out, about to be answered).
    Waiting,
    /// Sent on, to whatever Envoy answers.
    Resumed,
    /// Answered at the edge (the 503 after the hold).
    Answered,
}

/// Every down cluster of one worker, the requests waiting for each, and those taken out to be
/// answered. Times are any clock that does not go back (Envoy's, in the filter).
#[derive(Debug)]
pub struct Holds<T> {
    policy: HoldPolicy,
    down: Vec<Down<T>>,
    /// Requests waiting, all clusters together.
    held: usize,
    /// Requests waiting, by client.
    by_client: BTreeMap<Client, usize>,
    /// Taken out, in order, to be answered [`ACTIONS_PER_CALL`] at a time: their streams are
    /// still paused in Envoy.
    answering: VecDeque<Answer<T>>,
    /// Every stream held, from its admission until it ends ([`Holds::forget`]).
    streams: BTreeMap<u32, Standing>,
}

impl<T> Holds<T> {
    pub fn new(policy: HoldPolicy) -> Self {
        Self {
            policy,
            down: Vec::new(),
            held: 0,
            by_client: BTreeMap::new(),
            answering: VecDeque::new(),
            streams: BTreeMap::new(),
        }
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

    /// Answers are queued: the filter ticks at [`BUSY_TICK`] until they are out.
    pub fn busy(&self) -> bool {
        !self.answering.is_empty()
    }

    /// A request for `cluster`, stream `id`, from `client`. In a full waiting room it takes the
    /// place of the newest request of the client with the most waiting, if that client has at
    /// least two more than this one: one client cannot keep the others out.
    pub fn admit(&mut self, cluster: &str, id: u32, client: Client, payload: T, now: Duration) -> Admission {
        let Some(at) = self.down.iter().position(|d| d.cluster == cluster) else {
            return Admission::Forward;
        };
        if self.policy.is_off() {
            return Admission::Full;
        }
        if self.held >= self.policy.max_held && !self.make_room_for(client) {
            return Admission::Full;
        }
        self.down[at].waiting.push(Held { id, since: now, payload, body: 0, client });
        self.streams.insert(id, Standing::Waiting);
        self.held += 1;
        *self.by_client.entry(client).or_default() += 1;
        Admission::Held
    }

    /// Answers the newest request of the client with the most waiting, if it has two more than
    /// `client` and the answers queued are fewer than the room holds.
    fn make_room_for(&mut self, client: Client) -> bool {
        let mine = self.by_client.get(&client).copied().unwrap_or(0);
        let Some((&top, &most)) = self.by_client.iter().max_by_key(|(_, n)| **n) else { return false };
        if top == client || mine + 2 > most || self.answering.len() >= self.policy.max_held {
            return false;
        }
        self.crowd_out_newest(|h| h.client == top)
    }

    /// Answers the newest waiting request `pick` chooses, to make room for another client's:
    /// whether there was one.
    fn crowd_out_newest(&mut self, pick: impl Fn(&Held<T>) -> bool) -> bool {
        let newest = self
            .down
            .iter()
            .enumerate()
            .flat_map(|(d, down)| down.waiting.iter().enumerate().map(move |(w, h)| (d, w, h)))
            .filter(|(_, _, h)| pick(h))
            .max_by_key(|(_, _, h)| h.since)
            .map(|(d, w, _)| (d, w));
        let Some((d, w)) = newest else { return false };
        let held = self.down[d].waiting.remove(w);
        let cluster = self.down[d].cluster.clone();
        self.left(&held);
        self.answering.push_back(Answer { cluster, held, why: Why::Crowded });
        true
    }

    /// `held` no longer waits.
    fn left(&mut self, held: &Held<T>) {
        self.held -= 1;
        if let Some(n) = self.by_client.get_mut(&held.client) {
            *n -= 1;
            if *n == 0 {
                self.by_client.remove(&held.client);
            }
        }
    }

    /// Envoy found no apiserver of `cluster` to take a request. It stays down until a probe
    /// through it reaches an apiserver, however long that takes and whether or not anything
    /// waits for it.
    pub fn failed(&mut self, cluster: &str) {
        if self.policy.is_off() {
            return;
        }
        match self.down.iter_mut().find(|d| d.cluster == cluster) {
            Some(down) => down.up = false,
            None => self.down.push(Down {
                cluster: cluster.to_owned(),
                up: false,
                last_probe: None,
                last_release: None,
                probe: None,
                waiting: Vec::new(),
            }),
        }
    }

    /// The clusters to probe now: down, with no probe under way, not probed for
    /// [`PROBE_PERIOD`]. Each is then [`Holds::probing`] or, when the probe could not be sent,
    /// left to the next period. A probe unanswered for twice its timeout is given up: its answer
    /// went to a root context Envoy has since dropped (a table pushed meanwhile), and waiting for
    /// it would keep the cluster down for good.
    pub fn probes_due(&mut self, now: Duration) -> Vec<String> {
        let lost = |at: Option<Duration>| at.is_some_and(|at| now.saturating_sub(at) >= PROBE_TIMEOUT * 2);
        let due = |d: &&mut Down<T>| {
            !d.up
                && (d.probe.is_none() || lost(d.last_probe))
                && d.last_probe.is_none_or(|at| now.saturating_sub(at) >= PROBE_PERIOD)
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
    /// [`RELEASE_PER_TICK`] now and as many every [`RELEASE_PERIOD`] after ([`Holds::due`]);
    /// requests that come meanwhile queue behind them.
    pub fn probed(&mut self, token: u32, up: bool, now: Duration) -> Vec<(String, Held<T>)> {
        let Some(down) = self.down.iter_mut().find(|d| d.probe == Some(token)) else { return Vec::new() };
        down.probe = None;
        down.up = up;
        if !up {
            return Vec::new();
        }
        down.last_release = None;
        self.releases(now, RELEASE_PER_TICK)
    }

    /// The next requests of every cluster that is back and has not released for
    /// [`RELEASE_PERIOD`], at most `budget` in all; a cluster with none left waiting is up for
    /// good.
    fn releases(&mut self, now: Duration, budget: usize) -> Vec<(String, Held<T>)> {
        let mut out = Vec::new();
        for down in self.down.iter_mut().filter(|d| d.up) {
            if down.last_release.is_some_and(|at| now.saturating_sub(at) < RELEASE_PERIOD) {
                continue;
            }
            let n = down.waiting.len().min(RELEASE_PER_TICK).min(budget - out.len());
            if n > 0 {
                down.last_release = Some(now);
            }
            out.extend(down.waiting.drain(..n).map(|h| (down.cluster.clone(), h)));
        }
        for (_, held) in &out {
            self.left(held);
        }
        self.down.retain(|d| !(d.up && d.waiting.is_empty()));
        out
    }

    /// What to carry out now: the requests that waited `max_wait` join the answers queued, then
    /// the releases due and the first answers, [`ACTIONS_PER_CALL`] in all.
    pub fn due(&mut self, now: Duration) -> Due<T> {
        let max_wait = self.policy.max_wait;
        let waited = |h: &Held<T>| now.saturating_sub(h.since) >= max_wait;
        self.take_out(Why::Expired, |_, h| waited(h));
        let released = self.releases(now, RELEASE_PER_TICK.min(ACTIONS_PER_CALL));
        let n = self.answering.len().min(ACTIONS_PER_CALL - released.len());
        Due { released, answers: self.answering.drain(..n).collect() }
    }

    /// Moves the waiting requests `pick` chooses (by cluster and request) to the answers, in the
    /// order they came.
    fn take_out(&mut self, why: Why, mut pick: impl FnMut(&str, &Held<T>) -> bool) {
        let mut out = Vec::new();
        for down in &mut self.down {
            let (gone, kept) = std::mem::take(&mut down.waiting)
                .into_iter()
                .partition::<Vec<_>, _>(|h| pick(&down.cluster, h));
            down.waiting = kept;
            out.extend(gone.into_iter().map(|held| Answer { cluster: down.cluster.clone(), held, why }));
        }
        out.sort_by_key(|a| a.held.since);
        for answer in &out {
            self.left(&answer.held);
        }
        self.answering.extend(out);
    }

    /// The waiting requests `stale` picks (a new table sends them elsewhere), to be answered
    /// rather than left to wait for a cluster they no longer belong to.
    pub fn take_where(&mut self, mut stale: impl FnMut(&T) -> bool) {
        self.take_out(Why::Changed, |_, h| stale(&h.payload));
    }

    /// Forgets the down clusters `known` says no longer exist (a new table without them); what
    /// waits for them is to be answered: nothing would probe or release them again.
    pub fn retain_clusters(&mut self, mut known: impl FnMut(&str) -> bool) {
        self.take_out(Why::Changed, |cluster, _| !known(cluster));
        self.down.retain(|d| known(&d.cluster));
    }

    /// Stream `id`, if it waits, taken out (to be answered now), with its cluster.
    pub fn take(&mut self, id: u32) -> Option<(String, Held<T>)> {
        let (d, w) = self
            .down
            .iter()
            .enumerate()
            .find_map(|(d, down)| down.waiting.iter().position(|h| h.id == id).map(|w| (d, w)))?;
        let held = self.down[d].waiting.remove(w);
        self.left(&held);
        Some((self.down[d].cluster.clone(), held))
    }

    /// Waiting stream `id`'s body has grown to `size` bytes: whether it may keep waiting, within
    /// [`MAX_HELD_BODY`] and [`MAX_HELD_BODIES`]. A stream not waiting has room. The room for
    /// bodies is shared as the room for requests is: when it is full, the newest waiting body of
    /// the client whose bodies take the most, if more than this client's would, is answered to
    /// make room (one client cannot keep the others' writes out).
    pub fn body_grew(&mut self, id: u32, size: usize) -> BodyRoom {
        let Some(client) = self.waiting().find(|h| h.id == id).map(|h| h.client) else {
            return BodyRoom::Kept;
        };
        if size > MAX_HELD_BODY {
            return BodyRoom::TooLarge;
        }
        loop {
            let all = self.bodies();
            let Some(held) = self.down.iter_mut().flat_map(|d| d.waiting.iter_mut()).find(|h| h.id == id)
            else {
                return BodyRoom::Kept;
            };
            if all - held.body + size <= MAX_HELD_BODIES {
                held.body = size;
                return BodyRoom::Kept;
            }
            let growth = size.saturating_sub(held.body);
            if !self.make_body_room_for(client, id, growth) {
                return BodyRoom::NoRoom;
            }
        }
    }

    /// Answers the newest waiting body of the client whose waiting bodies take the most, if that
    /// is more than `client`'s will once its stream `id` grows by `growth`.
    fn make_body_room_for(&mut self, client: Client, id: u32, growth: usize) -> bool {
        let mut by_client: BTreeMap<Client, usize> = BTreeMap::new();
        for h in self.waiting() {
            *by_client.entry(h.client).or_default() += h.body;
        }
        let mine = by_client.get(&client).copied().unwrap_or(0) + growth;
        let Some((&top, &most)) = by_client.iter().max_by_key(|(_, bytes)| **bytes) else { return false };
        if top == client || most <= mine {
            return false;
        }
        self.crowd_out_newest(|h| h.client == top && h.body > 0 && h.id != id)
    }

    /// Every waiting request.
    fn waiting(&self) -> impl Iterator<Item = &Held<T>> {
        self.down.iter().flat_map(|d| d.waiting.iter())
    }

    /// The bytes the waiting requests' bodies take (those queued to be answered too keep theirs
    /// in Envoy until then, one tick at most, and are not counted): counted only when a body
    /// grows, a few hundred additions at most.
    pub fn bodies(&self) -> usize {
        self.waiting().map(|h| h.body).sum()
    }

    /// Where held stream `id` stands; `None` for a stream never held (or ended).
    pub fn standing(&self, id: u32) -> Option<Standing> {
        self.streams.get(&id).copied()
    }

    /// Held stream `id` was let go as `standing` says (the caller carried out a release or an
    /// answer it took out).
    pub fn settle(&mut self, id: u32, standing: Standing) {
        if let Some(s) = self.streams.get_mut(&id) {
            *s = standing;
        }
    }

    /// Stream `id` ended. Whether it still waited or was about to be answered (the client went
    /// away): nothing to answer.
    pub fn forget(&mut self, id: u32) -> bool {
        self.streams.remove(&id);
        if self.take(id).is_some() {
            return true;
        }
        let before = self.answering.len();
        self.answering.retain(|a| a.held.id != id);
        self.answering.len() < before
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

    const ALICE: Client = 1;
    const BOB: Client = 2;

    fn ids<T>(released: &[(String, Held<T>)]) -> Vec<u32> {
        released.iter().map(|(_, h)| h.id).collect()
    }

    fn answered<T>(due: &Due<T>) -> Vec<(u32, Why)> {
        due.answers.iter().map(|a| (a.held.id, a.why)).collect()
    }

    #[test]
    fn nothing_is_held_until_envoy_finds_a_cluster_down() {
        let mut h = holds();
        assert!(h.is_empty());
        assert_eq!(h.admit("c", 1, ALICE, "r1", ms(0)), Admission::Forward);
        h.failed("c");
        assert!(!h.is_empty());
        assert_eq!(h.admit("c", 2, ALICE, "r2", ms(20)), Admission::Held);
        assert_eq!(h.admit("other", 3, ALICE, "r3", ms(20)), Admission::Forward, "only that cluster");
        assert_eq!(h.held(), 1);
    }

    /// A held stream stands where the caller settled it until it ends; one never held, nowhere.
    #[test]
    fn a_held_stream_stands_waiting_then_where_it_was_let_go_until_it_ends() {
        let mut h = Holds::new(HoldPolicy { max_wait: ms(1000), max_held: 10 });
        h.failed("c");
        h.admit("c", 1, ALICE, "resumed", ms(0));
        h.admit("c", 2, ALICE, "answered", ms(0));
        h.admit("c", 3, ALICE, "left", ms(0));
        assert_eq!(h.standing(4), None);
        assert_eq!((h.standing(1), h.standing(2)), (Some(Standing::Waiting), Some(Standing::Waiting)));
        h.settle(1, Standing::Resumed);
        h.settle(2, Standing::Answered);
        h.settle(4, Standing::Resumed);
        assert_eq!(
            (h.standing(1), h.standing(2), h.standing(4)),
            (Some(Standing::Resumed), Some(Standing::Answered), None)
        );
        assert!(h.forget(3), "it was waiting");
        for id in [1, 2, 3] {
            h.forget(id);
            assert_eq!(h.standing(id), None, "{id} ended: nothing kept");
        }
        assert!(h.streams.is_empty());
    }

    #[test]
    fn a_probe_never_answered_is_given_up_and_sent_again() {
        let mut h = holds();
        h.failed("c");
        h.admit("c", 1, ALICE, "r1", ms(0));
        assert_eq!(h.probes_due(ms(0)), ["c"]);
        h.probing("c", 7);
        assert!(h.probes_due(ms(3_999)).is_empty(), "under way");
        assert_eq!(h.probes_due(ms(4_000)), ["c"], "lost after twice the probe's timeout");
        h.probing("c", 8);
        assert!(h.probed(7, true, ms(4_010)).is_empty(), "the lost probe's late answer counts for nothing");
        assert_eq!(h.probed(8, true, ms(4_020)).len(), 1);
    }

    #[test]
    fn an_answered_probe_releases_every_waiting_request_in_order() {
        let mut h = holds();
        h.failed("c");
        h.admit("c", 1, ALICE, "first", ms(1));
        h.admit("c", 2, ALICE, "second", ms(2));
        assert_eq!(h.probes_due(ms(5)), vec!["c".to_string()]);
        h.probing("c", 7);
        assert_eq!(h.probes_due(ms(500)), Vec::<String>::new(), "one probe at a time");
        assert!(h.probed(7, false, ms(50)).is_empty(), "still down");
        assert_eq!(h.probes_due(ms(100)), Vec::<String>::new(), "not before the period");
        assert_eq!(h.probes_due(ms(205)), vec!["c".to_string()]);
        h.probing("c", 8);
        let released: Vec<_> =
            h.probed(8, true, ms(210)).into_iter().map(|(c, r)| (c, r.id, r.payload)).collect();
        assert_eq!(released, [("c".into(), 1, "first"), ("c".into(), 2, "second")]);
        assert!(h.is_empty() && h.held() == 0);
        assert_eq!(h.admit("c", 3, ALICE, "r", ms(300)), Admission::Forward, "up again");
        assert!(h.probed(8, true, ms(300)).is_empty(), "an answer to a forgotten probe releases nothing");
    }

    #[test]
    fn a_cluster_no_longer_known_is_forgotten_and_its_waiting_requests_answered() {
        let mut h = holds();
        h.failed("c");
        h.failed("d");
        assert_eq!(h.admit("c", 1, ALICE, "r1", ms(0)), Admission::Held);
        assert_eq!(h.admit("d", 2, ALICE, "r2", ms(0)), Admission::Held);
        h.retain_clusters(|c| c == "d");
        assert!(h.busy());
        assert_eq!(h.held(), 1);
        assert_eq!(h.probes_due(ms(0)), ["d"], "only the known one is probed");
        assert_eq!(answered(&h.due(ms(1))), [(1, Why::Changed)]);
        assert!(!h.busy());
        assert_eq!(h.admit("c", 3, ALICE, "r3", ms(0)), Admission::Forward);
        assert_eq!(h.take(2).map(|(c, held)| (c, held.payload)), Some(("d".to_string(), "r2")));
        assert_eq!(h.held(), 0);
        assert!(h.take(2).is_none());
    }

    #[test]
    fn waiting_bodies_are_bounded_each_and_together() {
        let mut h = Holds::new(HoldPolicy { max_wait: ms(1000), max_held: 1000 });
        h.failed("c");
        let n = MAX_HELD_BODIES / MAX_HELD_BODY;
        for id in 0..n as u32 {
            assert_eq!(h.admit("c", id, ALICE, "w", ms(0)), Admission::Held);
            assert_eq!(h.body_grew(id, MAX_HELD_BODY / 2), BodyRoom::Kept);
            assert_eq!(h.body_grew(id, MAX_HELD_BODY), BodyRoom::Kept, "a body grows in place");
        }
        assert_eq!(h.bodies(), MAX_HELD_BODIES);
        let next = n as u32;
        assert_eq!(
            h.admit("c", next, ALICE, "w", ms(0)),
            Admission::Held,
            "a request without a body still waits"
        );
        assert_eq!(h.body_grew(next, 1), BodyRoom::NoRoom);
        assert_eq!(h.body_grew(0, MAX_HELD_BODY + 1), BodyRoom::TooLarge);
        assert_eq!(h.body_grew(99_999, 1 << 30), BodyRoom::Kept, "not waiting: not ours to bound");
        // A body that leaves frees its room, however it leaves.
        assert!(h.take(0).is_some());
        assert_eq!(h.body_grew(next, MAX_HELD_BODY), BodyRoom::Kept);
        assert!(h.forget(1));
        let due = h.due(ms(1000));
        assert_eq!(due.answers.len(), n - 1);
        assert_eq!(h.held(), 0);
        assert_eq!(h.bodies(), 0, "answered: Envoy no longer keeps them");
    }

    #[test]
    fn past_the_bound_a_request_goes_on_to_its_503() {
        let mut h = holds();
        h.failed("c");
        assert_eq!(h.admit("c", 1, ALICE, "a", ms(0)), Admission::Held);
        assert_eq!(h.admit("c", 2, ALICE, "b", ms(0)), Admission::Held);
        assert_eq!(h.admit("c", 3, ALICE, "c", ms(0)), Admission::Full);
        assert_eq!(h.held(), 2);
        assert!(h.forget(1));
        assert!(!h.forget(1), "forgotten once");
        assert_eq!(h.admit("c", 4, ALICE, "d", ms(0)), Admission::Held, "room again");
    }

    #[test]
    fn a_request_waits_at_most_max_wait() {
        let mut h = holds();
        h.failed("c");
        h.admit("c", 1, ALICE, "early", ms(100));
        h.admit("c", 2, ALICE, "late", ms(600));
        assert!(h.due(ms(1099)).answers.is_empty());
        assert_eq!(answered(&h.due(ms(1100))), [(1, Why::Expired)]);
        assert_eq!(h.held(), 1);
        assert_eq!(answered(&h.due(ms(1600))), [(2, Why::Expired)]);
        assert_eq!(h.held(), 0);
    }

    #[test]
    fn an_outage_is_remembered_until_a_probe_says_it_is_over() {
        let mut h = holds();
        h.failed("c");
        h.admit("c", 1, ALICE, "r", ms(0));
        assert_eq!(h.due(ms(1000)).answers.len(), 1);
        // Long after the last wait ran out, nobody waiting: still down, so the next request
        // waits too rather than finding it down again with a 503 of its own.
        assert!(h.due(ms(60_000)).answers.is_empty());
        assert!(!h.is_empty());
        assert_eq!(h.admit("c", 2, ALICE, "r", ms(60_000)), Admission::Held);
        assert_eq!(h.probes_due(ms(60_000)), ["c"], "probed all along");
        h.probing("c", 9);
        assert_eq!(ids(&h.probed(9, true, ms(60_100))), [2]);
        assert!(h.is_empty(), "over");
    }

    #[test]
    fn a_zero_wait_holds_nothing() {
        let mut h: Holds<()> = Holds::new(HoldPolicy { max_wait: Duration::ZERO, max_held: 10 });
        h.failed("c");
        assert!(h.is_empty());
        assert_eq!(h.admit("c", 1, ALICE, (), ms(0)), Admission::Forward);
    }

    #[test]
    fn a_failure_while_down_keeps_the_cluster_down() {
        let mut h = holds();
        h.failed("c");
        h.failed("c");
        assert_eq!(h.probes_due(ms(1500)).len(), 1, "one cluster, not two");
    }

    #[test]
    fn a_cluster_back_gets_its_requests_a_batch_at_a_time_and_newcomers_queue_behind() {
        let mut h: Holds<u32> = Holds::new(HoldPolicy { max_wait: ms(10_000), max_held: 1000 });
        h.failed("c");
        for id in 0..120 {
            assert_eq!(h.admit("c", id, ALICE, id, ms(1)), Admission::Held);
        }
        h.probes_due(ms(2));
        h.probing("c", 1);
        assert_eq!(ids(&h.probed(1, true, ms(3))), (0..50).collect::<Vec<_>>());
        assert_eq!(h.admit("c", 500, ALICE, 500, ms(3)), Admission::Held, "behind the others");
        assert!(h.probes_due(ms(1000)).is_empty(), "up: no probe");
        assert!(h.due(ms(50)).released.is_empty(), "not before the release period");
        assert_eq!(ids(&h.due(ms(103)).released), (50..100).collect::<Vec<_>>());
        // Down again before the rest went: they wait for the next probe.
        h.failed("c");
        assert!(h.due(ms(300)).released.is_empty());
        assert_eq!(h.probes_due(ms(1000)), vec!["c".to_string()]);
        h.probing("c", 2);
        assert_eq!(ids(&h.probed(2, true, ms(1001))), (100..120).chain([500]).collect::<Vec<_>>());
        assert!(h.is_empty() && h.held() == 0);
    }

    /// Envoy carries out what one call into the VM asked for one action inside the other: a
    /// full waiting room expiring together goes out a bounded batch at a time, in order.
    #[test]
    fn a_full_waiting_room_is_answered_a_bounded_batch_at_a_time() {
        let mut h: Holds<u32> = Holds::new(HoldPolicy { max_wait: ms(10_000), max_held: 1024 });
        h.failed("c");
        h.failed("d");
        for id in 0..1024 {
            let cluster = if id % 2 == 0 { "c" } else { "d" };
            assert_eq!(h.admit(cluster, id, ALICE, id, ms(u64::from(id % 7))), Admission::Held);
        }
        let mut out = Vec::new();
        let mut calls = 0;
        loop {
            let due = h.due(ms(10_010));
            assert!(due.released.len() + due.answers.len() <= ACTIONS_PER_CALL);
            if due.answers.is_empty() {
                break;
            }
            calls += 1;
            out.extend(due.answers.iter().map(|a| (a.held.since, a.why)));
        }
        assert_eq!((out.len(), calls), (1024, 1024 / ACTIONS_PER_CALL));
        assert!(out.windows(2).all(|w| w[0].0 <= w[1].0), "the longest waiting first");
        assert!(out.iter().all(|(_, why)| *why == Why::Expired));
        assert!(!h.busy() && h.held() == 0);
    }

    #[test]
    fn releases_and_answers_share_a_calls_budget() {
        let mut h: Holds<u32> = Holds::new(HoldPolicy { max_wait: ms(10_000), max_held: 1024 });
        h.failed("c");
        h.failed("d");
        for id in 0..200 {
            h.admit("c", id, ALICE, id, ms(0));
            h.admit("d", 1000 + id, ALICE, id, ms(5_000));
        }
        h.probes_due(ms(9_000));
        h.probing("d", 1);
        assert_eq!(h.probed(1, true, ms(9_000)).len(), RELEASE_PER_TICK);
        let due = h.due(ms(10_000));
        assert_eq!(
            (due.released.len(), due.answers.len()),
            (RELEASE_PER_TICK, ACTIONS_PER_CALL - RELEASE_PER_TICK)
        );
        assert_eq!(h.due(ms(10_010)).answers.len(), ACTIONS_PER_CALL, "no release due: all answers");
    }

    #[test]
    fn requests_a_new_table_sends_elsewhere_are_answered_in_batches() {
        let mut h = holds();
        h.failed("c");
        h.admit("c", 1, ALICE, "stays", ms(0));
        h.admit("c", 2, ALICE, "goes", ms(0));
        h.take_where(|p| *p == "goes");
        assert_eq!(h.held(), 1);
        assert!(h.busy());
        assert_eq!(answered(&h.due(ms(1))), [(2, Why::Changed)]);
    }

    #[test]
    fn a_stream_that_ends_before_its_answer_is_not_answered() {
        let mut h = holds();
        h.failed("c");
        h.admit("c", 1, ALICE, "r", ms(0));
        h.take_where(|_| true);
        assert!(h.forget(1));
        assert!(!h.busy() && h.due(ms(1)).answers.is_empty());
    }

    /// One client cannot keep others out of a full waiting room: a newcomer with fewer waiting
    /// takes the place of the newest request of the client with the most.
    #[test]
    fn a_full_waiting_room_is_shared_between_clients() {
        let mut h: Holds<u32> = Holds::new(HoldPolicy { max_wait: ms(10_000), max_held: 10 });
        h.failed("c");
        for id in 0..10 {
            assert_eq!(h.admit("c", id, ALICE, id, ms(u64::from(id))), Admission::Held);
        }
        assert_eq!(h.admit("c", 10, ALICE, 10, ms(20)), Admission::Full, "alice already has the most");
        for id in 100..105 {
            assert_eq!(h.admit("c", id, BOB, id, ms(30)), Admission::Held, "bob gets in");
        }
        assert_eq!(h.held(), 10);
        assert_eq!(h.admit("c", 105, BOB, 105, ms(31)), Admission::Full, "an even share each: no more");
        let crowded = h.due(ms(40));
        assert_eq!(answered(&crowded), [9, 8, 7, 6, 5].map(|id| (id, Why::Crowded)), "alice's newest");
        assert!(crowded.answers.iter().all(|a| a.held.client == ALICE));
        assert_eq!(client("10.0.0.1:5555"), client("10.0.0.1:6666"), "one host, one client");
        assert_ne!(client("10.0.0.1:5555"), client("10.0.0.2:5555"));
        assert_eq!(client("[::1]:443"), client("[::1]:80"));
    }

    /// The room for bodies is shared too: once one client's writes fill it, another's write
    /// takes the place of the newest of the first client's, not the 503.
    #[test]
    fn the_room_for_bodies_is_shared_between_clients() {
        let mut h: Holds<u32> = Holds::new(HoldPolicy { max_wait: ms(10_000), max_held: 1000 });
        h.failed("c");
        let n = (MAX_HELD_BODIES / MAX_HELD_BODY) as u32;
        for id in 0..n {
            assert_eq!(h.admit("c", id, ALICE, id, ms(u64::from(id))), Admission::Held);
            assert_eq!(h.body_grew(id, MAX_HELD_BODY), BodyRoom::Kept);
        }
        assert_eq!(h.admit("c", n, ALICE, n, ms(100)), Admission::Held);
        assert_eq!(h.body_grew(n, 1), BodyRoom::NoRoom, "alice's own: no one to make room");
        for id in 100..103 {
            assert_eq!(h.admit("c", id, BOB, id, ms(200)), Admission::Held);
            assert_eq!(h.body_grew(id, MAX_HELD_BODY / 2), BodyRoom::Kept, "bob's writes get in");
            assert_eq!(h.body_grew(id, MAX_HELD_BODY), BodyRoom::Kept, "and grow");
        }
        assert!(h.bodies() <= MAX_HELD_BODIES);
        let crowded = h.due(ms(300));
        assert_eq!(answered(&crowded), [(n - 1, Why::Crowded), (n - 2, Why::Crowded), (n - 3, Why::Crowded)]);
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
    fn a_worker_reads_only_findings_it_has_not_seen_and_that_are_fresh() {
        let board = b"set-a=5000;c=9000;x=16000;";
        // First read: what is fresh (set-a was found 11 s ago).
        assert_eq!(board_news(board, None, 16_000, 10_000), (vec!["c", "x"], Some(16_000)));
        // Later reads: only what came after the newest it read, stale or not.
        assert_eq!(board_news(board, Some(9000), 16_500, 10_000), (vec!["x"], Some(16_000)));
        assert_eq!(board_news(board, Some(16_000), 17_000, 10_000), (vec![], Some(16_000)));
        assert_eq!(board_news(board, Some(16_000), 30_000, 10_000).1, Some(16_000));
        // A finding older than the newest already read is not news.
        assert_eq!(board_news(b"c=100;", Some(16_000), 16_100, 10_000), (vec![], Some(16_000)));
        assert_eq!(board_news(b"", Some(7), 8, 10_000), (vec![], Some(7)));
        assert_eq!(board_news(b"junk", None, 8, 10_000), (vec![], None));
    }
}
