//! The filter's side of [`skewgate_core::hold`]: streams paused at their request headers while
//! their cluster is down, released by the root context when a probe through that cluster
//! reaches an apiserver, or answered once they waited too long.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use skewgate_core::edits::Routed;
use skewgate_core::hold::{self, Answer, Held, Holds, Standing, Why};
use skewgate_core::policy::HoldPolicy;

use crate::active::Active;
use crate::host::Host;
use crate::metrics;

/// What became of a request that met a down cluster: released to its apiserver, answered after
/// the longest wait, answered because the live table now sends it elsewhere, answered to make
/// room for another client's, or not held (too many waiting, or its body too large to keep).
const OUTCOMES: [&str; 5] = ["resumed", "expired", "changed", "crowded", "refused"];

/// What answering a held stream needs: the table it was decided on, where it went.
pub struct Waiter<H: Host> {
    active: Rc<Active<H>>,
    routed: Routed,
}

/// One worker's held streams and the counts of what became of them.
pub struct Holding<H: Host> {
    host: H,
    /// The live table: a request decided on an older one goes on only if this one sends it to
    /// the same cluster.
    live: RefCell<Option<Rc<Active<H>>>>,
    /// The root context that took the live table: its ticks carry out the hold.
    live_root: Cell<Option<u32>>,
    holds: RefCell<Holds<Waiter<H>>>,
    /// The newest finding on the board this worker took over (milliseconds), if any.
    board_seen: Cell<Option<u64>>,
    /// Counter ids by (cluster, outcome), defined when first needed.
    counters: RefCell<BTreeMap<(String, &'static str), Option<u32>>>,
    waited: Option<u32>,
}

impl<H: Host> Holding<H> {
    pub fn new(host: H) -> Self {
        let waited = host.define_histogram(metrics::HOLD_MILLISECONDS);
        Self {
            live: RefCell::default(),
            live_root: Cell::new(None),
            board_seen: Cell::new(None),
            holds: RefCell::new(Holds::new(HoldPolicy::default())),
            counters: RefCell::default(),
            waited,
            host,
        }
    }

    /// A new table, and its policy: requests already held keep waiting, under its bounds, but
    /// for those it sends elsewhere (an API no longer served, or by others now), which are
    /// answered (in the ticks that follow, a bounded batch each: this is a call into the VM too):
    /// sent again, they are decided on it.
    pub fn set_live(&self, root: u32, active: &Rc<Active<H>>) {
        self.holds.borrow_mut().set_policy(active.table.policy().hold);
        *self.live.borrow_mut() = Some(active.clone());
        self.live_root.set(Some(root));
        let stale = |w: &Waiter<H>| {
            !Rc::ptr_eq(&w.active, active) && !w.routed.routed_alike(&w.active.table, &active.table)
        };
        let mut holds = self.holds.borrow_mut();
        holds.take_where(stale);
        // A cluster the table no longer has is gone from Envoy too (or about to be): nothing
        // would answer its probes.
        holds.retain_clusters(|c| active.table.has_cluster(c));
    }

    /// Whether root context `root` took the live table.
    pub fn is_live(&self, root: u32) -> bool {
        self.live_root.get() == Some(root)
    }

    /// Answers are queued: the root context ticks faster until they are out.
    pub fn busy(&self) -> bool {
        self.holds.borrow().busy()
    }

    /// `reply` as stream `id`'s local reply.
    fn send(&self, id: u32, reply: &skewgate_core::edits::Reply) {
        let headers = reply.headers();
        let headers = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.host.send_response_to(id, reply.status, headers, Some(reply.body.as_bytes()));
    }

    /// A waiting request answered at the edge: 503 with `Retry-After`.
    fn answer(&self, answer: Answer<Waiter<H>>) {
        let Answer { cluster, held, why } = answer;
        let waited = self.now().saturating_sub(held.since);
        self.holds.borrow_mut().settle(held.id, Standing::Answered);
        let Waiter { active, routed } = held.payload;
        let reply = match why {
            Why::Expired => {
                self.record(&cluster, "expired", waited);
                active.metrics.unavailable(routed.serving);
                routed.held_too_long(&active.table, waited)
            }
            Why::Changed => {
                self.record(&cluster, "changed", waited);
                routed.table_changed(&active.table)
            }
            Why::Crowded => {
                self.record(&cluster, "crowded", waited);
                active.metrics.unavailable(routed.serving);
                routed.crowded_out(&active.table, waited)
            }
        };
        self.send(held.id, &reply);
    }

    /// Stream `id`'s request for `cluster`: whether it is held ([`Holding::standing`] says
    /// where it stands from then on), or on its way.
    pub fn admit(&self, cluster: &str, id: u32, active: &Rc<Active<H>>, routed: &Routed) -> bool {
        if self.holds.borrow().is_empty() {
            return false;
        }
        let waiter = Waiter { active: active.clone(), routed: routed.clone() };
        // The waiting room is shared by source host: read only while something is down.
        let source = self.host.property(&["source", "address"]);
        let client = hold::client(&String::from_utf8_lossy(source.as_deref().unwrap_or_default()));
        let admission = self.holds.borrow_mut().admit(cluster, id, client, waiter, self.now());
        match admission {
            hold::Admission::Forward => false,
            hold::Admission::Held => true,
            hold::Admission::Full => {
                self.count(cluster, "refused");
                false
            }
        }
    }

    /// Where held stream `id` stands.
    pub fn standing(&self, id: u32) -> Option<Standing> {
        self.holds.borrow().standing(id)
    }

    /// Envoy answered for `cluster` that no apiserver took a request: marked here, and on the
    /// board for the other workers.
    pub fn failed(&self, cluster: &str) {
        self.mark(cluster);
        let (now, keep) = (millis(self.now()), millis(self.holds.borrow().policy().max_wait));
        for _ in 0..3 {
            let (board, cas) = self.host.shared_data(hold::BOARD_KEY);
            let board = hold::board_with(board.as_deref().unwrap_or_default(), cluster, now, keep);
            if self.host.set_shared_data(hold::BOARD_KEY, &board, cas) {
                break;
            }
        }
    }

    fn mark(&self, cluster: &str) {
        self.holds.borrow_mut().failed(cluster);
        // Every outcome's series from the first time the cluster is down, zeros included.
        for outcome in OUTCOMES {
            self.counter(cluster, outcome);
        }
    }

    /// Held stream `id`'s body has grown to `size` bytes: it keeps waiting while Envoy has room
    /// for it, else it is answered now (503, `Retry-After`).
    pub fn body_grew(&self, id: u32, size: usize) {
        let room = self.holds.borrow_mut().body_grew(id, size);
        if room == hold::BodyRoom::Kept {
            return;
        }
        let Some((cluster, held)) = self.holds.borrow_mut().take(id) else { return };
        self.count(&cluster, "refused");
        self.holds.borrow_mut().settle(id, Standing::Answered);
        let Waiter { active, routed } = held.payload;
        active.metrics.unavailable(routed.serving);
        self.send(id, &routed.body_too_large_to_hold(&active.table, room));
    }

    /// A held stream ended (its client left, or it is done).
    pub fn forget(&self, id: u32) {
        self.holds.borrow_mut().forget(id);
    }

    /// Every tick: what other workers found down, probes due, releases, and answers for streams
    /// that waited their time.
    pub fn tick(&self) {
        let now = self.now();
        if let (Some(board), _) = self.host.shared_data(hold::BOARD_KEY) {
            let keep = millis(self.holds.borrow().policy().max_wait);
            let (news, newest) = hold::board_news(&board, self.board_seen.get(), millis(now), keep);
            self.board_seen.set(newest);
            let live = self.live.borrow().clone();
            let known = |c: &str| live.as_ref().is_none_or(|l| l.table.has_cluster(c));
            for cluster in news.into_iter().filter(|c| known(c)) {
                self.mark(cluster);
            }
        }
        let due = self.holds.borrow_mut().probes_due(now);
        let headers = |cluster: &str| -> Vec<(&str, String)> {
            vec![
                (":method", "GET".into()),
                (":path", hold::PROBE_PATH.into()),
                (":authority", cluster.to_owned()),
            ]
        };
        for cluster in due {
            let h = headers(&cluster);
            let h = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
            match self.host.dispatch_call(&cluster, h, hold::PROBE_TIMEOUT) {
                Ok(token) => self.holds.borrow_mut().probing(&cluster, token),
                // Envoy failed the call before it left: no apiserver of the cluster to take it,
                // the answer the probe asks for, at every period until one is back.
                Err(proxy_wasm::types::Status::InternalFailure) => {
                    log::debug!("skewgate: cluster {cluster} still down")
                }
                Err(e) => log::warn!("skewgate: probing cluster {cluster}: {e:?}"),
            }
        }
        // Taken out before any host call: Envoy may call back into the streams.
        let due = self.holds.borrow_mut().due(now);
        for (cluster, held) in due.released {
            self.resume(&cluster, held);
        }
        for answer in due.answers {
            self.answer(answer);
        }
    }

    /// The answer to a probe: Envoy's own 503 (or none) says the cluster is still down, any
    /// other status that an apiserver took it.
    pub fn probed(&self, token: u32, status: Option<u16>) {
        let up = status.is_some_and(|s| s != 503);
        let released = self.holds.borrow_mut().probed(token, up, self.now());
        for (cluster, held) in released {
            self.resume(&cluster, held);
        }
    }

    fn resume(&self, cluster: &str, held: Held<Waiter<H>>) {
        let waited = self.now().saturating_sub(held.since);
        let live = self.live.borrow().clone();
        let Waiter { active, routed, .. } = &held.payload;
        let alike = live
            .as_ref()
            .is_none_or(|l| Rc::ptr_eq(l, active) || routed.routed_alike(&active.table, &l.table));
        if !alike {
            self.answer(Answer { cluster: cluster.to_owned(), held, why: Why::Changed });
            return;
        }
        self.record(cluster, "resumed", waited);
        self.holds.borrow_mut().settle(held.id, Standing::Resumed);
        self.host.resume_request(held.id);
    }

    fn record(&self, cluster: &str, outcome: &'static str, waited: Duration) {
        self.count(cluster, outcome);
        if let Some(id) = self.waited {
            self.host.record_metric(id, u64::try_from(waited.as_millis()).unwrap_or(u64::MAX));
        }
    }

    fn count(&self, cluster: &str, outcome: &'static str) {
        if let Some(id) = self.counter(cluster, outcome) {
            self.host.increment_metric(id, 1);
        }
    }

    fn counter(&self, cluster: &str, outcome: &'static str) -> Option<u32> {
        *self
            .counters
            .borrow_mut()
            .entry((cluster.to_owned(), outcome))
            .or_insert_with(|| self.host.define_counter(&metrics::held_requests(cluster, outcome)))
    }

    fn now(&self) -> Duration {
        self.host.now()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
