//! The drill's pure parts on canned data: client-go's rule for sending a request again, the
//! harm counted from what etcd holds, the controller-manager's errors grouped, the edge's held
//! requests read from Envoy's stats, and writes applied twice.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use skewgate_drill::harm::{self, Census, Deleted, Object, OwnedSet};
use skewgate_drill::held;
use skewgate_drill::retry::{self, Body, MAX_RETRIES, Outcome};

fn answered(status: u16, retry_after: Option<&str>) -> Outcome<'_> {
    Outcome::Answered { status, retry_after }
}

#[test]
fn retry_after_on_429_and_every_5xx_waits_the_given_seconds() {
    for status in [429, 500, 502, 503, 504, 599] {
        assert_eq!(
            retry::again(true, Body::None, 1, answered(status, Some("3"))),
            Some(Duration::from_secs(3))
        );
    }
    assert_eq!(retry::again(true, Body::None, 1, answered(503, Some("0"))), Some(Duration::ZERO));
    assert_eq!(retry::again(true, Body::None, 1, answered(503, Some("+2"))), Some(Duration::from_secs(2)));
    // Go's Atoi takes a sign: a negative wait is no wait, still a retry.
    assert_eq!(retry::again(true, Body::None, 1, answered(503, Some("-4"))), Some(Duration::ZERO));
}

#[test]
fn without_a_usable_retry_after_nothing_is_sent_again() {
    assert_eq!(retry::again(true, Body::None, 1, answered(503, None)), None);
    // An HTTP date or a fraction is not an integer: client-go ignores it.
    assert_eq!(retry::again(true, Body::None, 1, answered(503, Some("Wed, 21 Oct 2026 07:28:00 GMT"))), None);
    assert_eq!(retry::again(true, Body::None, 1, answered(503, Some("1.5"))), None);
    for status in [200, 201, 404, 409, 410, 499] {
        assert_eq!(retry::again(true, Body::None, 1, answered(status, Some("1"))), None, "{status}");
    }
}

#[test]
fn writes_with_an_encoded_body_are_sent_again_and_opaque_readers_never() {
    assert_eq!(retry::again(false, Body::Encoded, 1, answered(503, Some("1"))), Some(Duration::from_secs(1)));
    assert_eq!(retry::again(false, Body::Reader, 1, answered(503, Some("1"))), None);
    assert_eq!(retry::again(true, Body::Reader, 1, answered(429, Some("1"))), None);
}

#[test]
fn a_broken_connection_is_retried_after_a_second_only_for_a_get() {
    let reset = Outcome::NoAnswer { reset_or_eof: true };
    assert_eq!(retry::again(true, Body::None, 1, reset), Some(Duration::from_secs(1)));
    assert_eq!(retry::again(false, Body::Encoded, 1, reset), None);
    // Refused or timed out: not a reset, not retried, GET or not.
    assert_eq!(retry::again(true, Body::None, 1, Outcome::NoAnswer { reset_or_eof: false }), None);
}

#[test]
fn at_most_ten_sends_after_the_first() {
    let outcome = answered(503, Some("1"));
    assert_eq!(MAX_RETRIES, 10);
    assert!(retry::again(true, Body::None, MAX_RETRIES, outcome).is_some());
    assert_eq!(retry::again(true, Body::None, MAX_RETRIES + 1, outcome), None);
    let sends =
        (1..).take_while(|attempts| retry::again(true, Body::None, *attempts, outcome).is_some()).count();
    assert_eq!(sends, 10);
}

fn object(kind: &str, namespace: &str, name: &str, uid: &str) -> Object {
    Object { kind: kind.into(), namespace: namespace.into(), name: name.into(), uid: uid.into() }
}

fn set(kind: &str, n: u32) -> OwnedSet {
    OwnedSet {
        owner_kind: kind.into(),
        owner: object(kind, "drill-gc", &format!("owner-{n}"), &format!("{kind}-{n}")),
        dependent: object("ConfigMap", "drill-gc", &format!("of-{n}"), &format!("dep-{kind}-{n}")),
    }
}

#[test]
fn a_dependent_gone_while_its_owner_is_there_counts_and_nothing_else_does() {
    let sets =
        vec![set("ResourceClaim", 1), set("ResourceClaim", 2), set("ResourceClaim", 3), set("ConfigMap", 4)];
    let objects = vec![
        // 1: both there.
        sets[0].owner.clone(),
        sets[0].dependent.clone(),
        // 2: owner there, dependent gone: wrongly collected.
        sets[1].owner.clone(),
        // 3: owner gone too (the collector was right): not counted. An owner of the same name
        // with another uid is another object.
        object("ResourceClaim", "drill-gc", "owner-3", "someone-else"),
        // 4: a ConfigMap owner there, its dependent gone.
        sets[3].owner.clone(),
    ];
    let harm = harm::count(&Census { sets, objects, ..Default::default() });
    assert_eq!(
        harm.wrongly_collected,
        BTreeMap::from([("ConfigMap".into(), 1), ("ResourceClaim".into(), 1)])
    );
    assert_eq!(harm.sets, BTreeMap::from([("ConfigMap".into(), 1), ("ResourceClaim".into(), 3)]));
    assert_eq!(harm.wrongly_collected_total(), 2);
}

#[test]
fn objects_under_a_gone_namespace_are_left_behind_and_a_remaining_one_is_stuck() {
    let census = Census {
        deleted: vec![
            Deleted { name: "drill-ns-1".into(), at: 10.0, took: Some(5.2) },
            Deleted { name: "drill-ns-2".into(), at: 13.0, took: Some(6.0) },
            Deleted { name: "drill-ns-3".into(), at: 16.0, took: None },
        ],
        objects: vec![
            object("ResourceClaim", "drill-ns-1", "held", "u1"),
            object("ConfigMap", "drill-ns-1", "held", "u2"),
            // drill-ns-3 still exists (terminating): its objects are not left behind yet.
            object("ResourceClaim", "drill-ns-3", "held", "u3"),
            object("ConfigMap", "drill-gc", "of-1", "u4"),
        ],
        namespaces: ["default", "drill-gc", "drill-ns-3"].map(String::from).into(),
        ..Default::default()
    };
    let harm = harm::count(&census);
    assert_eq!(harm.left_behind, BTreeMap::from([("ConfigMap".into(), 1), ("ResourceClaim".into(), 1)]));
    assert_eq!(harm.left_behind_total(), 2);
    assert_eq!(harm.stuck, vec!["drill-ns-3".to_string()]);
    assert_eq!(harm.namespaces_deleted, 3);
    assert_eq!(harm.deletion_seconds, vec![5.2, 6.0]);
    assert_eq!(harm.slowest().map(|d| d.at), Some(13.0));
}

#[test]
fn controller_manager_errors_are_grouped_by_what_they_say() {
    let log = r#"I1127 12:00:00.000001   42 garbagecollector.go:500] "item not found, generating a virtual delete event" item="x"
E1127 12:00:01.000001   42 garbagecollector.go:360] "Unhandled Error" err="unable to get REST mapping for resource.k8s.io/v1/ResourceClaim" logger="UnhandledError"
E1127 12:00:02.000001   42 garbagecollector.go:360] "Unhandled Error" err="unable to get REST mapping for resource.k8s.io/v1/ResourceClaim" logger="UnhandledError"
E1127 12:00:03.000001   42 namespace_controller.go:164] "Unhandled Error" err="deletion of namespace drill-ns-12 failed: 503" logger="UnhandledError"
E1127 12:00:04.000001   42 namespace_controller.go:164] "Unhandled Error" err="deletion of namespace drill-ns-7 failed: 503" logger="UnhandledError"
E1127 12:00:05.000001   42 reflector.go:200] failed to list *v1.PartialObjectMetadata: the server could not find the requested resource
Error: not a klog line
W1127 12:00:06.000001   42 warnings.go:70] a warning
"#;
    let groups = harm::errors(log);
    assert_eq!(
        groups,
        BTreeMap::from([
            ("Unhandled Error: unable to get REST mapping for resource.k#s.io/v#/ResourceClaim".into(), 2),
            ("Unhandled Error: deletion of namespace drill-ns-# failed: #".into(), 2),
            (
                "failed to list *v#.PartialObjectMetadata: the server could not find the requested resource"
                    .into(),
                1
            ),
        ])
    );
}

fn envoy_stats(counters: &[(&str, u64)], hold: Option<[f64; 3]>) -> serde_json::Value {
    let mut stats: Vec<serde_json::Value> =
        counters.iter().map(|(name, value)| json!({"name": name, "value": value})).collect();
    let quantiles = [0.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 100.0];
    let computed = match hold {
        Some([p50, p99, max]) => {
            let values: Vec<serde_json::Value> = quantiles
                .iter()
                .map(|q| {
                    let v = match *q {
                        50.0 => p50,
                        99.0 => p99,
                        100.0 => max,
                        _ => 1.0,
                    };
                    json!({"interval": null, "cumulative": v})
                })
                .collect();
            vec![json!({"name": "wasmcustom.skewgate.hold_milliseconds", "values": values})]
        }
        None => Vec::new(),
    };
    stats.push(json!({"histograms": {"supported_quantiles": quantiles, "computed_quantiles": computed}}));
    json!({"stats": stats})
}

#[test]
fn held_requests_are_summed_by_outcome_with_the_hold_quantiles() {
    let stats = envoy_stats(
        &[
            ("wasmcustom.skewgate.held_requests_total.cluster=a;outcome=resumed;", 7),
            ("wasmcustom.skewgate.held_requests_total.cluster=c;outcome=resumed;", 5),
            ("wasmcustom.skewgate.held_requests_total.cluster=c;outcome=expired;", 2),
            ("skewgate.held_requests_total.cluster=c;outcome=refused;", 1),
            ("wasmcustom.skewgate.requests_total", 900),
        ],
        Some([120.0, 2400.0, 3100.0]),
    );
    let held = held::parse(&stats);
    assert_eq!(
        held.outcomes,
        BTreeMap::from([("expired".into(), 2), ("refused".into(), 1), ("resumed".into(), 12)])
    );
    assert_eq!(held.total(), 15);
    assert_eq!(held.waits(), 14, "a refused request never waited");
    assert_eq!((held.p50_ms, held.p99_ms, held.max_ms), (Some(120.0), Some(2400.0), Some(3100.0)));
}

/// The histogram's samples reach Envoy's cumulative figures at its next stats flush: the drill
/// reads them once the Prometheus count has every wait the counters have.
#[test]
fn the_waits_recorded_are_the_histograms_count() {
    let page = "# TYPE skewgate_hold_milliseconds histogram\n\
                skewgate_hold_milliseconds_bucket{le=\"0.5\"} 0\n\
                skewgate_hold_milliseconds_sum{} 40210.5\n\
                skewgate_hold_milliseconds_count{} 14\n\
                skewgate_held_requests_total{cluster=\"c\",outcome=\"expired\"} 2\n";
    assert_eq!(held::waits_recorded(page), 14);
    assert_eq!(held::waits_recorded(""), 0);
}

#[test]
fn an_envoy_without_the_held_stats_held_nothing() {
    let held = held::parse(&envoy_stats(&[("wasmcustom.skewgate.requests_total", 900)], None));
    assert_eq!(held, held::Held::default());
    assert_eq!(held.total(), 0);
    assert_eq!(held::parse(&json!({})), held::Held::default());
}

#[test]
fn a_generated_create_found_twice_is_one_write_applied_twice() {
    let labels = ["1", "2", "2", "3", "3", "3"].map(String::from);
    assert_eq!(skewgate_drill::extra_copies(labels), 3);
    assert_eq!(skewgate_drill::extra_copies(Vec::<String>::new()), 0);
}
