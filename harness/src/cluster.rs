//! The local skewed control plane: stand-in apiservers sharing one store, or real kube-apiservers
//! (binaries given by path, `crate::real`) sharing one etcd; Envoy with the skewgate filter in
//! front of them, every certificate, and a kubeconfig. What `make demo` runs and what the
//! end-to-end tests and the drill drive.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use skewgate_core::build::{ClusterNames, ServerApis, build_table};
use skewgate_core::table::{RoutingTable, TableConfig};
use skewgate_envoy::{self as resources, DEFAULT_ROUTE_TIMEOUT, Endpoint, Files, Health};

use crate::envoy::{Config, Envoy, Settings, free_port, upstream_tls};
use crate::paths;
use crate::pki::{APISERVER_NAME, FRONT_PROXY_CN, Pki};
use crate::real::{self, ControlPlane};
use crate::sidecar::{self, Sidecar};
use crate::standin::{self, Auth, Profile, Standin, Store, Token};

/// The bearer token of the `admin` user in `system:masters`, written into the kubeconfig.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// One apiserver to run: a stand-in, `ID=PROFILE[:disable=G/V,...]`, or a real kube-apiserver,
/// `ID=kube-apiserver[@MAJOR.MINOR][:--flag=value]...` ([`real::Spec`]).
#[derive(Debug, Clone)]
pub struct ApiserverSpec {
    pub id: String,
    /// The stand-in profile or the real kube-apiserver spec.
    pub profile: String,
}

impl std::str::FromStr for ApiserverSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let Some((id, profile)) = s.split_once('=') else {
            bail!(
                "--apiserver {s:?}: expected ID=PROFILE[:disable=GROUP/VERSION,...], e.g. b=1.36, or \
                 ID=kube-apiserver[@MAJOR.MINOR][:--flag=value]..., e.g. b=kube-apiserver@1.33"
            );
        };
        if !skewgate_core::build::is_valid_apiserver_id(id) {
            bail!(
                "--apiserver {s:?}: the id must be a DNS label (1-63 of [a-z0-9-], alphanumeric at both ends)"
            );
        }
        if real::Spec::is_real(profile) {
            real::Spec::parse(profile).with_context(|| format!("--apiserver {s:?}"))?;
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
    /// Stand-ins (by id) whose serving certificate comes from the rogue CA, which neither Envoy
    /// nor the sidecar trusts: they must never be used.
    pub rogue: BTreeSet<String>,
    /// The apiservers' `--anonymous-auth`.
    pub anonymous_auth: bool,
    /// Envoy as a plain load balancer (`envoy-config/plain-lb.yaml`: no skewgate filter, every
    /// request to the pool) over a static CDS built once from the stand-ins. Needs `sidecar: false`.
    pub plain_lb: bool,
    /// Real kube-apiserver and etcd binaries: every apiserver spec is then a real one
    /// (`kube-apiserver[@X.Y]...`), all sharing one etcd. Stand-ins and real apiservers do not
    /// mix: they would not share objects.
    pub real: Option<real::Binaries>,
    /// etcd's client port (real binaries; 0: any free port).
    pub etcd_port: u16,
    /// The sidecar takes its apiservers from the cluster (`[cluster] members = "endpointSlice"`,
    /// extensions listed, `leaveAfter = "0s"`): stand-ins publish themselves, and the configured
    /// apiservers are only the bootstrap.
    pub from_cluster: bool,
    /// With `from_cluster`: the identity Leases (`members = "leases"`) rather than the
    /// EndpointSlice.
    pub from_leases: bool,
    /// Real binaries: Kubernetes' own Mixed Version Proxy on every apiserver ([`crate::mvp`]).
    pub mvp: bool,
    /// The sidecar's `hold.maxWait`: how long a request waits in Envoy while every apiserver
    /// that serves it is away. `None`: the product's default.
    pub hold: Option<Duration>,
}

impl Options {
    /// `ID=PROFILE` stand-ins behind Envoy and the sidecar, every port picked by the system (so
    /// that clusters run side by side), a 1 s poll period: what tests start.
    pub fn ephemeral(out: &Path, apiservers: &[(&str, &str)]) -> Self {
        Self {
            apiservers: apiservers
                .iter()
                .map(|(id, profile)| ApiserverSpec { id: (*id).to_string(), profile: (*profile).to_string() })
                .collect(),
            out: out.to_path_buf(),
            envoy: true,
            envoy_port: 0,
            admin_port: 0,
            first_apiserver_port: 0,
            history: 10_000,
            sidecar: true,
            sidecar_port: 0,
            poll_period: Duration::from_secs(1),
            rogue: BTreeSet::new(),
            anonymous_auth: true,
            plain_lb: false,
            real: None,
            etcd_port: 0,
            from_cluster: false,
            from_leases: false,
            mvp: false,
            hold: None,
        }
    }
}

/// What `cluster` prints once everything is ready.
pub fn ready_line(c: &Cluster) -> Value {
    let apiservers: BTreeMap<String, String> =
        c.running().into_iter().map(|(id, addr)| (id, format!("https://{addr}"))).collect();
    let mut line = json!({
        "kubeconfig": c.kubeconfig.display().to_string(),
        "apiservers": apiservers,
    });
    if let Some(real) = &c.real {
        line["etcd"] = json!(real.etcd.url);
        line["specs"] = json!(real.specs());
        line["versions"] = json!(real.versions());
    }
    if let Some(envoy) = &c.envoy {
        line["envoy"] = json!(format!("https://127.0.0.1:{}", envoy.settings.listen_port));
        line["admin"] = json!(format!("http://127.0.0.1:{}", envoy.settings.admin_port));
    }
    if let Some(sidecar) = &c.sidecar {
        line["sidecar"] = json!(format!("http://{}", sidecar.listen));
        line["sidecarLog"] = json!(sidecar::log_path(&c.out));
    }
    line
}

pub struct Cluster {
    pub sidecar: Option<Sidecar>,
    pub pki: Pki,
    pub store: Arc<Store>,
    /// The running stand-ins, in `Options::apiservers` order (none with real binaries).
    pub standins: Vec<Standin>,
    /// etcd and the real kube-apiservers (`None` with stand-ins).
    pub real: Option<ControlPlane>,
    /// A real kube-controller-manager against the front door, when one was given.
    pub controller_manager: Option<real::ControllerManager>,
    pub envoy: Option<Envoy>,
    /// The table Envoy started with.
    pub table: TableConfig,
    pub kubeconfig: PathBuf,
    /// Certificates, Envoy's files, the kubeconfig, the sidecar's configuration.
    pub out: PathBuf,
    admin_token: String,
    /// How each stand-in was started (its port fixed after the first start), to start it again.
    templates: Vec<standin::Options>,
    /// The sidecar's configuration file and the address it answers on, to start it again.
    sidecar_config: Option<(PathBuf, SocketAddr)>,
    /// `plaintext_attempts` of every stand-in ever started here, stopped ones included.
    plaintext: Vec<Arc<AtomicU64>>,
    http: reqwest::Client,
    /// Stand-ins publish themselves (EndpointSlice, identity Lease) when they start.
    publish: bool,
}

/// Who a client of [`Cluster::client`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// alice's client certificate (`CN=alice, O=devs`), as the kubeconfig's default context.
    Alice,
    /// The admin bearer token (`admin`, `system:masters`), as the `skewgate-admin` context.
    AdminToken,
    /// Nothing at all.
    Anonymous,
}

impl Cluster {
    /// Stops the sidecar, then Envoy, then the stand-ins (closing their watches) or the real
    /// apiservers and etcd.
    pub async fn shutdown(mut self) -> Result<()> {
        drop(self.controller_manager.take());
        if let Some(sidecar) = self.sidecar.take() {
            sidecar.stop().await?;
        }
        drop(self.envoy.take());
        for standin in self.standins.drain(..) {
            standin.shutdown().await;
        }
        match self.real.take() {
            Some(real) => real.shutdown().await,
            None => Ok(()),
        }
    }

    /// The running apiservers (stand-ins or real) and their addresses, in configured order.
    pub fn running(&self) -> Vec<(String, SocketAddr)> {
        match &self.real {
            Some(real) => real.apiservers.iter().map(|a| (a.id.clone(), a.addr)).collect(),
            None => self.standins.iter().map(|s| (s.id.clone(), s.addr)).collect(),
        }
    }

    /// The apiserver (running or not) listening on `port`: Envoy's `/clusters` and access log
    /// name hosts by address.
    pub fn apiserver_at(&self, port: u16) -> Option<String> {
        match &self.real {
            Some(real) => real.addresses().iter().find(|(_, a)| a.port() == port).map(|(id, _)| id.clone()),
            None => self.templates.iter().find(|t| t.listen.port() == port).map(|t| t.id.clone()),
        }
    }

    pub fn envoy(&self) -> Result<&Envoy> {
        self.envoy.as_ref().context("this cluster runs without Envoy")
    }

    /// `https://127.0.0.1:<listener>`.
    pub fn envoy_url(&self) -> Result<String> {
        Ok(format!("https://127.0.0.1:{}", self.envoy()?.settings.listen_port))
    }

    pub fn standin(&self, id: &str) -> Result<&Standin> {
        self.standins.iter().find(|s| s.id == id).with_context(|| format!("stand-in {id} is not running"))
    }

    /// `https://127.0.0.1:<port>` of an apiserver, running or not.
    pub fn apiserver_url(&self, id: &str) -> Result<String> {
        Ok(format!("https://{}", self.listen(id)?))
    }

    /// Where an apiserver listens, running or not.
    pub fn listen(&self, id: &str) -> Result<SocketAddr> {
        match &self.real {
            Some(real) => real.addr(id).with_context(|| format!("no apiserver {id} in this cluster")),
            None => Ok(self.template(id)?.listen),
        }
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    fn template(&self, id: &str) -> Result<&standin::Options> {
        self.templates
            .iter()
            .find(|t| t.id == id)
            .with_context(|| format!("no apiserver {id} in this cluster"))
    }

    /// A client for Envoy's listener (trusting the cluster CA) with these credentials.
    pub fn client(&self, who: Credentials, timeout: Duration) -> Result<reqwest::Client> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.pki.cluster_ca.cert_path)?)?;
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .no_proxy()
            .timeout(timeout);
        match who {
            Credentials::Alice => {
                builder = builder.identity(reqwest::Identity::from_pem(&self.pki.alice.identity_pem()?)?);
            }
            Credentials::AdminToken => builder = builder.default_headers(self.bearer()?),
            Credentials::Anonymous => {}
        }
        Ok(builder.build()?)
    }

    /// A client straight to the stand-ins (trusting the peer CA), as the admin token.
    pub fn direct_client(&self, timeout: Duration) -> Result<reqwest::Client> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.pki.peer_ca.cert_path)?)?;
        Ok(reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .no_proxy()
            .timeout(timeout)
            .default_headers(self.bearer()?)
            .build()?)
    }

    fn bearer(&self) -> Result<reqwest::header::HeaderMap> {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", self.admin_token).parse()?);
        Ok(headers)
    }

    /// The routing table in `ecds.json` now (what Envoy runs, unless it refused the file).
    pub fn table_on_disk(&self) -> Result<RoutingTable> {
        let path = Files::new(self.envoy_dir()).ecds_path();
        let ecds: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        let table = resources::table_from_ecds(&ecds).context("ecds.json holds no table")?;
        RoutingTable::from_json(table.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Where Envoy's `cds/` and `ecds/` directories are.
    pub fn envoy_dir(&self) -> PathBuf {
        self.out.join("envoy")
    }

    /// Connections that reached any stand-in of this cluster (stopped ones included) without
    /// TLS.
    pub fn plaintext_attempts(&self) -> u64 {
        self.plaintext.iter().map(|p| p.load(Ordering::SeqCst)).sum()
    }

    /// Stops a stand-in the way `kube-apiserver` stops on SIGTERM without a shutdown delay:
    /// it stops accepting, finishes what is in flight, ends watches. A real one gets SIGTERM
    /// (unless drained already) and this returns once it has exited, after its
    /// `--shutdown-delay-duration`.
    /// The last step of a release upgrade, after every apiserver: the old release's
    /// kube-controller-manager stops (SIGTERM, as the kubelet stops a static pod) and the new
    /// one starts with the same flags. Returns whether there was one to upgrade.
    pub async fn upgrade_controller_manager(&mut self) -> Result<bool> {
        let Some(binaries) = self.real.as_ref().map(|r| r.binaries.clone()) else { return Ok(false) };
        let old = binaries.old.as_ref().and_then(|o| o.kube_controller_manager.as_ref());
        let (Some(_), Some(new)) = (old, binaries.kube_controller_manager.as_deref()) else {
            return Ok(false);
        };
        if let Some(mut running) = self.controller_manager.take() {
            running.stop(Duration::from_secs(30)).await?;
        }
        self.controller_manager = Some(start_controller_manager(Some(&binaries), new, &self.out, &self.pki)?);
        Ok(true)
    }

    pub async fn stop_apiserver(&mut self, id: &str) -> Result<()> {
        if let Some(real) = &mut self.real {
            return real.take(id)?.stop().await;
        }
        self.take_standin(id)?.shutdown().await;
        Ok(())
    }

    /// Kills an apiserver (a real one with SIGKILL): its connections close at once, requests
    /// in flight get no answer.
    pub async fn kill_apiserver(&mut self, id: &str) -> Result<()> {
        if let Some(real) = &mut self.real {
            return real.take(id)?.kill();
        }
        self.take_standin(id)?.kill().await;
        Ok(())
    }

    fn take_standin(&mut self, id: &str) -> Result<Standin> {
        let index = self
            .standins
            .iter()
            .position(|s| s.id == id)
            .with_context(|| format!("stand-in {id} is not running"))?;
        Ok(self.standins.remove(index))
    }

    /// Starts a stopped stand-in again on its port, sharing the store, with `profile` (e.g.
    /// the next era: an upgrade in place) and the serving certificate the peer CA signed.
    /// It is ready at once. A real apiserver is started with `profile` as its spec (e.g.
    /// `kube-apiserver` after `kube-apiserver@1.33`: an upgrade) and this returns once its
    /// `/readyz` is ok.
    pub async fn start_apiserver(&mut self, id: &str, profile: &str) -> Result<()> {
        if let Some(real) = &mut self.real {
            real.spawn(id, &real::Spec::parse(profile)?, 0)?;
            let readiness = real.wait_ready(id, Duration::from_secs(120)).await?;
            eprintln!("kube-apiserver {id} ({profile}) /readyz: {readiness}");
            return Ok(());
        }
        let serving = self.pki.apiserver.clone();
        self.start_with(id, profile, serving, None).await
    }

    /// Like [`Cluster::start_apiserver`], but the way kube-apiserver starts, ready `startup`
    /// from now ([`standin::Startup::like_kube_apiserver`]): connections refused at first, then
    /// 403 for all but `system:masters` (RBAC not synced), then discovery and everything else
    /// served while `/readyz` still fails (post-start hooks).
    /// A real apiserver is spawned and this returns at once: its own start-up is the real one,
    /// and `startup` does not apply.
    pub async fn boot_apiserver(&mut self, id: &str, profile: &str, startup: Duration) -> Result<()> {
        if let Some(real) = &mut self.real {
            return real.spawn(id, &real::Spec::parse(profile)?, 0);
        }
        let serving = self.pki.apiserver.clone();
        self.start_with(id, profile, serving, Some(startup)).await
    }

    /// Starts a stand-in that was not in the cluster's options, on a free port, like the others
    /// (sharing the store, trusted certificate); it publishes itself if the cluster does. The
    /// sidecar's configuration does not name it: only the cluster can tell the sidecar.
    pub async fn add_apiserver(&mut self, id: &str, profile: &str) -> Result<SocketAddr> {
        if self.templates.iter().any(|t| t.id == id) {
            bail!("apiserver {id} is already part of the cluster");
        }
        let mut template = self.templates.first().context("no stand-in to model the new one on")?.clone();
        template.id = id.to_string();
        template.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        self.templates.push(template);
        self.start_with(id, profile, self.pki.apiserver.clone(), None).await?;
        let addr = self.standin(id)?.addr;
        // A restart must come back on the same port.
        if let Some(t) = self.templates.iter_mut().find(|t| t.id == id) {
            t.listen = addr;
        }
        Ok(addr)
    }

    /// Like [`Cluster::start_apiserver`], but serving a certificate from the rogue CA.
    pub async fn start_rogue_apiserver(&mut self, id: &str, profile: &str) -> Result<()> {
        let serving = self.pki.rogue_apiserver.clone();
        self.start_with(id, profile, serving, None).await
    }

    async fn start_with(
        &mut self,
        id: &str,
        profile: &str,
        serving: crate::pki::Pair,
        startup: Option<Duration>,
    ) -> Result<()> {
        if self.real.is_some() {
            bail!("{id} is a real kube-apiserver: its certificate is the cluster's");
        }
        if self.standins.iter().any(|s| s.id == id) {
            bail!("stand-in {id} is already running");
        }
        let mut options = self.template(id)?.clone();
        options.profile = Profile::parse(profile).with_context(|| format!("apiserver {id}"))?;
        options.serving = serving;
        let standin = match startup {
            None => standin::serve(options, self.store.clone()).await?,
            Some(ready_after) => {
                let startup = standin::Startup::like_kube_apiserver(ready_after);
                standin::serve_booting(options, self.store.clone(), startup).await?
            }
        };
        if self.publish {
            standin.publish()?;
        }
        self.plaintext.push(standin.plaintext_attempts.clone());
        let order: Vec<&str> = self.templates.iter().map(|t| t.id.as_str()).collect();
        let rank = |id: &str| order.iter().position(|o| *o == id).unwrap_or(usize::MAX);
        let at = self.standins.iter().position(|s| rank(&s.id) > rank(id)).unwrap_or(self.standins.len());
        self.standins.insert(at, standin);
        Ok(())
    }

    /// Health of every host of every Envoy cluster: (cluster, port) → healthy.
    pub async fn envoy_hosts(&self) -> Result<BTreeMap<(String, u16), bool>> {
        let text = self.http.get(self.envoy()?.admin_url("/clusters")).send().await?.text().await?;
        Ok(parse_host_health(&text))
    }

    /// Whether Envoy sees `id` healthy: `Some(true)` when healthy in every cluster it is a host
    /// of, `Some(false)` when unhealthy in every one, `None` in between.
    pub async fn envoy_sees_healthy(&self, id: &str) -> Result<Option<bool>> {
        let port = self.listen(id)?.port();
        let flags: Vec<bool> =
            self.envoy_hosts().await?.into_iter().filter(|((_, p), _)| *p == port).map(|(_, h)| h).collect();
        Ok(if !flags.is_empty() && flags.iter().all(|h| *h) {
            Some(true)
        } else if flags.iter().all(|h| !*h) {
            Some(false)
        } else {
            None
        })
    }

    /// Polls until Envoy sees `id` as `healthy` everywhere; returns how long that took.
    pub async fn wait_envoy_sees(&self, id: &str, healthy: bool, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        loop {
            if self.envoy_sees_healthy(id).await? == Some(healthy) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!(
                    "Envoy does not see {id} as {} after {timeout:?}",
                    if healthy { "healthy" } else { "unhealthy" }
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What a real apiserver does before it stops (`--shutdown-delay-duration`): `/readyz`
    /// fails its `shutdown` check, and the load balancer stops sending it new requests: a
    /// plain one everywhere (its health checks fail), skewgate wherever another apiserver takes
    /// them (the last server of an API keeps that API's requests while it still serves).
    /// Returns once Envoy sends it none where another host could take them; the stand-in still
    /// serves. A real apiserver gets SIGTERM: it serves for its shutdown delay
    /// ([`real::SHUTDOWN_DELAY`]), then exits; [`Cluster::stop_apiserver`] waits for that.
    pub async fn drain_apiserver(&mut self, id: &str, timeout: Duration) -> Result<Duration> {
        match &mut self.real {
            Some(real) => real.apiserver_mut(id)?.terminate()?,
            None => self.standin(id)?.set_ready(false),
        }
        let started = Instant::now();
        let port = self.listen(id)?.port();
        loop {
            let hosts = self.envoy_hosts().await?;
            // A cluster where it is healthy and another host is too: it still gets new requests.
            let shared = hosts.iter().any(|((cluster, p), healthy)| {
                *p == port
                    && *healthy
                    && hosts.iter().any(|((other, q), up)| other == cluster && *q != port && *up)
            });
            if !shared {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!("Envoy still sends {id} new requests that others could take after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the sidecar (SIGTERM); Envoy keeps the files (and the table) it has.
    pub async fn stop_sidecar(&mut self) -> Result<()> {
        match self.sidecar.take() {
            Some(sidecar) => sidecar.stop().await,
            None => bail!("the sidecar is not running"),
        }
    }

    /// Kills the sidecar (SIGKILL): it dies wherever it is, mid-sync or not.
    pub fn kill_sidecar(&mut self) -> Result<()> {
        match self.sidecar.take() {
            Some(sidecar) => {
                sidecar.kill();
                Ok(())
            }
            None => bail!("the sidecar is not running"),
        }
    }

    /// Starts the sidecar again, on the address it had, and waits until it is ready.
    pub async fn start_sidecar(&mut self) -> Result<&Sidecar> {
        if self.sidecar.is_some() {
            bail!("the sidecar is already running");
        }
        let (config, listen) = self.sidecar_config.clone().context("this cluster runs without a sidecar")?;
        let running = Sidecar::start(&config, listen, &sidecar::log_path(&self.out), SIDECAR_READY).await?;
        Ok(self.sidecar.insert(running))
    }

    fn running_sidecar(&self) -> Result<&Sidecar> {
        self.sidecar.as_ref().context("the sidecar is not running")
    }

    /// The sidecar's Prometheus text.
    pub async fn sidecar_metrics(&self) -> Result<String> {
        self.running_sidecar()?.metrics().await
    }

    /// The sidecar's latest sync report (its `/status`), `None` before its first sync ended.
    pub async fn sidecar_status(&self) -> Result<Option<Value>> {
        self.running_sidecar()?.status().await
    }

    /// Polls the sidecar's `/status` until `check` finds what it wants in a report.
    pub async fn until_sidecar_reports<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Value) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(report) = self.sidecar_status().await? {
                if let Some(found) = check(&report) {
                    return Ok(found);
                }
                last = Some(report);
            }
            if Instant::now() > deadline {
                bail!("{what}: not within {timeout:?}; the sidecar's latest report: {last:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// How long a started sidecar has to pass `/readyz`.
const SIDECAR_READY: Duration = Duration::from_secs(30);

/// `cluster::port::health_flags::<flags>` lines of Envoy's `/clusters`.
fn parse_host_health(text: &str) -> BTreeMap<(String, u16), bool> {
    text.lines()
        .filter_map(|line| {
            let (cluster, rest) = line.split_once("::")?;
            let (address, rest) = rest.split_once("::")?;
            let flags = rest.strip_prefix("health_flags::")?;
            let port = address.rsplit_once(':')?.1.parse().ok()?;
            Some(((cluster.to_string(), port), flags == "healthy"))
        })
        .collect()
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
    if o.plain_lb && o.sidecar {
        bail!("a plain-LB Envoy runs without the sidecar");
    }
    if o.mvp && o.real.is_none() {
        bail!("the in-apiserver Mixed Version Proxy needs real kube-apiservers (--kube-apiserver, --etcd)");
    }
    let real_specs = o.apiservers.iter().filter(|a| real::Spec::is_real(&a.profile)).count();
    match (&o.real, real_specs) {
        (None, 0) => {}
        (Some(_), n) if n == o.apiservers.len() => {
            if !o.rogue.is_empty() {
                bail!("rogue apiservers are stand-ins only");
            }
        }
        (None, _) => bail!("ID=kube-apiserver… specs need the binaries: --kube-apiserver PATH --etcd PATH"),
        (Some(_), 0) => bail!(
            "--kube-apiserver/--etcd given, but every --apiserver is a stand-in profile: use \
             ID=kube-apiserver[@MAJOR.MINOR]"
        ),
        (Some(_), _) => bail!(
            "stand-ins and real kube-apiservers do not mix in one cluster: the stand-ins' store is not \
             etcd, so they would not share objects"
        ),
    }
    // Port 0 means "any free port" (tests run clusters side by side), and one below the kernel's
    // ephemeral range: an apiserver stopped and started again comes back on its port, which the
    // kernel may meanwhile have given an outgoing connection (seen: "already in use").
    let mut ports: Vec<(u16, String)> = Vec::new();
    for (i, a) in o.apiservers.iter().enumerate() {
        let port = match o.first_apiserver_port {
            0 => free_port()?,
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
    let mut templates = Vec::new();
    if let Some(unknown) = o.rogue.iter().find(|r| !o.apiservers.iter().any(|a| a.id == **r)) {
        bail!("rogue apiserver {unknown} is not one of the apiservers");
    }
    let control = match &o.real {
        Some(binaries) => Some(start_real(binaries, o, &ports, &out, &pki, &admin_token).await?),
        None => None,
    };
    for (spec, (port, _)) in o.apiservers.iter().zip(&ports).filter(|_| control.is_none()) {
        let profile = Profile::parse(&spec.profile).with_context(|| format!("apiserver {}", spec.id))?;
        profiles.push(profile.clone());
        let serving = match o.rogue.contains(&spec.id) {
            true => pki.rogue_apiserver.clone(),
            false => pki.apiserver.clone(),
        };
        let mut options = standin::Options {
            id: spec.id.clone(),
            profile,
            listen: SocketAddr::from(([127, 0, 0, 1], *port)),
            serving,
            auth: Auth {
                requestheader_ca: pki.requestheader_ca.cert_path.clone(),
                requestheader_allowed_names: vec![FRONT_PROXY_CN.to_string()],
                client_ca: pki.cluster_ca.cert_path.clone(),
                tokens: vec![Token {
                    token: admin_token.clone(),
                    user: "admin".into(),
                    groups: vec!["system:masters".into()],
                }],
                anonymous: o.anonymous_auth,
            },
            bookmark_interval: Duration::from_secs(15),
        };
        let standin = standin::serve(options.clone(), store.clone()).await?;
        if o.from_cluster {
            standin.publish()?;
        }
        // A restart must come back on the same port, whatever port 0 became.
        options.listen = standin.addr;
        options.serving = pki.apiserver.clone();
        templates.push(options);
        standins.push(standin);
    }
    let plaintext = standins.iter().map(|s| s.plaintext_attempts.clone()).collect();

    let running: Vec<(String, SocketAddr)> = match &control {
        Some(real) => real.addresses().to_vec(),
        None => standins.iter().map(|s| (s.id.clone(), s.addr)).collect(),
    };
    let endpoints: Vec<Endpoint> = running
        .iter()
        .map(|(id, addr)| Endpoint { id: id.clone(), address: addr.ip().to_string(), port: addr.port() })
        .collect();
    let envoy_dir = out.join("envoy");
    // A previous run's Envoy files (`make demo` twice) describe another cluster, on other ports;
    // a push over them would also wait for an Envoy that is not running yet.
    let files = Files::new(&envoy_dir);
    for dir in [files.cds_dir(), files.ecds_dir()] {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", dir.display()));
            }
            _ => {}
        }
    }
    // Real apiservers have no profile to build the table from: their discovery makes it, as
    // the sidecar's does (the plain LB takes that table's clusters and never changes them).
    let sidecar_config = if o.sidecar || control.is_some() {
        let path = out.join("sidecar.json");
        let port = if o.sidecar_port == 0 { free_port()? } else { o.sidecar_port };
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let doc = sidecar_config(&pki, &endpoints, &envoy_dir, admin_port, listen, o)?;
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        Some((path, listen))
    } else {
        None
    };
    // Envoy refuses to start without its files, so the first table is written before it starts.
    let table = match &sidecar_config {
        Some((config, _)) => {
            sidecar::sync_once(config, &out.join("sidecar-once.log"))?;
            let ecds: Value = serde_json::from_slice(&std::fs::read(Files::new(&envoy_dir).ecds_path())?)?;
            let table = resources::table_from_ecds(&ecds).context("the first sync wrote no table")?;
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
                    legacy: None,
                    features: None,
                })
                .collect();
            let mut table = build_table(&servers, &ClusterNames::default())?;
            let wasm = paths::filter_wasm()?;
            let rendered = resources::render(
                &mut table,
                &endpoints,
                &upstream_tls(&pki),
                health(),
                &wasm,
                DEFAULT_ROUTE_TIMEOUT,
                |_| {},
            )?;
            Files::new(&envoy_dir).write_first(&rendered.cds, &rendered.rds, &rendered.ecds)?;
            rendered.table
        }
    };
    if o.plain_lb {
        // A plain load balancer takes an apiserver out on any `/readyz` failure, its shutdown
        // included: it knows nothing of who else serves what.
        let cds_path = Files::new(&envoy_dir).cds_path();
        let cds = std::fs::read_to_string(&cds_path)?;
        let plain = cds.replace(&serde_json::to_string(resources::READINESS_PATH)?, "\"/readyz\"");
        resources::write_atomic(&cds_path, plain.as_bytes())?;
    }

    let envoy = if o.envoy {
        let config = match o.plain_lb {
            true => Config::PlainLb { pool_cluster: table.pool_cluster.clone() },
            false => Config::Skewgate,
        };
        let settings = Settings {
            listen_port: envoy_port,
            admin_port,
            ..Settings::new(config, envoy_dir.clone(), &pki)?
        };
        let envoy = Envoy::start_on_files(settings).await?;
        wait_healthy(&envoy, &table, &o.rogue, Duration::from_secs(20)).await?;
        Some(envoy)
    } else {
        None
    };
    let (sidecar, sidecar_config) = match sidecar_config.filter(|_| o.sidecar) {
        Some((config, listen)) => {
            let running = Sidecar::start(&config, listen, &sidecar::log_path(&out), SIDECAR_READY).await?;
            (Some(running), Some((config, listen)))
        }
        None => (None, None),
    };
    std::fs::write(out.join("table.json"), serde_json::to_string_pretty(&table)?)?;
    let kubeconfig = out.join("kubeconfig");
    let kubeconfig_text = kubeconfig_yaml(&pki, &admin_token, envoy.as_ref(), &running);
    std::fs::write(&kubeconfig, &kubeconfig_text)?;
    // Through the front door (Envoy: skewgate or the plain load balancer), as the admin.
    let controller_manager = match o.real.as_ref().and_then(|b| b.first_controller_manager()) {
        Some(binary) => {
            let admin = kubeconfig_text.replacen(
                "current-context: skewgate\n",
                "current-context: skewgate-admin\n",
                1,
            );
            std::fs::write(controller_manager_kubeconfig(&out), admin)?;
            Some(start_controller_manager(o.real.as_ref(), binary, &out, &pki)?)
        }
        None => None,
    };
    Ok(Cluster {
        controller_manager,
        sidecar,
        pki,
        store,
        standins,
        real: control,
        envoy,
        table,
        kubeconfig,
        out,
        admin_token,
        templates,
        sidecar_config,
        plaintext,
        http: reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build()?,
        publish: o.from_cluster && o.real.is_none(),
    })
}

/// etcd, then the first apiserver until its `/readyz` is ok, then the others at once, then the
/// demo users' RBAC. The first start on an empty etcd initialises cluster-wide state (the
/// service IP allocator): kube-apiservers started together on an empty etcd race for it and
/// the losers exit ("another caller has already initialized the resource"), so the first one
/// goes alone, as `kubeadm init` does before the other control-plane nodes join.
async fn start_real(
    binaries: &real::Binaries,
    o: &Options,
    ports: &[(u16, String)],
    out: &Path,
    pki: &Pki,
    admin_token: &str,
) -> Result<ControlPlane> {
    let mut control =
        ControlPlane::new(binaries, &out.join("real"), pki, admin_token, o.anonymous_auth, o.etcd_port)
            .await?;
    if o.mvp {
        control.enable_mvp(crate::mvp::Mvp::new(pki, crate::mvp::Namespaces::probe()?)?);
    }
    for (i, (spec, (port, _))) in o.apiservers.iter().zip(ports).enumerate() {
        control.spawn(&spec.id, &real::Spec::parse(&spec.profile)?, *port)?;
        if i == 0 {
            let readiness = control.wait_ready(&spec.id, Duration::from_secs(120)).await?;
            eprintln!("kube-apiserver {} ({}) /readyz: {readiness}", spec.id, spec.profile);
        }
    }
    for spec in o.apiservers.iter().skip(1) {
        let readiness = control.wait_ready(&spec.id, Duration::from_secs(120)).await?;
        eprintln!("kube-apiserver {} ({}) /readyz: {readiness}", spec.id, spec.profile);
    }
    control.bind_demo_users().await?;
    Ok(control)
}

fn controller_manager_kubeconfig(out: &Path) -> PathBuf {
    out.join("kube-controller-manager.kubeconfig")
}

/// A kube-controller-manager of `binary` through the front door, as the admin; its log goes on
/// after the one before it (an upgrade's old release).
fn start_controller_manager(
    real: Option<&real::Binaries>,
    binary: &Path,
    out: &Path,
    pki: &Pki,
) -> Result<real::ControllerManager> {
    let controllers = real.map_or(real::CONTROLLERS, |b| b.controllers.as_str());
    real::ControllerManager::start(binary, &controller_manager_kubeconfig(out), out, controllers, pki)
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
    listen: SocketAddr,
    o: &Options,
) -> Result<Value> {
    let h = health();
    let ms = |v: u64| format!("{v}ms");
    let mut doc = json!({
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
        "health": {"interval": ms(h.interval_ms), "timeout": ms(h.timeout_ms), "connectTimeout": ms(h.connect_timeout_ms)},
        "listen": listen.to_string(),
    });
    if let Some(wait) = o.hold {
        doc["hold"] = json!({"maxWait": ms(wait.as_millis() as u64)});
    }
    if o.from_cluster {
        let members = if o.from_leases { "leases" } else { "endpointSlice" };
        doc["cluster"] =
            json!({"members": members, "bootstrap": "pool", "leaveAfter": "0s", "extensions": true});
    }
    Ok(doc)
}

/// Until every host of every cluster passed its first health check (rogue ones never do).
async fn wait_healthy(
    envoy: &Envoy,
    table: &TableConfig,
    rogue: &BTreeSet<String>,
    timeout: Duration,
) -> Result<()> {
    let trusted = |id: &String| !rogue.contains(id);
    let apiservers = table.apiservers.iter().filter(|a| trusted(&a.id)).count();
    let members: usize = table.sets.iter().map(|s| s.members.iter().filter(|m| trusted(m)).count()).sum();
    let hosts = apiservers * 2 + members;
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
fn kubeconfig_yaml(
    pki: &Pki,
    token: &str,
    envoy: Option<&Envoy>,
    apiservers: &[(String, SocketAddr)],
) -> String {
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
    for (id, addr) in apiservers {
        clusters.push(format!(
            "- name: direct-{id}\n  cluster:\n    server: https://{addr}\n    certificate-authority: {ca}\n",
            ca = p(&pki.peer_ca.cert_path)
        ));
        contexts.push(format!("- name: direct-{id}\n  context: {{cluster: direct-{id}, user: admin}}\n"));
    }
    let current = match (envoy, apiservers.first()) {
        (None, Some((id, _))) => format!("direct-{id}"),
        _ => "skewgate".to_string(),
    };
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
