//! The local skewed control plane: stand-in apiservers sharing one store, Envoy with the skewgate
//! filter in front of them, every certificate, and a kubeconfig. What `make demo` runs and what
//! the end-to-end tests drive.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use skewgate::config::{Overrides, SyncConfig};
use skewgate::envoy::{self as resources, Endpoint, Health, UpstreamTls};
use skewgate::sync;
use skewgate_core::build::{ClusterNames, ServerApis, build_table};
use skewgate_core::table::TableConfig;

use crate::envoy::{Config, Envoy, Settings, free_port};
use crate::paths;
use crate::pki::{APISERVER_NAME, FRONT_PROXY_CN, Pki};
use crate::standin::{self, Auth, Profile, Standin, Store, Token};

/// The bearer token of the `admin` user in `system:masters`, written into the kubeconfig.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// One stand-in apiserver to run: `ID=PROFILE[:disable=G/V,...]`.
#[derive(Debug, Clone)]
pub struct ApiserverSpec {
    pub id: String,
    pub profile: String,
}

impl std::str::FromStr for ApiserverSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let Some((id, profile)) = s.split_once('=') else {
            bail!("--apiserver {s:?}: expected ID=PROFILE[:disable=GROUP/VERSION,...], e.g. b=1.36");
        };
        if !skewgate_core::build::is_valid_apiserver_id(id) {
            bail!(
                "--apiserver {s:?}: the id must be a DNS label (1-63 of [a-z0-9-], alphanumeric at both ends)"
            );
        }
        Ok(Self { id: id.to_string(), profile: profile.to_string() })
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub apiservers: Vec<ApiserverSpec>,
    pub out: PathBuf,
    pub envoy: bool,
    pub envoy_port: u16,
    pub admin_port: u16,
    /// The first stand-in listens here, the next one port up, and so on.
    pub first_apiserver_port: u16,
    pub history: usize,
    /// Run `skewgate sync` (in-process) to keep Envoy's table current; without it the table is
    /// built once from the stand-ins' profiles.
    pub sidecar: bool,
    /// The sidecar's /healthz, /readyz, /metrics.
    pub sidecar_port: u16,
    pub poll_period: Duration,
}

/// What `cluster` prints once everything is ready.
pub fn ready_line(c: &Cluster) -> Value {
    let apiservers: BTreeMap<&str, String> =
        c.standins.iter().map(|s| (s.id.as_str(), format!("https://{}", s.addr))).collect();
    let mut line = json!({
        "kubeconfig": c.kubeconfig.display().to_string(),
        "apiservers": apiservers,
    });
    if let Some(envoy) = &c.envoy {
        line["envoy"] = json!(format!("https://127.0.0.1:{}", envoy.settings.listen_port));
        line["admin"] = json!(format!("http://127.0.0.1:{}", envoy.settings.admin_port));
    }
    if let Some(sidecar) = &c.sidecar {
        line["sidecar"] = json!(format!("http://{}", sidecar.listen));
    }
    line
}

pub struct Cluster {
    pub sidecar: Option<sync::Running>,
    pub pki: Pki,
    pub store: Arc<Store>,
    pub standins: Vec<Standin>,
    pub envoy: Option<Envoy>,
    pub table: TableConfig,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Stops the sidecar, then Envoy, then the stand-ins (closing their watches).
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(sidecar) = self.sidecar.take() {
            sidecar.stop().await?;
        }
        drop(self.envoy.take());
        for standin in self.standins.drain(..) {
            standin.shutdown().await;
        }
        Ok(())
    }
}

/// Refuses busy ports up front, so a second cluster fails at once and names the port.
fn check_free(ports: &[(u16, &str)]) -> Result<()> {
    for (port, what) in ports {
        if TcpListener::bind(("127.0.0.1", *port)).is_err() {
            bail!("{what} port 127.0.0.1:{port} is already in use");
        }
    }
    Ok(())
}

pub async fn start(o: &Options) -> Result<Cluster> {
    if o.apiservers.is_empty() {
        bail!("at least one --apiserver is needed");
    }
    // Port 0 means "any free port" (tests run clusters side by side).
    let mut ports: Vec<(u16, String)> = Vec::new();
    for (i, a) in o.apiservers.iter().enumerate() {
        let port = match o.first_apiserver_port {
            0 => 0,
            first => first.checked_add(i as u16).context("apiserver port out of range")?,
        };
        ports.push((port, format!("apiserver {}", a.id)));
    }
    let envoy_port = if o.envoy_port == 0 { free_port()? } else { o.envoy_port };
    let admin_port = if o.admin_port == 0 { free_port()? } else { o.admin_port };
    let mut wanted: Vec<(u16, &str)> = ports.iter().map(|(p, w)| (*p, w.as_str())).collect();
    if o.envoy {
        wanted.extend([(envoy_port, "Envoy listener"), (admin_port, "Envoy admin")]);
    }
    if o.sidecar {
        wanted.push((o.sidecar_port, "sidecar"));
    }
    check_free(&wanted.into_iter().filter(|(p, _)| *p != 0).collect::<Vec<_>>())?;

    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let out = o.out.canonicalize()?;
    let pki = Pki::generate(&out.join("pki"))?;
    let admin_token = random_token();
    std::fs::write(out.join(ADMIN_TOKEN_FILE), &admin_token)?;
    let store = Store::new(o.history);
    let mut standins = Vec::new();
    let mut profiles = Vec::new();
    for (spec, (port, _)) in o.apiservers.iter().zip(&ports) {
        let profile = Profile::parse(&spec.profile).with_context(|| format!("apiserver {}", spec.id))?;
        profiles.push(profile.clone());
        let options = standin::Options {
            id: spec.id.clone(),
            profile,
            listen: SocketAddr::from(([127, 0, 0, 1], *port)),
            serving: pki.apiserver.clone(),
            auth: Auth {
                requestheader_ca: pki.requestheader_ca.cert_path.clone(),
                requestheader_allowed_names: vec![FRONT_PROXY_CN.to_string()],
                client_ca: pki.cluster_ca.cert_path.clone(),
                tokens: vec![Token {
                    token: admin_token.clone(),
                    user: "admin".into(),
                    groups: vec!["system:masters".into()],
                }],
            },
            bookmark_interval: Duration::from_secs(15),
        };
        standins.push(standin::serve(options, store.clone()).await?);
    }

    let endpoints: Vec<Endpoint> = standins
        .iter()
        .map(|s| Endpoint { id: s.id.clone(), address: s.addr.ip().to_string(), port: s.addr.port() })
        .collect();
    let envoy_dir = out.join("envoy");
    let sidecar_config = if o.sidecar {
        let path = out.join("sidecar.json");
        let doc = sidecar_config(&pki, &endpoints, &envoy_dir, admin_port, o)?;
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        Some(SyncConfig::load(&path, &Overrides::default()).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        None
    };
    // Envoy refuses to start without its files, so the first table is written before it starts.
    let table = match &sidecar_config {
        Some(config) => {
            sync::sync_once(config.clone()).await?;
            let ecds: Value = serde_json::from_slice(&std::fs::read(config.envoy.ecds_path())?)?;
            let table = resources::table_from_ecds(&ecds).context("the sidecar wrote no table")?;
            serde_json::from_str(table)?
        }
        None => {
            let servers: Vec<ServerApis<'_>> = o
                .apiservers
                .iter()
                .zip(&profiles)
                .map(|(spec, p)| ServerApis {
                    id: &spec.id,
                    version: &p.git_version,
                    documents: vec![&p.api, &p.apis],
                })
                .collect();
            let table = build_table(&servers, &ClusterNames::default())?;
            std::fs::create_dir_all(envoy_dir.join("cds"))?;
            std::fs::create_dir_all(envoy_dir.join("ecds"))?;
            let cds = resources::cds(&table, &endpoints, &upstream_tls(&pki), health())?;
            let ecds = resources::ecds(&serde_json::to_string(&table)?, &paths::filter_wasm()?);
            resources::write_atomic(&envoy_dir.join("cds/cds.json"), cds.to_string().as_bytes())?;
            resources::write_atomic(&envoy_dir.join("ecds/ecds.json"), ecds.to_string().as_bytes())?;
            table
        }
    };

    let envoy = if o.envoy {
        let read = |p: PathBuf| -> Result<Value> { Ok(serde_json::from_slice(&std::fs::read(p)?)?) };
        let settings = Settings {
            config: Config::Skewgate,
            dir: envoy_dir.clone(),
            listen_port: envoy_port,
            admin_port,
            serving_cert: pki.envoy_listener.cert.clone(),
            serving_key: pki.envoy_listener.key.clone(),
            client_ca: pki.cluster_ca.cert_path.clone(),
            route_timeout: "65s".into(),
            concurrency: 2,
        };
        let (cds, ecds) = (read(settings.cds_path())?, read(settings.ecds_path())?);
        let envoy = Envoy::start(settings, &cds, &ecds).await?;
        wait_healthy(&envoy, &table, Duration::from_secs(20)).await?;
        Some(envoy)
    } else {
        None
    };
    let sidecar = match sidecar_config {
        Some(config) => Some(sync::spawn(config).await?),
        None => None,
    };
    std::fs::write(out.join("table.json"), serde_json::to_string_pretty(&table)?)?;
    let kubeconfig = out.join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_yaml(&pki, &admin_token, envoy.as_ref(), &standins))?;
    Ok(Cluster { sidecar, pki, store, standins, envoy, table, kubeconfig })
}

fn upstream_tls(pki: &Pki) -> UpstreamTls {
    UpstreamTls {
        peer_ca: pki.peer_ca.cert_path.display().to_string(),
        client_cert: pki.front_proxy.cert.display().to_string(),
        client_key: pki.front_proxy.key.display().to_string(),
        server_name: APISERVER_NAME.into(),
    }
}

fn health() -> Health {
    Health { interval_ms: 1000, timeout_ms: 1000, connect_timeout_ms: 1000 }
}

/// The sidecar's configuration, written next to the kubeconfig: `skewgate sync --config` reads
/// the same file.
fn sidecar_config(
    pki: &Pki,
    endpoints: &[Endpoint],
    envoy_dir: &Path,
    admin_port: u16,
    o: &Options,
) -> Result<Value> {
    let h = health();
    let ms = |v: u64| format!("{v}ms");
    Ok(json!({
        "apiservers": endpoints.iter().map(|e| json!({"id": e.id, "address": e.address, "port": e.port})).collect::<Vec<_>>(),
        "serverName": APISERVER_NAME,
        "tls": {
            "peerCa": pki.peer_ca.cert_path,
            "clientCert": pki.front_proxy.cert,
            "clientKey": pki.front_proxy.key,
        },
        "envoy": {
            "dir": envoy_dir,
            "wasm": paths::filter_wasm()?,
            "adminUrl": format!("http://127.0.0.1:{admin_port}"),
        },
        "pollPeriod": ms(o.poll_period.as_millis() as u64),
        "gracePeriod": ms(o.poll_period.as_millis() as u64 * 5),
        "health": {"interval": ms(h.interval_ms), "timeout": ms(h.timeout_ms), "connectTimeout": ms(h.connect_timeout_ms)},
        "listen": format!("127.0.0.1:{}", o.sidecar_port),
    }))
}

/// Until every host of every cluster passed its first health check.
async fn wait_healthy(envoy: &Envoy, table: &TableConfig, timeout: Duration) -> Result<()> {
    let hosts = table.apiservers.len() * 2 + table.sets.iter().map(|s| s.members.len()).sum::<usize>();
    let deadline = Instant::now() + timeout;
    loop {
        let clusters = reqwest::get(envoy.admin_url("/clusters")).await?.text().await?;
        let healthy = clusters.lines().filter(|l| l.ends_with("::health_flags::healthy")).count();
        if healthy >= hosts {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {healthy} of {hosts} upstream hosts healthy after {timeout:?}:\n{}", envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut token = String::new();
    for _ in 0..4 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(Instant::now().elapsed().as_nanos());
        token.push_str(&format!("{:016x}", h.finish()));
    }
    token
}

/// Contexts: `skewgate` (alice's certificate, through Envoy; the default), `skewgate-admin` (the
/// admin token, through Envoy), and `direct-<id>` (admin token, straight to one stand-in).
fn kubeconfig_yaml(pki: &Pki, token: &str, envoy: Option<&Envoy>, standins: &[Standin]) -> String {
    let p = |path: &Path| path.display().to_string();
    let mut clusters = Vec::new();
    let mut contexts = Vec::new();
    if let Some(envoy) = envoy {
        clusters.push(format!(
            "- name: skewgate\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\n",
            envoy.settings.listen_port,
            p(&pki.cluster_ca.cert_path)
        ));
        contexts.push("- name: skewgate\n  context: {cluster: skewgate, user: alice}\n".to_string());
        contexts.push("- name: skewgate-admin\n  context: {cluster: skewgate, user: admin}\n".to_string());
    }
    for s in standins {
        clusters.push(format!(
            "- name: direct-{id}\n  cluster:\n    server: https://{addr}\n    certificate-authority: {ca}\n",
            id = s.id,
            addr = s.addr,
            ca = p(&pki.peer_ca.cert_path)
        ));
        contexts.push(format!(
            "- name: direct-{id}\n  context: {{cluster: direct-{id}, user: admin}}\n",
            id = s.id
        ));
    }
    let current = if envoy.is_some() { "skewgate".to_string() } else { format!("direct-{}", standins[0].id) };
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {current}\nclusters:\n{}contexts:\n{}users:\n\
         - name: alice\n  user:\n    client-certificate: {}\n    client-key: {}\n\
         - name: admin\n  user:\n    token: {token}\n",
        clusters.concat(),
        contexts.concat(),
        p(&pki.alice.cert),
        p(&pki.alice.key),
    )
}
