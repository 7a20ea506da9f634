//! Scenario 9: Hostile input.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use skewgate_core::request_info::{RequestInfo, decode_path, split_target};
use skewgate_harness::cluster::{Cluster, Credentials};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::envoy::{self};
use skewgate_harness::scenario::{Row, cert_sha256, header, ids, scenario, vm_untroubled};

use crate::support::{CREDENTIAL_ID, ERAS, TIMEOUT, finish, start};

/// One raw HTTP/1.1 exchange over TLS with alice's certificate, so that the request reaches
/// Envoy byte for byte as written. (status, response headers, body)
async fn raw_request(c: &Cluster, request: &[u8]) -> Result<(u16, Vec<(String, String)>, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = c.envoy()?.settings.listen_port;
    let mut tls = envoy::connect_tls(&c.pki.cluster_ca.cert_path, Some(&c.pki.alice), port).await?;
    tls.write_all(request).await?;
    let mut response = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response)).await {
        Ok(_) => {}
        Err(_) => bail!("no answer within 10s"),
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s09_hostile_input() -> Result<()> {
    scenario("09", "hostile input", hostile_input()).await
}

async fn hostile_input() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s09", ERAS, |_| {}).await?;
    let table = c.table_on_disk()?;
    let claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
    let long_path = format!("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims", "n".repeat(16 * 1024));
    let many_params =
        format!("{claims}?{}", (0..1000).map(|i| format!("p{i}=v")).collect::<Vec<_>>().join("&"));
    let flood: String = (0..90).map(|i| format!("X-Remote-Extra-K{i}: v\r\n")).collect();
    let junk: String = (0..200).map(|i| format!("X-Junk-{i}: {}\r\n", "j".repeat(100))).collect();
    let plain: Vec<(String, String)> = vec![
        ("/apis/resource.k8s.io/v1/namespaces/../../../api/v1/pods".into(), String::new()),
        ("/apis/resource.k8s.io/v1/namespaces/x/../resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1alpha3/../v1/resourceclaims".into(), String::new()),
        ("/api/v1/../../apis/resource.k8s.io/v1/resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1/%2e%2e/v1alpha3/deviceclasses".into(), String::new()),
        ("/apis/resource.k8s.io%2Fv1/namespaces/default/resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1%2Fnamespaces%2Fdefault%2Fresourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1alpha3%2F..%2Fv1/resourceclaims".into(), String::new()),
        ("/apis//resource.k8s.io/v1/resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1//resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io//v1alpha3/deviceclasses".into(), String::new()),
        ("//apis/resource.k8s.io/v1/resourceclaims".into(), String::new()),
        ("/api/v1/namespaces/default/pods%zz".into(), String::new()),
        ("/apis/resource.k8s.io/v1/watch".into(), String::new()),
        // Watches (legacy and query forms): one second long.
        (
            "/apis/resource.k8s.io/v1/watch/namespaces/default/resourceclaims?timeoutSeconds=1".into(),
            String::new(),
        ),
        (long_path, String::new()),
        (many_params, String::new()),
        (claims.into(), format!("X-Remote-User: admin\r\n{flood}")),
        (claims.into(), junk),
        (
            "/apis/resource.k8s.io/v1/resourceclaims?watch=true&watch=false&fieldSelector=metadata.name%3D..\
             &timeoutSeconds=1"
                .into(),
            String::new(),
        ),
        ("/apis/resource.k8s.io/v1alpha3/deviceclasses?%ff%fe=%00".into(), String::new()),
    ];
    let mut requests: Vec<Vec<u8>> = plain
        .iter()
        .map(|(p, extra)| {
            format!("GET {p} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").into_bytes()
        })
        .collect();
    let close = b"Host: x\r\nConnection: close\r\n\r\n".as_slice();
    let invalid_utf8: [&[u8]; 3] = [
        b"GET /apis/resource.k8s.io/v1/\xff\xfe/resourceclaims HTTP/1.1\r\n",
        b"GET /apis/resource.k8s.io/v1alpha3/deviceclasses/\xc3\x28 HTTP/1.1\r\n",
        b"GET /api/v1/pods HTTP/1.1\r\nX-Remote-User: \xc3\x28\r\nX-Remote-Group: system:masters\r\n",
    ];
    requests.extend(invalid_utf8.iter().map(|head| [*head, close].concat()));

    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut reached = 0;
    for request in &requests {
        let shown: String = String::from_utf8_lossy(&request[..request.len().min(100)])
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let (status, headers, body) = raw_request(&c, request).await.with_context(|| shown.clone())?;
        row.requests += 1;
        *statuses.entry(status).or_default() += 1;
        println!("{status} ← {shown}");
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        // Envoy's or the filter's own 5xx would mean a crash or a broken route; an apiserver
        // may answer 500 itself (a legacy `watch` segment with nothing after it, upstream).
        ensure!(status != 0 && (status < 500 || get(SERVED_BY).is_some()), "{shown}: {status} {body}");
        // F8: `skewgate explain`, given the target as sent, predicts what Envoy does with it.
        let sent = std::str::from_utf8(request).ok().and_then(|r| r.split(' ').nth(1));
        let predicted = sent.map(|target| {
            let request = skewgate::explain::Request {
                method: "GET".into(),
                target: target.into(),
                client_cert_subject: Some("CN=alice,O=devs".into()),
                ..Default::default()
            };
            skewgate::explain::explain(&table, &request)
        });
        if let Some(p) = predicted.as_ref().filter(|p| p["by"] == "envoy") {
            ensure!(Some(u64::from(status)) == p["status"].as_u64(), "{shown}: {status}, explain: {p}");
        }
        let Some(by) = get(SERVED_BY) else { continue };
        reached += 1;
        let audit = get("audit-id").context("no Audit-Id")?;
        let seen =
            c.standin(&by)?.served(&audit).with_context(|| format!("{by} does not remember {audit}"))?;
        if let Some(p) = &predicted {
            let members: Vec<&str> =
                p["servingSet"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            ensure!(
                p["path"]["forwarded"] == seen.target.as_str()
                    && (members.is_empty() || members.contains(&by.as_str())),
                "{shown}: {by} got {:?}, explain: {p}",
                seen.target
            );
        }
        // Who should have got it: the GVR the apiserver reads out of the path it received.
        let (raw, query) = split_target(&seen.target);
        if let Ok(decoded) = decode_path(raw) {
            let info = RequestInfo::parse("GET", &decoded, query);
            if let Some(gvr) = table.gvr(info.api_group, info.api_version, info.resource) {
                let members: Vec<&str> = table.members(gvr.serving).collect();
                ensure!(
                    members.contains(&by.as_str()),
                    "{shown}: {by} got {:?}, served by {members:?}",
                    seen.target
                );
            }
        }
        if let Some(who) = &seen.identity {
            let credential_id = format!("X509SHA256={}", cert_sha256(&c.pki.alice.cert)?);
            ensure!(
                who.user == "alice"
                    && who.groups == ids(&["devs", "system:authenticated"])
                    && who.extra == BTreeMap::from([(CREDENTIAL_ID.to_string(), vec![credential_id])]),
                "{shown}: {who:?}"
            );
        }
    }
    vm_untroubled(c.envoy()?).await?;
    // Still routing normally afterwards.
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    for _ in 0..10 {
        let r = alice.get(format!("{}{claims}", c.envoy_url()?)).send().await?;
        row.requests += 1;
        assert_eq!((r.status().as_u16(), header(r.headers(), SERVED_BY).as_deref()), (200, Some("c")));
    }
    // Envoy 1.40 counts reloads by outcome; it has no plain `vm_reload`.
    let envoy = c.envoy()?;
    let reloads = envoy.stat("wasm.skewgate.vm_reload_success").await?
        + envoy.stat("wasm.skewgate.vm_reload_failure").await?;
    row.figure(format!(
        "{} hostile requests → statuses {statuses:?}, {reached} reached an apiserver, 0 misrouted, \
         VM reloads {reloads}",
        requests.len()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
