//! The apiservers behind the edge under a scale run: one process, one listener per apiserver id,
//! all sharing one event store as kube-apiservers share etcd. Each watch is a chunked stream of
//! [`Event`] lines; a watch resumed from a resourceVersion gets every event of its own after it
//! first, wherever it lands. Events are written at a steady rate, round-robin over the watches.
//! Built for the load: no JSON parsing, one lock, a bounded channel per watch, an event formatted
//! once and sent to its one watcher. Its CPU is measured with the run (its runtime's threads).

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use super::{Event, now_ns, parse_watch_query};

/// Events a watch may have unread before the upstream drops it, as kube-apiserver drops a watcher
/// that does not keep up; its client resumes from where it was.
const WATCH_BUFFER: usize = 256;

/// The HTTP/2 streams kube-apiserver takes on a connection by default (k8s.io/apiserver's secure
/// serving, without `--http2-max-streams-per-connection`).
const KUBE_APISERVER_STREAMS: u32 = 100;

/// A running upstream; stops when dropped.
pub struct Upstream {
    pub ports: Vec<(String, u16)>,
    store: Arc<Store>,
    drains: Vec<watch::Sender<bool>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for d in &self.drains {
            let _ = d.send(true);
        }
    }
}

/// What the upstream has done so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub events: u64,
    /// Watches it dropped for not reading their events.
    pub dropped_slow: u64,
    pub watch_requests: u64,
    pub other_requests: u64,
}

#[derive(Default)]
struct Store {
    inner: Mutex<Inner>,
    /// Events a second, 0: none.
    rate: AtomicU64,
    watch_requests: AtomicU64,
    other_requests: AtomicU64,
}

#[derive(Default)]
struct Inner {
    resource_version: u64,
    /// By watch index.
    watches: HashMap<usize, Stream>,
    order: Vec<usize>,
    next: usize,
    events: u64,
    dropped_slow: u64,
    /// Apiservers told to stop.
    stopped: Vec<usize>,
}

#[derive(Default)]
struct Stream {
    /// Every event written, in order: a resumed watch may ask for any of them.
    log: Vec<Event>,
    watchers: Vec<Watcher>,
}

struct Watcher {
    apiserver: usize,
    events: mpsc::Sender<Bytes>,
}

impl Store {
    /// A new watcher of `index` on `apiserver`, with the events after `since` already queued;
    /// none once `apiserver` is told to stop (its watches would never be ended).
    fn watch(&self, apiserver: usize, index: usize, since: u64) -> Option<mpsc::Receiver<Bytes>> {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        if inner.stopped.contains(&apiserver) {
            return None;
        }
        let stream = inner.watches.entry(index).or_insert_with(|| {
            inner.order.push(index);
            Stream::default()
        });
        let replay: String =
            stream.log.iter().filter(|e| e.resource_version > since).map(|e| e.line(index)).collect();
        if !replay.is_empty() {
            let _ = tx.try_send(Bytes::from(replay));
        }
        stream.watchers.push(Watcher { apiserver, events: tx });
        Some(rx)
    }

    /// Writes `n` events, each to the next watch in turn.
    fn write(&self, n: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        if inner.order.is_empty() {
            return;
        }
        for _ in 0..n {
            let index = inner.order[inner.next % inner.order.len()];
            inner.next += 1;
            inner.resource_version += 1;
            inner.events += 1;
            let Some(stream) = inner.watches.get_mut(&index) else { continue };
            let event = Event {
                resource_version: inner.resource_version,
                seq: stream.log.len() as u64 + 1,
                written_ns: now_ns(),
            };
            stream.log.push(event);
            if stream.watchers.is_empty() {
                continue;
            }
            let line = Bytes::from(event.line(index));
            let before = stream.watchers.len();
            stream.watchers.retain(|w| w.events.try_send(line.clone()).is_ok());
            // A full channel is a watcher that fell behind; a closed one, a watch that ended.
            inner.dropped_slow += (before - stream.watchers.len()) as u64;
        }
    }

    /// Ends every watch `apiserver` serves, and refuses it new ones; how many it ended.
    fn end_watches(&self, apiserver: usize) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.stopped.push(apiserver);
        let mut ended = 0;
        for stream in inner.watches.values_mut() {
            // A watcher whose client has gone stays until the next event finds its channel closed.
            let live = |w: &&Watcher| w.apiserver == apiserver && !w.events.is_closed();
            ended += stream.watchers.iter().filter(live).count() as u64;
            stream.watchers.retain(|w| w.apiserver != apiserver);
        }
        ended
    }

    /// The events written so far for each watch, by index.
    fn written(&self) -> HashMap<usize, u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.watches.iter().map(|(i, s)| (*i, s.log.len() as u64)).collect()
    }
}

impl Upstream {
    /// Listeners for `ids` on 127.0.0.1 (their ports in [`Upstream::ports`]), served with `tls`
    /// (the apiservers' serving certificate, Envoy's front-proxy client certificate required), on
    /// the current Tokio runtime.
    pub async fn start(ids: &[&str], tls: Arc<rustls::ServerConfig>) -> Result<Upstream> {
        // Session tickets, on by default in kube-apiserver (Go's crypto/tls): each watch is a
        // TLS connection of its own from Envoy, and thousands of full handshakes at once (a
        // drained apiserver's watches coming back) would otherwise take this one thread seconds.
        let mut tls = (*tls).clone();
        tls.ticketer = rustls::crypto::ring::Ticketer::new()?;
        let tls = Arc::new(tls);
        let store = Arc::new(Store::default());
        let mut ports = Vec::new();
        let mut drains = Vec::new();
        let mut tasks = Vec::new();
        for (apiserver, id) in ids.iter().enumerate() {
            // The backlog of a Go server (the kernel's somaxconn): tokio's default of 1,024
            // drops connections when thousands of watches come back at once.
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
            let listener = socket.listen(4096)?;
            ports.push((id.to_string(), listener.local_addr()?.port()));
            let (drain, drained) = watch::channel(false);
            drains.push(drain);
            tasks.push(tokio::spawn(serve(
                listener,
                TlsAcceptor::from(tls.clone()),
                store.clone(),
                apiserver,
                drained,
            )));
        }
        tasks.push(tokio::spawn(write_events(store.clone())));
        Ok(Upstream { ports, store, drains, tasks })
    }

    /// Events written a second from now on, round-robin over the watches opened so far.
    pub fn set_rate(&self, per_second: u64) {
        self.store.rate.store(per_second, Ordering::SeqCst);
    }

    /// What kube-apiserver does when it finally shuts down: it stops accepting connections and
    /// ends its watches (their clients watch again elsewhere, from their last resourceVersion);
    /// requests on its open connections are answered, then the connections close.
    /// How many watches it ended.
    pub fn drain(&self, id: &str) -> u64 {
        let Some(apiserver) = self.ports.iter().position(|(i, _)| i == id) else { return 0 };
        let _ = self.drains[apiserver].send(true);
        self.store.end_watches(apiserver)
    }

    pub fn counts(&self) -> Counts {
        let inner = self.store.inner.lock().unwrap_or_else(|e| e.into_inner());
        Counts {
            events: inner.events,
            dropped_slow: inner.dropped_slow,
            watch_requests: self.store.watch_requests.load(Ordering::SeqCst),
            other_requests: self.store.other_requests.load(Ordering::SeqCst),
        }
    }

    /// The events written so far for each watch, by index.
    pub fn written(&self) -> HashMap<usize, u64> {
        self.store.written()
    }
}

/// The rate's events, a batch every millisecond: fine enough that a watch's events do not come
/// in bursts, coarse enough that the timer costs nothing next to them.
async fn write_events(store: Arc<Store>) {
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = tokio::time::Instant::now();
    let (mut due, mut rate) = (0.0f64, 0);
    let mut last = started;
    loop {
        let now = tick.tick().await;
        let r = store.rate.load(Ordering::Relaxed);
        if r != rate {
            (rate, due) = (r, 0.0);
        }
        due += rate as f64 * now.duration_since(last).as_secs_f64();
        last = now;
        let n = due.floor();
        if n >= 1.0 {
            due -= n;
            store.write(n as u64);
        }
    }
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    store: Arc<Store>,
    apiserver: usize,
    mut drained: watch::Receiver<bool>,
) {
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
            // Closing the listener refuses new connections, as a stopped apiserver does.
            _ = stopped(&mut drained) => return,
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, store, mut drained) = (acceptor.clone(), store.clone(), drained.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else { return };
            let service = service_fn(move |req| {
                let store = store.clone();
                async move { Ok::<_, Infallible>(handle(&store, apiserver, req)) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // kube-apiserver's streams a connection unless --http2-max-streams-per-connection
            // says otherwise: how many connections Envoy's HTTP/2 watches take upstream.
            builder.http2().max_concurrent_streams(KUBE_APISERVER_STREAMS);
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopped(&mut drained) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

/// Until the apiserver is told to stop (or its upstream is gone).
async fn stopped(drained: &mut watch::Receiver<bool>) {
    let _ = drained.wait_for(|d| *d).await;
}

fn handle(store: &Store, apiserver: usize, req: Request<Incoming>) -> Response<Answer> {
    let path = req.uri().path();
    if path == "/readyz" || path == "/livez" || path == "/healthz" {
        return answer(StatusCode::OK, Answer::Once(Some(Bytes::from_static(b"ok"))));
    }
    if let Some(query) = req.uri().query().and_then(parse_watch_query) {
        store.watch_requests.fetch_add(1, Ordering::Relaxed);
        return match store.watch(apiserver, query.index, query.resource_version) {
            Some(events) => answer(StatusCode::OK, Answer::Watch(events)),
            // A watch that reaches a stopped apiserver on a connection it has not closed yet.
            None => {
                answer(StatusCode::SERVICE_UNAVAILABLE, Answer::Once(Some(Bytes::from_static(b"stopping"))))
            }
        };
    }
    store.other_requests.fetch_add(1, Ordering::Relaxed);
    answer(
        StatusCode::OK,
        Answer::Once(Some(Bytes::from_static(
            b"{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"kube-root-ca.crt\",\"resourceVersion\":\"1\"}}",
        ))),
    )
}

fn answer(status: StatusCode, body: Answer) -> Response<Answer> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
    resp
}

/// A response body: a short answer, or a watch's events until the upstream ends the watch.
pub enum Answer {
    Once(Option<Bytes>),
    Watch(mpsc::Receiver<Bytes>),
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Answer::Once(body) => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
            Answer::Watch(events) => events.poll_recv(cx).map(|e| e.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Answer::Once(None))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Answer::Once(body) => {
                hyper::body::SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
            Answer::Watch(_) => hyper::body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::{Lines, Sequence};

    /// Every event queued on `rx` so far, as its watch's sequence sees them; the last
    /// resourceVersion.
    fn read(rx: &mut mpsc::Receiver<Bytes>, seq: &mut Sequence) -> u64 {
        let mut last = 0;
        let mut lines = Lines::default();
        while let Ok(chunk) = rx.try_recv() {
            lines.push(&chunk, |l| {
                let e = Event::parse(l).unwrap();
                seq.see(e.seq);
                last = e.resource_version;
            });
        }
        last
    }

    #[test]
    fn a_watch_resumed_elsewhere_from_its_last_resource_version_misses_nothing() {
        let store = Store::default();
        let (mut on_b, mut other) = (store.watch(1, 7, 0).unwrap(), store.watch(0, 8, 0).unwrap());
        store.write(10);
        let mut seq = Sequence::default();
        let seen = read(&mut on_b, &mut seq);
        assert_eq!(seq.last, 5, "two watches share ten events in turn");
        // b stops after writing more that its watch never read out.
        store.write(4);
        assert_eq!(store.end_watches(1), 1);
        assert!(store.watch(1, 7, seen).is_none(), "a stopped apiserver takes no watch");
        store.write(4);
        let mut resumed = store.watch(2, 7, seen).unwrap();
        store.write(2);
        read(&mut resumed, &mut seq);
        assert_eq!(store.written()[&7], 10);
        assert_eq!(seq, Sequence { last: 10, gaps: 0, repeats: 0 });
        assert_eq!(seq.lost(10), 0);
        // The other apiserver's watch went on untouched.
        let mut other_seq = Sequence::default();
        read(&mut other, &mut other_seq);
        assert_eq!((other_seq.last, other_seq.gaps), (10, 0));
    }

    #[test]
    fn a_watcher_that_falls_behind_is_dropped_and_counted() {
        let store = Store::default();
        let _slow = store.watch(0, 1, 0).unwrap();
        store.write(WATCH_BUFFER as u64 + 1);
        let inner = store.inner.lock().unwrap();
        assert_eq!(inner.dropped_slow, 1);
        assert!(inner.watches[&1].watchers.is_empty());
    }
}
