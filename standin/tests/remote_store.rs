//! Stand-ins sharing a store over HTTP (`skewgate-harness store`), as the docker-compose
//! stand-ins do from separate containers: writes through one are read and watched through the
//! other, concurrent writers lose nothing, and every answer is the one an in-process store
//! gives.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use skewgate_pki::Pki;
use skewgate_standin::{
    self as standin, Options, Profile, RemoteStore, Standin, Store, StoreHandle, StoreService, Token,
};

const TOKEN: &str = "remote-store-test-token";

fn options(pki: &Pki, id: &str, profile: &str) -> Result<Options> {
    let admin = Token { token: TOKEN.into(), user: "admin".into(), groups: vec!["system:masters".into()] };
    Ok(Options::of_cluster(pki, id, Profile::parse(profile)?, vec![admin]))
}

fn pki(name: &str) -> Result<Pki> {
    let dir = std::env::temp_dir().join(format!("skewgate-remote-store-{name}-{}", std::process::id()));
    Pki::generate(&dir)
}

/// Stand-ins a (1.33) and c (1.36), each with its own connection to one store service, as two
/// processes would have.
struct Remote {
    _service: StoreService,
    standins: Vec<Standin>,
    http: Client,
}

async fn remote(pki: &Pki, history: usize) -> Result<Remote> {
    let service = standin::serve_store(Store::new(history), "127.0.0.1:0".parse()?).await?;
    let mut standins = Vec::new();
    for (id, profile) in [("a", "1.33"), ("c", "1.36")] {
        let store = RemoteStore::connect(&service.url(), Duration::from_secs(5)).await?;
        standins.push(standin::serve(options(pki, id, profile)?, store).await?);
    }
    Ok(Remote { _service: service, standins, http: client(pki)? })
}

fn client(pki: &Pki) -> Result<Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.peer_ca.cert_path)?)?;
    Ok(Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10))
        .build()?)
}

async fn send(
    http: &Client,
    standin: &Standin,
    method: Method,
    path: &str,
    content_type: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Value)> {
    let mut req =
        http.request(method, format!("https://127.0.0.1:{}{path}", standin.addr.port())).bearer_auth(TOKEN);
    if let Some(body) = body {
        req = req.header("content-type", content_type).body(body.to_string());
    }
    let resp = req.send().await?;
    assert_eq!(resp.headers()["x-skewgate-served-by"], standin.id.as_str());
    let status = resp.status();
    let text = resp.text().await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

fn rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";

/// Reads one newline-delimited watch event.
async fn next_event(resp: &mut reqwest::Response, buf: &mut Vec<u8>) -> Result<Value> {
    loop {
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            return Ok(serde_json::from_slice(&line)?);
        }
        match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
            Ok(Ok(Some(chunk))) => buf.extend_from_slice(&chunk),
            other => anyhow::bail!("no watch event within 5 s: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_through_one_read_and_watched_through_the_other() -> Result<()> {
    let pki = pki("share")?;
    let r = remote(&pki, 1000).await?;
    let (a, c) = (&r.standins[0], &r.standins[1]);

    // A watch on c from the current revision, opened before anything is written.
    let (code, list) = send(&r.http, c, Method::GET, CMS, JSON, None).await?;
    assert_eq!(code, 200);
    let start = rv(&json!({"metadata": list["metadata"]}));
    let mut watch = r
        .http
        .get(format!("https://127.0.0.1:{}{CMS}?watch=1&resourceVersion={start}", c.addr.port()))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(30))
        .send()
        .await?;
    let mut buf = Vec::new();

    let (code, created) =
        send(&r.http, a, Method::POST, CMS, JSON, Some(cm("shared", json!({"k": "1"})))).await?;
    assert_eq!(code, 201, "{created}");
    assert_eq!(rv(&created), start + 1);
    let (code, got) = send(&r.http, c, Method::GET, &format!("{CMS}/shared"), JSON, None).await?;
    assert_eq!((code, &got["data"]), (StatusCode::OK, &json!({"k": "1"})));
    assert_eq!(got["metadata"]["uid"], created["metadata"]["uid"]);

    let (code, patched) =
        send(&r.http, a, Method::PATCH, &format!("{CMS}/shared"), MERGE, Some(json!({"data": {"k": "2"}})))
            .await?;
    assert_eq!(code, 200, "{patched}");
    let added = next_event(&mut watch, &mut buf).await?;
    let modified = next_event(&mut watch, &mut buf).await?;
    assert_eq!((added["type"].as_str(), rv(&added["object"])), (Some("ADDED"), start + 1));
    assert_eq!(
        (modified["type"].as_str(), &modified["object"]["data"]),
        (Some("MODIFIED"), &json!({"k": "2"}))
    );

    // An update carrying the version read before the patch: 409, whichever stand-in gets it.
    let stale = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "stale"},
        "metadata": {"name": "shared", "resourceVersion": created["metadata"]["resourceVersion"]}});
    let (code, status) = send(&r.http, c, Method::PUT, &format!("{CMS}/shared"), JSON, Some(stale)).await?;
    assert_eq!((code, status["reason"].as_str()), (StatusCode::CONFLICT, Some("Conflict")), "{status}");

    // Creating twice, and in a namespace that does not exist.
    let (code, status) = send(&r.http, c, Method::POST, CMS, JSON, Some(cm("shared", json!({})))).await?;
    assert_eq!((code, status["reason"].as_str()), (StatusCode::CONFLICT, Some("AlreadyExists")));
    let (code, status) =
        send(&r.http, c, Method::POST, "/api/v1/namespaces/nope/configmaps", JSON, Some(cm("x", json!({}))))
            .await?;
    assert_eq!(
        (code, status["message"].as_str()),
        (StatusCode::NOT_FOUND, Some(r#"namespaces "nope" not found"#))
    );

    // Deleted through c, gone for a; the watch on c sees it.
    let (code, _) = send(&r.http, c, Method::DELETE, &format!("{CMS}/shared"), JSON, None).await?;
    assert_eq!(code, 200);
    let deleted = next_event(&mut watch, &mut buf).await?;
    assert_eq!(deleted["type"], "DELETED");
    let (code, _) = send(&r.http, a, Method::GET, &format!("{CMS}/shared"), JSON, None).await?;
    assert_eq!(code, 404);
    Ok(())
}

/// Merge patches racing through both stand-ins: each read-decide-commit that loses a race
/// decides again, so every key arrives and every write is one revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_lose_nothing() -> Result<()> {
    let pki = pki("race")?;
    let r = Arc::new(remote(&pki, 1000).await?);
    let (code, created) =
        send(&r.http, &r.standins[0], Method::POST, CMS, JSON, Some(cm("race", json!({})))).await?;
    assert_eq!(code, 201);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let r = r.clone();
        tasks.spawn(async move {
            let standin = &r.standins[i % 2];
            let patch = json!({"data": {format!("k{i}"): i.to_string()}});
            send(&r.http, standin, Method::PATCH, &format!("{CMS}/race"), MERGE, Some(patch)).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (code, body) = done??;
        assert_eq!(code, 200, "{body}");
    }
    let (_, last) = send(&r.http, &r.standins[1], Method::GET, &format!("{CMS}/race"), JSON, None).await?;
    assert_eq!(last["data"].as_object().map(|d| d.len()), Some(24), "{last}");
    assert_eq!(rv(&last), rv(&created) + 24);
    Ok(())
}

/// Drops what differs by nature between two runs: uids and timestamps.
fn normalized(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            for key in ["uid", "creationTimestamp", "deletionTimestamp"] {
                if map.contains_key(key) {
                    map.insert(key.into(), json!("-"));
                }
            }
            for value in map.values_mut() {
                *value = normalized(value.take());
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                *item = normalized(item.take());
            }
        }
        _ => {}
    }
    v
}

/// The same requests against a stand-in on an in-process store and on a remote one: the same
/// codes and bodies, errors included (compaction with a history of 6 events).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_answers_are_the_local_answers() -> Result<()> {
    let pki = pki("same")?;
    let http = client(&pki)?;
    let local = standin::serve(options(&pki, "a", "1.33")?, StoreHandle::from(Store::new(6))).await?;
    let remote = remote(&pki, 6).await?;
    let x = format!("{CMS}/x");
    let script: Vec<(Method, String, &str, Option<Value>)> = vec![
        (Method::POST, CMS.into(), JSON, Some(cm("x", json!({"k": "1"})))),
        (Method::POST, CMS.into(), JSON, Some(cm("x", json!({"k": "1"})))),
        (Method::POST, format!("{CMS}?dryRun=All"), JSON, Some(cm("dry", json!({})))),
        (Method::GET, format!("{CMS}/dry"), JSON, None),
        (
            Method::PUT,
            x.clone(),
            JSON,
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "resourceVersion": "4"}, "data": {}})),
        ),
        (Method::PATCH, x.clone(), MERGE, Some(json!({"data": {"k": "2"}}))),
        (Method::PATCH, x.clone(), MERGE, Some(json!({"data": {"k": "2"}}))),
        (
            Method::PATCH,
            format!("{CMS}/ssa?fieldManager=t"),
            "application/apply-patch+yaml",
            Some(cm("ssa", json!({"a": "b"}))),
        ),
        (Method::GET, format!("{CMS}?resourceVersion=5&resourceVersionMatch=Exact"), JSON, None),
        (
            Method::POST,
            "/api/v1/namespaces".into(),
            JSON,
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}})),
        ),
        (Method::POST, "/api/v1/namespaces/t/configmaps".into(), JSON, Some(cm("in-t", json!({})))),
        (Method::DELETE, "/api/v1/namespaces/t".into(), JSON, None),
        (Method::POST, "/api/v1/namespaces/t/configmaps".into(), JSON, Some(cm("late", json!({})))),
        (Method::GET, format!("{CMS}?resourceVersion=5&resourceVersionMatch=Exact"), JSON, None),
        (Method::GET, format!("{CMS}?resourceVersion=3&resourceVersionMatch=Exact"), JSON, None),
        // Compacted: one ERROR event, then the stream ends.
        (Method::GET, format!("{CMS}?watch=1&resourceVersion=4"), JSON, None),
        (Method::DELETE, format!("{CMS}?labelSelector=none%3Dhere"), JSON, None),
        (Method::DELETE, x.clone(), JSON, None),
        (Method::GET, x.clone(), JSON, None),
        (Method::GET, CMS.into(), JSON, None),
    ];
    let mut codes = Vec::new();
    for (i, (method, path, content_type, body)) in script.into_iter().enumerate() {
        let (lc, lb) = send(&http, &local, method.clone(), &path, content_type, body.clone()).await?;
        let (rc, rb) = send(&http, &remote.standins[0], method.clone(), &path, content_type, body).await?;
        codes.push(lc.as_u16());
        assert_eq!(
            (lc, normalized(lb)),
            (rc, normalized(rb)),
            "step {i}: {method} {path}: local, then remote"
        );
    }
    // The script reaches what it means to: conflicts, dry run, no-op, apply, namespace
    // precondition, compaction (list and watch), deletecollection.
    assert_eq!(
        codes,
        [201, 409, 201, 404, 409, 200, 200, 201, 200, 201, 201, 200, 404, 200, 410, 200, 200, 200, 404, 200]
    );
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_remote_store_needs_the_multi_threaded_runtime() -> Result<()> {
    let service = standin::serve_store(Store::new(10), "127.0.0.1:0".parse()?).await?;
    let err = match RemoteStore::connect(&service.url(), Duration::from_secs(1)).await {
        Ok(_) => anyhow::bail!("connected on a current-thread runtime"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("multi-threaded runtime"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_store_is_an_error_that_names_it() -> Result<()> {
    let port = skewgate_harness::envoy::free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let err = match RemoteStore::connect(&url, Duration::from_millis(600)).await {
        Ok(_) => anyhow::bail!("connected to nothing"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains(&url), "{err}");
    Ok(())
}
