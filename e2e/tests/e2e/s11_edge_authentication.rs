//! Scenario 11: The edge against real apiservers' authentication, and adversarial clients.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use skewgate_harness::cluster::{Cluster, Credentials};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::envoy::{self};
use skewgate_harness::scenario::{Row, header, ids, scenario, until};

use crate::support::{ERAS, TIMEOUT, V2, finish, served, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_edge_authentication() -> Result<()> {
    scenario("11", "edge authentication and hardening", edge_authentication()).await
}

async fn edge_authentication() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s11", ERAS, |_| {}).await?;
    let base = c.envoy_url()?;
    let envoy = c.envoy()?;
    let claims = format!("{base}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims");

    // R1: the stand-ins answer the front-proxy certificate without X-Remote-User with 401 as
    // kube-apiserver does, so Envoy's health checks must carry the sidecar's identity: every
    // host of every cluster, twins without the certificate included, is healthy.
    let hosts = c.envoy_hosts().await?;
    ensure!(
        hosts.keys().any(|(cluster, _)| cluster.starts_with("skewgate-anonymous-")),
        "no twins: {hosts:?}"
    );
    ensure!(hosts.values().all(|healthy| *healthy), "unhealthy hosts: {hosts:?}");

    // R2: no credentials → the apiserver's own anonymous answers.
    let anonymous = c.client(Credentials::Anonymous, TIMEOUT)?;
    for (path, status) in [("/version", 200), ("/readyz", 200), ("/livez", 200), ("/api/v1/namespaces", 403)]
    {
        let r = anonymous.get(format!("{base}{path}")).send().await?;
        row.requests += 1;
        ensure!(r.status() == status, "{path}: {} (want {status})", r.status());
        ensure!(header(r.headers(), SERVED_BY).is_some(), "{path}: not answered by an apiserver");
    }

    // The merged /apis only after an apiserver authorized the request; its own
    // 403 (anonymous) or 401 (a token nobody issued) otherwise.
    let stranger = {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, "Bearer garbage".parse()?);
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(
                &c.pki.cluster_ca.cert_path,
            )?)?)
            .default_headers(headers)
            .no_proxy()
            .timeout(TIMEOUT)
            .build()?
    };
    let merged = c.table_on_disk()?.merged_discovery().context("no merged document")?.clone();
    for (who, client, status) in [("anonymous", &anonymous, 403), ("bad token", &stranger, 401)] {
        for inm in [None, Some(merged.quoted_etag.as_str())] {
            let mut req = client.get(format!("{base}/apis")).header("accept", V2);
            if let Some(etag) = inm {
                req = req.header("if-none-match", etag);
            }
            let r = req.send().await?;
            row.requests += 1;
            ensure!(r.status() == status, "{who} /apis (If-None-Match {inm:?}): {}", r.status());
            ensure!(header(r.headers(), SERVED_BY).is_some(), "{who}: not the apiserver's answer");
            ensure!(r.headers().get("etag").is_none_or(|e| e.as_bytes() != merged.quoted_etag.as_bytes()));
            let body = r.text().await?;
            ensure!(!body.contains("APIGroupDiscoveryList"), "{who} got discovery: {body:.200}");
        }
    }
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let r = alice.get(format!("{base}/apis")).header("accept", V2).send().await?;
    row.requests += 1;
    ensure!(r.status() == 200 && header(r.headers(), "etag").as_deref() == Some(merged.quoted_etag.as_str()));
    ensure!(r.text().await? == merged.document, "alice did not get the merged document");
    let r = alice
        .get(format!("{base}/apis"))
        .header("accept", V2)
        .header("if-none-match", &merged.quoted_etag)
        .send()
        .await?;
    row.requests += 1;
    ensure!(r.status() == 304, "alice with the merged ETag: {}", r.status());

    // F1: a certificate from the client CA whose O or CN a header would change is refused by
    // the filter, never forwarded as somebody else.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let whoami = format!("{base}/apis/authentication.k8s.io/v1/selfsubjectreviews");
    for (file, cn, orgs) in [
        ("mallory", "mallory", vec![" system:masters"]),
        ("padded-admin", "admin ", vec![]),
        ("tab", "eve", vec!["devs\t"]),
    ] {
        let pair = c.pki.cluster_ca.client(&c.pki.dir, file, cn, &orgs)?;
        let client = client_with(&c, &pair)?;
        let r = client.post(&whoami).json(&review).send().await?;
        row.requests += 1;
        ensure!(
            r.status() == 401 && header(r.headers(), SERVED_BY).is_none(),
            "{cn:?} {orgs:?}: {}",
            r.status()
        );
        let body: Value = r.json().await?;
        ensure!(body["reason"] == "Unauthorized", "{body}");
    }
    for id in ["a", "b", "c"] {
        let privileged = c.standin(id)?.identities().into_iter().find(|i| {
            i.user.trim() == "admin"
                || i.user == "mallory"
                || i.groups.iter().any(|g| g.trim() == "system:masters")
        });
        ensure!(privileged.is_none(), "{id} saw {privileged:?}");
    }

    // R6 + F6: the access log (on at run time through the runtime key) shows where a request
    // went; a client's own x-skewgate-route does not buy the route without timeout.
    let set = reqwest::Client::new()
        .post(envoy.admin_url("/runtime_modify?skewgate.access_log_min_status=0"))
        .send()
        .await?;
    ensure!(set.status().is_success(), "runtime_modify: {}", set.status());
    let r = alice.get(format!("{claims}?limit=11")).header("x-skewgate-route", "long-running").send().await?;
    row.requests += 1;
    ensure!(r.status() == 200, "{}", r.status());
    let line = until("the access log line", Duration::from_secs(10), || {
        Ok(envoy.log().lines().find(|l| l.contains("resourceclaims?limit=11")).map(str::to_string))
    })
    .await?;
    // The filter's read route, or (alice's connection mapped already) the set's bypass route:
    // both have the route timeout.
    let routes = ["route=read ", "route=bypass-certificate/skewgate-set-c "];
    ensure!(routes.iter().any(|r| line.contains(r)) && line.contains("cluster=skewgate-set-c"), "{line}");
    let r = alice.get(format!("{claims}?watch=true&timeoutSeconds=1&limit=12")).send().await?;
    row.requests += 1;
    ensure!(r.status() == 200, "{}", r.status());
    r.bytes().await?;
    let line = until("the watch's access log line", Duration::from_secs(10), || {
        Ok(envoy.log().lines().find(|l| l.contains("limit=12")).map(str::to_string))
    })
    .await?;
    // A serving set's watches always go through the filter.
    ensure!(line.contains("route=long-running "), "{line}");

    // F9: header names with underscores never reach an apiserver (HTTP/1 and HTTP/2 codecs
    // count them apart).
    let dropped = || async {
        let stats = envoy.stats().await?;
        anyhow::Ok(
            stats
                .iter()
                .filter(|(k, _)| k.ends_with(".dropped_headers_with_underscores"))
                .map(|(_, v)| v)
                .sum::<u64>(),
        )
    };
    let before = dropped().await?;
    let r = alice
        .get(&claims)
        .header("x_remote_user", "system:admin")
        .header("x_remote_group", "system:masters")
        .send()
        .await?;
    row.requests += 1;
    ensure!(r.status() == 200, "{}", r.status());
    let who = served(&c, r.headers())?.identity.context("alice not authenticated")?;
    ensure!(who.user == "alice" && who.groups == ids(&["devs", "system:authenticated"]), "{who:?}");
    let after = dropped().await?;
    ensure!(after > before, "dropped headers with underscores: {before} → {after}");

    // F10: a client that never finishes its request headers is cut off.
    let closed_in = slow_headers_closed(&c).await?;
    row.requests += 1;
    println!("slow-header connection closed by Envoy after {closed_in:?}");

    // R2 with anonymous access off at the apiservers: their 401, still not Envoy's.
    let off = start("s11-anonymous-off", ERAS, |o| o.anonymous_auth = false).await?;
    let anonymous = off.client(Credentials::Anonymous, TIMEOUT)?;
    for path in ["/version", "/readyz", "/api/v1/namespaces"] {
        let r = anonymous.get(format!("{}{path}", off.envoy_url()?)).send().await?;
        row.requests += 1;
        ensure!(r.status() == 401 && header(r.headers(), SERVED_BY).is_some(), "{path}: {}", r.status());
    }
    let alice_off = off.client(Credentials::Alice, TIMEOUT)?;
    let r = alice_off.get(format!("{}/version", off.envoy_url()?)).send().await?;
    row.requests += 1;
    ensure!(r.status() == 200, "alice with anonymous off: {}", r.status());
    finish(off, &mut Row::default()).await?;

    row.figure(format!(
        "health checks pass with the front-proxy identity; anonymous: /version 200, resources 403 \
         (401 with --anonymous-auth=false); 3 padded/control-character certificates → 401 from the \
         filter, none forwarded; client x-skewgate-route ignored; underscore headers dropped; \
         slow headers cut after {:.1}s",
        closed_in.as_secs_f64()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}

/// A client with its own certificate (from `pair`), trusting the cluster CA.
fn client_with(c: &Cluster, pair: &skewgate_pki::Pair) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&c.pki.cluster_ca.cert_path)?)?;
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&pair.identity_pem()?)?)
        .no_proxy()
        .timeout(TIMEOUT)
        .build()?)
}

/// Opens a TLS connection, sends half a request head and waits for Envoy to close it.
async fn slow_headers_closed(c: &Cluster) -> Result<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = c.envoy()?.settings.listen_port;
    let mut tls = envoy::connect_tls(&c.pki.cluster_ca.cert_path, None, port).await?;
    let started = Instant::now();
    tls.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n").await?;
    let mut rest = Vec::new();
    match tokio::time::timeout(Duration::from_secs(60), tls.read_to_end(&mut rest)).await {
        Ok(_) => Ok(started.elapsed()),
        Err(_) => bail!("the connection with unfinished headers is still open after 60s"),
    }
}
