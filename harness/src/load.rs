//! A load loop through Envoy that records every request: when it started, what it asked for,
//! what came back (status, who served it, the `Status` reason of an error), how long it took and,
//! when no answer came, what kind of failure it was. The end-to-end tests and the rolling-upgrade
//! drill read their verdicts out of these records.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::Value;

use crate::echo::SERVED_BY;

/// One list request the loop repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub group: String,
    pub version: String,
    pub resource: String,
    /// Path and query sent to Envoy.
    pub path: String,
}

impl Target {
    /// A list of `resource` (in `namespace` when given), as kubectl asks for it.
    pub fn list(group: &str, version: &str, resource: &str, namespace: Option<&str>) -> Self {
        let prefix =
            if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
        let path = match namespace {
            Some(ns) => format!("{prefix}/namespaces/{ns}/{resource}?limit=500"),
            None => format!("{prefix}/{resource}?limit=500"),
        };
        Self { group: group.into(), version: version.into(), resource: resource.into(), path }
    }

    /// `resource.version.group` (`pods.v1` for core), as kubectl names a GVR.
    pub fn name(&self) -> String {
        match self.group.is_empty() {
            true => format!("{}.{}", self.resource, self.version),
            false => format!("{}.{}.{}", self.resource, self.version, self.group),
        }
    }
}

/// Why a request got no HTTP answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No connection to Envoy.
    Connect,
    /// No complete answer within the client's timeout.
    Timeout,
    /// The connection or stream broke before the answer was complete.
    Reset,
    Other,
}

/// One request and its outcome.
#[derive(Debug, Clone)]
pub struct Record {
    /// Index into the load's targets.
    pub target: usize,
    /// When it was sent, from the load's start.
    pub started: Duration,
    pub latency: Duration,
    pub answer: Answer,
}

/// A record reads as what its request got (`record.status`, `record.served_by`, ...).
impl std::ops::Deref for Record {
    type Target = Answer;

    fn deref(&self) -> &Answer {
        &self.answer
    }
}

impl Record {
    pub fn ok(&self) -> bool {
        self.status == Some(200)
    }

    pub fn ended(&self) -> Duration {
        self.started + self.latency
    }

    /// A 503 with a Kubernetes `Status` body (what skewgate turns Envoy's failures into).
    pub fn is_unavailable_status(&self) -> bool {
        self.status == Some(503) && self.reason.as_deref() == Some("ServiceUnavailable")
    }

    /// Whether the request was under way at `at`.
    pub fn in_flight_at(&self, at: Duration) -> bool {
        self.started <= at && at <= self.ended()
    }

    /// One line for failure listings.
    pub fn describe(&self, targets: &[Target]) -> String {
        let name = targets.get(self.target).map(Target::name).unwrap_or_default();
        let outcome = match (self.status, self.error) {
            (Some(status), _) => format!(
                "{status} {} by {}: {}",
                self.reason.as_deref().unwrap_or("-"),
                self.served_by.as_deref().unwrap_or("Envoy"),
                self.message.as_deref().unwrap_or("")
            ),
            (None, kind) => format!("{kind:?}: {}", self.detail.as_deref().unwrap_or("")),
        };
        format!("{name} at {:?} ({:?}): {outcome}", self.started, self.latency)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Concurrent request loops; worker `i` starts at target `i` and walks round the list.
    pub workers: usize,
    /// Each worker rests this long between its requests: it bounds the load's CPU use on a
    /// small machine (pacing, not synchronisation).
    pub pause: Duration,
    /// The client's per-request timeout: a request taking longer is a `Timeout` record.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { workers: 4, pause: Duration::from_millis(10), timeout: Duration::from_secs(10) }
    }
}

/// A running load loop.
pub struct Load {
    targets: Vec<Target>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<Record>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts `settings.workers` loops sending GETs of `targets` to `base` with `client`.
    pub fn start(client: &reqwest::Client, base: &str, targets: Vec<Target>, settings: Settings) -> Self {
        let epoch = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new(targets.clone());
        let tasks = (0..settings.workers)
            .map(|worker| {
                let (stop, records, targets) = (stop.clone(), records.clone(), shared.clone());
                let (client, base) = (client.clone(), base.trim_end_matches('/').to_owned());
                tokio::spawn(async move {
                    let mut next = worker;
                    while !stop.load(Ordering::SeqCst) && !targets.is_empty() {
                        let target = next % targets.len();
                        next += 1;
                        let record =
                            one(&client, &base, &targets[target], target, epoch, settings.timeout).await;
                        records.lock().unwrap_or_else(PoisonError::into_inner).push(record);
                        tokio::time::sleep(settings.pause).await;
                    }
                })
            })
            .collect();
        Self { targets, epoch, stop, records, tasks }
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Time since the load started, on the records' clock.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// The records so far, in completion order.
    pub fn snapshot(&self) -> Vec<Record> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Polls the records every 20 ms until `done` holds for them, for at most `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Target], &[Record]) -> bool,
    ) -> Result<Duration> {
        let started = Instant::now();
        loop {
            if done(&self.targets, &self.records.lock().unwrap_or_else(PoisonError::into_inner)) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!("load: {what}: not within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops every worker (each finishes the request it has under way) and returns everything.
    pub async fn finish(self) -> Report {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut records = std::mem::take(&mut *self.records.lock().unwrap_or_else(PoisonError::into_inner));
        records.sort_by_key(|r| r.started);
        Report { targets: self.targets, records, elapsed: self.epoch.elapsed() }
    }
}

async fn one(
    client: &reqwest::Client,
    base: &str,
    target: &Target,
    index: usize,
    epoch: Instant,
    timeout: Duration,
) -> Record {
    let started = epoch.elapsed();
    let clock = Instant::now();
    // kubectl's Accept for a plain `get -o json`.
    let request =
        client.get(format!("{base}{}", target.path)).header("accept", "application/json").timeout(timeout);
    let answer = exchange(request, &[200]).await;
    Record { target: index, started, latency: clock.elapsed(), answer }
}

/// What one request got: the answer's status, who served it and, unless the status is one of
/// the expected ones, its `Status` body's reason and message; or why there was no answer.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub status: Option<u16>,
    /// `x-skewgate-served-by`: the apiserver that answered (absent on Envoy's or the filter's
    /// own answers).
    pub served_by: Option<String>,
    /// `reason` of a `Status` body (`ServiceUnavailable`, `NotFound`, ...).
    pub reason: Option<String>,
    pub message: Option<String>,
    /// `Retry-After`, as sent: when a client-go client would send the request again.
    pub retry_after: Option<String>,
    pub error: Option<ErrorKind>,
    /// The client's error text, when there was no answer.
    pub detail: Option<String>,
}

/// Sends `request` and reads the whole answer (the drill's and the load loops' one way of
/// recording a request).
pub async fn exchange(request: reqwest::RequestBuilder, expected: &[u16]) -> Answer {
    let mut answer = Answer::default();
    match request.send().await {
        Ok(response) => {
            answer.status = Some(response.status().as_u16());
            answer.served_by =
                response.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(str::to_owned);
            answer.retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            match response.bytes().await {
                Ok(body) if !answer.status.is_some_and(|s| expected.contains(&s)) => {
                    if let Ok(status) = serde_json::from_slice::<Value>(&body) {
                        if status["kind"] == "Status" {
                            answer.reason = status["reason"].as_str().map(str::to_owned);
                            answer.message = status["message"].as_str().map(str::to_owned);
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // The head came, the body broke off: as bad as no answer.
                    answer.error = Some(classify(&e));
                    answer.detail = Some(error_chain(&e));
                }
            }
        }
        Err(e) => {
            answer.error = Some(classify(&e));
            answer.detail = Some(error_chain(&e));
        }
    }
    answer
}

fn classify(e: &reqwest::Error) -> ErrorKind {
    if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_connect() {
        ErrorKind::Connect
    } else if e.is_body() || e.is_request() || e.is_decode() {
        ErrorKind::Reset
    } else {
        ErrorKind::Other
    }
}

/// The error and its causes, which is where hyper says "connection reset".
pub fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Per-target tallies of a finished load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub requests: usize,
    pub ok: usize,
    /// Answers by status code.
    pub statuses: BTreeMap<u16, usize>,
    /// Successful answers by apiserver.
    pub served_by: BTreeMap<String, usize>,
    /// Requests with no answer.
    pub errors: usize,
}

/// Everything a finished load did.
#[derive(Debug, Clone)]
pub struct Report {
    pub targets: Vec<Target>,
    /// In the order they were sent.
    pub records: Vec<Record>,
    pub elapsed: Duration,
}

impl Report {
    pub fn index(&self, name: &str) -> Option<usize> {
        self.targets.iter().position(|t| t.name() == name)
    }

    pub fn of<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Record> + 'a {
        let index = self.index(name);
        self.records.iter().filter(move |r| Some(r.target) == index)
    }

    pub fn failures(&self) -> Vec<&Record> {
        self.records.iter().filter(|r| !r.ok()).collect()
    }

    pub fn tally(&self) -> BTreeMap<String, Tally> {
        let mut tallies: BTreeMap<String, Tally> =
            self.targets.iter().map(|t| (t.name(), Tally::default())).collect();
        for r in &self.records {
            let Some(t) = self.targets.get(r.target).and_then(|t| tallies.get_mut(&t.name())) else {
                continue;
            };
            t.requests += 1;
            match r.status {
                Some(status) => *t.statuses.entry(status).or_default() += 1,
                None => t.errors += 1,
            }
            if r.ok() {
                t.ok += 1;
                *t.served_by.entry(r.served_by.clone().unwrap_or_default()).or_default() += 1;
            }
        }
        tallies
    }

    /// The slowest request.
    pub fn max_latency(&self) -> Duration {
        self.records.iter().map(|r| r.latency).max().unwrap_or_default()
    }

    /// A few lines per target, for test output.
    pub fn summary(&self) -> String {
        let mut out = format!("{} requests in {:.1?}\n", self.records.len(), self.elapsed);
        for (name, t) in self.tally() {
            out.push_str(&format!(
                "  {name:<55} {:>5} ok / {:>5}  statuses {:?} errors {} served by {:?}\n",
                t.ok, t.requests, t.statuses, t.errors, t.served_by
            ));
        }
        out
    }
}
