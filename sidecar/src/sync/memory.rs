//! What the sidecar remembers of one apiserver, and how each look changes it.

use tokio::time::Instant;

use super::Standing;
use crate::eligibility::{Exclusion, Served};
use crate::fetch::{Documents, ErrorKind, Etags, FetchError};
use crate::peers::Source;
use crate::tether::Readiness;

/// Looks in a row without an answer in time that make a reachable apiserver unreachable.
pub(super) const TIMEOUTS_OUT: u32 = 2;

/// What is remembered of one apiserver.
#[derive(Debug, Default)]
pub(super) struct Memory {
    /// The last good documents and what they serve: kept while the apiserver is configured.
    pub(super) good: Option<(Documents, Served, Instant)>,
    pub(super) failing: bool,
    /// The latest look's failure.
    pub(super) error: Option<FetchError>,
    /// The latest look reached its discovery.
    pub(super) reachable: bool,
    /// Looks in a row that got no answer in time.
    pub(super) timeouts: u32,
    /// `/readyz` at the latest probe.
    pub(super) ready: Option<Readiness>,
    /// When the look behind what is remembered started: a slower, older look that finishes
    /// later must not undo what a newer one found.
    pub(super) seen: Option<Instant>,
    /// Since when it is marked `DRAINING`.
    pub(super) excluded_since: Option<Instant>,
    pub(super) excluded: Option<Exclusion>,
    pub(super) source: Source,
    /// Found in the cluster while running: it enters the table once its discovery answered.
    pub(super) joined: bool,
    /// Since when the cluster no longer publishes it.
    pub(super) departed_since: Option<Instant>,
}

impl Memory {
    /// Whether a look that started at `started` is newer than what is remembered (and is then
    /// what counts).
    pub(super) fn newer(&mut self, started: Instant) -> bool {
        if self.seen.is_some_and(|seen| started < seen) {
            return false;
        }
        self.seen = Some(started);
        true
    }

    pub(super) fn standing(&self, now: Instant) -> Standing {
        match (&self.good, self.failing) {
            (Some(_), false) => Standing::Current,
            (Some((_, _, at)), true) => Standing::Stale { age: now.duration_since(*at) },
            (None, _) => Standing::Missing,
        }
    }

    /// Documents from a look older than what is remembered: they only fill a gap. Ones that
    /// differ from what a newer look found are dropped; the next probe asks again.
    pub(super) fn fill(&mut self, documents: Documents, now: Instant) -> bool {
        if self.good.is_some() {
            return false;
        }
        let served = Served::of(&documents);
        self.good = Some((documents, served, now));
        true
    }

    /// Returns whether the documents changed.
    pub(super) fn answered(&mut self, id: &str, documents: Documents, now: Instant) -> bool {
        self.answers(id, "discovery answers again");
        // ETags alone say nothing the table needs: a server whose ETag is not a pure function of
        // its documents must not cause a push (and a save) at every probe.
        let changed = self.good.as_ref().is_none_or(|(d, _, _)| {
            (&d.version, &d.core, &d.apis, d.legacy, &d.legacy_documents)
                != (
                    &documents.version,
                    &documents.core,
                    &documents.apis,
                    documents.legacy,
                    &documents.legacy_documents,
                )
        });
        let served = Served::of(&documents);
        self.good = Some((documents, served, now));
        changed
    }

    pub(super) fn failed(&mut self, id: &str, error: FetchError) {
        if !self.failing {
            match self.good.is_some() {
                true => tracing::warn!(
                    apiserver = id,
                    %error,
                    "discovery failed; its last good documents stay in the table until it answers"
                ),
                false => {
                    tracing::warn!(apiserver = id, %error, "discovery failed; it serves nothing in the table")
                }
            }
        } else {
            tracing::debug!(apiserver = id, %error, "discovery still failing");
        }
        self.failing = true;
        // Over a `[limits]` bound the apiserver still answers, and what it serves in the table
        // (its last good documents) is unchanged: it keeps its requests. So does one that was
        // reachable and is slow to answer once: a busy apiserver (one that has just started,
        // under load) misses a deadline now and then, and taking out the only server of an API
        // for it fails every request for that API. A process that stopped closes the
        // connection (at once) and one frozen misses the next deadline too. Anything else counts
        // as unreachable.
        (self.timeouts, self.reachable) = match error.kind {
            ErrorKind::Limit => (0, true),
            ErrorKind::Timeout => {
                let timeouts = self.timeouts.saturating_add(1);
                (timeouts, self.reachable && timeouts < TIMEOUTS_OUT)
            }
            _ => (0, false),
        };
        self.error = Some(error);
    }

    /// A probe found its documents unchanged: it answers.
    pub(super) fn unchanged(&mut self, id: &str) {
        self.answers(id, "discovery answers again, unchanged");
    }

    /// Its discovery answered: whatever failed before is over (`again` is logged if it did).
    fn answers(&mut self, id: &str, again: &'static str) {
        if self.failing {
            tracing::info!(apiserver = id, "{again}");
        }
        self.failing = false;
        self.error = None;
        self.reachable = true;
        self.timeouts = 0;
    }

    pub(super) fn readiness(&mut self, id: &str, ready: Readiness) {
        if self.ready != Some(ready) {
            match ready {
                Readiness::Ready => tracing::info!(apiserver = id, "ready"),
                Readiness::Stopping => {
                    tracing::info!(
                        apiserver = id,
                        "stopping (/readyz: shutdown): it serves until it stops answering"
                    )
                }
                Readiness::Unready => tracing::info!(apiserver = id, "not ready (/readyz)"),
            }
        }
        self.ready = Some(ready);
    }

    pub(super) fn etags(&self) -> Etags {
        self.good.as_ref().map(|(d, _, _)| d.etags.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use skewgate_core::discovery::ApiGroupDiscoveryList;

    use super::*;

    pub(in crate::sync) fn docs(version: &str) -> Documents {
        Documents {
            version: version.into(),
            core: ApiGroupDiscoveryList::v2(Vec::new()),
            apis: ApiGroupDiscoveryList::v2(Vec::new()),
            legacy: false,
            etags: Etags::default(),
            legacy_documents: None,
            features: Default::default(),
        }
    }

    fn failure() -> FetchError {
        FetchError { path: "/apis".into(), kind: ErrorKind::Connect, detail: "x".into() }
    }

    /// No timer: the last good documents stand for as long as the apiserver fails.
    #[test]
    fn last_good_documents_stay_until_it_answers_again() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m = Memory::default();
        m.failed("a", failure());
        assert_eq!(m.standing(at(0)), Standing::Missing);
        assert!(m.answered("a", docs("v1.33.0"), at(1)));
        assert_eq!(m.standing(at(1)), Standing::Current);
        assert!(m.reachable && !m.failing);
        m.failed("a", failure());
        assert_eq!(m.standing(at(3600)), Standing::Stale { age: Duration::from_secs(3599) });
        assert!(m.good.is_some() && !m.reachable);
        assert!(!m.answered("a", docs("v1.33.0"), at(3601)), "the same documents are no change");
        assert!(m.answered("a", docs("v1.36.0"), at(3602)));
        assert_eq!(m.standing(at(3602)), Standing::Current);
    }

    #[test]
    fn an_older_look_finishing_later_does_not_count() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert!(m.newer(t0 + Duration::from_millis(10)));
        assert!(!m.newer(t0), "started before what is remembered");
        assert!(m.newer(t0 + Duration::from_millis(10)));
        assert!(m.newer(t0 + Duration::from_millis(20)));
        // An older look's documents only fill a gap: never undo what a newer one found.
        assert!(m.fill(docs("v1.33.0"), t0));
        assert!(!m.fill(docs("v1.36.0"), t0));
        assert_eq!(m.good.as_ref().map(|(d, _, _)| d.version.as_str()), Some("v1.33.0"));
    }

    /// One look without an answer in time leaves a reachable apiserver reachable; the second
    /// in a row does not, nor does any answer-less look of one unreachable already. An answer
    /// starts the count again; a closed connection counts at once.
    #[test]
    fn one_slow_answer_is_not_an_outage() {
        let t0 = Instant::now();
        let slow = || FetchError { path: "/readyz".into(), kind: ErrorKind::Timeout, detail: "x".into() };
        let mut m = Memory::default();
        m.failed("a", slow());
        assert!(!m.reachable, "never answered: not reachable");
        assert!(m.answered("a", docs("v1.36.0"), t0));
        m.failed("a", slow());
        assert!(m.reachable, "one slow answer");
        m.failed("a", slow());
        assert!(!m.reachable, "two in a row");
        m.unchanged("a");
        assert!(m.reachable && m.timeouts == 0);
        m.failed("a", slow());
        assert!(m.reachable);
        m.unchanged("a");
        m.failed(
            "a",
            FetchError { path: "(connection)".into(), kind: ErrorKind::Closed, detail: "x".into() },
        );
        assert!(!m.reachable, "a closed connection counts at once");
        m.failed("a", slow());
        assert!(!m.reachable);
    }

    /// Over a limit the last good documents stay and the apiserver stays reachable (it
    /// answers); any other failure makes it unreachable, with the same documents.
    #[test]
    fn over_a_limit_the_last_good_documents_stay() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let over = || FetchError { path: "/apis".into(), kind: ErrorKind::Limit, detail: "x".into() };
        let mut m = Memory::default();
        m.failed("a", over());
        assert_eq!(m.standing(at(0)), Standing::Missing);
        assert!(m.answered("a", docs("v1.33.0"), at(1)));
        m.failed("a", over());
        assert_eq!(m.standing(at(100)), Standing::Stale { age: Duration::from_secs(99) });
        assert!(m.good.is_some() && m.reachable);
        m.failed("a", FetchError { path: "/apis".into(), kind: ErrorKind::Connect, detail: "x".into() });
        assert!(m.good.is_some() && !m.reachable);
    }
}
