//! The clients of a scale run, as client-go holds them: each one HTTP/2 connection over mTLS
//! with a kubelet's client certificate, carrying all its watches as streams. A watch whose stream
//! ends is asked for again from the last resourceVersion it saw, as a reflector does. Each watch
//! is a task (a few hundred bytes, woken only by its own events) on the clients' own runtime.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::{Event, Lines, Sequence, now_ns, short_target, watch_target};

/// What the clients saw, shared by their tasks and read by the driver.
#[derive(Debug)]
pub struct Seen {
    /// Watches open right now (answered 200, stream not ended).
    pub open: AtomicU64,
    /// Streams that ended (the watch was asked for again).
    pub ended: AtomicU64,
    /// Watch requests answered with anything but 200 (asked for again after a pause).
    pub refused: AtomicU64,
    /// Watch requests that got no answer at all.
    pub failed: AtomicU64,
    pub events: AtomicU64,
    pub short_ok: AtomicU64,
    pub short_failed: AtomicU64,
    /// Short requests a second, 0: none.
    pub short_rate: AtomicU64,
    /// Event delivery latencies (upstream write → client read), ms, since last taken.
    latencies: Mutex<Vec<f64>>,
    short_latencies: Mutex<Vec<f64>>,
    sequences: Vec<Mutex<Sequence>>,
}

impl Seen {
    fn new(watches: usize) -> Self {
        Seen {
            open: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            events: AtomicU64::new(0),
            short_ok: AtomicU64::new(0),
            short_failed: AtomicU64::new(0),
            short_rate: AtomicU64::new(0),
            latencies: Mutex::new(Vec::new()),
            short_latencies: Mutex::new(Vec::new()),
            sequences: (0..watches).map(|_| Mutex::new(Sequence::default())).collect(),
        }
    }

    /// The event latencies since last taken, sorted.
    pub fn take_latencies(&self) -> Vec<f64> {
        take_sorted(&self.latencies)
    }

    /// The short requests' latencies since last taken, sorted.
    pub fn take_short_latencies(&self) -> Vec<f64> {
        take_sorted(&self.short_latencies)
    }

    /// Each watch's sequence, by index.
    pub fn sequences(&self) -> Vec<Sequence> {
        self.sequences.iter().map(|s| *s.lock().unwrap_or_else(|e| e.into_inner())).collect()
    }
}

fn take_sorted(v: &Mutex<Vec<f64>>) -> Vec<f64> {
    let mut taken = std::mem::take(&mut *v.lock().unwrap_or_else(|e| e.into_inner()));
    taken.sort_by(f64::total_cmp);
    taken
}

/// Connected clients; their tasks end when dropped.
pub struct Clients {
    pub seen: Arc<Seen>,
    connections: Vec<SendRequest<Empty<Bytes>>>,
    authority: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Clients {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Clients {
    /// `clients` HTTP/2 connections to the listener on 127.0.0.1:`port` (trusting `ca`, each
    /// presenting `certificate`), with room for `watches` watches.
    pub async fn connect(
        port: u16,
        ca: &Path,
        certificate: &skewgate_pki::Pair,
        clients: usize,
        watches: usize,
    ) -> Result<Clients> {
        let mut connections = Vec::with_capacity(clients);
        let mut tasks = Vec::new();
        for i in 0..clients {
            let tls = skewgate_harness::envoy::connect_tls(ca, Some(certificate), port)
                .await
                .with_context(|| format!("client {i}: TLS to Envoy"))?;
            let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .handshake(TokioIo::new(tls))
                .await
                .with_context(|| format!("client {i}: HTTP/2 handshake"))?;
            tasks.push(tokio::spawn(async move {
                let _ = conn.await;
            }));
            connections.push(send);
        }
        let seen = Arc::new(Seen::new(watches));
        let authority = format!("127.0.0.1:{port}");
        tasks.push(tokio::spawn(short_requests(connections.clone(), authority.clone(), seen.clone())));
        Ok(Clients { seen, connections, authority, tasks })
    }

    /// Opens `watches` watches, `per_client` on each connection in order, `per_second` a second
    /// (clients that start together still do not open every watch in the same instant).
    pub fn watch(&mut self, watches: usize, per_client: usize, per_second: u64) {
        for index in 0..watches.min(self.seen.sequences.len()) {
            let Some(send) = self.connections.get(index / per_client.max(1)).cloned() else { break };
            let (authority, seen) = (self.authority.clone(), self.seen.clone());
            let start = Duration::from_secs_f64(index as f64 / per_second.max(1) as f64);
            self.tasks.push(tokio::spawn(watch(send, authority, seen, index, per_client, start)));
        }
    }
}

fn get(authority: &str, target: &str) -> Result<hyper::Request<Empty<Bytes>>> {
    Ok(hyper::Request::get(format!("https://{authority}{target}")).body(Empty::new())?)
}

/// One watch, for ever: asked for from the last resourceVersion seen, its events read and
/// checked, again when its stream ends.
async fn watch(
    send: SendRequest<Empty<Bytes>>,
    authority: String,
    seen: Arc<Seen>,
    index: usize,
    per_client: usize,
    start: Duration,
) {
    tokio::time::sleep(start).await;
    let (mut resource_version, mut failures) = (0, 0);
    loop {
        let mut send = send.clone();
        // The connection is gone: nothing to watch on (Envoy closes none in a run).
        if send.ready().await.is_err() {
            seen.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Ok(request) = get(&authority, &watch_target(index, per_client, resource_version)) else { return };
        match send.send_request(request).await {
            Ok(resp) if resp.status() == hyper::StatusCode::OK => {
                failures = 0;
                seen.open.fetch_add(1, Ordering::SeqCst);
                let mut body = resp.into_body();
                let mut lines = Lines::default();
                while let Some(Ok(frame)) = body.frame().await {
                    let Some(data) = frame.data_ref() else { continue };
                    let received = now_ns();
                    lines.push(data, |line| {
                        let Some(event) = Event::parse(line) else { return };
                        resource_version = resource_version.max(event.resource_version);
                        seen.events.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut s) = seen.sequences[index].lock() {
                            s.see(event.seq);
                        }
                        let ms = received.saturating_sub(event.written_ns) as f64 / 1e6;
                        if let Ok(mut l) = seen.latencies.lock() {
                            l.push(ms);
                        }
                    });
                }
                seen.open.fetch_sub(1, Ordering::SeqCst);
                seen.ended.fetch_add(1, Ordering::SeqCst);
            }
            Ok(resp) => {
                seen.refused.fetch_add(1, Ordering::SeqCst);
                let _ = resp.into_body().collect().await;
                tokio::time::sleep(backoff(index, failures)).await;
                failures += 1;
            }
            Err(_) => {
                seen.failed.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(backoff(index, failures)).await;
                failures += 1;
            }
        }
    }
}

/// What a reflector waits before it watches again after `failures` failed attempts in a row:
/// doubling from 100 ms to at most 6.4 s, spread by up to half again over the watches so that
/// they do not come back in one burst (client-go's backoff has the same shape).
pub fn backoff(index: usize, failures: u32) -> Duration {
    let base = 100u64 << failures.min(6);
    Duration::from_millis(base + base * ((index as u64 * 37) % 50) / 100)
}

/// Gets at the rate in [`Seen::short_rate`], round-robin over the connections, each timed on its
/// own (a slow one does not hold the next back).
async fn short_requests(connections: Vec<SendRequest<Empty<Bytes>>>, authority: String, seen: Arc<Seen>) {
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut due, mut rate, mut next) = (0.0f64, 0, 0usize);
    let mut last = tick.tick().await;
    loop {
        let now = tick.tick().await;
        let r = seen.short_rate.load(Ordering::Relaxed);
        if r != rate {
            (rate, due) = (r, 0.0);
        }
        due += rate as f64 * now.duration_since(last).as_secs_f64();
        last = now;
        while due >= 1.0 && !connections.is_empty() {
            due -= 1.0;
            let client = next % connections.len();
            next += 1;
            let (mut send, seen) = (connections[client].clone(), seen.clone());
            let Ok(request) = get(&authority, &short_target(client)) else { continue };
            tokio::spawn(async move {
                let started = Instant::now();
                let ok = match send.ready().await {
                    Ok(()) => match send.send_request(request).await {
                        Ok(resp) => {
                            let status = resp.status();
                            resp.into_body().collect().await.is_ok() && status == hyper::StatusCode::OK
                        }
                        Err(_) => false,
                    },
                    Err(_) => false,
                };
                if ok {
                    seen.short_ok.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut l) = seen.short_latencies.lock() {
                        l.push(started.elapsed().as_secs_f64() * 1000.0);
                    }
                } else {
                    seen.short_failed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_and_spreads_the_watches() {
        assert_eq!(backoff(0, 0), Duration::from_millis(100));
        assert_eq!(backoff(0, 3), Duration::from_millis(800));
        assert_eq!(backoff(0, 6), backoff(0, 60));
        assert_eq!(backoff(0, 60), Duration::from_millis(6400));
        let spread: std::collections::BTreeSet<Duration> = (0..100).map(|i| backoff(i, 1)).collect();
        assert!(
            spread.len() > 20
                && spread.iter().all(|d| *d >= Duration::from_millis(200) && *d < Duration::from_millis(300))
        );
    }
}
