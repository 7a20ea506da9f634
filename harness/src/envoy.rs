//! A real Envoy process running skewgate's bootstrap from `envoy-config/`, with its CDS, RDS and
//! ECDS files in a private directory.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skewgate_envoy::{Files, UpstreamTls, write_atomic};

use crate::paths;
use crate::pki::{APISERVER_NAME, Pki};

/// Which shipped bootstrap to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Config {
    /// `envoy-config/bootstrap.yaml`: the skewgate filter, table from ECDS.
    Skewgate,
    /// `envoy-config/plain-lb.yaml`: no filter, every request to this pool cluster.
    PlainLb { pool_cluster: String },
    /// `plain-lb.yaml` with these routes ahead of the pool route: routing done the way a user
    /// would without skewgate, by generating Envoy routes (benchmarks compare against it).
    NativeRoutes { pool_cluster: String, routes: Vec<serde_json::Value> },
    /// `envoy-config/bootstrap-native.yaml`: `bootstrap.yaml` with the native dynamic module
    /// ahead of the proxy-wasm filter ([`crate::native`]); its ECDS file carries the same table.
    /// Without `wasm`, the module alone (measurements only).
    Native { module_ecds: Value, wasm: bool },
    /// A complete bootstrap of its own (e.g. the benchmarks' upstream responder).
    Custom(String),
}

/// What the bootstrap template needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    pub dir: PathBuf,
    pub listen_port: u16,
    pub admin_port: u16,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub client_ca: PathBuf,
    /// Route timeout for requests that are not long-running, e.g. "65s".
    pub route_timeout: String,
    pub concurrency: u32,
    /// A command Envoy runs under, its arguments before Envoy's (valgrind's, for the
    /// benchmarks' instruction counts); empty: Envoy itself.
    pub wrapper: Vec<String>,
    /// The overload manager's `max_active_downstream_connections`: [`connection_limit`] of
    /// the file limit Envoy inherits.
    pub max_connections: u64,
}

/// The most downstream connections an Envoy whose hard `RLIMIT_NOFILE` is `nofile` can take
/// and still serve them (bootstrap.yaml, `overload_manager`): Envoy raises its soft limit to
/// the hard one, keeps [`FD_RESERVE`] for listeners, files and its own, and a client connection
/// may take one upstream connection of its own (an upgraded exec or WebSocket). Never above the
/// shipped 50,000.
pub fn connection_limit(nofile: u64) -> u64 {
    (nofile.saturating_sub(FD_RESERVE) / 2).clamp(1, SHIPPED_MAX_CONNECTIONS)
}

/// Descriptors Envoy keeps apart from client connections and their upstream twins.
pub const FD_RESERVE: u64 = 1024;
/// `max_active_downstream_connections` in the shipped renderings (compose, kubeadm).
pub const SHIPPED_MAX_CONNECTIONS: u64 = 50_000;

/// `table` as JSON, sealed with the clusters it names ([`skewgate_core::seal::seal_as_named`]):
/// the filter and the native module take only sealed tables, and tests and benchmarks write
/// theirs without the sidecar.
pub fn sealed_json(table: &skewgate_core::table::TableConfig) -> Result<String> {
    let mut table = table.clone();
    skewgate_core::seal::seal_as_named(&mut table);
    Ok(serde_json::to_string(&table)?)
}

/// The filter's `ecds.json` for `table`, sealed with the clusters it names.
pub fn sealed_ecds(table: &skewgate_core::table::TableConfig, wasm: &Path) -> Result<Value> {
    Ok(skewgate_envoy::ecds(&sealed_json(table)?, wasm))
}

/// This process's hard `RLIMIT_NOFILE`, which an Envoy it starts inherits.
pub fn hard_nofile() -> Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").context("reading /proc/self/limits")?;
    let line = limits.lines().find(|l| l.starts_with("Max open files")).context("no open files limit")?;
    let hard = line.split_whitespace().nth(4).context("open files limit: no hard value")?;
    // "unlimited" cannot be set for RLIMIT_NOFILE; fs.nr_open caps it anyway.
    Ok(hard.parse().unwrap_or(u64::MAX))
}

impl Settings {
    /// An Envoy on free ports that serves `pki`'s listener certificate to clients of its cluster
    /// CA, its files under `dir`; callers change what they need with `..`.
    pub fn new(config: Config, dir: PathBuf, pki: &Pki) -> Result<Settings> {
        Ok(Settings {
            config,
            dir,
            listen_port: free_port()?,
            admin_port: free_port()?,
            serving_cert: pki.envoy_listener.cert.clone(),
            serving_key: pki.envoy_listener.key.clone(),
            client_ca: pki.cluster_ca.cert_path.clone(),
            route_timeout: skewgate_envoy::envoy_duration(skewgate_envoy::DEFAULT_ROUTE_TIMEOUT),
            concurrency: 2,
            wrapper: Vec::new(),
            max_connections: connection_limit(hard_nofile()?),
        })
    }

    pub fn files(&self) -> Files {
        Files::new(&self.dir)
    }

    pub fn cds_path(&self) -> PathBuf {
        self.files().cds_path()
    }

    pub fn ecds_path(&self) -> PathBuf {
        self.files().ecds_path()
    }

    /// The `rds.json` the sidecar would write for the table `ecds` carries, with this Envoy's
    /// route timeout (without a table that compiles, the routes without the bypass).
    pub fn rds_for(&self, ecds: &Value) -> Value {
        let table = skewgate_envoy::table_from_ecds(ecds)
            .and_then(|t| skewgate_core::table::RoutingTable::from_json(t.as_bytes()).ok());
        skewgate_envoy::rds(table.as_ref(), &self.route_timeout)
    }
}

/// How Envoy reaches apiservers of `pki`: as its front proxy, trusting its peer CA, checking
/// health as `system:apiserver`.
pub fn upstream_tls(pki: &Pki) -> UpstreamTls {
    UpstreamTls {
        peer_ca: pki.peer_ca.cert_path.display().to_string(),
        client_cert: pki.front_proxy.cert.display().to_string(),
        client_key: pki.front_proxy.key.display().to_string(),
        server_name: APISERVER_NAME.into(),
        health_user: "system:apiserver".into(),
        health_groups: vec!["system:authenticated".into()],
    }
}

/// A raw TLS connection to a listener on 127.0.0.1 (trusting `ca`, presenting `client` if
/// given), for requests that must reach Envoy byte for byte as written.
pub async fn connect_tls(
    ca: &Path,
    client: Option<&crate::pki::Pair>,
    port: u16,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in skewgate_pki::load_certs(ca)? {
        roots.add(cert)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match client {
        Some(pair) => builder.with_client_auth_cert(
            skewgate_pki::load_certs(&pair.cert)?,
            skewgate_pki::load_key(&pair.key)?,
        )?,
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    Ok(connector.connect(rustls::pki_types::ServerName::try_from("127.0.0.1")?, tcp).await?)
}

/// Ports handed out by `free_port` come from below the kernel's ephemeral range (32768–60999 on
/// Linux): a port the kernel picked for `bind(0)` is released when we return it, and until Envoy
/// binds it the kernel may give it to any outgoing connection (Envoy's own upstream connections
/// included) — CI saw "Address already in use" that way. A per-process counter keeps two tests in
/// one binary from getting the same port; the pid spreads test binaries apart.
const PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A port free right now on 127.0.0.1, never handed out before by this process.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = PORTS.end - PORTS.start;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(97) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let Ok(port) = u16::try_from(PORTS.start + offset) else { continue };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on 127.0.0.1 in {PORTS:?}")
}

/// Fills `{{NAME}}` placeholders; a placeholder left unfilled is an error.
pub fn render(template: &str, values: &BTreeMap<&str, String>) -> Result<String> {
    let mut out = template.to_string();
    for (name, value) in values {
        out = out.replace(&format!("{{{{{name}}}}}"), value);
    }
    if let Some(start) = out.find("{{") {
        let end = out[start..].find("}}").map_or(out.len(), |e| start + e + 2);
        bail!("bootstrap template: no value for {}", &out[start..end]);
    }
    Ok(out)
}

pub fn render_bootstrap(s: &Settings) -> Result<String> {
    let (file, pool) = match &s.config {
        Config::Skewgate => ("bootstrap.yaml", String::new()),
        Config::PlainLb { pool_cluster } => ("plain-lb.yaml", pool_cluster.clone()),
        Config::NativeRoutes { pool_cluster, routes } => {
            let plain = render_bootstrap(&Settings {
                config: Config::PlainLb { pool_cluster: pool_cluster.clone() },
                ..s.clone()
            })?;
            return insert_routes(&plain, routes);
        }
        Config::Custom(bootstrap) => return Ok(bootstrap.clone()),
        // The shipped variant (its rendering of bootstrap.yaml, kept equal by static_compose).
        Config::Native { wasm: true, .. } => ("bootstrap-native.yaml", String::new()),
        Config::Native { wasm: false, .. } => {
            let shipped = render_bootstrap(&Settings { config: Config::Skewgate, ..s.clone() })?;
            let shipped = with_static_routes(&shipped, &s.route_timeout)?;
            return crate::native::with_module(&shipped, &s.files().ecds_dir(), false);
        }
    };
    let template = std::fs::read_to_string(paths::envoy_config_dir().join(file))?;
    let p = |p: &Path| p.display().to_string();
    let values = BTreeMap::from([
        ("POOL_CLUSTER", pool),
        ("ADMIN_PORT", s.admin_port.to_string()),
        ("LISTEN_ADDRESS", "127.0.0.1".to_string()),
        ("LISTEN_PORT", s.listen_port.to_string()),
        ("CDS_DIR", p(&s.files().cds_dir())),
        ("ECDS_DIR", p(&s.files().ecds_dir())),
        ("SERVING_CERT", p(&s.serving_cert)),
        ("SERVING_KEY", p(&s.serving_key)),
        ("CLIENT_CA", p(&s.client_ca)),
        ("ROUTE_TIMEOUT", s.route_timeout.clone()),
        ("MAX_CONNECTIONS", s.max_connections.to_string()),
    ]);
    render(&template, &values)
}

/// `bootstrap` (bootstrap.yaml, rendered or not) with the routes the sidecar writes to
/// `rds.json` (without the bypass: they need a table) in place of its `rds`, as block YAML: for
/// the native module's variant, which keeps its routes static (bootstrap-native.yaml).
pub fn with_static_routes(bootstrap: &str, route_timeout: &str) -> Result<String> {
    const RDS: &str = "          rds:\n";
    let at = bootstrap.find(RDS).context("bootstrap.yaml has no rds")?;
    // The comment above `rds:` goes with it; the block ends where its indentation does.
    let start = bootstrap[..at].rfind("          # The routes come from the sidecar").unwrap_or(at);
    let body = &bootstrap[at + RDS.len()..];
    let len = body.lines().take_while(|l| l.starts_with("            ")).map(|l| l.len() + 1).sum::<usize>();
    let config = skewgate_envoy::route_configuration(None, route_timeout);
    let mut routes = String::from("          route_config:\n");
    yaml_block(&config, 12, &mut routes);
    Ok(format!("{}{routes}{}", &bootstrap[..start], &body[len..]))
}

/// `value` (a mapping) as block YAML at `indent`, `name` first in each mapping.
fn yaml_block(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let Some(map) = value.as_object() else { return };
    let keys = map.keys().filter(|k| *k == "name").chain(map.keys().filter(|k| *k != "name"));
    for (i, key) in keys.enumerate() {
        // The first key of a sequence item follows its dash.
        let lead = if i == 0 && out.ends_with("- ") { String::new() } else { pad.clone() };
        let key_text = match key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            true => key.clone(),
            false => Value::from(key.as_str()).to_string(),
        };
        match &map[key] {
            Value::Object(_) => {
                out.push_str(&format!("{lead}{key_text}:\n"));
                yaml_block(&map[key], indent + 2, out);
            }
            Value::Array(items) => {
                out.push_str(&format!("{lead}{key_text}:\n"));
                for item in items {
                    out.push_str(&format!("{pad}- "));
                    match item {
                        Value::Object(_) => yaml_block(item, indent + 2, out),
                        scalar => out.push_str(&format!("{}\n", yaml_scalar(scalar))),
                    }
                }
            }
            scalar => out.push_str(&format!("{lead}{key_text}: {}\n", yaml_scalar(scalar))),
        }
    }
}

/// A plain scalar where YAML reads it back as the same string (placeholders included, which
/// are filled in before YAML reads them), else JSON's quoting, which YAML reads alike.
fn yaml_scalar(value: &Value) -> String {
    match value.as_str() {
        Some(s) if s.starts_with("{{") && s.ends_with("}}") => s.to_owned(),
        Some(s)
            if s.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '/')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "/.,_-".contains(c))
                && !matches!(s, "true" | "false" | "null") =>
        {
            s.to_owned()
        }
        _ => value.to_string(),
    }
}

/// JSON is YAML: each route goes in as one flow-style line ahead of plain-lb.yaml's pool route.
fn insert_routes(plain: &str, routes: &[serde_json::Value]) -> Result<String> {
    const ROUTES: &str = "              routes:\n";
    let at = plain.find(ROUTES).context("plain-lb.yaml has no routes list")? + ROUTES.len();
    let lines: String = routes.iter().map(|r| format!("              - {r}\n")).collect();
    Ok(format!("{}{lines}{}", &plain[..at], &plain[at..]))
}

/// Runs `envoy --mode validate` on a bootstrap.
pub fn validate(bootstrap: &Path) -> Result<()> {
    let out = Command::new(paths::envoy_binary()?)
        .args(["--mode", "validate", "-c"])
        .arg(bootstrap)
        .output()
        .context("running envoy --mode validate")?;
    if !out.status.success() {
        bail!(
            "envoy --mode validate {} failed:\n{}{}",
            bootstrap.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A running Envoy; killed when dropped.
pub struct Envoy {
    pub settings: Settings,
    pub child: Child,
    log: PathBuf,
    http: reqwest::Client,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    /// Writes the bootstrap, `cds` and `ecds`, starts Envoy and waits until it is live.
    /// Its `rds.json` is the sidecar's for the table of `ecds`, with `settings.route_timeout`,
    /// under the overlay `cds` carries.
    pub async fn start(settings: Settings, cds: &Value, ecds: &Value) -> Result<Self> {
        let rds =
            skewgate_envoy::rds_with_overlay(&settings.rds_for(ecds), &skewgate_envoy::draining_in(cds));
        settings.files().write_first(cds, &rds, ecds)?;
        if let Config::Native { module_ecds, .. } = &settings.config {
            let path = settings.files().module_ecds_path();
            std::fs::create_dir_all(path.parent().context("module ECDS directory")?)?;
            write_atomic(&path, module_ecds.to_string().as_bytes())?;
        }
        Self::start_on_files(settings).await
    }

    /// Starts Envoy on the `cds.json` and `ecds.json` already in `settings.dir` (with the native
    /// module, its ECDS file too).
    pub async fn start_on_files(settings: Settings) -> Result<Self> {
        let bootstrap = settings.dir.join("bootstrap.yaml");
        std::fs::write(&bootstrap, render_bootstrap(&settings)?)?;
        let log = settings.dir.join("envoy.log");
        std::fs::File::create(&log)?;
        let append = || std::fs::OpenOptions::new().append(true).open(&log);
        let mut command = match settings.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(paths::envoy_binary()?);
                c
            }
            None => Command::new(paths::envoy_binary()?),
        };
        if matches!(settings.config, Config::Native { .. }) {
            command.env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", crate::native::module_dir()?);
        }
        let child = command
            .arg("-c")
            .arg(&bootstrap)
            .args(["--concurrency", &settings.concurrency.to_string()])
            .args(["--use-dynamic-base-id", "--log-level", "warn", "--component-log-level", "wasm:info"])
            .args(["--drain-time-s", "1"])
            // The access log (stdout) and Envoy's own log (stderr) in one file, in order.
            .stdout(append()?)
            .stderr(append()?)
            .spawn()
            .context("starting envoy")?;
        // Under valgrind Envoy starts tens of times slower.
        let startup = if settings.wrapper.is_empty() { 20 } else { 180 };
        let mut envoy = Self { settings, child, log, http: reqwest::Client::new() };
        envoy.wait_live(Duration::from_secs(startup)).await?;
        Ok(envoy)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.settings.admin_port)
    }

    async fn wait_live(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("envoy exited ({status}):\n{}", self.log());
            }
            if let Ok(r) = self.http.get(self.admin_url("/ready")).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("envoy not live after {timeout:?}:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Counters and gauges from the admin API, by full name.
    pub async fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let text = self.http.get(self.admin_url("/stats")).send().await?.text().await?;
        Ok(text
            .lines()
            .filter_map(|l| l.rsplit_once(": "))
            .filter_map(|(k, v)| v.trim().parse().ok().map(|v| (k.to_string(), v)))
            .collect())
    }

    /// A counter or gauge by its full name; a name Envoy does not have is an error, so that a
    /// check for 0 cannot pass on a misspelt or renamed stat.
    pub async fn stat(&self, name: &str) -> Result<u64> {
        let stats = self.stats().await?;
        if let Some(value) = stats.get(name) {
            return Ok(*value);
        }
        let last = name.rsplit('.').next().unwrap_or(name);
        let similar: Vec<&String> = stats.keys().filter(|k| k.contains(last)).take(10).collect();
        bail!("Envoy has no stat {name:?}; similar: {similar:?}")
    }

    /// Bytes Envoy's allocator has handed out, now (admin `/memory`; the `server.memory_*`
    /// stats are only as fresh as the last stats flush).
    pub async fn memory_allocated(&self) -> Result<u64> {
        let memory: Value = self.http.get(self.admin_url("/memory")).send().await?.json().await?;
        memory["allocated"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("admin /memory without allocated: {memory}"))
    }

    pub async fn prometheus(&self) -> Result<String> {
        Ok(self.http.get(self.admin_url("/stats/prometheus")).send().await?.text().await?)
    }

    /// Waits until `name` reaches at least `value`.
    pub async fn wait_stat(&self, name: &str, value: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.stat(name).await?;
            if now >= value {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{name} = {now}, wanted ≥ {value} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Writes `cds.json`; with the shipped bootstrap, the routes of the table on disk too, under
    /// the overlay `cds` carries, as the sidecar lays it: an apiserver's own routes
    /// ([`skewgate_envoy::rds_with_overlay`]) leave before it leaves the clusters, and come back
    /// after it is back. Returns whether the routes changed.
    pub fn write_cds(&self, cds: &Value) -> Result<bool> {
        let overlay = skewgate_envoy::draining_in(cds);
        let before =
            std::fs::read(self.settings.cds_path()).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let before = skewgate_envoy::draining_in(&before.unwrap_or_default());
        let leaving = !overlay.away().is_subset(&before.away());
        let ecds =
            std::fs::read(self.settings.ecds_path()).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let routes = |write: bool| match (&ecds, write) {
            (Some(ecds), true) => self.write_routes(ecds, &overlay),
            _ => Ok(false),
        };
        let mut changed = routes(leaving)?;
        write_atomic(&self.settings.cds_path(), cds.to_string().as_bytes())?;
        changed |= routes(!leaving)?;
        Ok(changed)
    }

    /// With the shipped bootstrap and a table that compiles in `ecds`, writes its routes under
    /// `overlay` if they changed (Envoy compiles every route's regex again on each rds.json it
    /// reads, ≈ 100 ms at 10,000 GVRs); returns whether it wrote them.
    fn write_routes(&self, ecds: &Value, overlay: &skewgate_envoy::Overlay) -> Result<bool> {
        let table = skewgate_envoy::table_from_ecds(ecds);
        let compiles =
            table.is_some_and(|t| skewgate_core::table::RoutingTable::from_sealed_json(t.as_bytes()).is_ok());
        if self.settings.config != Config::Skewgate || !compiles {
            return Ok(false);
        }
        let rds = skewgate_envoy::rds_with_overlay(&self.settings.rds_for(ecds), overlay).to_string();
        let path = self.settings.files().rds_path();
        if std::fs::read_to_string(&path).ok().as_deref() == Some(rds.as_str()) {
            return Ok(false);
        }
        write_atomic(&path, rds.as_bytes())?;
        Ok(true)
    }

    /// Writes the filter's ECDS file; with the native module, the module's too (same table, first).
    /// With the shipped bootstrap, first the routes of a table that compiles, under the overlay
    /// of the `cds.json` on disk, as the sidecar's push does.
    pub fn write_ecds(&self, ecds: &Value) -> Result<()> {
        let cds = std::fs::read(self.settings.cds_path()).ok().and_then(|b| serde_json::from_slice(&b).ok());
        self.write_routes(ecds, &skewgate_envoy::draining_in(&cds.unwrap_or_default()))?;
        if let Config::Native { .. } = self.settings.config {
            let table = skewgate_envoy::table_from_ecds(ecds);
            let module = skewgate_envoy::module_ecds(table.context("ECDS without a table")?);
            let path = self.settings.files().module_ecds_path();
            write_atomic(&path, module.to_string().as_bytes())?;
            return Ok(write_atomic(&self.settings.ecds_path(), ecds.to_string().as_bytes())?);
        }
        Ok(write_atomic(&self.settings.ecds_path(), ecds.to_string().as_bytes())?)
    }
}
