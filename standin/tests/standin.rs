//! The stand-in apiservers over real TLS on 127.0.0.1: authentication, discovery, object
//! semantics, watch, and the shared store across stand-ins and versions.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use skewgate_pki::{Pair, Pki};
use skewgate_standin::{self as standin, AuthMethod, Options, Profile, Standin, Store, Token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NOT_FOUND: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#;
const UNAUTHORIZED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;
const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

struct Fixture {
    pki: Pki,
    standins: Vec<Standin>,
    alice: Client,
}

fn options(pki: &Pki, id: &str, profile: &str) -> Result<Options> {
    let bob = Token { token: "t0k3n".into(), user: "bob".into(), groups: vec!["ops".into()] };
    Ok(Options {
        bookmark_interval: Duration::from_millis(300),
        ..Options::of_cluster(pki, id, Profile::parse(profile)?, vec![bob])
    })
}

impl Fixture {
    async fn new(name: &str, standins: &[(&str, &str)], history: usize) -> Result<Fixture> {
        let dir = std::env::temp_dir().join(format!("skewgate-standin-{name}-{}", std::process::id()));
        let pki = Pki::generate(&dir)?;
        let store = Store::new(history);
        let mut running = Vec::new();
        for (id, profile) in standins {
            running.push(standin::serve(options(&pki, id, profile)?, store.clone()).await?);
        }
        let alice = client(&pki, Some(&pki.alice))?;
        Ok(Fixture { pki, standins: running, alice })
    }

    fn url(&self, index: usize, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.standins[index].addr.port())
    }

    async fn send(
        &self,
        index: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value)> {
        let mut req = self.alice.request(method, self.url(index, path));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await?;
        assert_eq!(resp.headers()["x-skewgate-served-by"], self.standins[index].id.as_str());
        let status = resp.status();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    async fn get(&self, index: usize, path: &str) -> Result<(StatusCode, Value)> {
        self.send(index, Method::GET, path, None).await
    }
}

fn client(pki: &Pki, identity: Option<&Pair>) -> Result<Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.peer_ca.cert_path)?)?;
    let mut builder = Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10));
    if let Some(pair) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(&pair.identity_pem()?)?);
    }
    Ok(builder.build()?)
}

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

fn rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Newline-delimited watch events from a streaming response.
struct Events {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Events {
    async fn open(client: &Client, url: &str) -> Result<Events> {
        let resp = client.get(url).timeout(Duration::from_secs(60)).send().await?;
        assert_eq!(resp.status(), 200, "{url}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        Ok(Events { resp, buf: Vec::new() })
    }

    /// The next event, or None when the stream ended (or stayed silent for `wait`).
    async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return serde_json::from_slice(&line).ok();
            }
            match tokio::time::timeout(wait, self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// Whether the stream ends (cleanly or not) within `wait`, skipping any events before.
    async fn ends_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None) | Err(_)) => return true,
                Err(_) => return false,
            }
        }
    }

    async fn next(&mut self) -> Value {
        self.next_within(Duration::from_secs(5)).await.expect("a watch event within 5 s")
    }
}

fn summary(event: &Value) -> (String, String) {
    (
        event["type"].as_str().unwrap_or_default().into(),
        event["object"]["metadata"]["name"].as_str().unwrap_or_default().into(),
    )
}

#[tokio::test]
async fn authentication_paths() -> Result<()> {
    let f = Fixture::new("auth", &[("a", "1.36")], 1000).await?;
    let whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let post = |c: &Client, headers: &[(&str, &str)]| {
        let mut req = c.post(f.url(0, whoami)).json(&review);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };

    // Anonymous: health and version only; elsewhere RBAC's 403, as kube-apiserver words it.
    let anonymous = client(&f.pki, None)?;
    assert_eq!(anonymous.get(f.url(0, "/version")).send().await?.status(), 200);
    assert_eq!(anonymous.get(f.url(0, "/readyz")).send().await?.text().await?, "ok");
    let denied = anonymous.get(f.url(0, "/api")).send().await?;
    assert_eq!(denied.status(), 403);
    assert_eq!(denied.headers()["x-skewgate-served-by"], "a");
    assert_eq!(
        denied.text().await?,
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"system:anonymous\" cannot get path \"/api\"","reason":"Forbidden","details":{},"code":403}"#
    );

    // A cluster-CA certificate: user = CN, groups = O; X-Remote-* are ignored without the proxy cert.
    let resp = post(&f.alice, &[("X-Remote-User", "root"), ("X-Remote-Group", "system:masters")]).await?;
    assert_eq!(resp.status(), 201);
    let body: Value = resp.json().await?;
    assert_eq!(body["kind"], "SelfSubjectReview");
    let user = &body["status"]["userInfo"];
    assert_eq!(
        (&user["username"], &user["groups"]),
        (&json!("alice"), &json!(["devs", "system:authenticated"]))
    );
    // 1.36's x509 authenticator records the certificate's SHA-256 as the credential id.
    let id = user["extra"]["authentication.kubernetes.io/credential-id"][0].as_str().unwrap_or_default();
    assert!(id.starts_with("X509SHA256=") && id.len() == "X509SHA256=".len() + 64, "{user}");

    // Front proxy with an allowed CN: identity from the headers, one group per header line.
    let proxy = client(&f.pki, Some(&f.pki.front_proxy))?;
    let headers = [
        ("X-Remote-User", "carol"),
        ("X-Remote-Group", "g1"),
        ("X-Remote-Group", "g2,still-g2"),
        ("X-Remote-Extra-Scopes%2Fx", "s1"),
        ("X-Remote-Uid", "u-1"),
    ];
    let body: Value = post(&proxy, &headers).await?.json().await?;
    assert_eq!(
        body["status"]["userInfo"],
        json!({"username": "carol", "uid": "u-1", "groups": ["g1", "g2,still-g2", "system:authenticated"], "extra": {"scopes/x": ["s1"]}})
    );
    // The proxy certificate alone is a client certificate the client CA did not sign: 401,
    // also for /readyz (what Envoy's health checks must avoid); a token next to it still works.
    assert_eq!(post(&proxy, &[]).await?.status(), 401);
    assert_eq!(proxy.get(f.url(0, "/readyz")).send().await?.status(), 401);
    assert_eq!(post(&proxy, &[("Authorization", "Bearer t0k3n")]).await?.status(), 201);
    // A requestheader-CA certificate whose CN is not allowed.
    let intruder = f.pki.requestheader_ca.client(&f.pki.dir, "intruder", "intruder", &[])?;
    assert_eq!(post(&client(&f.pki, Some(&intruder))?, &headers).await?.status(), 401);

    // Static tokens.
    let body: Value = post(&anonymous, &[("Authorization", "Bearer t0k3n")]).await?.json().await?;
    assert_eq!(body["status"]["userInfo"]["username"], "bob");
    let wrong = post(&anonymous, &[("Authorization", "Bearer nope")]).await?;
    assert_eq!((wrong.status(), wrong.text().await?), (StatusCode::UNAUTHORIZED, UNAUTHORIZED.to_string()));

    let seen = f.standins[0].identities();
    let users: Vec<(&str, AuthMethod)> = seen.iter().map(|i| (i.user.as_str(), i.method)).collect();
    assert_eq!(
        users,
        [
            ("alice", AuthMethod::ClientCert),
            ("carol", AuthMethod::FrontProxy),
            ("bob", AuthMethod::Token),
            ("bob", AuthMethod::Token)
        ]
    );
    assert_eq!(
        f.standins[0].last_identity().map(|i| i.groups),
        Some(vec!["ops".into(), "system:authenticated".into()])
    );

    // A certificate from a CA nobody trusts fails the handshake, and is counted.
    let rogue = f.pki.rogue_ca.client(&f.pki.dir, "rogue", "mallory", &[])?;
    assert!(client(&f.pki, Some(&rogue))?.get(f.url(0, "/version")).send().await.is_err());
    assert_eq!(f.standins[0].tls_handshake_failures.load(Ordering::SeqCst), 1);

    // Plain HTTP gets Go's answer and is counted.
    let mut tcp = tokio::net::TcpStream::connect(f.standins[0].addr).await?;
    tcp.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n").await?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await?;
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request"), "{answer}");
    assert_eq!(f.standins[0].plaintext_attempts.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn discovery_negotiation_etag_and_disabled_versions() -> Result<()> {
    let f = Fixture::new("discovery", &[("a", "1.36:disable=resource.k8s.io/v1beta1")], 1000).await?;
    let get = |accept: &str, etag: Option<&str>| {
        let mut req = f.alice.get(f.url(0, "/apis")).header("Accept", accept);
        if let Some(tag) = etag {
            req = req.header("If-None-Match", tag);
        }
        req.send()
    };
    let resp = get(&format!("{V2};profile=nopeer,{V2},application/json"), None).await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], V2);
    assert_eq!(resp.headers()["vary"], "Accept");
    let etag = resp.headers()["etag"].to_str()?.to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() == 130, "{etag}");
    let doc: Value = resp.json().await?;
    assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2");
    let resource =
        doc["items"].as_array().unwrap().iter().find(|g| g["metadata"]["name"] == "resource.k8s.io").unwrap();
    let versions: Vec<&str> =
        resource["versions"].as_array().unwrap().iter().map(|v| v["version"].as_str().unwrap()).collect();
    assert_eq!(versions, ["v1", "v1beta2", "v1alpha3"]);

    // Same ETag without the profile (a stand-in has no peers); 304 when it matches.
    let again = get(V2, Some(&etag)).await?;
    assert_eq!(again.status(), 304);
    assert_eq!(again.headers()["etag"].to_str()?, etag);
    assert_eq!(get(V2, Some("\"other\"")).await?.status(), 200);

    // 1.36 no longer speaks v2beta1: the next range of the Accept header, or 406.
    let beta = get(&format!("{V2BETA1},application/json"), None).await?;
    assert_eq!(beta.headers()["content-type"], "application/json");
    assert_eq!(beta.json::<Value>().await?["kind"], "APIGroupList");
    assert_eq!(get(V2BETA1, None).await?.status(), 406);

    for legacy in ["application/json", "*/*"] {
        let resp = get(legacy, None).await?;
        assert_eq!(resp.headers()["content-type"], "application/json");
        let list: Value = resp.json().await?;
        assert_eq!(list["kind"], "APIGroupList");
        assert!(list["groups"].as_array().unwrap().iter().all(|g| {
            g["versions"].as_array().unwrap().iter().all(|v| v["groupVersion"] != "resource.k8s.io/v1beta1")
        }));
    }

    let core: Value = f.alice.get(f.url(0, "/api")).header("Accept", V2).send().await?.json().await?;
    // The core group's name is "", which Go's omitempty leaves out.
    assert!(core["items"][0]["metadata"].get("name").is_none());
    assert_eq!(core["items"][0]["versions"][0]["version"], "v1");
    let versions: Value = f.alice.get(f.url(0, "/api")).send().await?.json().await?;
    assert_eq!(versions["kind"], "APIVersions");
    let (_, group) = f.get(0, "/apis/resource.k8s.io").await?;
    assert_eq!(group["preferredVersion"], json!({"groupVersion": "resource.k8s.io/v1", "version": "v1"}));
    let (_, list) = f.get(0, "/apis/resource.k8s.io/v1").await?;
    assert!(list["resources"].as_array().unwrap().iter().any(|r| r["name"] == "resourceclaims/status"));
    let (_, core_v1) = f.get(0, "/api/v1").await?;
    assert_eq!(core_v1["groupVersion"], "v1");
    for gone in ["/apis/resource.k8s.io/v1beta1", "/apis/no.such.group"] {
        let resp = f.alice.get(f.url(0, gone)).send().await?;
        assert_eq!((resp.status().as_u16(), resp.text().await?), (404, NOT_FOUND.to_string()), "{gone}");
    }
    // kube-openapi's handler writes nothing for a group/version it has no document of.
    let resp = f.alice.get(f.url(0, "/openapi/v3/apis/resource.k8s.io/v1beta1")).send().await?;
    assert_eq!((resp.status().as_u16(), resp.text().await?), (200, String::new()));
    let (_, version) = f.get(0, "/version").await?;
    assert_eq!(
        (version["major"].as_str(), version["minor"].as_str(), version["gitVersion"].as_str()),
        (Some("1"), Some("36"), Some("v1.36.0"))
    );
    let (_, index) = f.get(0, "/openapi/v3").await?;
    assert!(
        index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"].as_str().unwrap().contains("?hash=")
    );
    let (code, v2) = f.get(0, "/openapi/v2").await?;
    assert_eq!((code.as_u16(), v2["swagger"].as_str()), (200, Some("2.0")));
    Ok(())
}

#[tokio::test]
async fn resource_versions_conflicts_and_not_found() -> Result<()> {
    let f = Fixture::new("conflict", &[("a", "1.33")], 1000).await?;
    let base = "/api/v1/namespaces/default/configmaps";
    let (code, created) = f.send(0, Method::POST, base, Some(cm("x", json!({"a": "1"})))).await?;
    assert_eq!(code, 201);
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["metadata"]["namespace"], "default");
    assert!(created["metadata"]["uid"].as_str().unwrap().len() == 36);
    assert!(created["metadata"]["creationTimestamp"].as_str().unwrap().ends_with('Z'));
    let first = rv(&created);

    let (code, dup) = f.send(0, Method::POST, base, Some(cm("x", json!({})))).await?;
    assert_eq!(code, 409);
    assert_eq!(dup["reason"], "AlreadyExists");
    assert_eq!(dup["message"], r#"configmaps "x" already exists"#);
    assert_eq!(dup["details"], json!({"name": "x", "kind": "configmaps"}));

    let mut update = created.clone();
    update["data"]["a"] = json!("2");
    let (code, updated) = f.send(0, Method::PUT, &format!("{base}/x"), Some(update.clone())).await?;
    assert_eq!(code, 200);
    assert!(rv(&updated) > first);
    assert_eq!(updated["metadata"]["generation"], 2);

    // The same body again carries the old resourceVersion now.
    let (code, conflict) = f.send(0, Method::PUT, &format!("{base}/x"), Some(update.clone())).await?;
    assert_eq!(code, 409);
    assert_eq!(conflict["reason"], "Conflict");
    assert_eq!(
        conflict["message"],
        r#"Operation cannot be fulfilled on configmaps "x": the object has been modified; please apply your changes to the latest version and try again"#
    );

    // No resourceVersion: an unconditional update.
    update["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    update["data"]["a"] = json!("3");
    let (code, forced) = f.send(0, Method::PUT, &format!("{base}/x"), Some(update)).await?;
    assert_eq!((code.as_u16(), forced["data"]["a"].as_str()), (200, Some("3")));

    let stale = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": first.to_string()}});
    let (code, refused) = f.send(0, Method::DELETE, &format!("{base}/x"), Some(stale)).await?;
    assert_eq!((code.as_u16(), refused["reason"].as_str()), (409, Some("Conflict")));
    let wrong_uid = json!({"preconditions": {"uid": "not-it"}});
    assert_eq!(f.send(0, Method::DELETE, &format!("{base}/x"), Some(wrong_uid)).await?.0, 409);

    let (code, deleted) = f.send(0, Method::DELETE, &format!("{base}/x"), None).await?;
    assert_eq!(code, 200);
    assert_eq!(deleted["status"], "Success");
    let (code, missing) = f.get(0, &format!("{base}/x")).await?;
    assert_eq!(code, 404);
    assert_eq!(missing["message"], r#"configmaps "x" not found"#);
    assert_eq!(missing["details"], json!({"name": "x", "kind": "configmaps"}));

    // generateName, and the list revision.
    let generated = json!({"metadata": {"generateName": "gen-"}, "data": {}});
    let (code, made) = f.send(0, Method::POST, base, Some(generated)).await?;
    assert_eq!(code, 201);
    assert!(
        made["metadata"]["name"].as_str().unwrap().starts_with("gen-")
            && made["metadata"]["name"].as_str().unwrap().len() == 9
    );
    let (_, list) = f.get(0, base).await?;
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(rv(&list), rv(&made));
    let (code, invalid) = f.send(0, Method::POST, base, Some(cm("Not_Valid", json!({})))).await?;
    assert_eq!((code.as_u16(), invalid["reason"].as_str()), (422, Some("Invalid")));
    Ok(())
}

#[tokio::test]
async fn watch_from_a_revision_sees_exactly_the_later_events_in_order() -> Result<()> {
    let f = Fixture::new("watch", &[("a", "1.36")], 1000).await?;
    let base = "/api/v1/namespaces/default/configmaps";
    let (_, a) = f.send(0, Method::POST, base, Some(cm("a", json!({"v": "1"})))).await?;
    let from = rv(&a);
    f.send(0, Method::POST, base, Some(cm("b", json!({})))).await?;
    f.send(0, Method::PATCH, &format!("{base}/a"), None).await?; // no content type: 415, no event
    let patch = f
        .alice
        .patch(f.url(0, &format!("{base}/a")))
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"data":{"v":"2"}}"#)
        .send()
        .await?;
    assert_eq!(patch.status(), 200);
    f.send(0, Method::DELETE, &format!("{base}/b"), None).await?;
    // Another resource's events are not this watch's business.
    f.send(0, Method::POST, "/api/v1/namespaces/default/secrets", Some(json!({"metadata": {"name": "s"}})))
        .await?;

    let mut events =
        Events::open(&f.alice, &f.url(0, &format!("{base}?watch=true&resourceVersion={from}"))).await?;
    let mut seen = Vec::new();
    let mut revisions = Vec::new();
    for _ in 0..3 {
        let event = events.next().await;
        revisions.push(rv(&event["object"]));
        seen.push(summary(&event));
    }
    let expected = [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")];
    assert_eq!(seen, expected.map(|(t, n)| (t.to_string(), n.to_string())));
    assert!(revisions.windows(2).all(|w| w[0] < w[1]) && revisions[0] > from, "{revisions:?}");
    // Live events follow.
    f.send(0, Method::POST, base, Some(cm("c", json!({})))).await?;
    let live = events.next().await;
    assert_eq!(summary(&live), ("ADDED".into(), "c".into()));
    assert_eq!(live["object"]["apiVersion"], "v1");
    assert_eq!(live["object"]["kind"], "ConfigMap");

    // Without a revision: the current objects first.
    let mut fresh = Events::open(&f.alice, &f.url(0, &format!("{base}?watch=1&labelSelector="))).await?;
    let mut names = vec![summary(&fresh.next().await).1, summary(&fresh.next().await).1];
    names.sort();
    assert_eq!(names, ["a", "c"]);

    // The legacy /watch/ path for one object, and timeoutSeconds ending the stream.
    let mut one =
        Events::open(&f.alice, &f.url(0, "/api/v1/watch/namespaces/default/configmaps/a?timeoutSeconds=1"))
            .await?;
    assert_eq!(summary(&one.next().await), ("ADDED".into(), "a".into()));
    assert!(one.next_within(Duration::from_secs(5)).await.is_none(), "timeoutSeconds ends the watch");
    Ok(())
}

#[tokio::test]
async fn compacted_revisions_are_gone_for_list_and_watch() -> Result<()> {
    let f = Fixture::new("compacted", &[("a", "1.36")], 5).await?;
    let base = "/api/v1/namespaces/default/configmaps";
    let mut last = Value::Null;
    for i in 0..10 {
        last = f.send(0, Method::POST, base, Some(cm(&format!("c{i}"), json!({})))).await?.1;
    }
    let oldest_kept = rv(&last) - 5;
    let (code, expired) = f.get(0, &format!("{base}?resourceVersion=2")).await?;
    assert_eq!(code, 410);
    assert_eq!(expired["reason"], "Expired");
    assert_eq!(expired["message"], format!("too old resource version: 2 ({oldest_kept})"));
    // Within the window, an exact list is served at that revision.
    let at = rv(&last) - 2;
    let (_, exact) = f.get(0, &format!("{base}?resourceVersion={at}&resourceVersionMatch=Exact")).await?;
    assert_eq!(rv(&exact), at);
    assert_eq!(exact["items"].as_array().unwrap().len(), 8);

    let mut events =
        Events::open(&f.alice, &f.url(0, &format!("{base}?watch=true&resourceVersion=2"))).await?;
    let error = events.next().await;
    assert_eq!(error["type"], "ERROR");
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
    assert!(events.next_within(Duration::from_secs(3)).await.is_none(), "the stream ends after the error");
    Ok(())
}

#[tokio::test]
async fn objects_are_shared_across_standins_and_versions() -> Result<()> {
    let f = Fixture::new("shared", &[("old", "1.33"), ("new", "1.36")], 1000).await?;
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.example.com"}]}},
        "status": {"ignored": "on create"},
    });
    let (code, created) = f
        .send(0, Method::POST, "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims", Some(claim))
        .await?;
    assert_eq!(code, 201);
    assert!(created.get("status").is_none());

    let (code, via_v1) = f.get(1, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu").await?;
    assert_eq!(code, 200);
    assert_eq!(via_v1["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(via_v1["kind"], "ResourceClaim");
    assert_eq!(via_v1["metadata"]["uid"], created["metadata"]["uid"]);
    let (_, via_beta2) = f.get(1, "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims").await?;
    assert_eq!(via_beta2["kind"], "ResourceClaimList");
    assert_eq!(via_beta2["items"][0]["apiVersion"], "resource.k8s.io/v1beta2");

    // The old server does not serve v1: upstream's 404 wording.
    let resp = f
        .alice
        .get(f.url(0, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu"))
        .send()
        .await?;
    assert_eq!(resp.headers()["x-skewgate-served-by"], "old");
    assert_eq!((resp.status().as_u16(), resp.text().await?), (404, NOT_FOUND.to_string()));

    // The status subresource: writes to the object leave status alone, and the reverse.
    let status = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"}, "status": {"allocation": {"devices": {}}}});
    let (code, with_status) = f
        .send(
            1,
            Method::PUT,
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu/status",
            Some(status),
        )
        .await?;
    assert_eq!(code, 200);
    assert_eq!(with_status["status"], json!({"allocation": {"devices": {}}}));
    assert_eq!(with_status["metadata"]["generation"], 1);
    assert_eq!(with_status["spec"], via_v1["spec"]);
    let mut main = with_status.clone();
    main["status"] = json!({});
    main["spec"]["devices"]["requests"][0]["name"] = json!("renamed");
    let (_, after) = f
        .send(1, Method::PUT, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu", Some(main))
        .await?;
    assert_eq!(after["status"], json!({"allocation": {"devices": {}}}));
    assert_eq!(after["metadata"]["generation"], 2);
    Ok(())
}

#[tokio::test]
async fn unserved_and_unlisted() -> Result<()> {
    let f = Fixture::new("unserved", &[("a", "1.30")], 1000).await?;
    for path in [
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        "/apis/no.such/v1/things",
        "/api/v2/pods",
        "/api/v1/namespaces/default/configmaps/x/nosuchsub",
        "/api/v1/configmaps/x",
        "/api/v1/namespaces/default/nodes",
        "/nonsense",
    ] {
        let resp = f.alice.get(f.url(0, path)).send().await?;
        assert_eq!(resp.headers()["x-skewgate-served-by"], "a");
        assert_eq!((resp.status().as_u16(), resp.text().await?), (404, NOT_FOUND.to_string()), "{path}");
    }
    // Verbs discovery does not list.
    for (method, path) in [
        (Method::GET, "/apis/authentication.k8s.io/v1/selfsubjectreviews"),
        (Method::DELETE, "/api/v1/namespaces/default/bindings/x"),
        (Method::DELETE, "/api/v1/namespaces"),
    ] {
        let (code, body) = f.send(0, method, path, None).await?;
        assert_eq!((code.as_u16(), body["reason"].as_str()), (405, Some("MethodNotAllowed")), "{path}");
    }
    // Namespaces that do not exist, and deleting one that does.
    let (code, body) =
        f.send(0, Method::POST, "/api/v1/namespaces/nope/configmaps", Some(cm("x", json!({})))).await?;
    assert_eq!((code.as_u16(), body["message"].as_str()), (404, Some(r#"namespaces "nope" not found"#)));
    assert_eq!(body["details"], json!({"name": "nope", "kind": "namespaces"}));
    let (code, ns) =
        f.send(0, Method::POST, "/api/v1/namespaces", Some(json!({"metadata": {"name": "team"}}))).await?;
    assert_eq!((code.as_u16(), ns["status"]["phase"].as_str()), (201, Some("Active")));
    assert_eq!(
        f.send(0, Method::POST, "/api/v1/namespaces/team/configmaps", Some(cm("x", json!({})))).await?.0,
        201
    );
    assert_eq!(f.send(0, Method::DELETE, "/api/v1/namespaces/team", None).await?.0, 200);
    assert_eq!(f.get(0, "/api/v1/namespaces/team/configmaps/x").await?.0, 404);
    let (code, forbidden) = f.send(0, Method::DELETE, "/api/v1/namespaces/kube-system", None).await?;
    assert_eq!((code.as_u16(), forbidden["reason"].as_str()), (403, Some("Forbidden")));
    // Bodies over 3 MiB.
    let big = cm("big", json!({"a": "x".repeat(3 * 1024 * 1024)}));
    let (code, body) = f.send(0, Method::POST, "/api/v1/namespaces/default/configmaps", Some(big)).await?;
    assert_eq!((code.as_u16(), body["reason"].as_str()), (413, Some("RequestEntityTooLarge")));
    Ok(())
}

#[tokio::test]
async fn bookmarks_and_initial_events() -> Result<()> {
    let f = Fixture::new("bookmarks", &[("a", "1.36")], 1000).await?;
    let base = "/api/v1/namespaces/default/configmaps";
    f.send(0, Method::POST, base, Some(cm("one", json!({})))).await?;
    let url = f.url(
        0,
        &format!(
            "{base}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        ),
    );
    let mut events = Events::open(&f.alice, &url).await?;
    assert_eq!(summary(&events.next().await), ("ADDED".into(), "one".into()));
    let end = events.next().await;
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
    assert_eq!(end["object"]["kind"], "ConfigMap");
    // Then periodic bookmarks at the revision reached (interval 300 ms here).
    let (_, two) = f.send(0, Method::POST, base, Some(cm("two", json!({})))).await?;
    assert_eq!(summary(&events.next().await), ("ADDED".into(), "two".into()));
    let bookmark = events.next().await;
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert!(rv(&bookmark["object"]) >= rv(&two));
    assert!(bookmark["object"]["metadata"].get("annotations").is_none());
    Ok(())
}

#[tokio::test]
async fn selectors_paging_and_patches() -> Result<()> {
    let f = Fixture::new("selectors", &[("a", "1.36")], 1000).await?;
    let base = "/api/v1/namespaces/default/configmaps";
    for (name, tier) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut object = cm(name, json!({}));
        object["metadata"]["labels"] = json!({"tier": tier});
        f.send(0, Method::POST, base, Some(object)).await?;
    }
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&f.get(0, &format!("{base}?labelSelector=tier%3Dweb")).await?.1), ["a", "c"]);
    assert_eq!(names(&f.get(0, &format!("{base}?labelSelector=tier+notin+(web)")).await?.1), ["b"]);
    assert_eq!(names(&f.get(0, &format!("{base}?fieldSelector=metadata.name%3Db")).await?.1), ["b"]);
    assert_eq!(
        names(&f.get(0, "/api/v1/configmaps?fieldSelector=metadata.namespace%3Ddefault").await?.1),
        ["a", "b", "c"]
    );
    assert_eq!(f.get(0, &format!("{base}?labelSelector=tier+in+web")).await?.0, 400);
    let (_, page) = f.get(0, &format!("{base}?limit=2")).await?;
    assert_eq!(names(&page), ["a", "b"]);
    assert_eq!(page["metadata"]["remainingItemCount"], 1);
    let token = page["metadata"]["continue"].as_str().unwrap();
    let (_, rest) = f.get(0, &format!("{base}?limit=2&continue={token}")).await?;
    assert_eq!(names(&rest), ["c"]);
    assert!(rest["metadata"].get("continue").is_none());

    let patch = |name: &str, content_type: &str, body: &str| {
        f.alice
            .patch(f.url(0, &format!("{base}/{name}")))
            .header("Content-Type", content_type)
            .body(body.to_string())
            .send()
    };
    let json_patch: Value =
        patch("a", "application/json-patch+json", r#"[{"op":"add","path":"/data/k","value":"v"}]"#)
            .await?
            .json()
            .await?;
    assert_eq!(json_patch["data"], json!({"k": "v"}));
    let smp: Value =
        patch("a", "application/strategic-merge-patch+json", r#"{"data":{"k2":"v2"}}"#).await?.json().await?;
    assert_eq!(smp["data"], json!({"k": "v", "k2": "v2"}));
    let applied = patch(
        "new",
        "application/apply-patch+yaml",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"new"},"data":{"x":"y"}}"#,
    )
    .await?;
    assert_eq!(applied.status(), 201);
    assert_eq!(patch("new", "application/apply-patch+yaml", "data:\n  x: z\n").await?.status(), 415);
    assert_eq!(patch("a", "text/plain", "{}").await?.status(), 415);
    assert_eq!(patch("missing", "application/merge-patch+json", "{}").await?.status(), 404);
    let stale = patch("a", "application/merge-patch+json", r#"{"metadata":{"resourceVersion":"1"}}"#).await?;
    assert_eq!(stale.status(), 409);

    // deletecollection honours the selector.
    let (code, deleted) =
        f.send(0, Method::DELETE, &format!("{base}?labelSelector=tier%3Dweb"), None).await?;
    assert_eq!(code, 200);
    assert_eq!(names(&deleted), ["a", "c"]);
    assert_eq!(names(&f.get(0, base).await?.1), ["b", "new"]);
    Ok(())
}

#[tokio::test]
async fn kubectl_table_form() -> Result<()> {
    let f = Fixture::new("table", &[("a", "1.36")], 1000).await?;
    f.send(
        0,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        Some(cm("t", json!({"a": "1", "b": "2"}))),
    )
    .await?;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let table: Value = f
        .alice
        .get(f.url(0, "/api/v1/namespaces/default/configmaps"))
        .header("Accept", accept)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> =
        table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(columns, ["Name", "Data", "Age"]);
    assert_eq!(table["rows"][0]["cells"][0], "t");
    assert_eq!(table["rows"][0]["cells"][1], 2);
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let protobuf_only = f
        .alice
        .get(f.url(0, "/api/v1/namespaces/default/configmaps"))
        .header("Accept", "application/vnd.kubernetes.protobuf")
        .send()
        .await?;
    assert_eq!(protobuf_only.status(), 406);
    Ok(())
}

#[tokio::test]
async fn busy_port_and_shutdown() -> Result<()> {
    let f = Fixture::new("lifecycle", &[("a", "1.36")], 1000).await?;
    let taken = f.standins[0].addr;
    let mut clash = options(&f.pki, "b", "1.36")?;
    clash.listen = taken;
    let err = match standin::serve(clash, Store::new(10)).await {
        Ok(_) => panic!("a busy port must be an error"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(err, format!("{taken} is already in use"));

    let mut events =
        Events::open(&f.alice, &f.url(0, "/api/v1/namespaces/default/configmaps?watch=true")).await?;
    let Fixture { standins, .. } = f;
    for s in standins {
        s.shutdown().await;
    }
    assert!(events.ends_within(Duration::from_secs(5)).await, "the watch outlived its apiserver");
    Ok(())
}

#[test]
fn profiles_refuse_unknown_eras_and_versions() {
    assert!(Profile::parse("1.29").is_err());
    assert!(Profile::parse("1.30:disable=resource.k8s.io/v1").is_err());
    let p = Profile::parse("1.33:disable=networking.k8s.io/v1beta1").unwrap();
    assert_eq!(p.git_version, "v1.33.0");
    // The real profiles serve what was captured, nothing switched off.
    let real = Profile::parse("1.33-real").unwrap();
    assert_eq!((real.git_version.as_str(), real.era.as_str(), real.name()), ("v1.36.2", "1.33", "1.33-real"));
    assert!(Profile::parse("1.36-real:disable=resource.k8s.io/v1").is_err());
}

// ---------------------------------------------------------------------------------------------
// The real profiles: what a real kube-apiserver v1.36.2 served, packed in
// testdata/real-apiserver/documents.tar.xz (the repository's own copy: a clone stands alone).

/// The captured files of one server (`real-1.36.2`, `real-1.36.2-emulated-1.33-betas`), by their
/// path inside its folder.
fn captured(folder: &str) -> Result<std::collections::BTreeMap<String, Vec<u8>>> {
    let prefix = format!("{folder}/");
    Ok(standin::captured::archive_files()?
        .into_iter()
        .filter_map(|(name, body)| Some((name.strip_prefix(&prefix)?.to_owned(), body)))
        .collect())
}

/// One GET with extra headers: (status, headers, body).
async fn raw(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, reqwest::header::HeaderMap, bytes::Bytes)> {
    let mut req = client.get(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await?;
    Ok((resp.status().as_u16(), resp.headers().clone(), resp.bytes().await?))
}

/// The packed documents are whole: both servers' folders, every document a JSON document, the
/// emulated server's `/version` the one kept beside the archive.
#[test]
fn the_packed_documents_are_whole() -> Result<()> {
    let packed = standin::captured::archive_files()?;
    assert!(packed.len() > 200, "{} files", packed.len());
    for folder in ["real-1.36.2", "real-1.36.2-emulated-1.33-betas"] {
        let files = captured(folder)?;
        for name in
            ["version.json", "discovery/apis.aggregated_v2.json", "openapi/v3/index.json", "openapi/v2.json"]
        {
            assert!(files.contains_key(name), "{folder}/{name} missing");
        }
        for (name, body) in files.iter().filter(|(name, _)| name.ends_with(".json")) {
            serde_json::from_slice::<Value>(body).with_context(|| format!("{folder}/{name}"))?;
        }
    }
    let beside = std::fs::read(
        skewgate_harness::paths::workspace_root().join("testdata/real-apiserver/version-emulated-1.33.json"),
    )?;
    assert_eq!(captured("real-1.36.2-emulated-1.33-betas")?["version.json"], beside);
    Ok(())
}

/// Where each captured file is served, and with which Accept; None for the OpenAPI v3
/// documents (fetched by their index's URL).
fn served_at(file: &str) -> Option<(String, &'static str)> {
    let legacy = "application/json";
    let name = file.strip_suffix(".json")?;
    Some(match name {
        "version" => ("/version".into(), legacy),
        "discovery/apis.aggregated_v2" => ("/apis".into(), V2),
        "discovery/api.aggregated_v2" => ("/api".into(), V2),
        "openapi/v2" => ("/openapi/v2".into(), legacy),
        "openapi/v3/index" => ("/openapi/v3".into(), legacy),
        _ if name.starts_with("openapi/v3/") => return None,
        _ => (format!("/{}", name.strip_prefix("discovery/")?.replace("__", "/")), legacy),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_profiles_serve_every_captured_file_at_its_path() -> Result<()> {
    let f = Fixture::new("real-files", &[("a", "1.36-real"), ("b", "1.33-real")], 1000).await?;
    let mut checked = 0;
    for (index, folder) in [(0, "real-1.36.2"), (1, "real-1.36.2-emulated-1.33-betas")] {
        let files = captured(folder)?;
        let openapi_index: Value = serde_json::from_slice(&files["openapi/v3/index.json"])?;
        for (file, expected) in &files {
            let (path, accept) = match served_at(file) {
                Some(found) => found,
                None => {
                    let key = file.strip_prefix("openapi/v3/").and_then(|k| k.strip_suffix(".json"));
                    let key = key.map(|k| k.replace("__", "/")).unwrap_or_default();
                    let url = openapi_index["paths"][&key]["serverRelativeURL"].as_str();
                    (
                        url.unwrap_or_else(|| panic!("{file} is not in the index")).to_string(),
                        "application/json",
                    )
                }
            };
            let (code, headers, body) = raw(&f.alice, &f.url(index, &path), &[("Accept", accept)]).await?;
            assert_eq!(code, 200, "{folder}/{file} at {path}");
            assert_eq!(headers["x-skewgate-served-by"], f.standins[index].id.as_str());
            if path == "/api" && accept != V2 {
                // APIVersions names the server's own address, the stand-in's here.
                let mut captured: Value = serde_json::from_slice(expected)?;
                captured["serverAddressByClientCIDRs"][0]["serverAddress"] =
                    json!(f.standins[index].addr.to_string());
                assert_eq!(serde_json::from_slice::<Value>(&body)?, captured);
            } else {
                assert!(body == expected.as_slice(), "{folder}/{file} at {path} differs");
            }
            checked += 1;
        }
    }
    println!("{checked} captured files served byte for byte");
    assert!(checked > 200);
    Ok(())
}

async fn openapi_index(f: &Fixture, index: usize) -> Result<(reqwest::header::HeaderMap, Value)> {
    let (code, headers, body) = raw(&f.alice, &f.url(index, "/openapi/v3"), &[]).await?;
    assert_eq!(code, 200);
    Ok((headers, serde_json::from_slice(&body)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_caching_as_kube_openapi() -> Result<()> {
    let f = Fixture::new("openapi-cache", &[("a", "1.36-real"), ("b", "1.33-real")], 1000).await?;
    let (index_headers, a) = openapi_index(&f, 0).await?;
    let (_, b) = openapi_index(&f, 1).await?;
    // The index has an ETag of its own and answers 304 to it, but is not immutable.
    let index_etag = index_headers["etag"].to_str()?.to_string();
    assert_eq!(index_headers["cache-control"], "no-cache, private");
    let (code, _, body) = raw(&f.alice, &f.url(0, "/openapi/v3"), &[("If-None-Match", &index_etag)]).await?;
    assert_eq!((code, body.len()), (304, 0));
    assert_eq!(a["paths"].as_object().map(|p| p.len()), Some(47));
    assert_eq!(b["paths"].as_object().map(|p| p.len()), Some(52));

    let url = a["paths"]["api/v1"]["serverRelativeURL"].as_str().unwrap_or_default().to_string();
    let hash = url.split_once("?hash=").map(|(_, h)| h.to_string()).unwrap_or_default();
    let quoted = format!("\"{hash}\"");
    // Hash match: immutable, a year to expire, the hash as ETag.
    let (code, h, body) = raw(&f.alice, &f.url(0, &url), &[]).await?;
    assert_eq!(code, 200);
    assert_eq!(h["cache-control"], "public, immutable");
    assert_eq!(h["etag"].to_str()?, quoted);
    assert_eq!(h["vary"], "Accept");
    assert_eq!(h["content-type"], "application/json");
    assert!(h.contains_key("expires") && h.contains_key("last-modified"));
    assert!(body.len() > 1_000_000);
    // If-None-Match: 304 with the ETag, nothing else.
    let (code, h, body) = raw(&f.alice, &f.url(0, &url), &[("If-None-Match", &quoted)]).await?;
    assert_eq!((code, body.len()), (304, 0));
    assert_eq!(h["etag"].to_str()?, quoted);
    assert!(!h.contains_key("content-type") && !h.contains_key("last-modified"));
    // Another server's hash for the same path: a 301 to this server's.
    let other = b["paths"]["api/v1"]["serverRelativeURL"].as_str().unwrap_or_default();
    assert_ne!(other, url);
    let no_redirects = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&f.pki.peer_ca.cert_path)?)?)
        .identity(reqwest::Identity::from_pem(&f.pki.alice.identity_pem()?)?)
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let (code, h, body) = raw(&no_redirects, &f.url(0, other), &[]).await?;
    assert_eq!((code, body.len()), (301, 0));
    assert_eq!(h["location"].to_str()?, url);
    assert_eq!(h["etag"].to_str()?, quoted);
    // No hash: the document, not cacheable.
    let (code, h, body) = raw(&f.alice, &f.url(0, "/openapi/v3/api/v1"), &[]).await?;
    assert_eq!(
        (code, h["cache-control"].to_str()?, h["etag"].to_str()?),
        (200, "no-cache, private", quoted.as_str())
    );
    assert!(body.len() > 1_000_000);
    // A document this server does not have: upstream's handler writes nothing.
    let (code, _, body) = raw(&f.alice, &f.url(0, "/openapi/v3/apis/resource.k8s.io/v1beta2"), &[]).await?;
    assert_eq!((code, body.len()), (200, 0));
    let beta = b["paths"]["apis/resource.k8s.io/v1beta2"]["serverRelativeURL"].as_str().unwrap_or_default();
    assert_eq!(raw(&f.alice, &f.url(1, beta), &[]).await?.0, 200);
    // Only the protobuf forms accepted: not modelled, 406 as for any unknown type.
    let proto = "application/com.github.proto-openapi.spec.v3.v1.0+protobuf";
    assert_eq!(raw(&f.alice, &f.url(0, &url), &[("Accept", proto)]).await?.0, 406);
    // v2: JSON with an ETag and 304; protobuf (reduced: every path and definition by name).
    let (code, h, body) = raw(&f.alice, &f.url(0, "/openapi/v2"), &[("Accept", "application/json")]).await?;
    assert_eq!((code, h["vary"].to_str()?), (200, "Accept"));
    assert!(body.len() > 2_000_000);
    let v2_etag = h["etag"].to_str()?.to_string();
    assert_eq!(raw(&f.alice, &f.url(0, "/openapi/v2"), &[("If-None-Match", &v2_etag)]).await?.0, 304);
    let v2_proto = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let (code, h, proto) = raw(&f.alice, &f.url(0, "/openapi/v2"), &[("Accept", v2_proto)]).await?;
    assert_eq!((code, h["content-type"].to_str()?), (200, v2_proto));
    let json: Value = serde_json::from_slice(&body)?;
    let names = skewgate_openapi::v2proto::names(&proto).map_err(anyhow::Error::msg)?;
    let definitions = json["definitions"].as_object().map_or(0, |d| d.len());
    assert_eq!(names.iter().filter(|n| n.starts_with("definitions/")).count(), definitions);
    Ok(())
}

#[tokio::test]
async fn real_discovery_negotiation_and_peer_header() -> Result<()> {
    let f = Fixture::new("real-discovery", &[("a", "1.36-real"), ("b", "1.33-real")], 1000).await?;
    let apis = f.url(0, "/apis");
    let (code, h, body) = raw(&f.alice, &apis, &[("Accept", &format!("{V2};profile=nopeer"))]).await?;
    assert_eq!((code, h["content-type"].to_str()?), (200, V2));
    assert_eq!(serde_json::from_slice::<Value>(&body)?["kind"], "APIGroupDiscoveryList");
    let etag = h["etag"].to_str()?.to_string();
    assert_eq!(h["cache-control"], "public");
    let (code, _, empty) = raw(&f.alice, &apis, &[("Accept", V2), ("If-None-Match", &etag)]).await?;
    assert_eq!((code, empty.len()), (304, 0));
    // Neither the 1.36 server nor the emulated 1.33 one speaks v2beta1.
    for index in [0, 1] {
        assert_eq!(raw(&f.alice, &f.url(index, "/apis"), &[("Accept", V2BETA1)]).await?.0, 406);
    }
    // Without the mixed-version-proxy feature gate, x-kubernetes-peer-proxied changes nothing.
    for (index, path) in [(0, "/apis/resource.k8s.io/v1"), (1, "/apis/resource.k8s.io/v1"), (0, "/apis")] {
        let plain = raw(&f.alice, &f.url(index, path), &[("Accept", V2)]).await?;
        let proxied =
            raw(&f.alice, &f.url(index, path), &[("Accept", V2), ("x-kubernetes-peer-proxied", "true")])
                .await?;
        assert_eq!((plain.0, &plain.2), (proxied.0, &proxied.2), "{path}");
    }
    assert_eq!(raw(&f.alice, &f.url(1, "/apis/resource.k8s.io/v1"), &[]).await?.0, 404);
    // /version names the emulated version.
    let (_, version) = f.get(1, "/version").await?;
    assert_eq!(
        (version["gitVersion"].as_str(), version["emulationMinor"].as_str()),
        (Some("v1.36.2"), Some("33"))
    );
    Ok(())
}

#[tokio::test]
async fn real_profiles_do_crud_on_what_they_list() -> Result<()> {
    let f = Fixture::new("real-crud", &[("a", "1.36-real"), ("b", "1.33-real")], 1000).await?;
    let claim = |version: &str| {
        json!({
            "apiVersion": format!("resource.k8s.io/{version}"), "kind": "ResourceClaim",
            "metadata": {"name": format!("gpu-{version}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
        })
    };
    let (code, created) = f
        .send(
            0,
            Method::POST,
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
            Some(claim("v1")),
        )
        .await?;
    assert_eq!((code.as_u16(), created["kind"].as_str()), (201, Some("ResourceClaim")));
    let (code, _) = f
        .send(
            1,
            Method::POST,
            "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims",
            Some(claim("v1beta2")),
        )
        .await?;
    assert_eq!(code, 201);
    // The same store seen through the other version, where each server serves it.
    let (code, list) = f.get(1, "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims").await?;
    assert_eq!((code.as_u16(), list["items"].as_array().map(Vec::len)), (200, Some(2)));
    assert_eq!(f.get(1, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims").await?.0, 404);
    let (code, ipaddresses) = f.get(1, "/apis/networking.k8s.io/v1beta1/ipaddresses").await?;
    assert_eq!((code.as_u16(), ipaddresses["kind"].as_str()), (200, Some("IPAddressList")));
    let (code, _) = f
        .send(0, Method::DELETE, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu-v1", None)
        .await?;
    assert_eq!(code, 200);
    Ok(())
}

/// What one `/readyz` poll saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Refused,
    Code(u16),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booting_refuses_then_forbids_then_is_unready_then_ready() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("skewgate-standin-boot-{}", std::process::id()));
    let pki = Pki::generate(&dir)?;
    let mut opts = options(&pki, "a", "1.36-real")?;
    opts.auth.tokens.push(Token {
        token: "m4st3r".into(),
        user: "root".into(),
        groups: vec!["system:masters".into()],
    });
    let phase = Duration::from_millis(1000);
    let startup = standin::Startup { refusing: phase, forbidding: phase, unready: phase };
    let started = tokio::time::Instant::now();
    let s = standin::serve_booting(opts, Store::new(100), startup).await?;
    let alice = client(&pki, Some(&pki.alice))?;
    // A client certificate would win over the token (the x509 authenticator comes first).
    let tokens = client(&pki, None)?;
    let url = |path: &str| format!("https://127.0.0.1:{}{path}", s.addr.port());
    let mut seen: Vec<(Seen, Duration)> = Vec::new();
    let deadline = started + Duration::from_secs(20);
    while seen.last().map(|s| s.0) != Some(Seen::Code(200)) {
        assert!(tokio::time::Instant::now() < deadline, "not ready after 20 s: {seen:?}");
        let now = match alice.get(url("/readyz")).send().await {
            Ok(resp) => Seen::Code(resp.status().as_u16()),
            Err(e) if e.is_connect() => Seen::Refused,
            Err(e) => return Err(e.into()),
        };
        if seen.last().map(|s| s.0) != Some(now) {
            seen.push((now, started.elapsed()));
            match now {
                Seen::Code(403) => {
                    // RBAC not synced: alice is denied everything, system:masters is not.
                    let resp = alice.get(url("/readyz")).send().await?;
                    let body = resp.text().await?;
                    if body.contains("Forbidden") {
                        assert_eq!(
                            body,
                            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"alice\" cannot get path \"/readyz\"","reason":"Forbidden","details":{},"code":403}"#
                        );
                    }
                    let admin = tokens.get(url("/readyz")).bearer_auth("m4st3r").send().await?;
                    assert_ne!(admin.status(), 403);
                }
                Seen::Code(500) => {
                    // Post-start hooks still running: discovery is served already.
                    let apis = alice.get(url("/apis")).header("Accept", V2).send().await?;
                    assert_eq!(apis.status(), 200);
                    let readyz = alice.get(url("/readyz")).send().await?;
                    if readyz.status() == 500 {
                        assert!(readyz.text().await?.ends_with("[+]shutdown ok\nreadyz check failed\n"));
                    }
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let order: Vec<Seen> = seen.iter().map(|s| s.0).collect();
    println!("boot of a {:?} startup: {seen:?}", startup.total());
    assert_eq!(order, [Seen::Refused, Seen::Code(403), Seen::Code(500), Seen::Code(200)]);
    s.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookmark_comes_just_before_the_watch_times_out() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("skewgate-standin-pretimeout-{}", std::process::id()));
    let pki = Pki::generate(&dir)?;
    let mut opts = options(&pki, "a", "1.36")?;
    // Upstream's minute: no periodic bookmark within this test.
    opts.bookmark_interval = Duration::from_secs(60);
    let s = standin::serve(opts, Store::new(100)).await?;
    let alice = client(&pki, Some(&pki.alice))?;
    let base = format!("https://127.0.0.1:{}/api/v1/namespaces/default/configmaps", s.addr.port());
    let list: Value = alice.get(&base).send().await?.json().await?;
    let at = list["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    let opened = tokio::time::Instant::now();
    let url = format!("{base}?watch=1&resourceVersion={at}&allowWatchBookmarks=true&timeoutSeconds=3");
    let mut events = Events::open(&alice, &url).await?;
    let bookmark = events.next_within(Duration::from_secs(10)).await.expect("a bookmark before the timeout");
    let bookmarked = opened.elapsed();
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], json!(at));
    assert!(events.next_within(Duration::from_secs(10)).await.is_none(), "the watch ends at its timeout");
    println!("bookmark {bookmarked:?} into a 3 s watch, end at {:?}", opened.elapsed());
    // Without allowWatchBookmarks: nothing, then the end.
    let url = format!("{base}?watch=1&resourceVersion={at}&timeoutSeconds=3");
    let mut events = Events::open(&alice, &url).await?;
    assert!(events.next_within(Duration::from_secs(10)).await.is_none());
    s.shutdown().await;
    Ok(())
}
