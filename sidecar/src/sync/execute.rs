//! Carries out the scheduler's commands ([`super::schedule`]): starts the fetch, the look at the
//! cluster, the push and the tethers they ask for, and turns the end of each into the event the
//! scheduler takes next, once the sidecar has recorded it. What it starts comes from an [`Io`]:
//! the network and Envoy in the sidecar ([`Network`]), fakes in the tests, which drive it as the
//! loop does.
//!
//! A member's tether lives in the member ([`Tethered`]): a member that leaves takes its tether
//! with it.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use skewgate_envoy::{Endpoint, Resources};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::schedule::{Command, Event, Membership};
use super::{Fetched, Look, Sidecar, SyncReport};
use crate::cluster::ClusterConfig;
use crate::envoy::{HttpAdmin, PushError, PushOutcome, Pusher};
use crate::fetch::{ErrorKind, Etags, FetchError, Fetcher};
use crate::peers::{self, Published};
use crate::tether::{Probe, Tether};

/// One probe's report: the member's id, when the probe started, what it found.
pub type Looked = (String, Instant, Look);

/// What the commands do outside the sidecar's memory.
pub trait Io: Send + Sync + 'static {
    /// Every member's discovery in full, each with its id, in order.
    fn fetch_all(
        &self,
        fetchers: Vec<(String, Fetcher)>,
    ) -> impl Future<Output = Vec<Fetched>> + Send + 'static;
    /// The cluster's apiservers and extensions.
    fn look(
        &self,
        config: ClusterConfig,
        configured: Vec<Endpoint>,
        candidates: Vec<Fetcher>,
    ) -> impl Future<Output = Result<Published, FetchError>> + Send + 'static;
    /// Pushes `resources`, and hands them back with the outcome.
    fn push(
        &self,
        pusher: Pusher<HttpAdmin>,
        resources: Resources,
    ) -> impl Future<Output = (Resources, Result<PushOutcome, PushError>)> + Send + 'static;
    /// Follows member `id` until dropped, reporting every look to `out`; asks with the ETags
    /// `etags` holds at each probe.
    fn tether(
        &self,
        id: String,
        tether: Tether,
        fetcher: Fetcher,
        etags: watch::Receiver<Etags>,
        out: mpsc::UnboundedSender<Looked>,
    ) -> impl Future<Output = ()> + Send + 'static;
}

/// A member's tether task and the ETags it asks with. Dropped with its member: the task is
/// aborted.
pub struct Tethered {
    _task: AbortOnDrop<()>,
    etags: watch::Sender<Etags>,
}

impl Tethered {
    /// The member's ETags changed: its next probe asks with these.
    pub fn ask_with(&self, current: Etags) {
        self.etags.send_if_modified(|asked| {
            let changed = *asked != current;
            *asked = current;
            changed
        });
    }
}

/// A task that ends with its owner.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type PushDone = (skewgate_core::table::TableConfig, Result<PushOutcome, PushError>, Instant);

/// The work under way, and where its ends are reported.
pub struct Executor<I: Io> {
    io: I,
    // One of each at a time, as the scheduler allows; all aborted with the executor.
    fetches: JoinSet<(Instant, Vec<Fetched>)>,
    asks: JoinSet<Result<Published, FetchError>>,
    pushes: JoinSet<PushDone>,
    looks_out: mpsc::UnboundedSender<Looked>,
    looks: mpsc::UnboundedReceiver<Looked>,
    /// The OpenAPI composer's members.
    recompose: watch::Sender<Vec<(String, Fetcher)>>,
    /// Every successful push's report.
    reports: watch::Sender<Option<Arc<SyncReport>>>,
}

impl<I: Io> Executor<I> {
    pub fn new(
        io: I,
        recompose: watch::Sender<Vec<(String, Fetcher)>>,
        reports: watch::Sender<Option<Arc<SyncReport>>>,
    ) -> Self {
        let (looks_out, looks) = mpsc::unbounded_channel();
        Self {
            io,
            fetches: JoinSet::new(),
            asks: JoinSet::new(),
            pushes: JoinSet::new(),
            looks_out,
            looks,
            recompose,
            reports,
        }
    }

    /// Carries out `command` on `sidecar`; an event that follows at once (there is nothing to
    /// wait for) goes to `pending`.
    pub fn carry_out(&mut self, sidecar: &mut Sidecar, command: Command, pending: &mut VecDeque<Event>) {
        match command {
            Command::Fetch { started } => {
                let fetching = self.io.fetch_all(sidecar.fetchers());
                self.fetches.spawn(async move { (started, fetching.await) });
            }
            Command::Ask => match sidecar.cluster_candidates() {
                Some((config, configured, candidates)) => {
                    self.asks.spawn(self.io.look(config, configured, candidates));
                }
                None => pending.push_back(Event::Asked(None)),
            },
            Command::Save => sidecar.save(),
            Command::Tether(id) => {
                let Some(member) = sidecar.members.iter_mut().find(|m| m.endpoint.id == id) else { return };
                let (etags, asked) = watch::channel(member.memory.etags());
                let (tether, fetcher) = (member.tether.clone(), member.fetcher.clone());
                let task = tokio::spawn(self.io.tether(id, tether, fetcher, asked, self.looks_out.clone()));
                member.tethered = Some(Tethered { _task: AbortOnDrop(task), etags });
            }
            Command::Untether(id) => {
                // A member that left took its tether already; one still here lets go of it.
                if let Some(member) = sidecar.members.iter_mut().find(|m| m.endpoint.id == id) {
                    member.tethered = None;
                }
            }
            Command::Recompose => {
                self.recompose.send_replace(sidecar.openapi_members());
            }
            Command::Push { since } => match sidecar.prepare() {
                Ok(resources) => {
                    sidecar.handing_over(&resources.table);
                    sidecar.shared.pushing.set(true);
                    let pushing = self.io.push(sidecar.pusher.clone(), resources);
                    self.pushes.spawn(async move {
                        let (resources, result) = pushing.await;
                        (resources.table, result, since)
                    });
                }
                Err(error) => {
                    sidecar.shared.metrics.push_error(error.label());
                    tracing::error!(%error, "sync failed");
                    pending.push_back(Event::Pushed);
                }
            },
        }
    }

    /// The next piece of work under way to end, recorded in `sidecar`, as the event it makes.
    /// Waits for ever when nothing is under way. Cancel-safe: nothing is taken from the work
    /// under way until it is recorded.
    pub async fn next(&mut self, sidecar: &mut Sidecar) -> Event {
        tokio::select! {
            Some(joined) = self.asks.join_next(), if !self.asks.is_empty() => match joined {
                Ok(Ok(published)) => {
                    let (joined, left, changed) = sidecar.apply_published(published);
                    Event::Asked(Some(Membership { joined, left, changed }))
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "cannot ask the cluster; what is known stays");
                    Event::Asked(None)
                }
                Err(_) => Event::Asked(None),
            },
            Some(joined) = self.fetches.join_next(), if !self.fetches.is_empty() => {
                let changed = joined.is_ok_and(|(started, results)| sidecar.record_fetches(started, results));
                Event::Fetched { changed }
            }
            Some((id, started, look)) = self.looks.recv() => {
                Event::Looked { started, changed: sidecar.record_look(&id, started, look) }
            }
            Some(joined) = self.pushes.join_next(), if !self.pushes.is_empty() => {
                sidecar.shared.pushing.set(false);
                if let Ok((table, result, started)) = joined {
                    if let Ok(report) = sidecar.pushed(table, result, started) {
                        self.reports.send_replace(Some(Arc::new(report)));
                    }
                }
                Event::Pushed
            }
        }
    }
}

/// The sidecar's [`Io`]: the apiservers, the cluster and Envoy.
pub struct Network {
    /// How often a tether probes its apiserver, and how long a probe may take.
    pub probe_period: Duration,
    pub probe_timeout: Duration,
}

// The futures are spawned: written as `async fn` they would borrow `self`.
#[allow(clippy::manual_async_fn)]
impl Io for Network {
    fn fetch_all(
        &self,
        fetchers: Vec<(String, Fetcher)>,
    ) -> impl Future<Output = Vec<Fetched>> + Send + 'static {
        fetch_all(fetchers)
    }

    fn look(
        &self,
        config: ClusterConfig,
        configured: Vec<Endpoint>,
        candidates: Vec<Fetcher>,
    ) -> impl Future<Output = Result<Published, FetchError>> + Send + 'static {
        async move { peers::look(config, &configured, &candidates).await }
    }

    fn push(
        &self,
        pusher: Pusher<HttpAdmin>,
        resources: Resources,
    ) -> impl Future<Output = (Resources, Result<PushOutcome, PushError>)> + Send + 'static {
        async move {
            let result = pusher.push(&resources).await;
            (resources, result)
        }
    }

    fn tether(
        &self,
        id: String,
        tether: Tether,
        fetcher: Fetcher,
        etags: watch::Receiver<Etags>,
        out: mpsc::UnboundedSender<Looked>,
    ) -> impl Future<Output = ()> + Send + 'static {
        tether_task(id, tether, fetcher, etags, (self.probe_period, self.probe_timeout), out)
    }
}

/// Every fetcher's documents, concurrently, each with its member's id.
pub async fn fetch_all(fetchers: Vec<(String, Fetcher)>) -> Vec<Fetched> {
    let mut tasks = JoinSet::new();
    for (index, (_, fetcher)) in fetchers.iter().enumerate() {
        let fetcher = fetcher.clone();
        tasks.spawn(async move { (index, fetcher.fetch().await) });
    }
    let mut results: Vec<Option<Result<_, FetchError>>> = fetchers.iter().map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((index, result)) => {
                if let Some(slot) = results.get_mut(index) {
                    *slot = Some(result);
                }
            }
            Err(e) => tracing::error!(error = %e, "fetch task failed"),
        }
    }
    results
        .into_iter()
        .zip(fetchers)
        .map(|(r, (id, _))| {
            let result = r.unwrap_or_else(|| Err(FetchError::new("/", ErrorKind::Request, "task lost")));
            (id, result)
        })
        .collect()
}

/// Keeps a connection open to one apiserver and probes it every `period` (bounded by
/// `timeout`), reporting every look; a changed apiserver is fetched in full, and a closed
/// connection is reported the moment it closes. Reconnects at the next period.
pub async fn tether_task(
    index: String,
    tether: Tether,
    fetcher: Fetcher,
    etags: watch::Receiver<Etags>,
    (period, timeout): (Duration, Duration),
    out: mpsc::UnboundedSender<Looked>,
) {
    let timed_out = |path: &str| {
        FetchError::new(
            path,
            ErrorKind::Timeout,
            format!("no answer within {}", skewgate_core::duration::format(timeout)),
        )
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut started = Instant::now();
        let mut link = match tokio::time::timeout(timeout, tether.connect()).await {
            Ok(Ok(link)) => link,
            Ok(Err(error)) => {
                if out.send((index.clone(), started, Look::Failed(error))).is_err() {
                    return;
                }
                continue;
            }
            Err(_) => {
                if out.send((index.clone(), started, Look::Failed(timed_out("(connect)")))).is_err() {
                    return;
                }
                continue;
            }
        };
        loop {
            let asked = etags.borrow().clone();
            let look = match tokio::time::timeout(timeout, link.probe(&asked)).await {
                Err(_) => Look::Failed(timed_out("/readyz")),
                Ok(Err(error)) => Look::Failed(error),
                Ok(Ok(Probe { readiness: ready, unchanged: Some(true) })) => Look::Unchanged { ready },
                Ok(Ok(Probe { readiness: ready, unchanged: None })) => Look::Ready { ready },
                Ok(Ok(Probe { readiness: ready, unchanged: Some(false) })) => {
                    Look::Changed { ready, fetched: Box::new(fetcher.fetch().await) }
                }
            };
            let failed = matches!(look, Look::Failed(_));
            if out.send((index.clone(), started, look)).is_err() {
                return;
            }
            if failed {
                break;
            }
            tokio::select! {
                _ = tick.tick() => started = Instant::now(),
                () = link.closed() => {
                    let closed = FetchError::new(
                        "(connection)",
                        ErrorKind::Closed,
                        "the apiserver closed the connection the sidecar keeps open to it",
                    );
                    if out.send((index.clone(), Instant::now(), Look::Failed(closed))).is_err() {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, Weak};

    use super::*;
    use crate::sync::memory::tests::docs;
    use crate::sync::schedule::{Cluster, Scheduler};

    /// The world, faked: each member's version by id (none: its fetch fails), the cluster's
    /// listings in turn, the members of every table pushed, and each member's tether while its
    /// task runs.
    #[derive(Clone, Default)]
    struct Fake {
        versions: Arc<Mutex<BTreeMap<String, String>>>,
        listings: Arc<Mutex<VecDeque<Vec<&'static str>>>>,
        pushed: Arc<Mutex<Vec<Vec<String>>>>,
        tethers: Arc<Mutex<BTreeMap<String, Weak<()>>>>,
    }

    impl Io for Fake {
        fn fetch_all(
            &self,
            fetchers: Vec<(String, Fetcher)>,
        ) -> impl Future<Output = Vec<Fetched>> + Send + 'static {
            let versions = self.versions.lock().unwrap().clone();
            async move {
                let down = || FetchError::new("/", ErrorKind::Request, "down");
                let fetched = |id: &String| versions.get(id).map(|v| docs(v)).ok_or_else(down);
                fetchers.into_iter().map(|(id, _)| (id.clone(), fetched(&id))).collect()
            }
        }

        fn look(
            &self,
            _config: ClusterConfig,
            _configured: Vec<Endpoint>,
            _candidates: Vec<Fetcher>,
        ) -> impl Future<Output = Result<Published, FetchError>> + Send + 'static {
            let listing = self.listings.lock().unwrap().pop_front();
            let member = |id: &str| crate::testing::published(id, 7000 + u16::from(id.as_bytes()[0]));
            let published = listing.map(|ids| Published {
                members: Some(ids.into_iter().map(member).collect()),
                extensions: None,
            });
            async move { published.ok_or_else(|| FetchError::new("/", ErrorKind::Request, "no listing")) }
        }

        fn push(
            &self,
            _pusher: Pusher<HttpAdmin>,
            resources: Resources,
        ) -> impl Future<Output = (Resources, Result<PushOutcome, PushError>)> + Send + 'static {
            let ids = resources.table.apiservers.iter().map(|a| a.id.clone()).collect();
            self.pushed.lock().unwrap().push(ids);
            async move { (resources, Ok(PushOutcome::Unchanged)) }
        }

        fn tether(
            &self,
            id: String,
            _tether: Tether,
            _fetcher: Fetcher,
            _etags: watch::Receiver<Etags>,
            _out: mpsc::UnboundedSender<Looked>,
        ) -> impl Future<Output = ()> + Send + 'static {
            let alive = Arc::new(());
            self.tethers.lock().unwrap().insert(id, Arc::downgrade(&alive));
            async move {
                let _alive = alive;
                std::future::pending::<()>().await
            }
        }
    }

    impl Fake {
        fn tethered(&self) -> Vec<String> {
            let tethers = self.tethers.lock().unwrap();
            tethers.iter().filter(|(_, alive)| alive.strong_count() > 0).map(|(id, _)| id.clone()).collect()
        }
    }

    /// The loop, as `run_with` turns it, driven by hand: `events` in, then what ends, until
    /// `done` says so.
    struct Loop {
        sidecar: Sidecar,
        scheduler: Scheduler,
        executor: Executor<Fake>,
        pending: VecDeque<Event>,
    }

    impl Loop {
        async fn until(&mut self, events: impl IntoIterator<Item = Event>, done: impl Fn() -> bool) {
            self.pending.extend(events);
            for _ in 0..50 {
                self.sidecar.ask_with_current_etags();
                self.sidecar.apply_eligibility();
                while let Some(event) = self.pending.pop_front() {
                    for command in self.scheduler.on(Instant::now(), event) {
                        self.executor.carry_out(&mut self.sidecar, command, &mut self.pending);
                    }
                }
                // An aborted task is dropped when the runtime next gets to it.
                tokio::task::yield_now().await;
                if done() {
                    return;
                }
                let next =
                    tokio::time::timeout(Duration::from_secs(5), self.executor.next(&mut self.sidecar));
                self.pending.push_back(next.await.expect("something under way ends"));
            }
            panic!("not done after 50 events");
        }
    }

    /// The executor carries out what the scheduler asks, with fakes for the network and Envoy:
    /// a member that joins is tethered and fetched and enters the pushed table; one that leaves
    /// takes its tether with it.
    #[tokio::test]
    async fn members_are_tethered_while_they_are_members_and_pushed_once_fetched() {
        let certs = crate::testing::Certs::new("execute");
        let config = certs.following_cluster(7097, false);
        let fake = Fake::default();
        fake.versions
            .lock()
            .unwrap()
            .extend([("a".to_owned(), "v1.33.0".to_owned()), ("d".to_owned(), "v1.36.0".to_owned())]);
        fake.listings.lock().unwrap().extend([vec!["a", "d"], vec!["a"], vec!["a"]]);
        let (recompose, composer) = watch::channel(Vec::new());
        let (reports, _) = watch::channel(None);
        let sidecar = Sidecar::new(config).unwrap();
        let scheduler = Scheduler::new(Cluster { asks: true, lists_extensions: false });
        let executor = Executor::new(fake.clone(), recompose, reports);
        let mut l = Loop { sidecar, scheduler, executor, pending: VecDeque::new() };

        l.until([Event::Started { members: vec!["a".into()] }], || true).await;
        assert_eq!(fake.tethered(), ["a"]);

        let pushed_with_d = || fake.pushed.lock().unwrap().last().is_some_and(|ids| ids == &["a", "d"]);
        l.until([Event::Poll], pushed_with_d).await;
        assert_eq!(fake.tethered(), ["a", "d"], "d joined: tethered");
        let composed: Vec<String> = composer.borrow().iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(composed, ["a", "d"], "and handed to the OpenAPI composer");
        assert_eq!(fake.pushed.lock().unwrap().first().map(Vec::len), Some(1), "the first push knew a alone");

        // Unlisted: DRAINING for a look, then gone, its tether with it.
        l.until([Event::Poll], || fake.listings.lock().unwrap().len() == 1).await;
        assert_eq!(fake.tethered(), ["a", "d"], "draining, still followed");
        let only_a = || {
            fake.tethered() == ["a"] && fake.pushed.lock().unwrap().last().is_some_and(|ids| ids == &["a"])
        };
        l.until([Event::Poll], only_a).await;
        assert!(l.sidecar.members.iter().all(|m| m.endpoint.id == "a"));
        let _ = std::fs::remove_dir_all(&certs.dir);
    }
}
