//! Requests that wait at the edge while their cluster is down: held after Envoy found it down,
//! released when a probe through it reaches an apiserver, answered (503, `Retry-After`) after
//! the longest wait, bounded in number.

use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::Action;
use serde_json::json;
use skewgate_core::hold::{MAX_HELD_BODIES, MAX_HELD_BODY, PROBE_PATH, PROBE_PERIOD};

use super::{configure, configured, get, sample, sealed};
use crate::host::fake::Fake;
use crate::root::Root;

const SUBSET: &str = "/apis/resource.k8s.io/v1/resourceclaims";
const HELD: &str = "skewgate.held_requests_total.cluster=set-c;outcome=";

/// A stream for `path` on `root`, its context id `id`.
fn open(fake: &Fake, root: &Root<Fake>, id: u32, path: &str) -> Box<dyn HttpContext> {
    fake.request(&get(path));
    root.create_http_context(id).expect("an HTTP context")
}

/// A write (`method`, with a body to come) for `SUBSET` on `root`, its context id `id`.
fn open_write(fake: &Fake, root: &Root<Fake>, id: u32, method: &str) -> Box<dyn HttpContext> {
    fake.request(&[(":method", method), (":path", SUBSET), ("authorization", "Bearer t")]);
    root.create_http_context(id).expect("an HTTP context")
}

/// Stream 1's request for `set-c` meets Envoy's "no healthy upstream": the worker finds it down.
fn found_down(fake: &Fake, root: &Root<Fake>) {
    let mut first = open(fake, root, 1, SUBSET);
    first.on_http_request_headers(0, true);
    fails(fake, &mut first, "no_healthy_upstream");
}

/// Envoy's answer to a request for `set-c` that found no apiserver there.
fn fails(fake: &Fake, http: &mut Box<dyn HttpContext>, detail: &str) {
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], detail);
    fake.set_property(&["xds", "cluster_name"], "set-c");
    assert_eq!(http.on_http_response_headers(0, true), Action::Pause, "rewritten to a Status");
}

fn advance(fake: &Fake, by: Duration) {
    fake.state().now += by;
}

/// The probes dispatched so far: (cluster, path).
fn probes(fake: &Fake) -> Vec<(String, String)> {
    let s = fake.state();
    let path = |h: &Vec<(String, String)>| h.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.clone());
    s.dispatched.iter().map(|(c, h)| (c.clone(), path(h).unwrap_or_default())).collect()
}

fn probe_answers(fake: &Fake, root: &mut Root<Fake>, token: u32, status: &str) {
    fake.state().call_response_headers = vec![(":status".into(), status.as_bytes().to_vec())];
    root.on_http_call_response(token, 1, 0, 0);
}

#[test]
fn after_envoy_finds_a_cluster_down_its_requests_wait_and_go_on_once_it_is_back() {
    let (fake, mut root) = configured(&sample());
    let mut first = open(&fake, &root, 1, SUBSET);
    assert_eq!(first.on_http_request_headers(0, true), Action::Continue, "nothing known down yet");
    fails(&fake, &mut first, "no_healthy_upstream");

    let mut second = open(&fake, &root, 2, SUBSET);
    assert_eq!(second.on_http_request_headers(0, true), Action::Pause, "held");
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"], "decided before it waits");
    let mut other = open(&fake, &root, 3, "/api/v1/namespaces/ns/pods");
    assert_eq!(other.on_http_request_headers(0, true), Action::Continue, "other clusters go on");

    fake.state().dispatched.clear();
    root.on_tick();
    assert_eq!(probes(&fake), [("set-c".to_string(), PROBE_PATH.to_string())]);
    probe_answers(&fake, &mut root, 1, "503");
    assert!(fake.state().resumed.is_empty(), "Envoy's own 503: still down");
    root.on_tick();
    assert_eq!(probes(&fake).len(), 1, "not again before the probe period");
    advance(&fake, PROBE_PERIOD);
    root.on_tick();
    assert_eq!(probes(&fake).len(), 2);
    // The probe carries no identity: the apiserver's 401 is an answer all the same.
    probe_answers(&fake, &mut root, 2, "401");
    assert_eq!(fake.state().resumed, [2]);
    assert!(fake.state().replies_to.is_empty());
    root.on_tick();
    assert_eq!(fake.counter(&format!("{HELD}resumed;")), 1);
    assert_eq!(fake.state().recorded, [(1000, 200)], "waited 200 ms");

    // The stream's own answer, from the apiserver, goes through untouched.
    fake.respond(&[(":status", "200")]);
    fake.state().replies.clear();
    fake.set_property(&["response", "code_details"], "via_upstream");
    assert_eq!(second.on_http_response_headers(0, true), Action::Continue);
    let mut third = open(&fake, &root, 4, SUBSET);
    assert_eq!(third.on_http_request_headers(0, true), Action::Continue, "up again");
}

#[test]
fn a_request_waits_at_most_the_tables_hold_then_gets_its_503_with_retry_after() {
    let mut table = sample();
    table["policy"] = json!({"hold": {"maxWait": "1s"}});
    let (fake, mut root) = configured(&table);
    found_down(&fake, &root);
    let mut held = open(&fake, &root, 2, SUBSET);
    assert_eq!(held.on_http_request_headers(0, true), Action::Pause);
    advance(&fake, Duration::from_millis(999));
    root.on_tick();
    assert!(fake.state().replies_to.is_empty());
    advance(&fake, Duration::from_millis(1));
    root.on_tick();
    let (id, (status, headers, body)) = fake.state().replies_to.first().cloned().expect("answered");
    assert_eq!((id, status), (2, 503));
    assert!(headers.contains(&("retry-after".into(), "1".into())), "{headers:?}");
    let body: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
    assert_eq!(body["details"]["retryAfterSeconds"], 1);
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("resourceclaims.v1.resource.k8s.io is served by [c]")
            && message.contains("held 1.0s"),
        "{message}"
    );
    // Envoy then hands the stream its own local reply: left alone.
    fake.state().replies.clear();
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], "wasm_fail_stream");
    assert_eq!(held.on_http_response_headers(0, true), Action::Continue);
    assert!(fake.state().replies.is_empty());
    assert_eq!(fake.counter(&format!("{HELD}expired;")), 1);
}

#[test]
fn past_the_bound_requests_are_not_held_and_a_client_that_leaves_frees_its_place() {
    let mut table = sample();
    table["policy"] = json!({"hold": {"maxHeld": 1}});
    let (fake, root) = configured(&table);
    found_down(&fake, &root);
    let mut held = open(&fake, &root, 2, SUBSET);
    assert_eq!(held.on_http_request_headers(0, true), Action::Pause);
    let mut over = open(&fake, &root, 3, SUBSET);
    assert_eq!(over.on_http_request_headers(0, true), Action::Continue, "to Envoy's 503 at once");
    assert_eq!(fake.counter(&format!("{HELD}refused;")), 1);
    drop(held);
    let mut again = open(&fake, &root, 4, SUBSET);
    assert_eq!(again.on_http_request_headers(0, true), Action::Pause, "the place is free");
}

/// The waiting room is shared by source host: a full one takes a request of a host with fewer
/// waiting in place of the newest of the host with the most, which is answered (503,
/// `Retry-After`) at the next tick.
#[test]
fn a_full_waiting_room_takes_another_hosts_request_in_place_of_the_busiest_hosts_newest() {
    let mut table = sample();
    table["policy"] = json!({"hold": {"maxHeld": 2}});
    let (fake, mut root) = configured(&table);
    found_down(&fake, &root);
    let from = |host: &str| fake.set_property(&["source", "address"], &format!("{host}:40000"));
    from("10.0.0.1");
    let mut mallory: Vec<_> = (2..5).map(|id| open(&fake, &root, id, SUBSET)).collect();
    let held: Vec<Action> = mallory.iter_mut().map(|h| h.on_http_request_headers(0, true)).collect();
    assert_eq!(held, [Action::Pause, Action::Pause, Action::Continue], "two wait, the third is not held");
    from("10.0.0.2");
    let mut alice = open(&fake, &root, 5, SUBSET);
    assert_eq!(alice.on_http_request_headers(0, true), Action::Pause, "alice gets in");
    assert!(fake.state().replies_to.is_empty(), "answered at the next tick");
    root.on_tick();
    let (id, (status, headers, body)) = fake.state().replies_to.first().cloned().expect("answered");
    assert_eq!((id, status), (3, 503), "mallory's newest");
    assert!(headers.contains(&("retry-after".into(), "1".into())));
    assert!(String::from_utf8_lossy(&body).contains("its place given to another client"));
    assert_eq!(fake.counter(&format!("{HELD}crowded;")), 1);
    from("10.0.0.3");
    let mut bob = open(&fake, &root, 6, SUBSET);
    assert_eq!(bob.on_http_request_headers(0, true), Action::Continue, "one each: no host has two more");
}

/// A full waiting room whose wait runs out together is answered a bounded batch per tick, the
/// root context ticking faster meanwhile: Envoy carries out the answers of one call into the VM
/// one inside the other.
#[test]
fn expired_requests_are_answered_a_bounded_batch_per_tick() {
    use skewgate_core::hold::{ACTIONS_PER_CALL, BUSY_TICK};
    let (fake, mut root) = configured(&sample());
    found_down(&fake, &root);
    let mut streams: Vec<_> = (2..202).map(|id| open(&fake, &root, id, SUBSET)).collect();
    assert!(streams.iter_mut().all(|h| h.on_http_request_headers(0, true) == Action::Pause));
    advance(&fake, Duration::from_secs(10));
    let mut answered = Vec::new();
    while answered.len() < 200 {
        root.on_tick();
        let now: Vec<u32> = fake.state().replies_to.drain(..).map(|(id, _)| id).collect();
        assert!(!now.is_empty() && now.len() <= ACTIONS_PER_CALL, "{} in one tick", now.len());
        answered.extend(now);
        if answered.len() < 200 {
            assert_eq!(fake.state().tick_period, Some(BUSY_TICK), "faster while answers are queued");
        }
    }
    assert_eq!(answered, (2..202).collect::<Vec<_>>(), "in the order they came");
    assert_eq!(fake.state().tick_period, Some(Duration::from_millis(100)), "back to its pace");
}

#[test]
fn failures_after_an_apiserver_took_the_request_mark_nothing_down() {
    let (fake, root) = configured(&sample());
    for detail in [
        "upstream_reset_before_response_started{remote_reset}",
        "upstream_response_timeout",
        "upstream_reset_before_response_started{overflow}",
    ] {
        let mut http = open(&fake, &root, 1, SUBSET);
        assert_eq!(http.on_http_request_headers(0, true), Action::Continue, "{detail}");
        fails(&fake, &mut http, detail);
    }
    let mut http = open(&fake, &root, 2, SUBSET);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
}

#[test]
fn a_zero_hold_answers_at_once_as_before() {
    let mut table = sample();
    table["policy"] = json!({"hold": {"maxWait": "0s"}});
    let (fake, root) = configured(&table);
    found_down(&fake, &root);
    let mut next = open(&fake, &root, 2, SUBSET);
    assert_eq!(next.on_http_request_headers(0, true), Action::Continue);
}

/// A table that arrives while a request waits: the request goes on if the new table sends it to
/// the same cluster, and is answered at once (503, `Retry-After`: it reached nothing) if not,
/// since the apiserver that came back may no longer serve it and a new decision may send it
/// elsewhere.
#[test]
fn a_request_goes_on_only_where_the_live_table_still_sends_it() {
    for (claims_by, resumed) in [(json!(["c"]), true), (json!(["a", "b"]), false)] {
        let (fake, mut root) = configured(&sample());
        let mut first = open(&fake, &root, 1, SUBSET);
        first.on_http_request_headers(0, true);
        fails(&fake, &mut first, "no_healthy_upstream");
        let mut held = open(&fake, &root, 2, SUBSET);
        assert_eq!(held.on_http_request_headers(0, true), Action::Pause);

        let mut newer = sample();
        newer["generation"] = json!("newer");
        let gvs = newer["groupVersions"].as_array_mut().expect("group/versions");
        let claims = gvs.iter_mut().find(|gv| gv["group"] == "resource.k8s.io" && gv["version"] == "v1");
        let claims = claims.expect("resource.k8s.io/v1");
        claims["servedBy"] = json!(["a", "b", "c"]);
        claims["resources"]["resourceclaims"] = claims_by.clone();
        // Envoy makes a root context for each configuration, in the same VM; the older one
        // stays while streams decided on its table last, and keeps ticking.
        let mut newer_root = root.next_configuration(2000);
        assert!(configure(&fake, &mut newer_root, sealed(&newer)), "{claims_by}");
        root.on_tick();
        assert!(fake.state().dispatched.is_empty() && fake.state().replies_to.is_empty(), "not live: idle");
        newer_root.on_tick();
        if resumed {
            probe_answers(&fake, &mut newer_root, 1, "200");
        }
        let s = fake.state();
        match resumed {
            true => assert_eq!((s.resumed.as_slice(), s.replies_to.len()), (&[2][..], 0)),
            false => {
                assert!(s.resumed.is_empty());
                let (id, (status, headers, body)) = s.replies_to.first().cloned().expect("answered");
                assert_eq!((id, status), (2, 503));
                assert!(headers.contains(&("retry-after".into(), "1".into())));
                assert!(String::from_utf8_lossy(&body).contains("routing table changed"));
            }
        }
    }
}

/// Envoy does not configure a root context again for a table it already has one for: that
/// table, pushed back after another, makes its root context current again without
/// `on_configure`. The first stream it makes hands it the hold, which it then carries out.
#[test]
fn the_root_context_that_makes_streams_carries_out_the_hold() {
    let (fake, mut root) = configured(&sample());
    let mut newer = sample();
    newer["generation"] = json!("newer");
    let mut newer_root = root.next_configuration(2000);
    assert!(configure(&fake, &mut newer_root, sealed(&newer)));
    // Back to the first table.
    let mut first = open(&fake, &root, 1, SUBSET);
    first.on_http_request_headers(0, true);
    fails(&fake, &mut first, "no_healthy_upstream");
    let mut held = open(&fake, &root, 2, SUBSET);
    assert_eq!(held.on_http_request_headers(0, true), Action::Pause);
    newer_root.on_tick();
    assert!(fake.state().dispatched.is_empty(), "no longer current: idle");
    root.on_tick();
    assert_eq!(probes(&fake).len(), 1, "the current root context probes");
    probe_answers(&fake, &mut root, 1, "200");
    assert_eq!(fake.state().resumed, [2]);
}

/// Another worker (its own VM, its own root context) learns from the board that a cluster is
/// down at its next tick, without a failed request of its own, and only once per finding.
#[test]
fn a_worker_tells_the_others_what_it_found_down() {
    let (fake, root) = configured(&sample());
    let mut other = super::new_vm(&fake);
    assert!(configure(&fake, &mut other, sealed(&sample())));
    found_down(&fake, &root);

    let mut before = open(&fake, &other, 2, SUBSET);
    assert_eq!(before.on_http_request_headers(0, true), Action::Continue, "not before its tick");
    other.on_tick();
    let token = fake.state().dispatched.len() as u32;
    assert_eq!(probes(&fake).last().map(|(c, _)| c.as_str()), Some("set-c"), "it probes set-c");
    let mut after = open(&fake, &other, 3, SUBSET);
    assert_eq!(after.on_http_request_headers(0, true), Action::Pause, "held: found down by the first");

    // Its probe finds the cluster up: the same finding on the board does not mark it again.
    probe_answers(&fake, &mut other, token, "200");
    assert_eq!(fake.state().resumed, [3]);
    advance(&fake, PROBE_PERIOD);
    other.on_tick();
    let mut later = open(&fake, &other, 4, SUBSET);
    assert_eq!(later.on_http_request_headers(0, true), Action::Continue);
}

/// A refused connection marks a cluster of one down (its only apiserver is away), not a cluster
/// of two (Envoy tries the other, or finds none healthy once it ejected the first).
#[test]
fn a_refused_connection_marks_only_a_cluster_of_one_down() {
    const REFUSED: &str = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}";
    let (fake, root) = configured(&sample());
    let two = "/apis/resource.k8s.io/v1alpha3/deviceclasses/gpu";
    let mut http = open(&fake, &root, 1, two);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-b"]);
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], REFUSED);
    fake.set_property(&["xds", "cluster_name"], "set-a-b");
    http.on_http_response_headers(0, true);
    let mut next = open(&fake, &root, 2, two);
    assert_eq!(next.on_http_request_headers(0, true), Action::Continue, "a and b: not down");

    let mut http = open(&fake, &root, 3, SUBSET);
    http.on_http_request_headers(0, true);
    fails(&fake, &mut http, REFUSED);
    let mut next = open(&fake, &root, 4, SUBSET);
    assert_eq!(next.on_http_request_headers(0, true), Action::Pause, "c alone: down");
}

/// A write waits with its body: Envoy's default for a body would send it on at its first piece,
/// to the cluster found down, for the 503 at once.
#[test]
fn a_held_request_keeps_its_body_until_it_goes_on() {
    let (fake, mut root) = configured(&sample());
    found_down(&fake, &root);

    let mut write = open_write(&fake, &root, 2, "POST");
    assert_eq!(write.on_http_request_headers(0, false), Action::Pause, "held");
    assert_eq!(write.on_http_request_body(300, false), Action::Pause, "its body waits too");
    assert_eq!(write.on_http_request_body(600, true), Action::Pause);
    assert_eq!(write.on_http_request_trailers(1), Action::Pause);
    assert!(fake.state().resumed.is_empty() && fake.state().replies_to.is_empty());

    fake.state().dispatched.clear();
    root.on_tick();
    probe_answers(&fake, &mut root, 1, "200");
    assert_eq!(fake.state().resumed, [2]);
    assert_eq!(write.on_http_request_body(900, true), Action::Continue, "on its way now");
    assert_eq!(write.on_http_request_trailers(1), Action::Continue);

    let mut unheld = open(&fake, &root, 3, SUBSET);
    assert_eq!(unheld.on_http_request_headers(0, false), Action::Continue, "up again");
    assert_eq!(unheld.on_http_request_body(10, true), Action::Continue);
}

/// Envoy keeps a waiting body up to its connection's buffer limit and answers 413 past it,
/// which no client sends again: past [`MAX_HELD_BODY`] the request stops waiting and gets the
/// 503 with `Retry-After`.
#[test]
fn a_body_too_large_to_keep_gets_the_503_at_once() {
    let (fake, mut root) = configured(&sample());
    found_down(&fake, &root);

    let mut write = open_write(&fake, &root, 2, "PUT");
    assert_eq!(write.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(write.on_http_request_body(MAX_HELD_BODY, false), Action::Pause);
    assert!(fake.state().replies_to.is_empty(), "up to the limit it waits");
    assert_eq!(write.on_http_request_body(MAX_HELD_BODY + 1, false), Action::Pause);
    let (id, (status, headers, body)) = fake.state().replies_to.first().cloned().expect("answered");
    assert_eq!((id, status), (2, 503));
    assert!(headers.contains(&("retry-after".into(), "1".into())), "{headers:?}");
    let body: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
    assert!(body["message"].as_str().is_some_and(|m| m.contains("too large to wait")), "{body}");
    assert_eq!(fake.counter(&format!("{HELD}refused;")), 1);
    assert_eq!(write.on_http_request_body(MAX_HELD_BODY + 2, true), Action::Pause, "nothing goes on");

    // No longer waiting: a probe that finds c back releases nothing, the tick answers nothing.
    fake.state().dispatched.clear();
    root.on_tick();
    probe_answers(&fake, &mut root, 1, "200");
    assert!(fake.state().resumed.is_empty());
    assert_eq!(fake.state().replies_to.len(), 1);
}

/// A new table without the down cluster (its apiservers now serve alike) ends the wait for it:
/// its waiting requests are answered to be sent again, and nothing probes a cluster Envoy is
/// about to drop.
#[test]
fn a_cluster_the_new_table_has_not_is_no_longer_down() {
    let (fake, mut root) = configured(&sample());
    found_down(&fake, &root);
    let mut held = open(&fake, &root, 2, SUBSET);
    assert_eq!(held.on_http_request_headers(0, true), Action::Pause);

    let mut alike = sample();
    alike["sets"].as_array_mut().expect("sets").retain(|s| s["cluster"] != "set-c");
    let alike = alike.to_string().replace(r#"["c"]"#, r#"["a","b","c"]"#);
    let sealed_alike = sealed(&serde_json::from_str(&alike).expect("JSON"));
    assert!(configure(&fake, &mut root, sealed_alike));
    assert!(fake.state().replies_to.is_empty(), "answered at the next tick, not inside the configuration");
    root.on_tick();
    let (id, (status, _, body)) = fake.state().replies_to.first().cloned().expect("answered");
    assert_eq!((id, status), (2, 503));
    assert!(String::from_utf8_lossy(&body).contains("routing table changed"));

    fake.state().dispatched.clear();
    advance(&fake, PROBE_PERIOD);
    root.on_tick();
    assert!(probes(&fake).is_empty(), "set-c probed: {:?}", probes(&fake));
    let mut next = open(&fake, &root, 3, SUBSET);
    assert_eq!(next.on_http_request_headers(0, true), Action::Continue);
}

/// The bodies waiting on a worker are bounded together: once they reach [`MAX_HELD_BODIES`],
/// the next body to grow gets the 503 at once, naming the bound.
#[test]
fn waiting_bodies_together_are_bounded() {
    let (fake, mut root) = configured(&sample());
    found_down(&fake, &root);
    let mut writes = Vec::new();
    for id in 2..(2 + (MAX_HELD_BODIES / MAX_HELD_BODY) as u32) {
        let mut write = open_write(&fake, &root, id, "POST");
        assert_eq!(write.on_http_request_headers(0, false), Action::Pause);
        assert_eq!(write.on_http_request_body(MAX_HELD_BODY, true), Action::Pause);
        writes.push(write);
    }
    assert!(fake.state().replies_to.is_empty());
    let mut one_more = open_write(&fake, &root, 1000, "POST");
    assert_eq!(one_more.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(one_more.on_http_request_body(10, true), Action::Pause);
    let (id, (status, _, body)) = fake.state().replies_to.first().cloned().expect("answered");
    assert_eq!((id, status), (1000, 503));
    assert!(String::from_utf8_lossy(&body).contains("reach 32 MiB"), "{}", String::from_utf8_lossy(&body));

    fake.state().dispatched.clear();
    root.on_tick();
    probe_answers(&fake, &mut root, 1, "200");
    assert_eq!(fake.state().resumed.len(), 50, "the first 50 of those that kept their bodies go on");
}
