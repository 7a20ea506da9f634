//! The rolling-upgrade drill (`make drill`): three stand-ins at the 1.33 era upgraded one at a
//! time to the 1.36 era (drained like kube-apiserver's `--shutdown-delay-duration`, stopped,
//! booted with the new profile and unready for a few seconds, next) under a fixed-rate client
//! load through Envoy — once with Envoy as a plain load balancer, once with skewgate (filter +
//! sidecar). Every request is recorded and classified; the binary `drill` writes the results.
//! The leave-and-return variant ([`Variant::LeaveAndReturn`]) instead takes the only 1.36-era
//! apiserver of a skewed cluster away for longer than the sidecar's old grace period and brings
//! it back.

mod controllers;
pub mod evidence;
pub mod harm;
pub mod held;
pub mod load;
mod mode;
pub mod probe;
pub mod retry;

pub use load::{Era, Gvr, Load};
pub use mode::Mode;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Value, json};

use skewgate_harness::clients::{Looping, Runs};
use skewgate_harness::cluster::{self, Cluster, Credentials};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::kubectl::Kubectl;
use skewgate_harness::load::ErrorKind;
use skewgate_harness::real;

use crate::held::Held;

const OLD: &str = "1.33";
const NEW: &str = "1.36";
const IDS: [&str; 3] = ["a", "b", "c"];
const DISCOVERY_ACCEPT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;q=0.9";

/// What happens to the apiservers under load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Variant {
    /// a, b, c at 1.33, upgraded to 1.36 one at a time.
    Upgrade,
    /// a, b at 1.33 and c at 1.36 (the only server of the 1.36 era's APIs); c is drained and
    /// stopped, stays away past the sidecar's old grace period, and comes back as it was.
    LeaveAndReturn,
    /// a at 1.33, c at 1.36, and b restarted `Options::restarts` times, alternating between the
    /// two, without a drain: stopped and started again at once (what a crash-looping or
    /// hastily restarted apiserver does). Measures how long b is kept out and how long its
    /// re-admission takes.
    Restarts,
}

impl Variant {
    /// File names and docs/drill.md.
    pub fn key(self) -> &'static str {
        match self {
            Variant::Upgrade => "upgrade",
            Variant::LeaveAndReturn => "leave-and-return",
            Variant::Restarts => "restarts",
        }
    }

    fn profiles(self) -> [(&'static str, &'static str); 3] {
        match self {
            Variant::Upgrade => [("a", OLD), ("b", OLD), ("c", OLD)],
            Variant::LeaveAndReturn | Variant::Restarts => [("a", OLD), ("b", OLD), ("c", NEW)],
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    /// Operations per second (a create-then-read is one operation, two requests).
    pub rate: u32,
    pub seed: u64,
    /// Where the clusters' files go (removed afterwards).
    pub work: PathBuf,
    /// How long a booted apiserver serves while its `/readyz` still fails (zero: ready the
    /// instant it starts; a real kube-apiserver's post-start hooks take 2–4 s).
    pub ready_delay: Duration,
    /// The sidecar's poll period (5 s is the production default).
    pub poll: Duration,
    pub variant: Variant,
    /// Leave-and-return: how long the apiserver stays away (`None`: past the grace period the
    /// sidecar used to have — five poll periods in the harness, 30 s by default — by 5 s, or by
    /// 1 s with `quick`).
    pub away: Option<Duration>,
    /// Restarts: how many.
    pub restarts: usize,
    /// Restarts: how long b refuses connections between its old process stopping and its new
    /// one listening (zero: at once; a real kube-apiserver takes 0.9–2.2 s).
    pub down: Duration,
    /// Real kube-apiserver and etcd binaries instead of stand-ins: the old era is
    /// [`REAL_OLD`], the new one [`REAL_NEW`]; their own start-up replaces `ready_delay`.
    pub real: Option<real::Binaries>,
    /// Upgrade: once the first apiserver is upgraded (the sole server of the new era's APIs),
    /// stop it gracefully for this long and bring it back, then SIGKILL it for this long and
    /// bring it back, before the others are upgraded (`None`: no such step).
    pub sole_away: Option<Duration>,
    /// One run alone (what to look into), not the comparison: nothing is written but
    /// `latest.json` and the plot.
    pub only: Option<Mode>,
    /// Each run's files (Envoy's log with its access log, the sidecar's, the table) are left in
    /// [`Options::work`] to look into afterwards.
    pub keep: bool,
    /// What the load asks for; `None`: the stand-ins' or the emulated real eras' tables
    /// ([`Options::load`]). A real release pair's is read from its binaries ([`drill`]).
    pub release_load: Option<Load>,
}

impl Options {
    pub fn new(quick: bool) -> Self {
        Self {
            quick,
            rate: if quick { 60 } else { 200 },
            seed: 42,
            work: skewgate_harness::paths::workspace_root()
                .join(format!("target/tmp/drill-{}", std::process::id())),
            ready_delay: Duration::from_secs(3),
            poll: Duration::from_secs(1),
            variant: Variant::Upgrade,
            away: None,
            restarts: 10,
            down: Duration::ZERO,
            real: None,
            sole_away: None,
            only: None,
            keep: false,
            release_load: None,
        }
    }

    /// The apiserver spec of an era (`OLD` or `NEW`): the stand-in profile, or with real binaries
    /// the kube-apiserver spec: the old release's binary as it is, or the new one emulating the
    /// old version.
    pub fn spec(&self, era: &str) -> String {
        match (&self.real, era) {
            (None, _) => era.to_string(),
            (Some(b), OLD) => match &b.old {
                Some(old) => old.kube_apiserver.display().to_string(),
                None => REAL_OLD.to_string(),
            },
            (Some(_), _) => REAL_NEW.to_string(),
        }
    }

    /// The two eras as docs/drill.md names them: 1.33 and 1.36, or a release pair's versions.
    pub fn era_names(&self) -> (String, String) {
        let version = |binary: Option<&Path>| {
            binary
                .and_then(|b| real::version_of(b).ok())
                .and_then(|v| v.split_whitespace().last().map(str::to_owned))
                .unwrap_or_default()
        };
        match self.real.as_ref().filter(|b| b.old.is_some()) {
            Some(b) => (
                version(b.old.as_ref().map(|o| o.kube_apiserver.as_path())),
                version(b.kube_apiserver.as_deref()),
            ),
            None => ("1.33".to_string(), "1.36".to_string()),
        }
    }

    /// Whether the old era is a real release's binaries rather than an emulated version.
    pub fn release(&self) -> bool {
        self.real.as_ref().is_some_and(|b| b.old.is_some())
    }

    /// The GVRs listed, watched and created.
    pub fn load(&self) -> Load {
        match (&self.release_load, &self.real) {
            (Some(load), _) => load.clone(),
            (None, None) => Load::standins(),
            (None, Some(_)) => Load::emulated(),
        }
    }

    fn away(&self) -> Duration {
        let old_grace = self.poll * 5;
        self.away.unwrap_or(match self.quick {
            true => old_grace + Duration::from_secs(1),
            false => old_grace.max(Duration::from_secs(30)) + Duration::from_secs(5),
        })
    }

    fn timing(&self) -> Timing {
        match self.quick {
            false => Timing {
                warmup: Duration::from_secs(3),
                shutdown_delay: Duration::from_secs(2),
                pause: Duration::from_secs(3),
                cooldown: Duration::from_secs(3),
            },
            true => Timing {
                warmup: Duration::from_secs(1),
                shutdown_delay: Duration::from_millis(500),
                pause: Duration::from_secs(1),
                cooldown: Duration::from_secs(2),
            },
        }
    }
}

struct Timing {
    warmup: Duration,
    /// How long a drained apiserver keeps serving what still reaches it before it stops.
    shutdown_delay: Duration,
    pause: Duration,
    cooldown: Duration,
}

pub use skewgate_harness::real::{REAL_NEW, REAL_OLD};

const DISCOVERY: &str = "apis (aggregated discovery v2)";
const WATCHES: usize = 3;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Success,
    /// 404 for a GVR that no up apiserver served: the right answer.
    CorrectNotFound,
    /// 404 for a GVR that an up apiserver served the whole time the request was under way.
    WrongNotFound,
    /// 503 with a Kubernetes `Status` body (or without one).
    Unavailable,
    Connection,
    Timeout,
    /// A read of an object whose create returned 201 found no object.
    LostWrite,
    /// Any other status.
    OtherStatus,
}

impl Class {
    pub const ERRORS: [Class; 6] = [
        Class::WrongNotFound,
        Class::Unavailable,
        Class::Connection,
        Class::Timeout,
        Class::LostWrite,
        Class::OtherStatus,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Class::Success => "success",
            Class::CorrectNotFound => "404, GVR served nowhere (correct)",
            Class::WrongNotFound => "wrong 404",
            Class::Unavailable => "503",
            Class::Connection => "connection error/reset",
            Class::Timeout => "timeout",
            Class::LostWrite => "lost write",
            Class::OtherStatus => "other status",
        }
    }

    fn key(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }

    fn color(self) -> &'static str {
        match self {
            Class::WrongNotFound => "#d62728",
            Class::Unavailable => "#ff7f0e",
            Class::Connection => "#9467bd",
            Class::Timeout => "#8c564b",
            Class::LostWrite => "#000000",
            _ => "#7f7f7f",
        }
    }
}

/// One request.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    /// Seconds since the load started.
    pub t: f64,
    pub latency_ms: f64,
    pub gvr: String,
    pub verb: &'static str,
    pub status: Option<u16>,
    pub served_by: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub error: Option<String>,
    pub class: Class,
    /// For a 503: whether every apiserver serving the GVR was restarting then.
    pub expected: bool,
    /// How many times it was sent (the client-go-like client sends some again).
    pub attempts: u32,
    #[serde(skip)]
    era: Era,
    #[serde(skip)]
    object: Option<String>,
    #[serde(skip)]
    timed_out: bool,
    #[serde(skip)]
    connection: bool,
}

impl Request {
    /// A request about to be sent at `t`; the outcome fields are filled in as it completes.
    fn start(t: Duration, gvr: String, verb: &'static str, era: Era, object: Option<String>) -> Self {
        Request {
            t: t.as_secs_f64(),
            latency_ms: 0.0,
            gvr,
            verb,
            status: None,
            served_by: None,
            reason: None,
            message: None,
            error: None,
            class: Class::Success,
            expected: false,
            attempts: 1,
            era,
            object,
            timed_out: false,
            connection: false,
        }
    }

    /// A request that failed before an answer: a timeout, or the connection.
    fn failed(&mut self, e: &reqwest::Error) {
        self.no_answer(
            if e.is_timeout() { ErrorKind::Timeout } else { ErrorKind::Other },
            skewgate_harness::load::error_chain(e),
        );
    }

    fn no_answer(&mut self, kind: ErrorKind, detail: String) {
        self.timed_out = kind == ErrorKind::Timeout;
        self.connection = !self.timed_out;
        self.error = Some(detail);
    }
}

impl Request {
    fn end(&self) -> f64 {
        self.t + self.latency_ms / 1000.0
    }
}

/// A moment of the upgrade.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub t: f64,
    pub apiserver: String,
    /// `drain`, `stop`, `boot` (serving, unready unless the ready delay is zero), `healthy`
    /// (Envoy sends it requests), `table` (skewgate: the sidecar wrote a new table
    /// after the drain).
    pub what: &'static str,
    pub profile: String,
}

/// One run of the drill.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub mode: Mode,
    pub name: &'static str,
    pub variant: Variant,
    pub requests: usize,
    pub counts: BTreeMap<String, usize>,
    pub unexpected_503: usize,
    pub watches_established: usize,
    /// Watch streams that broke off mid-stream (not a clean end).
    pub watch_cuts: usize,
    /// Operations the dispatcher skipped because too many were under way.
    pub skipped: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// From the first drain to the last apiserver healthy again.
    pub upgrade_seconds: f64,
    /// Per restart (or return): from the moment it served again (`boot`, or `ready` with a
    /// ready delay) to Envoy sending it requests.
    pub readmission_seconds: Vec<f64>,
    /// Per restart (or return): from its drain (or stop, without one) to Envoy sending it
    /// requests again.
    pub out_seconds: Vec<f64>,
    /// Per restart (or return): from its drain (or stop) to Envoy sending it no new request.
    pub exclusion_seconds: Vec<f64>,
    pub duration_seconds: f64,
    pub events: Vec<Event>,
    /// Errors per second by class: seconds → class → count.
    pub errors_per_second: BTreeMap<String, Vec<usize>>,
    /// The sole-server steps (`Options::sole_away`), with what went wrong during each.
    pub steps: Vec<Step>,
    /// The client-go-like client, next to the raw one (whose requests the rest counts).
    pub client_go: ClientGoTally,
    /// The kubectl loop (a `kubectl get` of a GVR only the new era serves: during the upgrade,
    /// only the upgraded apiservers serve it).
    pub kubectl: Option<KubectlTally>,
    /// skewgate: requests its Envoy held while their GVR had no ready apiserver.
    pub held: Option<held::Held>,
    /// With a kube-controller-manager: what its garbage collector and namespace controller
    /// did wrong ([`harm`]).
    pub harm: Option<harm::Harm>,
    /// The kube-controller-manager's error lines, grouped ([`harm::errors`]).
    pub controller_errors: BTreeMap<String, usize>,
    /// Real binaries: latency of rerouted and local requests, and `kubectl explain`
    /// completeness, on a quiet skewed cluster of the same kind.
    pub probe: Option<crate::probe::Probe>,
    #[serde(skip)]
    pub records: Vec<Request>,
    /// When the load started, by the clock the logs are written with.
    #[serde(skip)]
    pub started: time::OffsetDateTime,
    /// What the sidecar and Envoy logged around the requests that went wrong ([`evidence`]).
    #[serde(skip)]
    pub evidence: Option<String>,
}

/// One "sole server stopped, then back" step: from the stop (or drain) to the next step.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub what: String,
    pub apiserver: String,
    /// `graceful` (SIGTERM, the shutdown delay, the exit) or `sigkill`.
    pub how: &'static str,
    pub from: f64,
    pub until: f64,
    /// Requests that started in the window, by class.
    pub counts: BTreeMap<String, usize>,
    /// Its 503s by what the edge's `Status` says: answered after waiting at the edge, answered at
    /// once with `Retry-After` (Envoy's detail), or at once without (it may have reached an
    /// apiserver).
    pub unavailable_why: BTreeMap<String, usize>,
}

impl Step {
    pub fn count(&self, class: Class) -> usize {
        self.counts.get(&class.key()).copied().unwrap_or(0)
    }
}

impl Run {
    pub fn count(&self, class: Class) -> usize {
        self.counts.get(&class.key()).copied().unwrap_or(0)
    }

    /// The requests of `class` that count as failures (503s while every server of their GVR
    /// was away do not), one line each.
    pub fn failures(&self, class: Class, at_most: usize) -> String {
        self.records
            .iter()
            .filter(|r| r.class == class && !(class == Class::Unavailable && r.expected))
            .take(at_most)
            .map(|r| {
                format!(
                    "\n  {:.2}s (+{:.0} ms) {} {} -> {:?} {} by {}: {}",
                    r.t,
                    r.latency_ms,
                    r.verb,
                    r.gvr,
                    r.status,
                    r.reason.as_deref().or(r.error.as_deref()).unwrap_or("-"),
                    r.served_by.as_deref().unwrap_or("Envoy"),
                    r.message.as_deref().unwrap_or("")
                )
            })
            .collect()
    }
}

/// A tiny deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    List(usize),
    CreateRead(usize, u64),
    Discovery,
}

/// The operation sequence: the same for every run with the same seed.
fn plan(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = Rng(seed);
    (0..n as u64)
        .map(|i| match rng.below(100) {
            0..60 => Op::List(rng.below(load::LISTED)),
            60..85 => Op::CreateRead(rng.below(load::CREATED), i),
            _ => Op::Discovery,
        })
        .collect()
}

struct Shared {
    /// [`load::LISTED`] GVRs.
    lists: Vec<Gvr>,
    /// [`load::CREATED`] GVRs.
    creates: Vec<Gvr>,
    client: reqwest::Client,
    base: String,
    epoch: Instant,
    records: Mutex<Vec<Request>>,
    /// The client-go-like client's requests, one record per request however often it was sent.
    client_go: Mutex<Vec<Request>>,
    /// Named creates of the client-go-like client answered 409 AlreadyExists when sent again:
    /// an earlier attempt had taken effect.
    applied_twice: AtomicU64,
    stop: AtomicBool,
    watches: AtomicU64,
    watch_cuts: AtomicU64,
}

impl Shared {
    fn push(&self, client: Client, r: Request) {
        let records = match client {
            Client::Raw => &self.records,
            Client::ClientGo => &self.client_go,
        };
        records.lock().unwrap_or_else(PoisonError::into_inner).push(r);
    }
}

/// Who sends an operation's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// Once, whatever the answer: what the edge itself answers.
    Raw,
    /// Again when client-go would ([`retry::again`]): what kubectl and controllers see.
    ClientGo,
}

/// The label of the client-go-like client's `generateName` creates: the operation's number, so
/// that two objects with one value are one write applied twice.
const WRITE_LABEL: &str = "skewgate-drill-write";

async fn send(
    s: &Shared,
    client: Client,
    request: reqwest::RequestBuilder,
    gvr: String,
    verb: &'static str,
    era: Era,
    object: Option<String>,
) -> Request {
    let t = s.epoch.elapsed();
    let get = matches!(verb, "list" | "get" | "discovery");
    let mut r = Request::start(t, gvr, verb, era, object);
    let mut next = Some(request);
    while let Some(request) = next.take() {
        // A body that cannot be cloned is a stream: client-go never sends such a body twice.
        let copy = request.try_clone();
        let body = match copy {
            Some(_) => retry::Body::Encoded,
            None => retry::Body::Reader,
        };
        let answer = skewgate_harness::load::exchange(request, &[200, 201]).await;
        (r.status, r.served_by, r.reason, r.message) =
            (answer.status, answer.served_by, answer.reason, answer.message);
        (r.error, r.timed_out, r.connection) = (None, false, false);
        let outcome = match answer.error {
            Some(kind) => {
                r.no_answer(kind, answer.detail.unwrap_or_default());
                retry::Outcome::NoAnswer { reset_or_eof: kind == ErrorKind::Reset }
            }
            None => retry::Outcome::Answered {
                status: r.status.unwrap_or_default(),
                retry_after: answer.retry_after.as_deref(),
            },
        };
        if client == Client::ClientGo {
            if let Some(wait) = retry::again(get, body, r.attempts, outcome) {
                tokio::time::sleep(wait).await;
                r.attempts += 1;
                next = copy;
            }
        }
    }
    r.latency_ms = (s.epoch.elapsed() - t).as_secs_f64() * 1000.0;
    r
}

async fn operation(s: Arc<Shared>, client: Client, op: Op) {
    match op {
        Op::List(i) => {
            let g = &s.lists[i];
            let url = format!("{}{}?limit=500", s.base, g.collection());
            let req = s.client.get(url).header("accept", "application/json");
            let r = send(&s, client, req, g.name(), "list", g.era, None).await;
            s.push(client, r);
        }
        Op::Discovery => {
            let req = s.client.get(format!("{}/apis", s.base)).header("accept", DISCOVERY_ACCEPT);
            let r = send(&s, client, req, DISCOVERY.into(), "discovery", Era::Both, None).await;
            s.push(client, r);
        }
        Op::CreateRead(i, n) => {
            let g = &s.creates[i];
            let name = match client {
                Client::Raw => format!("drill-{n}"),
                Client::ClientGo => format!("drill-cg-{n}"),
            };
            let mut body =
                json!({"apiVersion": g.api_version(), "kind": g.api.kind, "metadata": {"name": name}});
            if g.api.namespaced {
                body["metadata"]["namespace"] = json!("default");
            }
            // The client-go-like client's ConfigMaps get their names from the server: a
            // re-sent create that had taken effect makes a second object, which a named create
            // cannot.
            let generated = client == Client::ClientGo && g.api.kind == "ConfigMap";
            if generated {
                body["metadata"] = json!({
                    "generateName": "drill-cg-", "namespace": "default", "labels": {WRITE_LABEL: n.to_string()}
                });
            }
            match g.spec() {
                Some(spec) => body["spec"] = spec,
                None => body["data"] = json!({"n": n.to_string()}),
            }
            let req = s
                .client
                .post(format!("{}{}", s.base, g.collection()))
                .header("accept", "application/json")
                .json(&body);
            let created = send(&s, client, req, g.name(), "create", g.era, None).await;
            let ok = created.status == Some(201);
            if created.attempts > 1
                && created.status == Some(409)
                && created.reason.as_deref() == Some("AlreadyExists")
            {
                s.applied_twice.fetch_add(1, Ordering::SeqCst);
            }
            s.push(client, created);
            if ok && !generated {
                let req = s
                    .client
                    .get(format!("{}{}/{name}", s.base, g.collection()))
                    .header("accept", "application/json");
                let r = send(&s, client, req, g.name(), "get", g.era, Some(name)).await;
                s.push(client, r);
            }
        }
    }
}

/// Operations at `rate` per second until the load stops, at most 256 under way at once (the
/// others are skipped and counted).
fn dispatch(
    s: Arc<Shared>,
    client: Client,
    ops: Vec<Op>,
    rate: u32,
    skipped: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    tokio::spawn(async move {
        let permits = Arc::new(tokio::sync::Semaphore::new(256));
        let mut tasks = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for op in ops {
            tick.tick().await;
            if s.stop.load(Ordering::SeqCst) {
                break;
            }
            while tasks.try_join_next().is_some() {}
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                skipped.fetch_add(1, Ordering::SeqCst);
                continue;
            };
            let s = s.clone();
            tasks.spawn(async move {
                operation(s, client, op).await;
                drop(permit);
            });
        }
        while tasks.join_next().await.is_some() {}
    })
}

/// A long watch of configmaps or pods, re-established whenever it ends, until the load stops.
async fn watch(s: Arc<Shared>, which: usize) {
    let g = &s.lists[load::WATCHED + which % 2];
    let mut round = 0u64;
    while !s.stop.load(Ordering::SeqCst) {
        let url = format!(
            "{}{}?watch=1&allowWatchBookmarks=true&timeoutSeconds={}",
            s.base,
            g.collection(),
            20 + 7 * (which as u64 + round) % 20
        );
        round += 1;
        let t = s.epoch.elapsed();
        let mut r = Request::start(t, g.name(), "watch", g.era, None);
        // No client timeout: a watch lasts as long as the server keeps it.
        match s
            .client
            .get(url)
            .header("accept", "application/json")
            .timeout(Duration::from_secs(3600))
            .send()
            .await
        {
            Ok(mut response) => {
                r.status = Some(response.status().as_u16());
                r.served_by =
                    response.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(str::to_owned);
                r.latency_ms = (s.epoch.elapsed() - t).as_secs_f64() * 1000.0;
                let ok = r.status == Some(200);
                s.push(Client::Raw, r);
                if ok {
                    s.watches.fetch_add(1, Ordering::SeqCst);
                    loop {
                        match response.chunk().await {
                            Ok(Some(_)) => {}
                            Ok(None) => break,
                            Err(_) => {
                                s.watch_cuts.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                r.failed(&e);
                r.latency_ms = (s.epoch.elapsed() - t).as_secs_f64() * 1000.0;
                s.push(Client::Raw, r);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Which apiserver served which profile when, on the load's clock.
#[derive(Debug, Default)]
struct Timeline {
    /// (apiserver, profile, up from, up until): up = Envoy sends it requests.
    up: Vec<(String, String, f64, f64)>,
    /// (apiserver, old profile, new profile, drain started, healthy again).
    restarts: Vec<(String, String, String, f64, f64)>,
    /// (apiserver, profile, from, until): away but still configured, and back with the same
    /// profile: what it serves is "served, unavailable" meanwhile, never "not found".
    away: Vec<(String, String, f64, f64)>,
}

impl Timeline {
    /// Some apiserver served `era` from `from` to `to`: up the whole time, or up and away
    /// (still configured) in turns.
    fn serving_throughout(&self, era: Era, from: f64, to: f64) -> bool {
        let mut by_apiserver: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for (id, p, a, b) in self.up.iter().chain(&self.away) {
            if era.served_by(p) {
                by_apiserver.entry(id).or_default().push((*a, *b));
            }
        }
        by_apiserver.into_values().any(|mut spans| {
            spans.sort_by(|x, y| x.0.total_cmp(&y.0));
            let mut covered: Option<(f64, f64)> = None;
            for (a, b) in spans {
                covered = match covered {
                    Some((start, end)) if a <= end => Some((start, end.max(b))),
                    Some(done) if done.0 <= from && to <= done.1 => return true,
                    _ => Some((a, b)),
                };
            }
            covered.is_some_and(|(start, end)| start <= from && to <= end)
        })
    }

    /// An apiserver was stopped (or began to drain) while the request was under way: a request
    /// already on a connection the stopped process closes cannot be retried safely (it may have
    /// been carried out), so its 503 is expected, as it would be straight to the apiserver.
    fn stopped_during(&self, from: f64, to: f64) -> bool {
        const SLACK: f64 = 0.05;
        self.restarts.iter().any(|(_, _, _, stopped, _)| from - SLACK <= *stopped && *stopped <= to + SLACK)
    }

    fn serving_at(&self, era: Era, at: f64) -> bool {
        self.up.iter().any(|(_, p, a, b)| era.served_by(p) && *a <= at && at <= *b)
    }

    /// Whether an apiserver serving `era` (before or after) was restarting around `at`, with
    /// a second of slack for Envoy's health checks.
    fn restarting(&self, era: Era, at: f64) -> bool {
        self.restarts.iter().any(|(_, old, new, a, b)| {
            (era.served_by(old) || era.served_by(new)) && *a - 1.0 <= at && at <= *b + 1.0
        })
    }
}

fn classify(r: &mut Request, timeline: &Timeline) {
    r.class = if r.timed_out {
        Class::Timeout
    } else if r.connection {
        Class::Connection
    } else {
        match r.status {
            Some(200 | 201) => Class::Success,
            Some(404) => {
                let missing_object = r.object.as_ref().is_some_and(|name| {
                    r.message.as_deref().is_some_and(|m| m.contains(&format!("\"{name}\" not found")))
                });
                if missing_object {
                    Class::LostWrite
                } else if timeline.serving_throughout(r.era, r.t, r.end()) {
                    Class::WrongNotFound
                } else {
                    Class::CorrectNotFound
                }
            }
            Some(503) => {
                // The stopping apiserver dropped the request under way: its connection, or over
                // HTTP/2 its stream.
                let raced_stop = timeline.stopped_during(r.t, r.end())
                    && r.message
                        .as_deref()
                        .is_some_and(|m| m.contains("connection_termination") || m.contains("remote_reset"));
                r.expected =
                    raced_stop || (!timeline.serving_at(r.era, r.t) && timeline.restarting(r.era, r.t));
                Class::Unavailable
            }
            _ => Class::OtherStatus,
        }
    };
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One run of `o.variant` under load through the given Envoy.
pub async fn run(mode: Mode, o: &Options) -> Result<Run> {
    let timing = o.timing();
    let dir = o.work.join(format!("{}-{}", o.variant.key(), mode.key()));
    let _ = std::fs::remove_dir_all(&dir);
    let specs: Vec<(&str, String)> =
        o.variant.profiles().iter().map(|(id, era)| (*id, o.spec(era))).collect();
    let specs: Vec<(&str, &str)> = specs.iter().map(|(id, spec)| (*id, spec.as_str())).collect();
    let mut options = cluster::Options::ephemeral(&dir, &specs);
    options.real = o.real.clone();
    mode.cluster_options(&mut options);
    options.poll_period = o.poll;
    let mut c =
        cluster::start(&options).await.with_context(|| format!("starting the {} cluster", mode.name()))?;
    let mut result = upgrade_under_load(&mut c, mode, o, &timing).await;
    c.shutdown().await?;
    if let Ok(run) = &mut result {
        run.evidence = evidence::gather(&dir, run.started, &run.records);
    }
    match o.keep {
        true => println!("drill [{}] kept {}", mode.key(), dir.display()),
        false => drop(std::fs::remove_dir_all(&dir)),
    }
    result
}

/// The load's clock and the record of what happened to the apiservers.
struct Phase {
    mode: Mode,
    epoch: Instant,
    events: Vec<Event>,
    timeline: Timeline,
    /// Since when Envoy sends each apiserver requests, with its profile then.
    up_since: BTreeMap<&'static str, (f64, &'static str)>,
    readmissions: Vec<f64>,
    exclusions: Vec<f64>,
    /// Sole-server steps: (what, apiserver, how, from, until).
    steps: Vec<(String, &'static str, &'static str, f64, f64)>,
    kubectl: Kubectl,
    /// What the kubectl loop runs (none: the new era serves nothing the old one does not).
    kubectl_args: Option<[String; 3]>,
    /// The kubectl loop and when it started.
    looping: Option<(f64, Looping)>,
}

impl Phase {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// The kubectl loop, once some apiserver serves what it lists (before, every run would
    /// fail rightly).
    fn start_kubectl(&mut self) {
        if let (None, Some(args)) = (&self.looping, &self.kubectl_args) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            self.looping = Some((self.now(), Looping::start(&self.kubectl, &args)));
        }
    }

    fn event(&mut self, id: &str, what: &'static str, profile: &str) -> f64 {
        let t = self.now();
        eprintln!("drill [{}] {t:6.2}s {id} {what} ({profile})", self.mode.name());
        self.events.push(Event { t, apiserver: id.into(), what, profile: profile.into() });
        t
    }

    /// Drains `id` the way kube-apiserver's `--shutdown-delay-duration` does and stops it.
    async fn drain_and_stop(&mut self, c: &mut Cluster, id: &'static str, timing: &Timing) -> Result<f64> {
        let (since, profile) = self.up_since[id];
        let drain = self.event(id, "drain", profile);
        self.timeline.up.push((id.into(), profile.into(), since, drain));
        c.drain_apiserver(id, Duration::from_secs(15)).await?;
        self.exclusions.push(self.now() - drain);
        // kube-apiserver's --shutdown-delay-duration: unready, still serving what reaches it.
        tokio::time::sleep(timing.shutdown_delay).await;
        self.event(id, "stop", profile);
        c.stop_apiserver(id).await?;
        Ok(drain)
    }

    /// Starts `id` with `profile`, serving at once and ready after `o.ready_delay`; returns when
    /// Envoy sends it requests and (with `table_from`) the table on disk is no longer that
    /// generation.
    async fn boot(
        &mut self,
        c: &mut Cluster,
        id: &'static str,
        profile: &'static str,
        o: &Options,
        table_from: Option<String>,
    ) -> Result<f64> {
        let spec = o.spec(profile);
        // A real kube-apiserver is spawned and goes through its own start-up.
        match o.ready_delay.is_zero() && o.real.is_none() {
            true => c.start_apiserver(id, &spec).await?,
            false => c.boot_apiserver(id, &spec, o.ready_delay).await?,
        }
        let booted = self.event(id, "boot", profile);
        let serving = match o.real {
            None => booted + o.ready_delay.as_secs_f64(),
            Some(_) => booted,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut healthy, mut followed) = (None, table_from.is_none().then_some(0.0));
        while healthy.is_none() || followed.is_none() {
            if Instant::now() > deadline {
                anyhow::bail!("{id} not healthy with the table followed within 60 s");
            }
            if healthy.is_none() && c.envoy_sees_healthy(id).await? == Some(true) {
                healthy = Some(self.event(id, "healthy", profile));
            }
            if let Some(generation) = &table_from {
                if followed.is_none() && c.table_on_disk()?.generation() != generation {
                    followed = Some(self.event(id, "table", profile));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let healthy = healthy.unwrap_or_default();
        self.readmissions.push((healthy - serving).max(0.0));
        self.up_since.insert(id, (healthy, profile));
        Ok(healthy)
    }
}

/// Every apiserver from 1.33 to 1.36, one at a time.
async fn rolling_upgrade(p: &mut Phase, c: &mut Cluster, o: &Options, timing: &Timing) -> Result<()> {
    for id in IDS {
        let generation = match p.mode {
            Mode::Skewgate => Some(c.table_on_disk()?.generation().to_string()),
            Mode::PlainLb | Mode::Mvp => None,
        };
        let drain = p.drain_and_stop(c, id, timing).await?;
        // With a ready delay, the sidecar usually has the new table live before Envoy's
        // /readyz checks pass; without one, only its eligibility control keeps Envoy from
        // sending the new apiserver requests for what it dropped.
        let healthy = p.boot(c, id, NEW, o, generation).await?;
        p.start_kubectl();
        p.timeline.restarts.push((id.into(), OLD.into(), NEW.into(), drain, healthy));
        tokio::time::sleep(timing.pause).await;
        // A real release pair: what went wrong while each apiserver was upgraded.
        if o.release() {
            let (from, to) = o.era_names();
            p.steps.push((format!("{id} upgraded ({from} → {to})"), id, "upgrade", drain, p.now()));
        }
        if let (Some(away), true) = (o.sole_away, id == IDS[0]) {
            sole_server_away(p, c, id, away, false, o, timing).await?;
            sole_server_away(p, c, id, away, true, o, timing).await?;
        }
    }
    // The version skew policy's order: the controller-manager after every apiserver.
    let from = p.now();
    if c.upgrade_controller_manager().await? {
        p.event(CONTROLLER_MANAGER, "upgrade", NEW);
        tokio::time::sleep(timing.pause + timing.pause).await;
        let (old, new) = o.era_names();
        p.steps.push((
            format!("{CONTROLLER_MANAGER} upgraded ({old} → {new})"),
            CONTROLLER_MANAGER,
            "upgrade",
            from,
            p.now(),
        ));
    }
    Ok(())
}

const CONTROLLER_MANAGER: &str = "kube-controller-manager";

/// `id`, the sole server of its era's APIs, stopped (drained and SIGTERM, or SIGKILL) for
/// `away`, then started again as it was: its APIs are "served, unavailable" meanwhile.
async fn sole_server_away(
    p: &mut Phase,
    c: &mut Cluster,
    id: &'static str,
    away: Duration,
    kill: bool,
    o: &Options,
    timing: &Timing,
) -> Result<()> {
    let (since, profile) = p.up_since[id];
    let stop = match kill {
        false => p.drain_and_stop(c, id, timing).await?,
        true => {
            let t = p.event(id, "kill", profile);
            p.timeline.up.push((id.into(), profile.into(), since, t));
            c.kill_apiserver(id).await?;
            t
        }
    };
    tokio::time::sleep(away).await;
    let healthy = p.boot(c, id, profile, o, None).await?;
    p.timeline.restarts.push((id.into(), profile.into(), profile.into(), stop, healthy));
    p.timeline.away.push((id.into(), profile.into(), stop, healthy));
    tokio::time::sleep(timing.pause).await;
    let shown = match profile {
        OLD => o.era_names().0,
        _ => o.era_names().1,
    };
    p.steps.push((
        format!(
            "{id} (sole {shown} server) {} {:.0} s, then back",
            if kill { "SIGKILLed" } else { "stopped (SIGTERM)" },
            away.as_secs_f64()
        ),
        id,
        if kill { "sigkill" } else { "graceful" },
        stop,
        p.now(),
    ));
    Ok(())
}

/// c, the only 1.36-era apiserver, away past the old grace period and back as it was.
async fn leave_and_return(p: &mut Phase, c: &mut Cluster, o: &Options, timing: &Timing) -> Result<()> {
    let id = "c";
    let profile = p.up_since[id].1;
    let drain = p.drain_and_stop(c, id, timing).await?;
    tokio::time::sleep(o.away()).await;
    // Nothing changed about c: the table stays as it was.
    let healthy = p.boot(c, id, profile, o, None).await?;
    p.timeline.restarts.push((id.into(), profile.into(), profile.into(), drain, healthy));
    p.timeline.away.push((id.into(), profile.into(), drain, healthy));
    Ok(())
}

/// How long until Envoy's `/clusters` shows the apiserver at `url` healthy in none of its
/// clusters (`None`: not within 10 s).
async fn until_excluded(clusters: String, url: String) -> Option<Duration> {
    let started = Instant::now();
    let port = url.rsplit(':').next().unwrap_or_default().to_string();
    let client = reqwest::Client::builder().no_proxy().build().ok()?;
    while started.elapsed() < Duration::from_secs(10) {
        if let Ok(text) = client.get(&clusters).send().await {
            if let Ok(text) = text.text().await {
                let flags: Vec<&str> =
                    text.lines().filter(|l| l.contains(&format!(":{port}::health_flags::"))).collect();
                if !flags.is_empty() && flags.iter().all(|l| !l.ends_with("::healthy")) {
                    return Some(started.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// b stopped and started again at once with the other release, `o.restarts` times.
async fn restarts(p: &mut Phase, c: &mut Cluster, o: &Options, timing: &Timing) -> Result<()> {
    let id = "b";
    for _ in 0..o.restarts {
        let (since, from) = p.up_since[id];
        let to = if from == OLD { NEW } else { OLD };
        let generation = match p.mode {
            Mode::Skewgate => Some(c.table_on_disk()?.generation().to_string()),
            Mode::PlainLb | Mode::Mvp => None,
        };
        let stop = p.event(id, "stop", from);
        p.timeline.up.push((id.into(), from.into(), since, stop));
        let excluded = tokio::spawn(until_excluded(c.envoy()?.admin_url("/clusters"), c.apiserver_url(id)?));
        c.stop_apiserver(id).await?;
        // A real kube-apiserver refuses connections for 0.9–2.2 s after it starts.
        tokio::time::sleep(o.down).await;
        let healthy = p.boot(c, id, to, o, generation).await?;
        // Taken back without ever being taken out (the plain LB, or a restart Envoy did not see).
        if excluded.is_finished() {
            if let Ok(Some(after)) = excluded.await {
                p.exclusions.push(after.as_secs_f64());
            }
        } else {
            excluded.abort();
        }
        p.timeline.restarts.push((id.into(), from.into(), to.into(), stop, healthy));
        tokio::time::sleep(timing.pause).await;
    }
    Ok(())
}

async fn upgrade_under_load(c: &mut Cluster, mode: Mode, o: &Options, timing: &Timing) -> Result<Run> {
    // Longer than the edge's hold (10 s): a request that waits there for its apiserver to come
    // back is a slow request, and the client would otherwise count it a timeout.
    let client = c.client(Credentials::AdminToken, Duration::from_secs(15))?;
    let load = o.load();
    let (lists, creates) = (load.lists.clone(), load.creates.clone());
    let shared = Arc::new(Shared {
        lists,
        creates,
        client,
        base: c.envoy_url()?,
        epoch: Instant::now(),
        records: Mutex::new(Vec::new()),
        client_go: Mutex::new(Vec::new()),
        applied_twice: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        watches: AtomicU64::new(0),
        watch_cuts: AtomicU64::new(0),
    });
    let started = time::OffsetDateTime::now_utc();
    let skipped = Arc::new(AtomicU64::new(0));
    let controllers = match c.controller_manager.is_some() {
        true => {
            controllers::Workload::prepare(&shared).await?;
            Some(Arc::new(controllers::Workload::default()))
        }
        false => None,
    };
    // Bounded: at most this many operations each.
    let ops = plan(o.seed, o.rate as usize * 600);
    let raw = dispatch(shared.clone(), Client::Raw, ops, o.rate, skipped.clone());
    let client_go_rate = (o.rate / CLIENT_GO_SHARE).max(1);
    let client_go_ops = plan(o.seed.wrapping_add(1), client_go_rate as usize * 600);
    let client_go =
        dispatch(shared.clone(), Client::ClientGo, client_go_ops, client_go_rate, skipped.clone());
    let watchers: Vec<_> = (0..WATCHES).map(|i| tokio::spawn(watch(shared.clone(), i))).collect();
    let workload: Vec<_> = match &controllers {
        Some(w) => vec![
            tokio::spawn(w.clone().owners(shared.clone())),
            tokio::spawn(w.clone().namespaces(shared.clone())),
        ],
        None => Vec::new(),
    };

    let kubectl = Kubectl::new(&c.kubeconfig, &c.out.join("kubectl-cache"))?.with_context("skewgate-admin");
    let mut p = Phase {
        mode,
        epoch: shared.epoch,
        events: Vec::new(),
        timeline: Timeline::default(),
        up_since: o.variant.profiles().into_iter().map(|(id, pr)| (id, (f64::NEG_INFINITY, pr))).collect(),
        readmissions: Vec::new(),
        exclusions: Vec::new(),
        steps: Vec::new(),
        kubectl,
        kubectl_args: load.kubectl_args(),
        looping: None,
    };
    if o.variant.profiles().iter().any(|(_, era)| *era == NEW) {
        p.start_kubectl();
    }
    tokio::time::sleep(timing.warmup).await;
    match o.variant {
        Variant::Upgrade => rolling_upgrade(&mut p, c, o, timing).await?,
        Variant::LeaveAndReturn => leave_and_return(&mut p, c, o, timing).await?,
        Variant::Restarts => restarts(&mut p, c, o, timing).await?,
    }
    tokio::time::sleep(timing.cooldown).await;
    shared.stop.store(true, Ordering::SeqCst);
    let kubectl = match p.looping.take() {
        Some((from, looping)) => {
            let command = load.kubectl_args().map(|a| a.join(" ")).unwrap_or_default();
            Some(KubectlTally::of(from, command, &looping.stop().await?))
        }
        None => None,
    };
    raw.await?;
    client_go.await?;
    for w in watchers {
        w.abort();
        let _ = w.await;
    }
    for w in workload {
        w.await?;
    }
    let duration = p.now();
    let Phase { events, mut timeline, up_since, readmissions, exclusions, steps, .. } = p;
    for (id, (since, profile)) in up_since {
        timeline.up.push((id.into(), profile.into(), since, f64::INFINITY));
    }

    // What etcd holds, read straight from an apiserver that serves every kind involved: at the
    // end of an upgrade all do; otherwise c, the new era's.
    let direct_id = match o.variant {
        Variant::Upgrade => "a",
        Variant::LeaveAndReturn | Variant::Restarts => "c",
    };
    let direct = c.direct_client(Duration::from_secs(10))?;
    let direct_url = c.apiserver_url(direct_id)?;
    let generated_twice = generated_twice(&direct, &direct_url).await?;
    let harm = match &controllers {
        Some(w) => Some(harm::count(&w.census(&direct, &direct_url).await?)),
        None => None,
    };
    let controller_errors = match &c.controller_manager {
        Some(m) => harm::errors(&std::fs::read_to_string(&m.log).unwrap_or_default()),
        None => BTreeMap::new(),
    };
    let held = match mode {
        Mode::Skewgate => Some(edge_held(c).await?),
        Mode::PlainLb | Mode::Mvp => None,
    };

    let mut records = std::mem::take(&mut *shared.records.lock().unwrap_or_else(PoisonError::into_inner));
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    for r in &mut records {
        classify(r, &timeline);
    }
    let mut client_go_records =
        std::mem::take(&mut *shared.client_go.lock().unwrap_or_else(PoisonError::into_inner));
    for r in &mut client_go_records {
        classify(r, &timeline);
    }
    let client_go = ClientGoTally::of(
        &client_go_records,
        shared.applied_twice.load(Ordering::SeqCst) as usize + generated_twice,
    );
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in &records {
        *counts.entry(r.class.key()).or_default() += 1;
    }
    let seconds = duration.ceil() as usize + 1;
    let mut errors_per_second: BTreeMap<String, Vec<usize>> =
        Class::ERRORS.iter().map(|c| (c.key(), vec![0; seconds])).collect();
    for r in &records {
        if let Some(bins) = errors_per_second.get_mut(&r.class.key()) {
            let i = (r.t.max(0.0) as usize).min(seconds - 1);
            bins[i] += 1;
        }
    }
    let mut latencies: Vec<f64> =
        records.iter().filter(|r| r.verb != "watch").map(|r| r.latency_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let steps: Vec<Step> = steps
        .into_iter()
        .map(|(what, apiserver, how, from, until)| {
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            let mut unavailable_why: BTreeMap<String, usize> = BTreeMap::new();
            for r in records.iter().filter(|r| from <= r.t && r.t < until) {
                *counts.entry(r.class.key()).or_default() += 1;
                if r.class == Class::Unavailable {
                    *unavailable_why.entry(unavailable_why_key(r.message.as_deref())).or_default() += 1;
                }
            }
            Step { what, apiserver: apiserver.into(), how, from, until, counts, unavailable_why }
        })
        .collect();
    let mut client_go = client_go;
    client_go.failures_in_steps = client_go_records
        .iter()
        .filter(|r| Class::ERRORS.contains(&r.class))
        .filter(|r| steps.iter().any(|s: &Step| s.from <= r.t && r.t < s.until))
        .count();
    let first_drain = timeline.restarts.first().map_or(0.0, |r| r.3);
    let last_healthy = timeline.restarts.last().map_or(0.0, |r| r.4);
    Ok(Run {
        mode,
        name: mode.name(),
        variant: o.variant,
        requests: records.len(),
        counts,
        unexpected_503: records.iter().filter(|r| r.class == Class::Unavailable && !r.expected).count(),
        watches_established: shared.watches.load(Ordering::SeqCst) as usize,
        watch_cuts: shared.watch_cuts.load(Ordering::SeqCst) as usize,
        skipped: skipped.load(Ordering::SeqCst),
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        upgrade_seconds: last_healthy - first_drain,
        readmission_seconds: readmissions,
        out_seconds: timeline.restarts.iter().map(|r| r.4 - r.3).collect(),
        exclusion_seconds: exclusions,
        duration_seconds: duration,
        events,
        errors_per_second,
        steps,
        client_go,
        kubectl,
        held,
        harm,
        controller_errors,
        probe: None,
        records,
        started,
        evidence: None,
    })
}

/// The client-go-like client runs at this fraction of the raw client's rate.
const CLIENT_GO_SHARE: u32 = 4;

/// Objects beyond the first made by one `generateName` create of the client-go-like client
/// (the same [`WRITE_LABEL`] value twice: a create sent again after it had taken effect).
async fn generated_twice(client: &reqwest::Client, apiserver: &str) -> Result<usize> {
    let url = format!("{apiserver}/api/v1/namespaces/default/configmaps?labelSelector={WRITE_LABEL}");
    let r = client.get(&url).header("accept", "application/json").send().await?;
    anyhow::ensure!(r.status() == 200, "GET {url}: {}", r.status());
    let list: Value = r.json().await?;
    let values = list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["metadata"]["labels"][WRITE_LABEL].as_str().map(str::to_owned));
    Ok(extra_copies(values))
}

/// How many values occur more than once, counted once per extra occurrence.
pub fn extra_copies(values: impl IntoIterator<Item = String>) -> usize {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for v in values {
        *seen.entry(v).or_default() += 1;
    }
    seen.values().map(|n| n - 1).sum()
}

/// The skewgate Envoy's held requests ([`held::parse`]).
async fn edge_held(c: &Cluster) -> Result<held::Held> {
    let url = c.envoy()?.admin_url("/stats?format=json&filter=skewgate");
    let client = reqwest::Client::builder().no_proxy().build()?;
    // Until the histogram has every wait the counters have (one stats flush, 5 s, at most).
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        let stats: Value = client.get(&url).send().await?.json().await?;
        let held = held::parse(&stats);
        let recorded = held::waits_recorded(&c.envoy()?.prometheus().await?);
        if recorded >= held.waits() || Instant::now() > deadline {
            return Ok(held);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The client-go-like client's requests.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientGoTally {
    pub requests: usize,
    /// By class of the last answer.
    pub counts: BTreeMap<String, usize>,
    /// Requests whose last answer was an error ([`Class::ERRORS`]): what its caller saw fail.
    pub failures: usize,
    /// Requests sent more than once, and the extra sends.
    pub resent: usize,
    pub extra_sends: usize,
    /// Writes that took effect twice, or would have but for their name.
    pub applied_twice: usize,
    /// Of `failures`, those sent while the sole server of the new APIs was stopped on purpose
    /// (the scripted stops, [`Options::sole_away`]): the rest fell in the rolling upgrade itself.
    pub failures_in_steps: usize,
}

impl ClientGoTally {
    pub fn count(&self, class: Class) -> usize {
        self.counts.get(&class.key()).copied().unwrap_or(0)
    }

    fn of(records: &[Request], applied_twice: usize) -> Self {
        let mut t = ClientGoTally { requests: records.len(), applied_twice, ..Default::default() };
        for r in records {
            *t.counts.entry(r.class.key()).or_default() += 1;
            t.failures += usize::from(Class::ERRORS.contains(&r.class));
            t.resent += usize::from(r.attempts > 1);
            t.extra_sends += r.attempts as usize - 1;
        }
        t
    }
}

/// The kubectl loop of a GVR only the new era serves, from when some apiserver first served it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KubectlTally {
    /// `kubectl`'s arguments.
    pub command: String,
    /// Seconds into the load when it started.
    pub from: f64,
    pub runs: usize,
    pub failures: usize,
    /// Failures by kubectl's error line.
    pub causes: BTreeMap<String, usize>,
}

impl KubectlTally {
    fn of(from: f64, command: String, runs: &Runs) -> Self {
        let failed = runs.failures();
        let mut causes = BTreeMap::new();
        for f in &failed {
            *causes.entry(skewgate_harness::clients::error_line(f)).or_default() += 1;
        }
        KubectlTally { command, from, runs: runs.0.len(), failures: failed.len(), causes }
    }
}

/// Every run, plain LB first (on real binaries: plain LB, in-apiserver MVP, skewgate, each with
/// its probe).
pub async fn drill(o: &Options) -> Result<Vec<Run>> {
    let mut o = o.clone();
    if o.release() && o.release_load.is_none() {
        o.release_load = Some(release_load(&o).await?);
    }
    let o = &o;
    let mut runs = Vec::new();
    for mode in Mode::all(o.real.is_some()).iter().filter(|m| o.only.is_none_or(|only| only == **m)) {
        let probe = match &o.real {
            Some(_) => Some(crate::probe::probe(*mode, o, &o.load()).await?),
            None => None,
        };
        let mut r = run(*mode, o).await?;
        r.probe = probe;
        runs.push(r);
    }
    let _ = std::fs::remove_dir(&o.work);
    Ok(runs)
}

/// A real release pair's load: each release's binary started alone on a throwaway etcd, and
/// what one serves and the other does not listed.
pub async fn release_load(o: &Options) -> Result<Load> {
    let binaries = o.real.as_ref().context("a release pair needs real binaries")?;
    let mut documents = Vec::new();
    for era in [OLD, NEW] {
        let spec = real::Spec::parse(&o.spec(era))?;
        let dir = o.work.join(format!("discovery-{}", era.to_lowercase()));
        let found = real::discovery_of(binaries, &spec, &dir)
            .await
            .with_context(|| format!("reading what {} serves", o.spec(era)))?;
        let _ = std::fs::remove_dir_all(&dir);
        documents.push(found);
    }
    let load = Load::release(&documents[0], &documents[1])?;
    eprintln!(
        "drill: the releases differ in {}",
        match load.differ.is_empty() {
            true => "nothing the load asks for".to_string(),
            false => load
                .differ
                .iter()
                .map(|g| format!("{} ({:?} only)", g.name(), g.era))
                .collect::<Vec<_>>()
                .join(", "),
        }
    );
    Ok(load)
}

/// What the drill shows, for `latest.json`.
pub fn results_json(o: &Options, runs: &[Run]) -> Value {
    json!({
        "variant": o.variant,
        "rate": o.rate,
        "seed": o.seed,
        "quick": o.quick,
        "readyDelaySeconds": o.ready_delay.as_secs_f64(),
        "pollSeconds": o.poll.as_secs_f64(),
        "awaySeconds": (o.variant == Variant::LeaveAndReturn).then(|| o.away().as_secs_f64()),
        "apiservers": match &o.real {
            None => json!({"stand-ins": {"old": OLD, "new": NEW}}),
            Some(b) => json!({"kube-apiserver": b.version().ok().flatten(), "old": o.spec(OLD), "new": o.spec(NEW)}),
        },
        "differ": o.load().differ.iter().map(|g| json!({"gvr": g.name(), "era": g.era})).collect::<Vec<_>>(),
        "runs": runs,
    })
}

fn era_name(era: Era, old: &str, new: &str) -> String {
    match era {
        Era::Old => old.to_string(),
        Era::New => new.to_string(),
        Era::Both => "both".to_string(),
    }
}

/// What the run was, in one sentence for docs/drill.md.
pub fn settings(o: &Options) -> String {
    let ready = match (&o.real, o.ready_delay.is_zero()) {
        (Some(b), _) => format!(
            "real {} ({} → {}), ready when their own start-up is done",
            b.version().ok().flatten().unwrap_or_else(|| "kube-apiservers".into()),
            o.spec(OLD),
            o.spec(NEW)
        ),
        (None, true) => "ready the instant they start".to_string(),
        (None, false) => format!("ready {} s after they start", o.ready_delay.as_secs_f64()),
    };
    let (from, to) = o.era_names();
    let what = match o.variant {
        Variant::Upgrade => match o.sole_away {
            None => format!("three apiservers upgraded from {from} to {to} one at a time"),
            Some(away) => format!(
                "three apiservers upgraded from {from} to {to} one at a time; the first upgraded (a, \
                 the sole {to} server) stopped (SIGTERM) for {0:.0} s and back, then SIGKILLed for \
                 {0:.0} s and back, before b and c",
                away.as_secs_f64()
            ),
        },
        Variant::LeaveAndReturn => format!(
            "a and b at 1.33, c (the only 1.36 apiserver) drained, stopped for {:.0} s and back",
            o.away().as_secs_f64()
        ),
        Variant::Restarts => format!(
            "a at 1.33, c at 1.36, b restarted {} times without a drain, alternating 1.33 and 1.36, \
             listening again {} s after its old process stopped",
            o.restarts,
            o.down.as_secs_f64()
        ),
    };
    let controllers = match o.real.as_ref().and_then(|b| b.kube_controller_manager.as_ref()) {
        Some(_) => {
            "; a kube-controller-manager (garbage collector, namespace controller) through the front door, \
             with owners (ResourceClaims of resource.k8s.io/v1, ConfigMaps) of dependent ConfigMaps \
             created every second and a namespace holding both created and deleted every 3 s"
        }
        None => {
            "; no kube-controller-manager (stand-ins have none; real binaries take one by \
             KUBE_CONTROLLER_MANAGER=PATH), so the garbage-collection and namespace rows are not measured"
        }
    };
    let differ = match o.release() {
        true => {
            let differ: Vec<String> = o
                .load()
                .differ
                .iter()
                .map(|g| format!("{} ({} only)", g.name(), era_name(g.era, &from, &to)))
                .collect();
            match differ.is_empty() {
                true => "; the releases serve the same GVRs".to_string(),
                false => format!(
                    "; the releases differ in {}: from the first apiserver's upgrade to the last, only \
                     some apiservers serve them, and the load asks for them",
                    differ.join(", ")
                ),
            }
        }
        false => String::new(),
    };
    let kcm_last =
        match o.real.as_ref().and_then(|b| b.old.as_ref()).and_then(|r| r.kube_controller_manager.as_ref()) {
            Some(_) => {
                format!("; the controller-manager {from} until every apiserver is upgraded, then {to}")
            }
            None => String::new(),
        };
    format!(
        "{what}{differ}; apiservers {ready}{controllers}{kcm_last}; sidecar poll {} s; {} operations/s from a raw client \
         (seed {}) and {} from a client that sends again as client-go does",
        o.poll.as_secs_f64(),
        o.rate,
        o.seed,
        (o.rate / CLIENT_GO_SHARE).max(1)
    )
}

/// `key: n` for each non-zero count.
fn by_class(counts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> =
        counts.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k}: {n}")).collect();
    match parts.is_empty() {
        true => "-".into(),
        false => parts.join(", "),
    }
}

/// `kind n of m` for each kind of owner.
fn of_kinds(counts: &BTreeMap<String, usize>, of: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> =
        of.iter().map(|(k, m)| format!("{k} {} of {m}", counts.get(k).copied().unwrap_or(0))).collect();
    parts.join(", ")
}

/// Median and maximum, in seconds.
fn median_max(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.last() {
        Some(max) => format!("{:.2} / {:.2} s", percentile(&sorted, 0.5), max),
        None => "-".into(),
    }
}

/// The side-by-side table (markdown).
pub fn markdown_table(runs: &[Run]) -> String {
    let mut md = String::from("| |");
    for r in runs {
        md.push_str(&format!(" {} |", r.name));
    }
    md.push_str("\n|---|");
    md.push_str(&"---:|".repeat(runs.len()));
    md.push('\n');
    let mut row = |label: &str, f: &dyn Fn(&Run) -> String| {
        md.push_str(&format!("| {label} |"));
        for r in runs {
            md.push_str(&format!(" {} |", f(r)));
        }
        md.push('\n');
    };
    row("requests", &|r| r.requests.to_string());
    for class in [
        Class::Success,
        Class::WrongNotFound,
        Class::LostWrite,
        Class::Unavailable,
        Class::Connection,
        Class::Timeout,
        Class::OtherStatus,
        Class::CorrectNotFound,
    ] {
        match class {
            Class::Unavailable => {
                row("503 (unexpected: not while every server of the GVR restarted or was away)", &|r| {
                    format!("{} ({})", r.count(class), r.unexpected_503)
                })
            }
            _ => row(class.label(), &|r| r.count(class).to_string()),
        }
    }
    row("watches established / cut mid-stream", &|r| format!("{} / {}", r.watches_established, r.watch_cuts));
    row("latency p50 / p99", &|r| format!("{:.1} / {:.1} ms", r.p50_ms, r.p99_ms));
    row("first drain → last healthy", &|r| format!("{:.1} s", r.upgrade_seconds));
    row("drain (or stop) → Envoy sends it no new request (median / max)", &|r| {
        median_max(&r.exclusion_seconds)
    });
    row("drain (or stop) → Envoy sends it requests again (median / max)", &|r| median_max(&r.out_seconds));
    row("serving again → Envoy sends it requests (median / max)", &|r| median_max(&r.readmission_seconds));
    row("client-go-like client: failed / requests (sent again: requests / extra sends)", &|r| {
        let t = &r.client_go;
        format!("{} / {} ({} / {})", t.failures, t.requests, t.resent, t.extra_sends)
    });
    row("… of them while the sole server was stopped on purpose / in the upgrade itself", &|r| {
        let t = &r.client_go;
        format!("{} / {}", t.failures_in_steps, t.failures - t.failures_in_steps)
    });
    row("… its failures by class", &|r| {
        let failed = Class::ERRORS.map(|c| (c.label().to_string(), r.client_go.count(c)));
        by_class(&failed.into_iter().collect())
    });
    row("writes applied twice (client-go-like client)", &|r| r.client_go.applied_twice.to_string());
    let command = runs.iter().find_map(|r| r.kubectl.as_ref()).map_or("get", |k| k.command.as_str());
    row(&format!("`kubectl {command}` in a loop, from the first moment it is served: failed / runs"), &|r| {
        match &r.kubectl {
            Some(k) => format!("{} / {}", k.failures, k.runs),
            None => "-".into(),
        }
    });
    row("requests held at the edge (resumed / expired / refused)", &|r| match &r.held {
        Some(h) => format!(
            "{} ({} / {} / {})",
            h.total(),
            h.outcomes.get("resumed").copied().unwrap_or(0),
            h.outcomes.get("expired").copied().unwrap_or(0),
            h.outcomes.get("refused").copied().unwrap_or(0)
        ),
        None => "—".into(),
    });
    row("… how long held, p50 / p99 / max", &|r| match &r.held {
        Some(Held { p50_ms: Some(p50), p99_ms: Some(p99), max_ms: Some(max), .. }) => {
            format!("{p50:.0} / {p99:.0} / {max:.0} ms")
        }
        Some(_) => "none held".into(),
        None => "—".into(),
    });
    const NO_CONTROLLERS: &str = "not run (no kube-controller-manager)";
    row("dependents wrongly garbage-collected (owner still there)", &|r| match &r.harm {
        Some(h) => format!("{} ({})", h.wrongly_collected_total(), of_kinds(&h.wrongly_collected, &h.sets)),
        None => NO_CONTROLLERS.into(),
    });
    row("objects left under deleted namespaces", &|r| match &r.harm {
        Some(h) if h.left_behind.is_empty() => "0".into(),
        Some(h) => format!("{} ({})", h.left_behind_total(), by_class(&h.left_behind)),
        None => NO_CONTROLLERS.into(),
    });
    row("namespaces stuck (of deleted)", &|r| match &r.harm {
        Some(h) => format!("{} of {}", h.stuck.len(), h.namespaces_deleted),
        None => NO_CONTROLLERS.into(),
    });
    row("namespace deletion, median / max (the slowest deleted at, into the run)", &|r| match &r.harm {
        Some(h) => match h.slowest() {
            Some(d) => format!("{} ({:.1} s)", median_max(&h.deletion_seconds), d.at),
            None => median_max(&h.deletion_seconds),
        },
        None => NO_CONTROLLERS.into(),
    });
    row("kube-controller-manager error lines (most frequent)", &|r| match &r.harm {
        Some(_) => {
            let total: usize = r.controller_errors.values().sum();
            match r.controller_errors.iter().max_by_key(|(_, n)| **n) {
                Some((what, n)) => format!("{total} ({n} × {})", what.replace('|', "/")),
                None => "0".into(),
            }
        }
        None => NO_CONTROLLERS.into(),
    });
    let steps = runs.iter().map(|r| r.steps.len()).max().unwrap_or(0);
    for i in 0..steps {
        let what = runs.iter().find_map(|r| r.steps.get(i)).map(|s| s.what.clone()).unwrap_or_default();
        row(
            &format!("{what}: wrong 404 / 503 / connection+timeout / lost write"),
            &|r| match r.steps.get(i) {
                Some(s) => format!(
                    "{} / {} / {} / {}",
                    s.count(Class::WrongNotFound),
                    s.count(Class::Unavailable),
                    s.count(Class::Connection) + s.count(Class::Timeout),
                    s.count(Class::LostWrite)
                ),
                None => "-".into(),
            },
        );
    }
    for i in 0..steps {
        let what = runs.iter().find_map(|r| r.steps.get(i)).map(|s| s.what.clone()).unwrap_or_default();
        row(
            &format!(
                "{what}: its 503s after waiting at the edge / at once with Retry-After / at once without"
            ),
            &|r| match r.steps.get(i) {
                Some(s) if !s.unavailable_why.is_empty() => {
                    let n = |k: &str| {
                        s.unavailable_why
                            .iter()
                            .filter(|(w, _)| w.starts_with(k))
                            .map(|(_, n)| n)
                            .sum::<usize>()
                    };
                    let at_once: Vec<String> = s
                        .unavailable_why
                        .iter()
                        .filter(|(w, _)| w.starts_with("at once"))
                        .map(|(w, n)| format!("{n} × {}", w.trim_start_matches("at once, ")))
                        .collect();
                    let counts =
                        format!("{} / {} / {}", n("held"), n("at once, retry"), n("at once, no retry"));
                    match at_once.is_empty() {
                        true => counts,
                        false => format!("{counts} ({})", at_once.join("; ")),
                    }
                }
                Some(_) => "none".into(),
                None => "-".into(),
            },
        );
    }
    if runs.iter().any(|r| r.probe.is_some()) {
        crate::probe::markdown_rows(&mut |label, cell| row(label, &|r: &Run| cell(r.probe.as_ref())));
    }
    md
}

/// Errors per second by class, one panel per run, restarts marked.
pub fn timeline_svg(o: &Options, runs: &[Run]) -> String {
    let (from, to) = o.era_names();
    let title = match runs.first().map(|r| r.variant) {
        Some(Variant::LeaveAndReturn) => format!("The only {to} apiserver away and back under load"),
        Some(Variant::Restarts) => "An apiserver restarted again and again under load".to_string(),
        _ => format!("Rolling upgrade {from} → {to} under load"),
    };
    let (w, panel, left, right, top, gap) = (860.0, 220.0, 60.0, 200.0, 34.0, 50.0);
    let h = top + runs.len() as f64 * (panel + gap);
    let seconds = runs.iter().map(|r| r.duration_seconds).fold(1.0, f64::max).ceil();
    let max_y =
        runs.iter().flat_map(|r| r.errors_per_second.values().flatten().copied()).max().unwrap_or(0).max(1)
            as f64
            * 1.1;
    let x = |t: f64| left + t / seconds * (w - left - right);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">{title}: client errors per second</text>\n"
    );
    for (i, run) in runs.iter().enumerate() {
        let y0 = top + i as f64 * (panel + gap) + 20.0;
        let y = |v: f64| y0 + panel - v / max_y * panel;
        svg +=
            &format!("<text x=\"{left}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>\n", y0 - 6.0, run.name);
        svg += &format!(
            "<line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\n\
             <line x1=\"{left}\" y1=\"{y0:.1}\" x2=\"{left}\" y2=\"{:.1}\" stroke=\"black\"/>\n",
            y(0.0),
            x(seconds),
            y(0.0),
            y(0.0)
        );
        for k in 0..=4 {
            let v = max_y / 1.1 * k as f64 / 4.0;
            svg += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\n",
                left - 6.0,
                y(v) + 4.0,
                v
            );
        }
        let step = if seconds > 60.0 { 10 } else { 5 };
        for s in (0..=seconds as usize).step_by(step) {
            svg += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{s}s</text>\n",
                x(s as f64),
                y(0.0) + 16.0
            );
        }
        for e in run.events.iter().filter(|e| e.what == "stop" || e.what == "kill") {
            svg += &format!(
                "<line x1=\"{0:.1}\" y1=\"{y0:.1}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"#888\" stroke-dasharray=\"4,3\"/>\n\
                 <text x=\"{2:.1}\" y=\"{3:.1}\" fill=\"#555\">{4} {5}</text>\n",
                x(e.t),
                y(0.0),
                x(e.t) + 3.0,
                y0 + 12.0,
                e.apiserver,
                if e.what == "kill" { "SIGKILL" } else { "stops" }
            );
        }
        for class in Class::ERRORS {
            let Some(bins) = run.errors_per_second.get(&class.key()) else { continue };
            if bins.iter().all(|b| *b == 0) {
                continue;
            }
            let points: Vec<String> = bins
                .iter()
                .enumerate()
                .map(|(s, v)| format!("{:.1},{:.1}", x(s as f64 + 0.5), y(*v as f64)))
                .collect();
            svg += &format!(
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                class.color(),
                points.join(" ")
            );
        }
    }
    for (k, class) in Class::ERRORS.iter().enumerate() {
        let ly = top + 30.0 + k as f64 * 18.0;
        svg += &format!(
            "<line x1=\"{0:.1}\" y1=\"{ly:.1}\" x2=\"{1:.1}\" y2=\"{ly:.1}\" stroke=\"{2}\" stroke-width=\"3\"/>\n\
             <text x=\"{3:.1}\" y=\"{4:.1}\">{5}</text>\n",
            w - right + 15.0,
            w - right + 35.0,
            class.color(),
            w - right + 40.0,
            ly + 4.0,
            class.label()
        );
    }
    svg + "</svg>\n"
}

pub const PAGE_BEGIN: &str = "<!-- drill:begin (generated by `make drill`) -->";
pub const PAGE_END: &str = "<!-- drill:end -->";

/// The plot of `variant` under `drill/results/`.
pub fn timeline_file(variant: Variant) -> String {
    match variant {
        Variant::Upgrade => "timeline.svg".into(),
        other => format!("timeline-{}.svg", other.key()),
    }
}

/// `variant`'s part of docs/drill.md's generated section: settings, table, plot.
pub fn page_part(o: &Options, runs: &[Run]) -> String {
    let title = match o.variant {
        Variant::Upgrade => "Rolling upgrade",
        Variant::LeaveAndReturn => "Leave and return",
        Variant::Restarts => "Restarts",
    };
    format!(
        "**{title}** (`make drill {}DRILL_ARGS=\"{}\"`): {}.\n\n{}\n![{title}: client errors per second](../drill/results/{})\n",
        match &o.real {
            Some(b) => {
                let kcm = |old: &str| match b.kube_controller_manager.is_some() {
                    true => format!("{old}KUBE_CONTROLLER_MANAGER=PATH "),
                    false => String::new(),
                };
                let release = match &b.old {
                    Some(old) if old.kube_controller_manager.is_some() => {
                        format!("OLD_KUBE_APISERVER=PATH {}", kcm("OLD_"))
                    }
                    Some(_) => "OLD_KUBE_APISERVER=PATH ".to_string(),
                    None => String::new(),
                };
                format!("KUBE_APISERVER=PATH ETCD=PATH {}{release}", kcm(""))
            }
            None => String::new(),
        },
        args(o),
        settings(o),
        markdown_table(runs),
        match (&o.real, o.release()) {
            (None, _) => timeline_file(o.variant),
            (Some(_), false) => format!("real-{}", timeline_file(o.variant)),
            (Some(_), true) => format!("release-{}", timeline_file(o.variant)),
        }
    )
}

/// The drill arguments that reproduce `o`.
fn args(o: &Options) -> String {
    let mut args = match o.real {
        None => vec![format!("--ready-delay {}", o.ready_delay.as_secs_f64())],
        Some(_) => Vec::new(),
    };
    args.push(format!("--poll {}", o.poll.as_secs_f64()));
    match o.variant {
        Variant::Upgrade => {
            let default = o.real.as_ref().map(|_| Duration::from_secs(20));
            if o.sole_away != default {
                args.push(format!("--sole-away {}", o.sole_away.unwrap_or_default().as_secs_f64()));
            }
        }
        Variant::LeaveAndReturn => args.push("--leave-and-return".into()),
        Variant::Restarts => args.push(format!("--restarts {} --down {}", o.restarts, o.down.as_secs_f64())),
    }
    if o.rate != Options::new(false).rate {
        args.push(format!("--rate {}", o.rate));
    }
    args.join(" ")
}

/// Replaces the section between the markers of `page` with every variant's part found in
/// `results` (`<variant>.md`), so that each run keeps the other's table.
pub fn update_page(page: &Path, results: &Path) -> Result<()> {
    let mut parts = Vec::new();
    for variant in [Variant::Upgrade, Variant::LeaveAndReturn, Variant::Restarts] {
        if let Ok(part) = std::fs::read_to_string(results.join(format!("{}.md", variant.key()))) {
            parts.push(part);
        }
    }
    skewgate_harness::markdown::update_section(page, None, PAGE_BEGIN, PAGE_END, &parts.join("\n"))
}

/// What a 503 `Status` from the edge says about itself, for [`Step::unavailable_why`]: waited at
/// the edge, or at once, with or without `Retry-After` (whose absence its message states), and
/// Envoy's detail.
fn unavailable_why_key(message: Option<&str>) -> String {
    let message = message.unwrap_or_default();
    if message.contains("at the edge") {
        return "held".into();
    }
    let retry = if message.contains("may have reached an apiserver") { "no retry" } else { "retry" };
    let detail = message
        .rsplit_once("(cluster ")
        .and_then(|(_, rest)| rest.split_once("; "))
        .map(|(_, d)| d.split([')', '{', '|']).next().unwrap_or_default())
        .unwrap_or("other");
    format!("at once, {retry}: {detail}")
}
