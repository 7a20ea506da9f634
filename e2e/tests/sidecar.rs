//! The discovery sidecar (`skewgate sync`, run in-process) against stand-in apiservers, and with
//! a real Envoy 1.40 in front of them. Loopback only; every wait is bounded.
//!
//! The Envoy test needs `make wasm` and `make setup` (Envoy in .venv): it fails, never skips.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use skewgate::envoy::{EnvoyAdmin, HttpAdmin};
use skewgate::fetch::ErrorKind;
use skewgate::sync::{self, Standing, SyncConfig, SyncReport};
use skewgate_core::table::RoutingTable;
use skewgate_harness::echo::{self, SERVED_BY};
use skewgate_harness::envoy::{Config, Envoy, Settings};
use skewgate_harness::limits::{DiscoveryServer, Shape, crd_groups};
use skewgate_harness::load::{Load, Record, Settings as LoadSettings, Target};
use skewgate_harness::paths;
use skewgate_pki::{APISERVER_NAME, FRONT_PROXY_CN, Pki};
use skewgate_standin::{self as standin, Auth, Options, Profile, Standin, Store};

const CLAIMS_V1: &str = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// A test's directory, certificates and stand-ins.
struct Cluster {
    dir: PathBuf,
    pki: Pki,
    store: Arc<Store>,
    standins: BTreeMap<String, Standin>,
}

/// Envoy and the sidecar in front of a [`Cluster`].
struct Edge {
    settings: Settings,
    admin_url: String,
    /// The report of the sync that wrote Envoy's first files.
    first: SyncReport,
    envoy: Envoy,
    running: sync::Running,
    /// A client with alice's certificate, and Envoy's URL.
    alice: reqwest::Client,
    base: String,
}

/// Four workers asking for resourceclaims (target 0) and pods at `base`, no pause.
fn claims_and_pods(alice: &reqwest::Client, base: &str) -> Load {
    let targets = vec![
        Target::list("resource.k8s.io", "v1", "resourceclaims", Some("default")),
        Target::list("", "v1", "pods", Some("default")),
    ];
    let settings = LoadSettings { workers: 4, pause: Duration::ZERO, timeout: Duration::from_secs(10) };
    Load::start(alice, base, targets, settings)
}

impl Cluster {
    async fn start(name: &str, apiservers: &[(&str, &str)]) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("skewgate-sidecar-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let pki = Pki::generate(&dir.join("pki"))?;
        let mut cluster = Self { dir, pki, store: Store::new(1000), standins: BTreeMap::new() };
        for (id, profile) in apiservers {
            cluster.start_standin(id, profile, "127.0.0.1:0".parse()?).await?;
        }
        Ok(cluster)
    }

    async fn start_standin(&mut self, id: &str, profile: &str, listen: SocketAddr) -> Result<SocketAddr> {
        let options = Options {
            id: id.to_owned(),
            profile: Profile::parse(profile)?,
            listen,
            serving: self.pki.apiserver.clone(),
            auth: Auth {
                requestheader_ca: self.pki.requestheader_ca.cert_path.clone(),
                requestheader_allowed_names: vec![FRONT_PROXY_CN.to_owned()],
                client_ca: self.pki.cluster_ca.cert_path.clone(),
                tokens: Vec::new(),
                anonymous: true,
            },
            bookmark_interval: Options::BOOKMARK_INTERVAL,
        };
        let standin = standin::serve(options, self.store.clone()).await?;
        let addr = standin.addr;
        self.standins.insert(id.to_owned(), standin);
        Ok(addr)
    }

    /// Stops `id` at once, the way a killed process stops: a graceful stop lets keep-alive
    /// connections answer a last probe, and the apiserver then counts (correctly) as back for a
    /// moment, which would make the exclusion counts below depend on timing.
    async fn kill_standin(&mut self, id: &str) -> Result<SocketAddr> {
        let standin = self.standins.remove(id).with_context(|| format!("no stand-in {id}"))?;
        let addr = standin.addr;
        standin.kill().await;
        Ok(addr)
    }

    async fn stop_standin(&mut self, id: &str) -> Result<SocketAddr> {
        let standin = self.standins.remove(id).with_context(|| format!("no stand-in {id}"))?;
        let addr = standin.addr;
        standin.shutdown().await;
        Ok(addr)
    }

    /// Stops `id` and starts it again on the same address with another profile.
    async fn restart_standin(&mut self, id: &str, profile: &str) -> Result<()> {
        let addr = self.stop_standin(id).await?;
        self.start_standin(id, profile, addr).await?;
        Ok(())
    }

    /// A skewgate Envoy in front of this cluster, its files under `dir/envoy`.
    fn envoy_settings(&self) -> Result<Settings> {
        Ok(Settings {
            route_timeout: "10s".into(),
            ..Settings::new(Config::Skewgate, self.dir.join("envoy"), &self.pki)?
        })
    }

    fn port(&self, id: &str) -> u16 {
        self.standins.get(id).map_or(0, |s| s.addr.port())
    }

    /// A real Envoy with the built filter in front of a, b and c, and the sidecar polling them
    /// every `poll_period`: the first table is written before Envoy starts (Envoy refuses to
    /// start without its files).
    async fn edge(&self, poll_period: &str) -> Result<Edge> {
        self.edge_with(poll_period, json!({})).await
    }

    /// [`Cluster::edge`] with more of the sidecar's configuration (`extra` wins).
    async fn edge_with(&self, poll_period: &str, extra: Value) -> Result<Edge> {
        let wasm = paths::filter_wasm()?;
        paths::envoy_binary()?;
        let settings = self.envoy_settings()?;
        let admin_url = format!("http://127.0.0.1:{}", settings.admin_port);
        let apiservers = [("a", self.port("a")), ("b", self.port("b")), ("c", self.port("c"))];
        // No hold: these tests count what each fault costs at once (the hold's own tests are
        // in envoy_filter.rs and clients.rs).
        let mut doc = json!({"pollPeriod": poll_period, "hold": {"maxWait": "0s"}, "envoy": {"adminUrl": admin_url, "wasm": wasm, "routeTimeout": settings.route_timeout}});
        for (key, value) in extra.as_object().into_iter().flatten() {
            doc[key] = value.clone();
        }
        let config = self.config(&apiservers, &settings.dir, doc)?;
        let first = sync::sync_once(config.clone()).await?;
        let read = |p: PathBuf| -> Result<Value> { Ok(serde_json::from_slice(&std::fs::read(p)?)?) };
        let envoy =
            Envoy::start(settings.clone(), &read(settings.cds_path())?, &read(settings.ecds_path())?).await?;
        let running = sync::spawn(config).await?;
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.pki.cluster_ca.cert_path)?)?;
        let alice = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .identity(reqwest::Identity::from_pem(&self.pki.alice.identity_pem()?)?)
            .timeout(Duration::from_secs(10))
            .build()?;
        let base = format!("https://127.0.0.1:{}", settings.listen_port);
        Ok(Edge { settings, admin_url, first, envoy, running, alice, base })
    }

    /// A sync config for `apiservers` (id, port), in that order, writing under `envoy_dir`.
    fn config(&self, apiservers: &[(&str, u16)], envoy_dir: &Path, extra: Value) -> Result<SyncConfig> {
        let wasm = match paths::filter_wasm() {
            Ok(path) => path,
            // Only the Envoy test loads the filter; elsewhere any file will do.
            Err(_) => {
                let path = self.dir.join("skewgate.wasm");
                std::fs::write(&path, b"\0asm")?;
                path
            }
        };
        let mut doc = json!({
            "apiservers": apiservers.iter().map(|(id, port)| json!({"id": id, "address": "127.0.0.1", "port": port})).collect::<Vec<_>>(),
            "serverName": APISERVER_NAME,
            "tls": {
                "peerCa": self.pki.peer_ca.cert_path,
                "clientCert": self.pki.front_proxy.cert,
                "clientKey": self.pki.front_proxy.key,
            },
            "envoy": {"dir": envoy_dir, "wasm": wasm, "settleDelay": "50ms", "confirmTimeout": "5s"},
            "pollPeriod": "200ms",
            "limits": {"requestTimeout": "700ms"},
            // A stopped stand-in refuses at once; the generous timeout is for a loaded machine,
            // where two 500 ms timeouts in a row on every host once left the pool with no
            // healthy host during `make test`.
            "health": {"interval": "250ms", "timeout": "2000ms", "connectTimeout": "1000ms"},
            "listen": "127.0.0.1:0",
        });
        for (key, value) in extra.as_object().into_iter().flatten() {
            match (doc.get_mut(key), value) {
                (Some(Value::Object(existing)), Value::Object(more)) => {
                    existing.extend(more.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                _ => doc[key] = value.clone(),
            }
        }
        Ok(SyncConfig::from_value(&doc, &self.dir)?)
    }
}

/// The table Envoy would read now.
fn table_on_disk(envoy_dir: &Path) -> Result<RoutingTable> {
    let bytes = std::fs::read(envoy_dir.join("ecds/ecds.json"))?;
    skewgate::explain::load_table(&bytes).map_err(anyhow::Error::msg)
}

/// Who serves a GVR in `table`; `None` when nobody does.
fn serving(table: &RoutingTable, group: &str, version: &str, resource: &str) -> Option<Vec<String>> {
    let gvr = table.gvr(group, version, resource)?;
    Some(table.members(gvr.serving).map(str::to_owned).collect())
}

fn claims(table: &RoutingTable) -> Option<Vec<String>> {
    serving(table, "resource.k8s.io", "v1", "resourceclaims")
}

fn ids(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|s| s.to_string()).collect())
}

fn cds_clusters(envoy_dir: &Path) -> Result<BTreeSet<String>> {
    let cds: Value = serde_json::from_slice(&std::fs::read(envoy_dir.join("cds/cds.json"))?)?;
    Ok(skewgate_envoy::cluster_names(Some(&cds)))
}

/// Polls `check` every 50 ms until it holds, or fails after `timeout`.
async fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics(running: &sync::Running) -> Result<String> {
    Ok(reqwest::get(format!("http://{}/metrics", running.listen)).await?.text().await?)
}

fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gvr_goes_to_the_apiservers_that_serve_it() -> Result<()> {
    let cluster = Cluster::start("routes", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let envoy_dir = cluster.dir.join("envoy");
    let apiservers = [("a", cluster.port("a")), ("b", cluster.port("b")), ("c", cluster.port("c"))];
    let report = sync::sync_once(cluster.config(&apiservers, &envoy_dir, json!({}))?).await?;
    assert!(report.changed);
    assert!(
        report.apiservers.iter().all(|a| a.standing == Standing::Current && a.error.is_none()),
        "{report:?}"
    );

    let table = table_on_disk(&envoy_dir)?;
    assert_eq!(claims(&table), ids(&["c"]));
    assert_eq!(serving(&table, "resource.k8s.io", "v1alpha3", "deviceclasses"), ids(&["a", "b"]));
    assert_eq!(serving(&table, "", "v1", "pods"), ids(&["a", "b", "c"]));
    let claims_gvr = table.gvr("resource.k8s.io", "v1", "resourceclaims").context("claims")?;
    assert_eq!(table.cluster(claims_gvr.serving), "skewgate-set-c");
    let versions: Vec<(&str, &str)> =
        table.apiservers().iter().map(|a| (a.id.as_str(), a.version.as_str())).collect();
    assert_eq!(versions, [("a", "v1.33.0"), ("b", "v1.33.0"), ("c", "v1.36.0")]);
    assert!(table.merged_discovery().is_some_and(|d| d.document.contains("\"resourceclaims\"")));
    assert_eq!(report.counts.gvrs, table.gvrs().len());
    assert!(report.counts.rerouted > 10, "{:?}", report.counts);

    // Envoy's clusters: one per serving set, with exactly its members' endpoints.
    let cds = skewgate_envoy::Files::new(&envoy_dir).read_clusters()?;
    let ports = |name: &str| -> Vec<u64> {
        cds["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == name)
            .flat_map(|c| {
                c["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().cloned().unwrap_or_default()
            })
            .filter_map(|e| e["endpoint"]["address"]["socket_address"]["port_value"].as_u64())
            .collect()
    };
    assert_eq!(ports("skewgate-set-c"), [u64::from(cluster.port("c"))]);
    assert_eq!(ports("skewgate-set-a_b"), [u64::from(cluster.port("a")), u64::from(cluster.port("b"))]);

    // The stand-ins saw the front-proxy identity kube-apiserver uses for peer discovery.
    let who = cluster.standins["a"].last_identity().context("no request reached a")?;
    assert_eq!(who.user, "system:apiserver");
    assert!(who.groups.contains(&"system:authenticated".to_string()), "{who:?}");
    assert_eq!(who.method, standin::AuthMethod::FrontProxy);

    // `skewgate table --config`: the same table, fetched live, nothing written.
    let (fetched, _) =
        sync::fetch_table(cluster.config(&apiservers, &cluster.dir.join("unused"), json!({}))?).await?;
    assert_eq!(fetched.generation, report.generation);
    assert!(!cluster.dir.join("unused").exists());

    // Same discovery again: nothing to write.
    let again = sync::sync_once(cluster.config(&apiservers, &envoy_dir, json!({}))?).await?;
    assert!(!again.changed);
    assert_eq!(again.generation, report.generation);
    Ok(())
}

/// Which apiservers `cds.json` marks DRAINING (Envoy sends them no new request), stopping ones
/// (where another apiserver takes their requests) included.
fn draining(envoy_dir: &Path) -> Result<BTreeSet<String>> {
    let overlay = skewgate_envoy::draining_in(&skewgate_envoy::Files::new(envoy_dir).read_clusters()?);
    Ok(overlay.draining.into_iter().chain(overlay.stopping).collect())
}

/// No timer turns "served, unavailable" into "not served" (a wrong 404 for a GVR its only apiserver
/// still serves once it is back): the only apiserver of
/// some GVRs stops, and long past what used to be the grace period (still in the file, now
/// ignored) its GVRs are in the table, routed to its set cluster, where it is DRAINING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_apiserver_stays_in_the_table_until_it_is_back() -> Result<()> {
    let mut cluster = Cluster::start("away", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let envoy_dir = cluster.dir.join("envoy");
    let apiservers = [("a", cluster.port("a")), ("b", cluster.port("b")), ("c", cluster.port("c"))];
    let config = cluster.config(
        &apiservers,
        &envoy_dir,
        json!({"gracePeriod": "1500ms", "pollPeriod": "200ms", "probePeriod": "100ms"}),
    )?;
    assert_eq!(config.deprecations.len(), 1, "gracePeriod is reported as ignored");
    let config_again = config.clone();
    let running = sync::spawn(config).await?;
    let ready = async {
        reqwest::get(format!("http://{}/readyz", running.listen)).await.map(|r| r.status().as_u16())
    };
    assert_eq!(ready.await?, 503, "ready before the first sync");
    let mut reports = running.reports.clone();
    tokio::time::timeout(Duration::from_secs(10), reports.wait_for(|r| r.is_some())).await??;
    assert_eq!(claims(&table_on_disk(&envoy_dir)?), ids(&["c"]));
    // Ready once the OpenAPI composer has had its first round too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reqwest::get(format!("http://{}/readyz", running.listen)).await?.status() != 200 {
        assert!(Instant::now() < deadline, "not ready 10 s after the first sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Ready means the edge has OpenAPI to answer with, not a 503 (the composer once failed to
    // bind its socket before Envoy's directory existed, and readiness never came).
    let text = metrics(&running).await?;
    assert_eq!(metric(&text, "skewgate_openapi_compositions_total"), Some(1.0), "{text}");
    assert!(metric(&text, "skewgate_openapi_documents").is_some_and(|n| n > 10.0), "{text}");
    assert!(envoy_dir.join(skewgate::openapi::SOCKET).exists());
    assert!(draining(&envoy_dir)?.is_empty());

    let stopped = Instant::now();
    cluster.kill_standin("c").await?;
    let out = wait_until("c marked DRAINING", Duration::from_secs(5), || {
        draining(&envoy_dir).ok().filter(|d| d.contains("c")).map(|_| stopped.elapsed())
    })
    .await?;
    // Fifteen more syncs (3 s at a 200 ms poll): twice the old grace period.
    for _ in 0..15 {
        reports.mark_unchanged();
        tokio::time::timeout(Duration::from_secs(5), reports.changed()).await??;
    }
    let away = stopped.elapsed();
    println!("c DRAINING {out:?} after it stopped; still in the table {away:?} after");
    let table = table_on_disk(&envoy_dir)?;
    assert_eq!(claims(&table), ids(&["c"]), "c's GVRs left the table {away:?} after it stopped");
    assert_eq!(serving(&table, "", "v1", "pods"), ids(&["a", "b", "c"]));
    assert!(cds_clusters(&envoy_dir)?.contains("skewgate-set-c"));
    assert_eq!(draining(&envoy_dir)?, BTreeSet::from(["c".to_string()]));
    let report = reports.borrow().clone().context("report")?;
    let c = report.apiservers.iter().find(|a| a.id == "c").context("c")?;
    assert!(matches!(c.standing, Standing::Stale { .. }), "{c:?}");
    assert_eq!(c.excluded, Some(skewgate::eligibility::Exclusion::Unreachable));
    let text = metrics(&running).await?;
    assert_eq!(metric(&text, "skewgate_apiserver_current{apiserver=\"c\"}"), Some(0.0), "{text}");
    assert_eq!(metric(&text, "skewgate_apiserver_eligible{apiserver=\"c\"}"), Some(0.0), "{text}");
    assert_eq!(metric(&text, "skewgate_apiserver_eligible{apiserver=\"a\"}"), Some(1.0), "{text}");
    assert_eq!(
        metric(&text, "skewgate_apiserver_exclusions_total{apiserver=\"c\",reason=\"unreachable\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("drops"), "{text}");
    assert!(
        metric(&text, "skewgate_sync_errors_total{apiserver=\"c\",kind=\"connect\"}")
            .is_some_and(|n| n >= 2.0),
        "{text}"
    );

    // A sidecar restarted meanwhile keeps c's GVRs too (the last good discovery is saved), and
    // keeps c out.
    running.stop().await?;
    let running = sync::spawn(config_again).await?;
    let mut reports = running.reports.clone();
    tokio::time::timeout(Duration::from_secs(10), reports.wait_for(|r| r.is_some())).await??;
    assert_eq!(claims(&table_on_disk(&envoy_dir)?), ids(&["c"]), "a restarted sidecar forgot c");
    assert_eq!(draining(&envoy_dir)?, BTreeSet::from(["c".to_string()]));

    let restarted = Instant::now();
    let addr: SocketAddr = format!("127.0.0.1:{}", apiservers[2].1).parse()?;
    cluster.start_standin("c", "1.36", addr).await?;
    let back = wait_until("c eligible again", Duration::from_secs(5), || {
        draining(&envoy_dir).ok().filter(|d| d.is_empty()).map(|_| restarted.elapsed())
    })
    .await?;
    println!("c eligible again {back:?} after it restarted (probe period 100 ms)");
    assert_eq!(claims(&table_on_disk(&envoy_dir)?), ids(&["c"]));
    let text = metrics(&running).await?;
    assert_eq!(metric(&text, "skewgate_apiserver_current{apiserver=\"c\"}"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "skewgate_apiserver_eligible{apiserver=\"c\"}"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "skewgate_apiserver_excluded_seconds_count"), Some(1.0), "{text}");
    assert!(cluster.dir.join("envoy/state/discovery.json").is_file());
    assert!(metric(&text, "skewgate_gvrs").is_some_and(|n| n > 80.0), "{text}");
    running.stop().await
}

/// Whether the routes Envoy reads now have bypass routes for while an apiserver is up.
fn routes_while_up(envoy_dir: &Path) -> Result<bool> {
    Ok(std::fs::read_to_string(envoy_dir.join("cds/rds.json"))?.contains("\"whileUp\""))
}

/// With the hold, reads of the API only c serves skip the filter while c is up (c's bypass
/// routes); the moment c stops, the sidecar takes those routes out, so that the reads that
/// follow meet the filter, which keeps them waiting until c is back; then they skip it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_servers_reads_skip_the_filter_while_it_is_up_and_wait_while_it_is_away() -> Result<()> {
    let mut cluster = Cluster::start("sole", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let hold = json!({"hold": {"maxWait": "5s"}, "probePeriod": "100ms"});
    let Edge { settings, admin_url, envoy, running, alice, base, .. } = cluster.edge_with("1s", hold).await?;
    let admin = HttpAdmin::new(&admin_url, Duration::from_secs(2))?;
    let claims_url = format!("{base}{CLAIMS_V1}");
    let get = || {
        let request = alice.get(&claims_url);
        async move {
            let resp = request.send().await?;
            let by = resp.headers().get(SERVED_BY).and_then(|v| v.to_str().ok()).map(str::to_owned);
            anyhow::Ok((resp.status().as_u16(), by))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while get().await.ok() != Some((200, Some("c".into()))) {
        ensure!(Instant::now() < deadline, "resourceclaims not routable through Envoy\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(routes_while_up(&settings.dir)?, "c's bypass routes are not rendered");
    let bypassed = "vhost.apiservers.route.rerouted_skewgate-set-c.upstream_rq_total";
    let reads = |n: usize| async move {
        for _ in 0..n {
            let answer = get().await?;
            ensure!(answer == (200, Some("c".into())), "{answer:?}");
        }
        anyhow::Ok(())
    };
    // Envoy counts a route's requests from its first on.
    let taken = || async { envoy.stat(bypassed).await.or_else(|_| anyhow::Ok(0)) };
    let before = taken().await?;
    reads(5).await?;
    let while_up = taken().await? - before;
    ensure!(while_up == 5, "{while_up} of 5 reads of c's API took c's bypass routes while c was up");

    let addr = cluster.kill_standin("c").await?;
    let stopped = Instant::now();
    let out = wait_until("c's routes out", Duration::from_secs(5), || {
        routes_while_up(&settings.dir).ok().filter(|up| !up).map(|_| stopped.elapsed())
    })
    .await?;
    // Envoy runs them (the version of routes with an apiserver's left out ends `+<ids>`).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !admin.live_routes().await?.is_some_and(|v| v.ends_with("+c")) {
        ensure!(Instant::now() < deadline, "Envoy does not run the routes without c's");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let live = stopped.elapsed();
    // An Envoy worker finds set-c down with its first request (a 503 with Retry-After) and
    // tells the others within 100 ms; from then on every worker holds the reads that follow.
    let first = get().await?;
    ensure!(first.0 == 503, "{first:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = taken().await?;
    let waiting = tokio::spawn(get());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ensure!(!waiting.is_finished(), "the read did not wait: {:?}", waiting.await?);
    let restarted = Instant::now();
    cluster.start_standin("c", "1.36", addr).await?;
    let answer = waiting.await??;
    ensure!(answer == (200, Some("c".into())), "{answer:?}");
    println!(
        "c's routes out {out:?} after it stopped (live in Envoy {live:?} after); a read waited and was \
         served {:?} after c restarted",
        restarted.elapsed()
    );
    ensure!(taken().await? == before, "a read took c's routes while c was away");
    let resumed =
        envoy.stat("wasmcustom.skewgate.held_requests_total.cluster=skewgate-set-c;outcome=resumed;").await?;
    ensure!(resumed >= 1, "{resumed} resumed");

    wait_until("c's routes back", Duration::from_secs(5), || {
        routes_while_up(&settings.dir).ok().filter(|up| *up)
    })
    .await?;
    let before = taken().await?;
    reads(5).await?;
    let back = taken().await? - before;
    ensure!(back == 5, "{back} of 5 reads took c's bypass routes once c was back");
    running.stop().await
}

/// An apiserver that comes back as another release is fetched as soon as a probe sees its new
/// discovery ETag, not at the next poll: with an hour-long poll period the table follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_apiserver_is_fetched_at_once_not_at_the_next_poll() -> Result<()> {
    let mut cluster = Cluster::start("probe", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let envoy_dir = cluster.dir.join("envoy");
    let apiservers = [("a", cluster.port("a")), ("b", cluster.port("b")), ("c", cluster.port("c"))];
    let config =
        cluster.config(&apiservers, &envoy_dir, json!({"pollPeriod": "1h", "probePeriod": "100ms"}))?;
    let running = sync::spawn(config).await?;
    let mut reports = running.reports.clone();
    tokio::time::timeout(Duration::from_secs(10), reports.wait_for(|r| r.is_some())).await??;
    assert_eq!(claims(&table_on_disk(&envoy_dir)?), ids(&["c"]));

    let restarted = Instant::now();
    cluster.restart_standin("b", "1.36").await?;
    let followed = wait_until("the table follows b", Duration::from_secs(5), || {
        table_on_disk(&envoy_dir).ok().filter(|t| claims(t) == ids(&["b", "c"])).map(|_| restarted.elapsed())
    })
    .await?;
    wait_until("b eligible", Duration::from_secs(5), || draining(&envoy_dir).ok().filter(|d| d.is_empty()))
        .await?;
    println!("b's new discovery live {followed:?} after its restart (poll 1 h, probe 100 ms)");
    let text = metrics(&running).await?;
    assert_eq!(metric(&text, "skewgate_apiserver_eligible{apiserver=\"b\"}"), Some(1.0), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("skewgate_apiserver_exclusions_total{apiserver=\"b\"")),
        "b was never taken out while it changed:\n{text}"
    );
    running.stop().await
}

/// What a misbehaving apiserver of the test's own does.
#[derive(Clone, Copy)]
enum Bad {
    /// `/api` fine, `/apis` garbage.
    Garbage,
    /// Accepts and never answers.
    Hang,
}

/// A TLS server with the stand-ins' certificate and client-certificate check, that misbehaves.
async fn bad_apiserver(pki: &Pki, bad: Bad) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let tls = echo::tls_config(&pki.apiserver, &pki.requestheader_ca.cert_path)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let core = Bytes::from(serde_json::to_vec(&Profile::parse("1.33")?.api)?);
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, core) = (acceptor.clone(), core.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let core = core.clone();
                    async move {
                        let body = match (bad, req.uri().path()) {
                            (Bad::Hang, _) => {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                                Bytes::new()
                            }
                            (Bad::Garbage, "/api") => core,
                            (Bad::Garbage, _) => Bytes::from_static(b"\x00\x01<html>not discovery{{{"),
                        };
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body)))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, task))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_or_a_hang_does_not_stop_the_others() -> Result<()> {
    let cluster = Cluster::start("bad", &[("a", "1.33"), ("c", "1.36")]).await?;
    let (garbage, _g) = bad_apiserver(&cluster.pki, Bad::Garbage).await?;
    let (hang, _h) = bad_apiserver(&cluster.pki, Bad::Hang).await?;
    let envoy_dir = cluster.dir.join("envoy");
    let apiservers = [
        ("a", cluster.port("a")),
        ("garbage", garbage.port()),
        ("hang", hang.port()),
        ("c", cluster.port("c")),
    ];
    let config = cluster.config(&apiservers, &envoy_dir, json!({"pollPeriod": "300ms"}))?;

    let started = Instant::now();
    let report = sync::sync_once(config.clone()).await?;
    let took = started.elapsed();
    // Behaviour is asserted below (the hang is a timeout, the others current); the time is reported.
    println!("one sync with a garbage and a hanging apiserver took {took:?}");
    let by_id: BTreeMap<&str, _> = report.apiservers.iter().map(|a| (a.id.as_str(), a)).collect();
    assert_eq!(by_id["a"].standing, Standing::Current);
    assert_eq!(by_id["c"].standing, Standing::Current);
    assert_eq!(
        by_id["garbage"].error.as_ref().map(|e| (e.kind, e.path.as_str())),
        Some((ErrorKind::NotJson, "/apis"))
    );
    assert_eq!(by_id["hang"].error.as_ref().map(|e| e.kind), Some(ErrorKind::Timeout));
    let table = table_on_disk(&envoy_dir)?;
    assert_eq!(claims(&table), ids(&["c"]));
    assert_eq!(serving(&table, "resource.k8s.io", "v1alpha3", "deviceclasses"), ids(&["a"]));
    assert_eq!(serving(&table, "", "v1", "pods"), ids(&["a", "c"]));
    assert_eq!(table.apiservers().len(), 4);

    // The loop keeps syncing around them, and counts what they do.
    let running = sync::spawn(config).await?;
    let mut reports = running.reports.clone();
    tokio::time::timeout(Duration::from_secs(10), reports.wait_for(|r| r.is_some())).await??;
    reports.mark_unchanged();
    tokio::time::timeout(Duration::from_secs(10), reports.changed()).await??;
    let text = metrics(&running).await?;
    assert!(
        metric(&text, "skewgate_sync_errors_total{apiserver=\"garbage\",kind=\"not_json\"}").is_some(),
        "{text}"
    );
    assert!(
        metric(&text, "skewgate_sync_errors_total{apiserver=\"hang\",kind=\"timeout\"}").is_some(),
        "{text}"
    );
    assert_eq!(metric(&text, "skewgate_sync_errors_total{apiserver=\"a\",kind=\"timeout\"}"), None, "{text}");
    assert!(
        metric(&text, "skewgate_rerouted_gvrs").is_some_and(|n| n == table.gvrs().len() as f64),
        "{text}"
    );
    running.stop().await
}

/// F4: an apiserver whose discovery grows past a `[limits]` bound keeps its last good documents
/// in the table and its requests (it still answers: not `DRAINING`), is reported and counted, and
/// none of the oversized document reaches the table; back under the limit, it is current again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_over_a_limit_keeps_its_last_good_discovery() -> Result<()> {
    let cluster = Cluster::start("limit", &[("a", "1.33")]).await?;
    let new = Profile::parse("1.36")?;
    let b = DiscoveryServer::start("b", &cluster.pki, &new.api, &new.apis).await?;
    let envoy_dir = cluster.dir.join("envoy");
    let groups = new.api.items.len() + new.apis.items.len();
    let extra = json!({"limits": {"maxGroups": groups + 5}});
    let config = cluster.config(&[("a", cluster.port("a")), ("b", b.addr.port())], &envoy_dir, extra)?;
    let running = sync::spawn(config).await?;
    let mut reports = running.reports.clone();
    let standing_of_b = |r: &Option<Arc<sync::SyncReport>>| {
        r.as_ref().and_then(|r| r.apiservers.iter().find(|a| a.id == "b").cloned())
    };
    let wait = Duration::from_secs(10);
    tokio::time::timeout(
        wait,
        reports.wait_for(|r| standing_of_b(r).is_some_and(|b| b.standing == Standing::Current)),
    )
    .await??;
    assert_eq!(claims(&table_on_disk(&envoy_dir)?), ids(&["b"]));

    let mut bigger = new.apis.clone();
    bigger.items.extend(crd_groups(
        0,
        10,
        "over.limit.example",
        Shape { versions: 1, resources: 1, full: true },
    ));
    b.set_apis(&bigger)?;
    let over = tokio::time::timeout(
        wait,
        reports.wait_for(|r| {
            standing_of_b(r).is_some_and(
                |b| matches!(b.standing, Standing::Stale { age } if age > Duration::from_secs(2)),
            )
        }),
    )
    .await??
    .clone();
    let b_report = standing_of_b(&over).context("b")?;
    let error = b_report.error.context("no error for b")?;
    assert_eq!(error.kind, ErrorKind::Limit, "{error}");
    assert!(error.to_string().contains(&format!("{} groups, over limits.maxGroups", groups + 10)), "{error}");
    // Seconds later, b's last good documents still route its GVRs, and nothing of the oversized
    // document is in the table.
    let table = table_on_disk(&envoy_dir)?;
    assert_eq!(claims(&table), ids(&["b"]));
    assert!(table.gvrs().iter().all(|g| !g.group.ends_with("over.limit.example")));
    let text = metrics(&running).await?;
    assert!(
        metric(&text, "skewgate_sync_errors_total{apiserver=\"b\",kind=\"limit\"}").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "skewgate_apiserver_current{apiserver=\"b\"}"), Some(0.0), "{text}");
    assert_eq!(metric(&text, "skewgate_apiserver_eligible{apiserver=\"b\"}"), Some(1.0), "{text}");

    b.set_apis(&new.apis)?;
    tokio::time::timeout(
        wait,
        reports.wait_for(|r| {
            standing_of_b(r).is_some_and(|b| b.standing == Standing::Current && b.error.is_none())
        }),
    )
    .await??;
    running.stop().await
}

/// Reads both watched files as fast as it can until stopped; every version must be complete.
struct Watcher {
    stop: Arc<AtomicBool>,
    task: std::thread::JoinHandle<(BTreeSet<u64>, BTreeSet<u64>, Vec<String>)>,
}

impl Watcher {
    fn start(envoy_dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (cds, ecds) = (envoy_dir.join("cds/cds.json"), envoy_dir.join("ecds/ecds.json"));
        let flag = stop.clone();
        let task = std::thread::spawn(move || {
            use std::hash::{Hash, Hasher};
            let hash = |b: &[u8]| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                b.hash(&mut h);
                h.finish()
            };
            let (mut cds_seen, mut ecds_seen, mut broken) = (BTreeSet::new(), BTreeSet::new(), Vec::new());
            while !flag.load(Ordering::SeqCst) {
                if let Ok(bytes) = std::fs::read(&cds) {
                    if cds_seen.insert(hash(&bytes)) {
                        match serde_json::from_slice::<Value>(&bytes) {
                            Ok(v) if v["resources"].as_array().is_some_and(|r| !r.is_empty()) => {}
                            _ => broken.push(format!("cds.json: {} bytes unusable", bytes.len())),
                        }
                    }
                }
                if let Ok(bytes) = std::fs::read(&ecds) {
                    if ecds_seen.insert(hash(&bytes)) {
                        if let Err(e) = skewgate::explain::load_table(&bytes) {
                            broken.push(format!("ecds.json: {} bytes: {e}", bytes.len()));
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            (cds_seen, ecds_seen, broken)
        });
        Self { stop, task }
    }

    fn finish(self) -> (BTreeSet<u64>, BTreeSet<u64>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.join().unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_never_reads_a_partial_file() -> Result<()> {
    let mut cluster = Cluster::start("atomic", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let envoy_dir = cluster.dir.join("envoy");
    std::fs::create_dir_all(envoy_dir.join("cds"))?;
    std::fs::create_dir_all(envoy_dir.join("ecds"))?;
    let apiservers = [("a", cluster.port("a")), ("b", cluster.port("b")), ("c", cluster.port("c"))];
    let watcher = Watcher::start(&envoy_dir);
    let running =
        sync::spawn(cluster.config(&apiservers, &envoy_dir, json!({"pollPeriod": "100ms"}))?).await?;
    let mut generations = Vec::new();
    // Pushes that wrote the union of old and new clusters, then the new ones alone.
    let mut unions = 0;
    let mut reports = running.reports.clone();
    for profile in ["", "1.36", "1.36:disable=resource.k8s.io/v1beta1", "1.30", "1.33"] {
        if !profile.is_empty() {
            cluster.restart_standin("b", profile).await?;
        }
        let previous = generations.last().cloned().unwrap_or_default();
        let report = tokio::time::timeout(
            Duration::from_secs(10),
            reports.wait_for(|r| r.as_ref().is_some_and(|r| r.generation != previous)),
        )
        .await??
        .clone()
        .context("report")?;
        generations.push(report.generation.clone());
        unions += usize::from(
            report.steps.iter().filter(|s| matches!(s, skewgate::envoy::Step::WroteCds(_))).count() >= 2,
        );
        assert_eq!(table_on_disk(&envoy_dir)?.generation(), report.generation);
    }
    running.stop().await?;
    let (cds_seen, ecds_seen, broken) = watcher.finish();
    println!(
        "watched {} cds.json and {} ecds.json versions over {} tables",
        cds_seen.len(),
        ecds_seen.len(),
        generations.len()
    );
    assert!(broken.is_empty(), "Envoy could have read: {broken:?}");
    let distinct: BTreeSet<&String> = generations.iter().collect();
    assert!(distinct.len() >= 4, "{generations:?}");
    assert!(ecds_seen.len() >= distinct.len(), "{} ECDS versions for {generations:?}", ecds_seen.len());
    // A mark of an apiserver no longer rewrites cds.json (its EDS files only): the versions seen
    // are the pushes' own, a union and a final one for each push that changed the clusters.
    assert!(unions > 0, "no push wrote a union of old and new clusters, then the new ones");
    assert!(cds_seen.len() > unions, "union and final CDS versions expected: {}", cds_seen.len());
    // cds.json and rds.json; ecds.json.
    for (sub, files) in [("cds", 2), ("ecds", 1)] {
        let names: Vec<String> = std::fs::read_dir(envoy_dir.join(sub))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        assert_eq!(names.len(), files, "left behind in {sub}/: {names:?}");
    }
    Ok(())
}

fn step_name(step: &skewgate::envoy::Step) -> String {
    use skewgate::envoy::Step;
    match step {
        Step::WroteCds(clusters) => format!("cds.json ({} clusters)", clusters.len()),
        Step::ClustersPresent => "clusters present".into(),
        Step::ClustersUnhealthy(c) => format!("unhealthy {c:?}"),
        Step::WroteRds(v) => format!("rds.json {v}"),
        Step::RoutesLive(_) => "routes live".into(),
        Step::WroteEcds(g) => format!("ecds.json {g}"),
        Step::WroteModuleEcds(g) => format!("module/ecds.json {g}"),
        Step::TableLive(_) => "table live".into(),
        Step::Settled => "settled".into(),
    }
}

/// Whether Envoy's active health checks see `port` as healthy in `cluster`.
async fn host_healthy(admin: &str, cluster: &str, port: u16) -> Result<bool> {
    let text = reqwest::get(format!("{admin}/clusters")).await?.text().await?;
    let prefix = format!("{cluster}::127.0.0.1:{port}::health_flags::");
    Ok(text.lines().any(|l| l.strip_prefix(&prefix) == Some("healthy")))
}

/// A rolling upgrade of one apiserver behind a real Envoy: it turns unready, stops, and comes
/// back as the 1.36 era. The new table must be live within two poll periods of the new
/// discovery, with not one failed request meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_change_goes_live_in_envoy_without_failed_requests() -> Result<()> {
    let mut cluster = Cluster::start("envoy", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let poll = Duration::from_secs(1);
    let Edge { settings, admin_url, first, envoy, running, alice, base } = cluster.edge("1s").await?;
    // Until the first health checks pass, the set clusters have no healthy host.
    let deadline = Instant::now() + Duration::from_secs(15);
    for path in [CLAIMS_V1, PODS] {
        loop {
            let status = alice.get(format!("{base}{path}")).send().await.map(|r| r.status().as_u16());
            if matches!(status, Ok(200)) {
                break;
            }
            if Instant::now() > deadline {
                bail!("{path} not routable through Envoy: {status:?}\n{}", envoy.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // resourceclaims (target 0) and pods; when each resourceclaims answer was asked for, and who
    // served it.
    let load = claims_and_pods(&alice, &base);
    let claim_answers = |records: &[Record]| -> Vec<(Duration, String)> {
        let ok = records.iter().filter(|r| r.target == 0 && r.ok());
        ok.map(|r| (r.started, r.served_by.clone().unwrap_or_default())).collect()
    };
    load.wait_for("20 resourceclaims answers", Duration::from_secs(10), |_, records| {
        claim_answers(records).len() >= 20
    })
    .await?;

    // b shuts down the way an apiserver does: /readyz fails first, Envoy stops sending to it.
    let port_b = cluster.port("b");
    cluster.standins.get("b").context("b")?.set_ready(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while host_healthy(&admin_url, "skewgate-pool", port_b).await? {
        if Instant::now() > deadline {
            bail!("Envoy still sends to b after it turned unready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop_standin("b").await?;
    // The scenario: b stays away a moment, as a restarting process does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.start_standin("b", "1.36", format!("127.0.0.1:{port_b}").parse()?).await?;
    let changed_at = load.now();

    let admin = HttpAdmin::new(&admin_url, Duration::from_secs(2))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let live_at = loop {
        let live = admin.live_table().await?.map(|t| t.generation);
        if live.as_deref().is_some_and(|g| g != first.generation) {
            break load.now();
        }
        if Instant::now() > deadline {
            bail!("the new table never went live (Envoy runs {live:?})\n{}", envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The next sync is a poll period away: the latest report is the one that pushed.
    let mut reports = running.reports.clone();
    let sync_report = tokio::time::timeout(
        Duration::from_secs(2),
        reports.wait_for(|r| r.as_ref().is_some_and(|r| r.generation != first.generation)),
    )
    .await??
    .clone()
    .context("no report")?;
    load.wait_for("20 resourceclaims answers from b", Duration::from_secs(10), |_, records| {
        claim_answers(records).iter().filter(|(at, by)| *at > changed_at && by == "b").count() >= 20
    })
    .await?;
    let report = load.finish().await;
    let ok = report.records.iter().filter(|r| r.ok()).count();
    let failed: Vec<String> = report.failures().iter().map(|r| r.describe(&report.targets)).collect();
    let claims_seen = claim_answers(&report.records);

    let took = live_at - changed_at;
    println!(
        "the sync that pushed it took {:?} (fetch, build, then {:?})",
        sync_report.took,
        sync_report.steps.iter().map(step_name).collect::<Vec<_>>()
    );
    let first_b =
        claims_seen.iter().find(|(at, by)| *at > changed_at && by == "b").map(|(at, _)| *at - changed_at);
    println!(
        "discovery change → new table live in Envoy: {took:?} (poll period {poll:?}); first resourceclaims \
         request served by b after {first_b:?}; {ok} requests ok, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "failed requests during the upgrade: {:?}", &failed[..failed.len().min(10)]);
    assert!(ok > 100, "too little load to mean anything: {ok}");
    assert!(first_b.is_some(), "b never served resourceclaims after it came back as 1.36");
    let before: BTreeSet<&str> =
        claims_seen.iter().filter(|(at, _)| *at < changed_at).map(|(_, by)| by.as_str()).collect();
    assert_eq!(before, BTreeSet::from(["c"]), "resourceclaims before b's upgrade");

    // The new sets replaced the old ones, on disk and in Envoy.
    let table = table_on_disk(&settings.dir)?;
    assert_eq!(claims(&table), ids(&["b", "c"]));
    let on_disk = cds_clusters(&settings.dir)?;
    let in_envoy = admin.clusters().await?;
    for name in ["skewgate-set-b_c", "skewgate-set-a"] {
        assert!(on_disk.contains(name) && in_envoy.contains_key(name), "{name} missing");
    }
    for name in ["skewgate-set-c", "skewgate-set-a_b"] {
        assert!(!on_disk.contains(name), "{name} still in cds.json");
    }
    assert_eq!(envoy.stat("extension_config_discovery.http_filter.skewgate.update_rejected").await?, 0);
    assert_eq!(envoy.stat("cluster_manager.cds.update_rejected").await?, 0);
    running.stop().await
}

/// Marking an apiserver `DRAINING` and back rebuilds no Envoy cluster: a rebuilt cluster's
/// apiservers count as down until their first health check, so when those checks are slow (busy
/// apiservers, here 1.5 s against a 1 s timeout, the product's) every request to the pool got
/// `no_healthy_upstream` until the next check, though a and c were up all along. The endpoints
/// live in EDS files of their own; a and c keep their health and take every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_an_apiserver_rebuilds_no_cluster() -> Result<()> {
    let cluster = Cluster::start("marks", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    // The product's health checks, not the quicker ones the other tests here use.
    let health = json!({"interval": "2s", "timeout": "1s", "connectTimeout": "1s"});
    let Edge { settings, admin_url, envoy, running, alice, base, .. } =
        cluster.edge_with("30s", json!({ "health": health })).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in ["a", "b", "c"] {
        while !host_healthy(&admin_url, "skewgate-pool", cluster.port(id)).await? {
            if Instant::now() > deadline {
                bail!("{id} never healthy in the pool\n{}", envoy.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let load = claims_and_pods(&alice, &base);
    load.wait_for("50 answers", Duration::from_secs(10), |_, records| records.len() >= 50).await?;
    let modified = envoy.stat("cluster_manager.cluster_modified").await?;

    let slow = |window_ms: u64| {
        for id in ["a", "c"] {
            if let Some(s) = cluster.standins.get(id) {
                s.slow_health_checks(Duration::from_millis(window_ms), Duration::from_millis(1500));
            }
        }
    };
    let b = cluster.standins.get("b").context("b")?;
    // Out: b turns unready, the sidecar marks it while a's and c's checks are slow.
    slow(1200);
    b.set_ready(false);
    wait_until("b DRAINING", Duration::from_secs(5), || {
        draining(&settings.dir).ok()?.contains("b").then_some(())
    })
    .await?;
    // Long enough for a check of each that passes: two slow ones in a row are an apiserver
    // down, rightly.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // And back, again while they are slow.
    slow(1200);
    b.set_ready(true);
    wait_until("b eligible", Duration::from_secs(5), || {
        draining(&settings.dir).ok()?.is_empty().then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.finish().await;

    let failed: Vec<String> = report.failures().iter().map(|r| r.describe(&report.targets)).collect();
    let rebuilt = envoy.stat("cluster_manager.cluster_modified").await? - modified;
    println!(
        "b marked DRAINING and back while a's and c's health checks took 1.5 s: {} requests, {} failed, \
         {rebuilt} clusters rebuilt",
        report.records.len(),
        failed.len()
    );
    assert_eq!(rebuilt, 0, "Envoy rebuilt clusters for a mark");
    assert!(failed.is_empty(), "{:?}", &failed[..failed.len().min(10)]);
    assert!(report.records.len() > 100, "too little load to mean anything");
    running.stop().await
}

/// Rewrites the table inside an `ecds.json`.
fn edit_table(ecds: &Value, edit: impl Fn(&mut Value)) -> Result<Value> {
    let mut ecds = ecds.clone();
    let pointer = "/resources/0/typed_config/config/configuration/value";
    let mut table: Value =
        serde_json::from_str(ecds.pointer(pointer).and_then(Value::as_str).context("table")?)?;
    edit(&mut table);
    table["generation"] = json!("hostile");
    *ecds.pointer_mut(pointer).context("table")? = Value::String(serde_json::to_string(&table)?);
    Ok(ecds)
}

const EARLIER_TABLE: &str = "ECDS of an earlier table of this sidecar's (resourceclaims to a set without c)";

/// Files that parse but are not the sidecar's, written into Envoy's directories under load: ECDS
/// naming an unknown pool, unknown set clusters, resourceclaims sent to a set without c, the same
/// unsealed; CDS without the table's apiserver and set clusters; the pool's endpoints (EDS) all on
/// port 1; RDS
/// sending c's bypass routes to a set without c, a catch-all route with the filter off, every
/// route to an unknown cluster. The filter refuses every ECDS one (no 404 at all, no failure);
/// the sidecar puts its own file back as soon as inotify reports the change (no poll in between:
/// `pollPeriod` is 30 s), so a CDS one costs 503s only until then and an RDS one, which Envoy
/// cannot refuse, routes only until then. Prints the window per fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_someone_else_writes_are_put_back_at_once() -> Result<()> {
    let cluster = Cluster::start("tamper", &[("a", "1.33"), ("b", "1.33"), ("c", "1.36")]).await?;
    let Edge { settings, envoy, running, alice, base, .. } = cluster.edge("30s").await?;
    let load = claims_and_pods(&alice, &base);
    let (cds_path, ecds_path) = (settings.cds_path(), settings.ecds_path());
    let since = |from: Duration| -> Vec<Record> {
        load.snapshot().into_iter().filter(|r| r.started >= from).collect()
    };
    // Healthy: 50 answers in a row, all 200, after `from`.
    let healthy_after = |from: Duration| {
        let all = since(from);
        all.len() >= 50 && all[all.len() - 50..].iter().all(|r| r.status == Some(200))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !healthy_after(Duration::ZERO) {
        if Instant::now() > deadline {
            bail!("not serving through Envoy\n{}", envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let rds_path = settings.files().rds_path();
    let rds: Value = serde_json::from_slice(&std::fs::read(&rds_path)?)?;
    let (good_cds, good_ecds) = (std::fs::read(&cds_path)?, std::fs::read(&ecds_path)?);
    let (cds, ecds): (Value, Value) =
        (serde_json::from_slice(&good_cds)?, serde_json::from_slice(&good_ecds)?);
    let table = table_on_disk(&settings.dir)?;
    let named: BTreeSet<String> = table
        .apiservers()
        .iter()
        .map(|a| a.cluster.clone())
        .chain(table.sets().iter().map(|s| s.cluster.clone()))
        .collect();
    let without_c = table
        .sets()
        .iter()
        .find(|s| !s.members.iter().any(|m| m == "c"))
        .map(|s| s.members.clone())
        .context("no set without c")?;
    let set_cluster = |members: &[&str]| {
        table.sets().iter().find(|s| s.members.iter().eq(members.iter())).map(|s| s.cluster.clone())
    };
    let only_c = set_cluster(&["c"]).context("no set of c alone")?;
    let without_c_cluster = set_cluster(&["a", "b"]).context("no set of a and b")?;

    let pool_eds = skewgate_envoy::eds::eds_path(&settings.files().eds_dir(), table.pool_cluster());
    let faults: Vec<(&str, &PathBuf, Value)> = vec![
        ("ECDS naming an unknown pool", &ecds_path, edit_table(&ecds, |t| t["poolCluster"] = json!("nope"))?),
        (
            "ECDS with unknown set clusters",
            &ecds_path,
            edit_table(&ecds, |t| {
                for (i, set) in t["sets"].as_array_mut().into_iter().flatten().enumerate() {
                    set["cluster"] = json!(format!("nope-{i}"));
                }
            })?,
        ),
        (
            "ECDS sending resourceclaims to a set without c",
            &ecds_path,
            edit_table(&ecds, |t| {
                for gv in t["groupVersions"].as_array_mut().into_iter().flatten() {
                    if gv["group"] == "resource.k8s.io" && gv["version"] == "v1" {
                        gv["servedBy"] = json!(without_c);
                        gv["resources"]["resourceclaims"] = json!(without_c);
                    }
                }
            })?,
        ),
        ("CDS without the table's apiserver and set clusters", &cds_path, {
            let mut bad = cds.clone();
            if let Some(list) = bad["resources"].as_array_mut() {
                list.retain(|c| !c["name"].as_str().is_some_and(|n| named.contains(n)));
            }
            bad
        }),
        ("the pool's endpoints (EDS), every one on port 1", &pool_eds, {
            let mut bad: Value = serde_json::from_slice(&std::fs::read(&pool_eds)?)?;
            fn ports(v: &mut Value) {
                match v {
                    Value::Object(map) => {
                        for (k, v) in map.iter_mut() {
                            if k == "port_value" {
                                *v = json!(1);
                            } else {
                                ports(v);
                            }
                        }
                    }
                    Value::Array(items) => items.iter_mut().for_each(ports),
                    _ => {}
                }
            }
            ports(&mut bad);
            bad
        }),
        // Without the seal: removing `clusters` used to remove the check too.
        (
            "ECDS unsealed (its clusters removed) sending resourceclaims to a set without c",
            &ecds_path,
            edit_table(&ecds, |t| {
                t.as_object_mut().map(|t| t.remove("clusters"));
                for gv in t["groupVersions"].as_array_mut().into_iter().flatten() {
                    if gv["group"] == "resource.k8s.io" && gv["version"] == "v1" {
                        gv["servedBy"] = json!(without_c);
                        gv["resources"]["resourceclaims"] = json!(without_c);
                    }
                }
            })?,
        ),
        (
            "ECDS unsealed (its clusters removed) naming an unknown pool",
            &ecds_path,
            edit_table(&ecds, |t| {
                t.as_object_mut().map(|t| t.remove("clusters"));
                t["poolCluster"] = json!("nope");
            })?,
        ),
        // What a copy of an earlier ecds.json of this sidecar's is: sealed with the clusters of
        // its cds.json, its hash intact (here: resourceclaims when c did not serve them yet).
        // Nothing in the file tells it from a new one: Envoy takes it, and it routes until the
        // sidecar puts its own back.
        (EARLIER_TABLE, &ecds_path, {
            let pointer = "/resources/0/typed_config/config/configuration/value";
            let mut t: Value =
                serde_json::from_str(ecds.pointer(pointer).and_then(Value::as_str).context("table")?)?;
            for gv in t["groupVersions"].as_array_mut().into_iter().flatten() {
                if gv["group"] == "resource.k8s.io" && gv["version"] == "v1" {
                    gv["servedBy"] = json!(without_c);
                    gv["resources"]["resourceclaims"] = json!(without_c);
                }
            }
            let mut t: skewgate_core::table::TableConfig = serde_json::from_value(t)?;
            let clusters = t.clusters.clone();
            skewgate_core::seal::seal(&mut t, clusters);
            let mut earlier = ecds.clone();
            *earlier.pointer_mut(pointer).context("table")? = Value::String(serde_json::to_string(&t)?);
            earlier
        }),
        ("RDS sending the bypass routes of c's set to a set without c", &rds_path, {
            let mut bad = rds.clone();
            let routes = bad["resources"][0]["virtual_hosts"][0]["routes"].as_array_mut();
            for route in routes.into_iter().flatten() {
                if route["route"]["cluster"] == only_c.as_str() {
                    route["route"]["cluster"] = json!(without_c_cluster);
                }
            }
            bad
        }),
        ("RDS with a catch-all route to the pool, the filter off", &rds_path, {
            let mut bad = rds.clone();
            let routes =
                bad["resources"][0]["virtual_hosts"][0]["routes"].as_array_mut().context("routes")?;
            let filter_off = routes
                .iter()
                .find_map(|r| r.get("typed_per_filter_config").cloned())
                .context("no bypass route")?;
            routes.insert(
                0,
                json!({"name": "hostile", "match": {"prefix": "/"},
                       "route": {"cluster": table.pool_cluster()}, "typed_per_filter_config": filter_off}),
            );
            bad
        }),
        ("RDS sending every request to an unknown cluster", &rds_path, {
            let mut bad = rds.clone();
            bad["version_info"] = json!("tampered");
            let routes = bad["resources"][0]["virtual_hosts"][0]["routes"].as_array_mut();
            for route in routes.into_iter().flatten() {
                route["route"] = json!({"cluster": "nope"});
            }
            bad
        }),
    ];
    let fault_count = faults.len();

    let mut report = Vec::new();
    // A push of the sidecar's own (an apiserver's eligibility moving meanwhile) may write over a
    // fault before the guard sees it: such faults are not the guard's to count.
    let mut pushes = running.reports.clone();
    let mut pushed_over = 0;
    for (name, path, bad) in faults {
        pushes.mark_unchanged();
        let bad = serde_json::to_vec(&bad)?;
        let written_at = load.now();
        skewgate_envoy::write_atomic(path, &bad)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        // Only the sidecar writes here besides the test (its eligibility overlay may change
        // meanwhile, so not necessarily the bytes of before).
        let restored_at = loop {
            if std::fs::read(path)? != bad {
                break load.now();
            }
            if Instant::now() > deadline {
                let text = metrics(&running).await?;
                let restores: Vec<&str> = text.lines().filter(|l| l.contains("restores")).collect();
                bail!("{name}: not put back ({restores:?})\n{}", envoy.log());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !healthy_after(restored_at) {
            if Instant::now() > deadline {
                bail!(
                    "{name}: Envoy does not serve again: {:?}\n{}",
                    since(restored_at).last().map(|r| r.describe(load.targets())),
                    envoy.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let during = since(written_at);
        let failed: Vec<&Record> = during.iter().filter(|r| r.status != Some(200)).collect();
        let count = |status: u16| failed.iter().filter(|r| r.status == Some(status)).count();
        let last_failure = failed.last().map(|r| r.started.saturating_sub(written_at));
        let shown = || failed.iter().map(|r| r.describe(load.targets())).collect::<Vec<_>>();
        if *path == rds_path || name == EARLIER_TABLE {
            // Envoy takes any route file that parses, and any table sealed as the sidecar seals
            // one: it routes until it is put back. Its harm is bounded by that window (a few ms
            // to tens of ms here; docs/deploy.md).
            let bound = restored_at + Duration::from_millis(500);
            let late: Vec<&&Record> = failed.iter().filter(|r| r.started > bound).collect();
            assert!(late.is_empty(), "{name}: failures 500 ms after it was put back: {late:?}");
        } else {
            assert_eq!(count(404), 0, "{name}: wrong 404s: {:?}", shown());
            assert_eq!(count(503), failed.len(), "{name}: {:?}", shown());
        }
        let by_push = pushes.has_changed().unwrap_or(false);
        pushed_over += usize::from(by_push);
        report.push(format!(
            "{name}: put back after {:.0} ms{}; {} × 503, {} × 404, {} × 401 of {} answers, last {:?} after the write",
            (restored_at - written_at).as_secs_f64() * 1000.0,
            if by_push { " (a push came meanwhile)" } else { "" },
            count(503),
            count(404),
            count(401),
            during.len(),
            last_failure.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0)),
        ));
    }
    let text = metrics(&running).await?;
    let restores = metric(&text, "skewgate_envoy_restores_total{kind=\"file\"}").unwrap_or(0.0);
    assert!(restores + pushed_over as f64 >= fault_count as f64, "{pushed_over} faults met a push\n{text}");
    println!("F3 windows:\n  {}", report.join("\n  "));
    load.finish().await;
    running.stop().await?;
    drop(envoy);
    Ok(())
}
