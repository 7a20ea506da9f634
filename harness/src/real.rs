//! Real kube-apiserver and etcd binaries, given by path (`--kube-apiserver PATH --etcd PATH`):
//! one etcd, and kube-apiservers sharing it (one `--etcd-prefix`, as an HA control plane does),
//! each started with the flags docs/deploy.md prescribes. What `skewgate-harness cluster`,
//! `make drill` and `make e2e` run when an operator rehearses an upgrade with their own
//! binaries. Nothing here builds or downloads them: the project takes them by path.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::envoy::free_port;
use crate::mvp::Mvp;
use crate::pki::{APISERVER_NAME, FRONT_PROXY_CN, Pki};
use crate::process::Process;

/// Real binaries: the old era is a 1.36 kube-apiserver emulating 1.33 with its beta APIs on (as
/// many 1.33 control planes run), the new one the binary's own version.
pub const REAL_OLD: &str = "kube-apiserver@1.33:--runtime-config=api/beta=true";
pub const REAL_NEW: &str = "kube-apiserver";

/// The word of an apiserver spec that names the `--kube-apiserver` binary:
/// `ID=kube-apiserver[@MAJOR.MINOR][:--flag=value]...`; an absolute path instead names another
/// binary (an operator's old and new releases side by side).
pub const KUBE_APISERVER: &str = "kube-apiserver";
/// Where `make drill` and `make e2e` pass the binaries' paths.
pub const KUBE_APISERVER_ENV: &str = "SKEWGATE_KUBE_APISERVER";
pub const ETCD_ENV: &str = "SKEWGATE_ETCD";
pub const KUBE_CONTROLLER_MANAGER_ENV: &str = "SKEWGATE_KUBE_CONTROLLER_MANAGER";
/// Where they pass the release being upgraded from: its kube-apiserver and, optionally, its
/// kube-controller-manager.
pub const OLD_KUBE_APISERVER_ENV: &str = "SKEWGATE_OLD_KUBE_APISERVER";
pub const OLD_KUBE_CONTROLLER_MANAGER_ENV: &str = "SKEWGATE_OLD_KUBE_CONTROLLER_MANAGER";
/// What the controller-manager runs: the controllers that act on what a wrong 404 tells them
/// (an owner gone, a resource type not served).
pub const CONTROLLERS: &str = "garbagecollector,namespace";

/// `--shutdown-delay-duration` of every real apiserver: after SIGTERM its `/readyz` fails at once
/// while it keeps serving this long, so that Envoy's health checks (1 s interval, 2 failures)
/// take it out before it closes its listener. An extra flag in the spec overrides it.
pub const SHUTDOWN_DELAY: Duration = Duration::from_secs(5);
/// The etcd key prefix every apiserver of the cluster shares.
pub const ETCD_PREFIX: &str = "/registry";
/// The ClusterRole (and ClusterRoleBinding) that gives group `devs` (alice) what the scenarios
/// do with the resources of the groups they use: read, write and delete them ([`DEVS_VERBS`]).
/// Not cluster-admin: no RBAC objects, no CRDs, and none of the verbs that reach beyond the
/// objects themselves (`impersonate` on the core group's users and groups would make alice
/// anyone, `system:masters` included; `escalate`, `bind`, `approve`, `sign`).
pub const DEVS_ROLE: &str = "skewgate-demo-devs";
/// What lets the sidecar's identity (the default, `system:apiserver`) read `/metrics`.
pub const SIDECAR_METRICS_ROLE: &str = "skewgate-sidecar-metrics";
const DEVS_VERBS: [&str; 8] =
    ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];
const DEVS_GROUPS: [&str; 9] = [
    "",
    "apps",
    "batch",
    "resource.k8s.io",
    "networking.k8s.io",
    "storage.k8s.io",
    "coordination.k8s.io",
    "admissionregistration.k8s.io",
    "storagemigration.k8s.io",
];

/// [`DEVS_ROLE`] itself.
pub fn devs_role() -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": DEVS_ROLE},
        "rules": [{"apiGroups": DEVS_GROUPS, "resources": ["*"], "verbs": DEVS_VERBS}],
    })
}

/// Flags the launcher owns: a spec that set them would take the apiserver away from the
/// cluster's etcd, port or version.
const RESERVED_FLAGS: [&str; 7] = [
    "--secure-port",
    "--bind-address",
    "--etcd-servers",
    "--etcd-prefix",
    "--emulated-version",
    "--tls-cert-file",
    "--tls-private-key-file",
];

/// The binaries, checked to exist: etcd, and the kube-apiserver that `kube-apiserver` specs
/// run (specs with a path run their own).
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: Option<PathBuf>,
    pub etcd: PathBuf,
    /// A kube-controller-manager to run against the cluster's front door, as a real control
    /// plane's runs against its load balancer ([`ControllerManager`]).
    pub kube_controller_manager: Option<PathBuf>,
    /// Its `--controllers` ([`CONTROLLERS`] unless given).
    pub controllers: String,
    /// The release upgraded from, when it is a real one rather than `kube-apiserver` emulating
    /// an older version: the cluster starts at it and is upgraded to the binaries above.
    pub old: Option<OldRelease>,
}

/// The binaries of the release an upgrade starts from.
#[derive(Debug, Clone)]
pub struct OldRelease {
    pub kube_apiserver: PathBuf,
    /// Runs until every apiserver is upgraded, then gives way to `kube_controller_manager`
    /// (the version skew policy's order); without it, the new one runs throughout.
    pub kube_controller_manager: Option<PathBuf>,
}

fn check_binary(path: &Path, what: &str) -> Result<PathBuf> {
    if !path.is_file() {
        bail!("{what} {}: no such file (give the path of your own binary)", path.display());
    }
    path.canonicalize().with_context(|| format!("resolving {}", path.display()))
}

/// The first line of `kube-apiserver --version`, e.g. `Kubernetes v1.36.2`.
pub fn version_of(kube_apiserver: &Path) -> Result<String> {
    let out = Command::new(kube_apiserver)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", kube_apiserver.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string())
}

/// Whether this kube-apiserver has `flag` (e.g. `--requestheader-uid-headers`, 1.32+).
fn has_flag(kube_apiserver: &Path, flag: &str) -> Result<bool> {
    let out = Command::new(kube_apiserver)
        .arg("--help")
        .output()
        .with_context(|| format!("running {} --help", kube_apiserver.display()))?;
    let text = [out.stdout, out.stderr].concat();
    Ok(String::from_utf8_lossy(&text).split_whitespace().any(|w| w == flag))
}

impl Binaries {
    pub fn new(kube_apiserver: Option<&Path>, etcd: &Path) -> Result<Self> {
        Ok(Self {
            kube_apiserver: kube_apiserver.map(|k| check_binary(k, "kube-apiserver")).transpose()?,
            etcd: check_binary(etcd, "etcd")?,
            kube_controller_manager: None,
            controllers: CONTROLLERS.to_owned(),
            old: None,
        })
    }

    /// Upgrading from this release's binaries rather than from an emulated version.
    pub fn with_old_release(
        self,
        kube_apiserver: Option<&Path>,
        controller_manager: Option<&Path>,
    ) -> Result<Self> {
        let old = match (kube_apiserver, controller_manager) {
            (None, None) => None,
            (None, Some(_)) => bail!("an old kube-controller-manager needs the old kube-apiserver too"),
            (Some(k), cm) => {
                if self.kube_apiserver.is_none() {
                    bail!("an old kube-apiserver needs the new one to upgrade to");
                }
                if cm.is_some() && self.kube_controller_manager.is_none() {
                    bail!("an old kube-controller-manager needs the new one to upgrade to");
                }
                Some(OldRelease {
                    kube_apiserver: check_binary(k, "old kube-apiserver")?,
                    kube_controller_manager: cm
                        .map(|p| check_binary(p, "old kube-controller-manager"))
                        .transpose()?,
                })
            }
        };
        Ok(Self { old, ..self })
    }

    /// The kube-controller-manager the cluster starts with: the old release's, if given.
    pub fn first_controller_manager(&self) -> Option<&Path> {
        self.old
            .as_ref()
            .and_then(|o| o.kube_controller_manager.as_deref())
            .or(self.kube_controller_manager.as_deref())
    }

    /// With a kube-controller-manager binary to run.
    pub fn with_controller_manager(self, path: Option<&Path>) -> Result<Self> {
        let kube_controller_manager = path.map(|p| check_binary(p, "kube-controller-manager")).transpose()?;
        Ok(Self { kube_controller_manager, ..self })
    }

    /// With the controller-manager running `controllers` (its `--controllers`, e.g. `*` for
    /// all: Kubernetes' e2e specs need the service-account and quota controllers).
    pub fn with_controllers(self, controllers: &str) -> Self {
        Self { controllers: controllers.to_owned(), ..self }
    }

    /// `$SKEWGATE_KUBE_APISERVER` and `$SKEWGATE_ETCD`: both, or neither (stand-ins).
    pub fn from_env() -> Result<Option<Self>> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        match (var(KUBE_APISERVER_ENV), var(ETCD_ENV)) {
            (None, None) if var(OLD_KUBE_APISERVER_ENV).is_some() => {
                bail!(
                    "{OLD_KUBE_APISERVER_ENV} is the release upgraded from: set {KUBE_APISERVER_ENV} and {ETCD_ENV} too"
                )
            }
            (None, None) => Ok(None),
            (Some(k), Some(e)) => Ok(Some(
                Self::new(Some(&k), &e)?
                    .with_controller_manager(var(KUBE_CONTROLLER_MANAGER_ENV).as_deref())?
                    .with_old_release(
                        var(OLD_KUBE_APISERVER_ENV).as_deref(),
                        var(OLD_KUBE_CONTROLLER_MANAGER_ENV).as_deref(),
                    )?,
            )),
            _ => {
                bail!("set both {KUBE_APISERVER_ENV} and {ETCD_ENV} (real binaries), or neither (stand-ins)")
            }
        }
    }

    /// `--version` of the `--kube-apiserver` binary, when there is one.
    pub fn version(&self) -> Result<Option<String>> {
        self.kube_apiserver.as_deref().map(version_of).transpose()
    }
}

/// How to run one real kube-apiserver: `kube-apiserver` (the `--kube-apiserver` binary at its
/// own version), `kube-apiserver@1.33` (`--emulated-version=1.33`), each extra flag after a colon:
/// `kube-apiserver@1.33:--runtime-config=api/beta=true:--feature-gates=A=true`. An absolute path
/// in place of `kube-apiserver` runs that binary: `/opt/k8s/v1.33.5/kube-apiserver`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `None`: the `--kube-apiserver` binary.
    pub binary: Option<PathBuf>,
    pub emulated: Option<String>,
    pub flags: Vec<String>,
}

impl Spec {
    /// Whether an apiserver spec names a real kube-apiserver (rather than a stand-in profile).
    pub fn is_real(spec: &str) -> bool {
        spec.starts_with('/')
            || spec
                .strip_prefix(KUBE_APISERVER)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['@', ':']))
    }

    pub fn parse(spec: &str) -> Result<Self> {
        let usage = "expected kube-apiserver[@MAJOR.MINOR][:--flag=value]... or \
                     /PATH/TO/kube-apiserver[@MAJOR.MINOR][:--flag=value]..., e.g. \
                     kube-apiserver@1.33:--runtime-config=api/beta=true";
        if !Self::is_real(spec) {
            bail!("{spec:?}: {usage}");
        }
        let (binary, rest) = match spec.strip_prefix(KUBE_APISERVER) {
            Some(rest) if !spec.starts_with('/') => (None, rest),
            _ => {
                let end =
                    [spec.find('@'), spec.find(":--")].into_iter().flatten().min().unwrap_or(spec.len());
                (Some(PathBuf::from(&spec[..end])), &spec[end..])
            }
        };
        let mut parts = rest.split(":--");
        let head = parts.next().unwrap_or_default();
        let emulated = match head {
            "" => None,
            version => {
                let v = version.strip_prefix('@').with_context(|| format!("{spec:?}: {usage}"))?;
                let valid = v.split_once('.').is_some_and(|(major, minor)| {
                    [major, minor].iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                });
                if !valid {
                    bail!("{spec:?}: the emulated version must be MAJOR.MINOR, e.g. 1.33");
                }
                Some(v.to_string())
            }
        };
        let mut flags = Vec::new();
        for part in parts {
            let flag = format!("--{part}");
            let name = flag.split('=').next().unwrap_or_default();
            if name.len() <= 2 || name.contains(char::is_whitespace) {
                bail!("{spec:?}: {flag:?} is not a flag; {usage}");
            }
            if RESERVED_FLAGS.contains(&name) {
                bail!("{spec:?}: {name} is set by the launcher (the version goes after @)");
            }
            flags.push(flag);
        }
        Ok(Self { binary, emulated, flags })
    }

    /// The flags this spec adds to the common ones.
    pub fn args(&self) -> Vec<String> {
        self.emulated
            .iter()
            .map(|v| format!("--emulated-version={v}"))
            .chain(self.flags.iter().cloned())
            .collect()
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.binary {
            Some(path) => write!(f, "{}", path.display())?,
            None => f.write_str(KUBE_APISERVER)?,
        }
        if let Some(v) = &self.emulated {
            write!(f, "@{v}")?;
        }
        for flag in &self.flags {
            write!(f, ":{flag}")?;
        }
        Ok(())
    }
}

/// A real kube-controller-manager (its garbage collector and namespace controller) talking to the
/// cluster through `kubeconfig`, as a control plane's does through its load balancer. With the
/// admin identity: with `--use-service-account-credentials=false` every controller acts as the
/// manager itself, and the bootstrap role of `system:kube-controller-manager` covers only its
/// own loops.
pub struct ControllerManager {
    process: Process,
    pub log: PathBuf,
}

impl ControllerManager {
    pub fn start(binary: &Path, kubeconfig: &Path, dir: &Path, controllers: &str, pki: &Pki) -> Result<Self> {
        let port = free_port()?;
        let mut command = Command::new(binary);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--authentication-kubeconfig={}", kubeconfig.display()))
            .arg(format!("--authorization-kubeconfig={}", kubeconfig.display()))
            .arg(format!("--controllers={controllers}"))
            // For the service-account token controller, when it runs: the apiservers' signing
            // key, and the CA a pod trusts them by.
            .arg(format!("--service-account-private-key-file={}", pki.service_account.key.display()))
            .arg(format!("--root-ca-file={}", pki.peer_ca.cert_path.display()))
            .args([
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--bind-address=127.0.0.1",
            ])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", dir.join("kcm-certs").display()))
            .arg("-v=2");
        let log = dir.join("kube-controller-manager.log");
        let process =
            Process::spawn(command, &log, &format!("kube-controller-manager on {}", kubeconfig.display()))?;
        Ok(Self { process, log })
    }

    pub fn running(&mut self) -> bool {
        self.process.running()
    }

    /// SIGTERM, and until it has exited (SIGKILL after `timeout`).
    pub async fn stop(&mut self, timeout: Duration) -> Result<()> {
        self.process.terminate()?;
        self.process.wait(timeout).await
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// One etcd member on loopback, plain HTTP (reachable from this host only), a fresh data dir.
pub struct Etcd {
    process: Process,
    pub url: String,
}

impl Etcd {
    pub async fn start(binary: &Path, dir: &Path, client_port: u16) -> Result<Self> {
        let data = dir.join("etcd");
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let client_port = if client_port == 0 { free_port()? } else { client_port };
        let url = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let mut command = Command::new(binary);
        command
            .arg("--name=skewgate")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=skewgate={peer}"))
            .arg("--initial-cluster-state=new");
        let mut process = Process::spawn(command, &dir.join("etcd.log"), &format!("etcd at {url}"))?;
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if !process.running() {
                bail!("etcd exited at start:\n{}", process.log_tail(20));
            }
            if let Ok(r) = http.get(format!("{url}/health")).send().await {
                if r.status() == 200 && r.text().await.unwrap_or_default().contains("true") {
                    return Ok(Self { process, url });
                }
            }
            if Instant::now() > deadline {
                bail!("etcd not healthy at {url} after 30 s:\n{}", process.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(mut self) -> Result<()> {
        self.process.terminate()?;
        self.process.wait(Duration::from_secs(10)).await
    }
}

/// One running kube-apiserver process.
pub struct Apiserver {
    pub id: String,
    pub addr: SocketAddr,
    pub spec: Spec,
    /// Its binary's `--version`.
    pub version: String,
    pub started: Instant,
    process: Process,
    /// When it got SIGTERM (it then fails `/readyz` and serves for `--shutdown-delay-duration`).
    pub terminated: Option<Instant>,
}

impl Apiserver {
    pub fn running(&mut self) -> bool {
        self.process.running()
    }

    /// SIGTERM: `/readyz` fails at once, the apiserver serves for its shutdown delay, finishes
    /// what is in flight, then exits.
    pub fn terminate(&mut self) -> Result<()> {
        if self.terminated.is_none() {
            self.process.terminate()?;
            self.terminated = Some(Instant::now());
        }
        Ok(())
    }

    /// SIGTERM (unless sent already) and wait for the exit; one still running a minute past
    /// its shutdown delay is SIGKILLed, as the kubelet kills a pod at the end of its grace
    /// period, and the upgrade goes on.
    pub async fn stop(mut self) -> Result<()> {
        self.terminate()?;
        let exited = self.process.wait(SHUTDOWN_DELAY + Duration::from_secs(60)).await;
        let after = self.terminated.map(|t| t.elapsed()).unwrap_or_default();
        match exited {
            Ok(()) => eprintln!(
                "kube-apiserver {} ({}) exited {:.1}s after SIGTERM",
                self.id,
                self.spec,
                after.as_secs_f64()
            ),
            Err(_) => eprintln!(
                "kube-apiserver {} ({}) still running {:.1}s after SIGTERM: SIGKILLed",
                self.id,
                self.spec,
                after.as_secs_f64()
            ),
        }
        Ok(())
    }

    /// SIGKILL: connections close at once, requests in flight get no answer.
    pub fn kill(mut self) -> Result<()> {
        self.process.kill()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// What a real apiserver answered on `/readyz` while it started: the first time of each answer
/// (`refused`, `403`, `500`, `200`, ...), from the spawn.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    pub phases: Vec<(String, Duration)>,
}

impl Readiness {
    pub fn ready_after(&self) -> Option<Duration> {
        self.phases.iter().find(|(what, _)| what == "200").map(|(_, at)| *at)
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> =
            self.phases.iter().map(|(what, at)| format!("{what} at {:.2}s", at.as_secs_f64())).collect();
        f.write_str(&parts.join(", "))
    }
}

/// The flags every apiserver of a cluster gets (its own and its spec's come after them).
fn common_flags(etcd_url: &str, pki: &Pki, tokens: &Path, anonymous_auth: bool) -> Vec<String> {
    let p = |path: &Path| path.display().to_string();
    vec![
        format!("--etcd-servers={}", etcd_url),
        format!("--etcd-prefix={ETCD_PREFIX}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--tls-cert-file={}", p(&pki.apiserver.cert)),
        format!("--tls-private-key-file={}", p(&pki.apiserver.key)),
        format!("--client-ca-file={}", p(&pki.cluster_ca.cert_path)),
        format!("--requestheader-client-ca-file={}", p(&pki.requestheader_ca.cert_path)),
        format!("--requestheader-allowed-names={FRONT_PROXY_CN}"),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--service-account-issuer=https://{APISERVER_NAME}"),
        format!("--service-account-key-file={}", p(&pki.service_account.cert)),
        format!("--service-account-signing-key-file={}", p(&pki.service_account.key)),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--token-auth-file={}", p(tokens)),
        format!("--anonymous-auth={anonymous_auth}"),
        format!("--shutdown-delay-duration={}s", SHUTDOWN_DELAY.as_secs()),
    ]
}

/// With the Mixed Version Proxy, peers present their proxy client certificate too.
fn allow_peers(common: &mut [String]) {
    let allowed = format!("--requestheader-allowed-names={}", Mvp::allowed_names());
    for flag in common.iter_mut().filter(|f| f.starts_with("--requestheader-allowed-names=")) {
        flag.clone_from(&allowed);
    }
}

/// What one kube-apiserver binary is, asked once.
#[derive(Debug, Clone)]
struct Probe {
    version: String,
    /// It has `--requestheader-uid-headers` (1.32+).
    uid_headers: bool,
    /// It has `--shutdown-watch-termination-grace-period` (1.27+).
    watch_termination: bool,
}

impl Probe {
    fn of(binary: &Path) -> Result<Self> {
        Ok(Self {
            version: version_of(binary)?,
            uid_headers: has_flag(binary, "--requestheader-uid-headers")?,
            watch_termination: has_flag(binary, "--shutdown-watch-termination-grace-period")?,
        })
    }
}

/// The command that starts apiserver `id` listening on `addr`, before its spec's flags.
fn apiserver_command(
    common: &[String],
    mvp: Option<&Mvp>,
    binary: &Path,
    id: &str,
    addr: SocketAddr,
    probe: &Probe,
    dir: &Path,
) -> Command {
    let mut command = match mvp {
        Some(mvp) => mvp.command(binary, id),
        None => Command::new(binary),
    };
    command.args(common);
    // Only the versions that have the flags: an older one refuses to start with them.
    if probe.uid_headers {
        command.arg("--requestheader-uid-headers=X-Remote-Uid");
    }
    // Without it a stopping apiserver keeps its watches open until its 60 s shutdown timeout,
    // behind any load balancer: with it, it ends them after its shutdown delay and its clients
    // watch again elsewhere (docs/deploy.md, "A draining apiserver's watches").
    if probe.watch_termination {
        command.arg(format!("--shutdown-watch-termination-grace-period={}s", SHUTDOWN_DELAY.as_secs()));
    }
    if let Some(mvp) = mvp {
        command.args(mvp.flags(addr));
    }
    command
        .arg(format!("--secure-port={}", addr.port()))
        .arg(format!("--cert-dir={}", dir.join(id).join("certs").display()));
    command
}

/// etcd and the real apiservers of one cluster, and what is needed to start them again.
pub struct ControlPlane {
    pub binaries: Binaries,
    pub etcd: Etcd,
    /// The running apiservers, in the order they were configured.
    pub apiservers: Vec<Apiserver>,
    /// Every configured apiserver's address, running or not: a restart comes back there.
    addresses: Vec<(String, SocketAddr)>,
    /// Flags every apiserver gets (the spec's come after them, so they may override).
    common: Vec<String>,
    /// Per binary: its `--version` and the flags it has.
    probed: BTreeMap<PathBuf, Probe>,
    dir: PathBuf,
    /// Trusts the peer CA, sends the admin token: for `/readyz` and the RBAC setup.
    admin: reqwest::Client,
    /// Kubernetes' own Mixed Version Proxy on every apiserver started from now on.
    mvp: Option<Mvp>,
}

impl ControlPlane {
    /// Starts etcd (not the apiservers). `dir` gets etcd's data and log, each apiserver's log
    /// and certificate folder, and the token file.
    pub async fn new(
        binaries: &Binaries,
        dir: &Path,
        pki: &Pki,
        admin_token: &str,
        anonymous_auth: bool,
        etcd_port: u16,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, format!("{admin_token},admin,admin,\"system:masters\"\n"))?;
        let etcd = Etcd::start(&binaries.etcd, dir, etcd_port).await?;
        let common = common_flags(&etcd.url, pki, &tokens, anonymous_auth);
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.peer_ca.cert_path)?)?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {admin_token}").parse()?);
        let admin = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .default_headers(headers)
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            binaries: binaries.clone(),
            etcd,
            apiservers: Vec::new(),
            addresses: Vec::new(),
            common,
            probed: BTreeMap::new(),
            dir: dir.to_path_buf(),
            admin,
            mvp: None,
        })
    }

    /// Every apiserver started from now on runs Kubernetes' own Mixed Version Proxy
    /// ([`crate::mvp`]): its own hostname, the peer flags, peers' proxy client trusted.
    pub fn enable_mvp(&mut self, mvp: Mvp) {
        allow_peers(&mut self.common);
        self.mvp = Some(mvp);
    }

    /// The address `id` listens on (configured at its first start; port 0: any free one).
    pub fn addr(&self, id: &str) -> Option<SocketAddr> {
        self.addresses.iter().find(|(i, _)| i == id).map(|(_, a)| *a)
    }

    /// Every configured apiserver, running or not, in order.
    pub fn addresses(&self) -> &[(String, SocketAddr)] {
        &self.addresses
    }

    pub fn apiserver_mut(&mut self, id: &str) -> Result<&mut Apiserver> {
        self.apiservers
            .iter_mut()
            .find(|a| a.id == id)
            .with_context(|| format!("kube-apiserver {id} is not running"))
    }

    pub fn take(&mut self, id: &str) -> Result<Apiserver> {
        let index = self
            .apiservers
            .iter()
            .position(|a| a.id == id)
            .with_context(|| format!("kube-apiserver {id} is not running"))?;
        Ok(self.apiservers.remove(index))
    }

    /// Spawns `id` with `spec` (on `port` the first time, 0 for any; on its own address after),
    /// without waiting for it to be ready.
    pub fn spawn(&mut self, id: &str, spec: &Spec, port: u16) -> Result<()> {
        if self.apiservers.iter().any(|a| a.id == id) {
            bail!("kube-apiserver {id} is already running");
        }
        let addr = match self.addr(id) {
            Some(addr) => addr,
            None => {
                let port = if port == 0 { free_port()? } else { port };
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                self.addresses.push((id.to_string(), addr));
                addr
            }
        };
        let binary = match (&spec.binary, &self.binaries.kube_apiserver) {
            (Some(path), _) => check_binary(path, "kube-apiserver")?,
            (None, Some(path)) => path.clone(),
            (None, None) => {
                bail!("{id}={spec}: which kube-apiserver? Give --kube-apiserver PATH or a path in the spec")
            }
        };
        let probe = match self.probed.get(&binary) {
            Some(probe) => probe.clone(),
            None => {
                let probe = Probe::of(&binary)?;
                self.probed.insert(binary.clone(), probe.clone());
                probe
            }
        };
        let version = probe.version.clone();
        let dir = self.dir.join(id);
        std::fs::create_dir_all(&dir)?;
        let mut command =
            apiserver_command(&self.common, self.mvp.as_ref(), &binary, id, addr, &probe, &self.dir);
        command.args(spec.args());
        let process = Process::spawn(command, &self.dir.join(format!("{id}.log")), &format!("{id}: {spec}"))?;
        let apiserver = Apiserver {
            id: id.to_string(),
            addr,
            spec: spec.clone(),
            version,
            started: Instant::now(),
            process,
            terminated: None,
        };
        let order: Vec<&str> = self.addresses.iter().map(|(i, _)| i.as_str()).collect();
        let rank = |i: &str| order.iter().position(|o| *o == i).unwrap_or(usize::MAX);
        let at = self.apiservers.iter().position(|a| rank(&a.id) > rank(id)).unwrap_or(self.apiservers.len());
        self.apiservers.insert(at, apiserver);
        Ok(())
    }

    /// Polls `id`'s `/readyz` (as the admin) until 200, noting each answer it gave on the way.
    pub async fn wait_ready(&mut self, id: &str, timeout: Duration) -> Result<Readiness> {
        let admin = self.admin.clone();
        let apiserver = self.apiserver_mut(id)?;
        let url = format!("https://{}/readyz", apiserver.addr);
        let mut readiness = Readiness::default();
        loop {
            let answer = match admin.get(&url).send().await {
                Ok(r) => r.status().as_u16().to_string(),
                Err(e) if e.is_connect() => "refused".to_string(),
                Err(e) if e.is_timeout() => "timeout".to_string(),
                Err(_) => "error".to_string(),
            };
            let at = apiserver.started.elapsed();
            if readiness.phases.last().is_none_or(|(last, _)| *last != answer) {
                readiness.phases.push((answer.clone(), at));
            }
            if answer == "200" {
                return Ok(readiness);
            }
            if !apiserver.running() {
                bail!("kube-apiserver {id} exited ({readiness}):\n{}", apiserver.log_tail(30));
            }
            if at > timeout {
                bail!(
                    "kube-apiserver {id} not ready after {timeout:?} ({readiness}):\n{}",
                    apiserver.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `path` of apiserver `id` as the admin, with `accept`: the body of a 200.
    pub async fn get(&self, id: &str, path: &str, accept: &str) -> Result<Vec<u8>> {
        let addr = self.addr(id).with_context(|| format!("no apiserver {id}"))?;
        let url = format!("https://{addr}{path}");
        let response = self.admin.get(&url).header(reqwest::header::ACCEPT, accept).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body.to_vec())
    }

    /// RBAC for the demo users: group `devs` (alice's certificate) gets [`devs_role`]. The admin
    /// token is in `system:masters` and needs nothing.
    pub async fn bind_demo_users(&self) -> Result<()> {
        let addr = self.apiservers.first().context("no apiserver running")?.addr;
        let base = format!("https://{addr}/apis/rbac.authorization.k8s.io/v1");
        let role = devs_role();
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": DEVS_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": DEVS_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "devs"}],
        });
        // The sidecar reads each apiserver's feature gates from /metrics (docs/kubeadm/rbac.yaml
        // grants the kubeadm identity the same).
        let metrics_role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": SIDECAR_METRICS_ROLE},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        });
        let metrics_binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": SIDECAR_METRICS_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SIDECAR_METRICS_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:apiserver"}],
        });
        for (collection, object) in [
            ("clusterroles", role),
            ("clusterrolebindings", binding),
            ("clusterroles", metrics_role),
            ("clusterrolebindings", metrics_binding),
        ] {
            let r = self.admin.post(format!("{base}/{collection}")).json(&object).send().await?;
            let status = r.status();
            if !status.is_success() && status != 409 {
                let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                bail!("creating {collection}/{name}: {status} {}", r.text().await.unwrap_or_default());
            }
        }
        Ok(())
    }

    /// What each running apiserver is, for the ready line: id → spec.
    pub fn specs(&self) -> BTreeMap<String, String> {
        self.apiservers.iter().map(|a| (a.id.clone(), a.spec.to_string())).collect()
    }

    /// Each running apiserver's binary version: id → `Kubernetes v1.36.2`.
    pub fn versions(&self) -> BTreeMap<String, String> {
        self.apiservers.iter().map(|a| (a.id.clone(), a.version.clone())).collect()
    }

    /// Every apiserver (SIGTERM to all first: their shutdown delays run side by side), then etcd.
    pub async fn shutdown(mut self) -> Result<()> {
        for a in &mut self.apiservers {
            a.terminate()?;
        }
        for a in self.apiservers.drain(..) {
            a.stop().await?;
        }
        self.etcd.stop().await
    }
}

/// The aggregated discovery documents of one kube-apiserver, as it serves them to a peer.
#[derive(Debug, Clone)]
pub struct Discovery {
    pub api: Vec<u8>,
    pub apis: Vec<u8>,
}

/// One top-level resource a client can list, as a discovery document names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listable {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
}

impl Listable {
    /// `resource.version.group` (`pods.v1` in the core group), as kubectl names it.
    pub fn name(&self) -> String {
        match self.group.is_empty() {
            true => format!("{}.{}", self.resource, self.version),
            false => format!("{}.{}.{}", self.resource, self.version, self.group),
        }
    }
}

impl Discovery {
    /// Every resource of both documents that has the `list` verb.
    pub fn listable(&self) -> Result<Vec<Listable>> {
        let mut all = Vec::new();
        for body in [&self.api, &self.apis] {
            let list: skewgate_core::discovery::ApiGroupDiscoveryList = serde_json::from_slice(body)?;
            for group in &list.items {
                for version in &group.versions {
                    for r in version.resources.iter().filter(|r| r.verbs.iter().any(|v| v == "list")) {
                        all.push(Listable {
                            group: group.name().to_owned(),
                            version: version.version.clone(),
                            resource: r.resource.clone(),
                            kind: r.response_kind.as_ref().map(|k| k.kind.clone()).unwrap_or_default(),
                            namespaced: r.scope == "Namespaced",
                        });
                    }
                }
            }
        }
        Ok(all)
    }
}

/// What `spec` serves: one apiserver of it started on a throwaway etcd under `dir`, its
/// discovery read as a peer reads it, both stopped again (~10 s).
pub async fn discovery_of(binaries: &Binaries, spec: &Spec, dir: &Path) -> Result<Discovery> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let pki = Pki::generate(&dir.join("pki"))?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let mut plane = ControlPlane::new(binaries, dir, &pki, &token, false, 0).await?;
    let read = async {
        plane.spawn("target", spec, 0)?;
        plane.wait_ready("target", Duration::from_secs(120)).await?;
        let apis = plane.get("target", "/apis", skewgate_core::discovery::ACCEPT_NOPEER).await?;
        let api = plane.get("target", "/api", skewgate_core::discovery::ACCEPT_NOPEER).await?;
        anyhow::Ok(Discovery { api, apis })
    }
    .await;
    plane.shutdown().await?;
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo users' role reaches no further than the objects: alice cannot become someone
    /// else (`impersonate` on users, groups or service accounts) nor grant herself more.
    #[test]
    fn the_demo_role_grants_no_identity_and_no_escalation() {
        let role = devs_role();
        for rule in role["rules"].as_array().into_iter().flatten() {
            let verbs: Vec<&str> =
                rule["verbs"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
            for forbidden in ["*", "impersonate", "escalate", "bind", "approve", "sign"] {
                assert!(!verbs.contains(&forbidden), "{forbidden} granted: {rule}");
            }
            let groups: Vec<&str> =
                rule["apiGroups"].as_array().into_iter().flatten().filter_map(|g| g.as_str()).collect();
            assert!(
                !groups
                    .iter()
                    .any(|g| *g == "*" || g.starts_with("rbac.") || g.starts_with("apiextensions."))
            );
        }
    }

    fn args_of(command: &Command) -> Vec<String> {
        command.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    /// The whole command line of an MVP apiserver: in its own UTS namespace, the common flags
    /// with the peers' proxy client allowed, the MVP flags naming its own address, then the
    /// spec's (which may override any of them); without the MVP, none of that.
    #[test]
    fn an_mvp_apiserver_gets_its_hostname_peer_flags_and_trusts_its_peers() {
        let dir = crate::paths::workspace_root().join(format!("target/tmp/real-mvp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki = Pki::generate(&dir.join("pki")).unwrap();
        let mvp = Mvp::new(&pki, crate::mvp::Namespaces::Uts).unwrap();
        let addr: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let binary = Path::new("/opt/k/kube-apiserver");
        let spec = Spec::parse(&format!("{KUBE_APISERVER}@1.33:--v=2")).unwrap();

        let plain = common_flags("http://127.0.0.1:2379", &pki, &dir.join("tokens.csv"), true);
        let probe = Probe { version: "v1.36.2".into(), uid_headers: true, watch_termination: true };
        let mut command = apiserver_command(&plain, None, binary, "b", addr, &probe, &dir);
        command.args(spec.args());
        assert_eq!(command.get_program(), binary);
        let args = args_of(&command);
        assert!(args.contains(&"--requestheader-allowed-names=skewgate-front-proxy".to_string()));
        assert!(args.contains(&"--shutdown-watch-termination-grace-period=5s".to_string()));
        let old = Probe { version: "v1.26.0".into(), uid_headers: false, watch_termination: false };
        let old_args = args_of(&apiserver_command(&plain, None, binary, "b", addr, &old, &dir));
        assert!(
            !old_args
                .iter()
                .any(|a| a.starts_with("--shutdown-watch") || a.starts_with("--requestheader-uid"))
        );
        assert!(
            !args.iter().any(|a| a.starts_with("--peer-") || a.starts_with("--feature-gates")),
            "{args:?}"
        );

        let mut common = plain.clone();
        allow_peers(&mut common);
        let mut command = apiserver_command(&common, Some(&mvp), binary, "b", addr, &probe, &dir);
        command.args(spec.args());
        assert_eq!(command.get_program(), "unshare");
        let args = args_of(&command);
        let at = |flag: &str| {
            args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag} in {args:?}"))
        };
        // unshare, the hostname, the binary, then kube-apiserver's flags.
        assert!(at("--uts") < at("kas-b") && at("kas-b") + 1 == at("/opt/k/kube-apiserver"));
        let exe = at("/opt/k/kube-apiserver");
        assert_eq!(
            args.iter().filter(|a| a.starts_with("--requestheader-allowed-names=")).collect::<Vec<_>>(),
            ["--requestheader-allowed-names=skewgate-front-proxy,kube-apiserver-proxy-client"]
        );
        for flag in mvp.flags(addr) {
            assert!(at(&flag) > exe, "{flag}");
        }
        assert!(at("--peer-advertise-port=7002") < at("--secure-port=7002"));
        assert!(
            at("--feature-gates=UnknownVersionInteroperabilityProxy=true") < at("--emulated-version=1.33")
        );
        assert_eq!(args.last().map(String::as_str), Some("--v=2"));
        // Every other flag is the same as without the MVP.
        let rest: Vec<&String> = args[exe + 1..]
            .iter()
            .filter(|a| !a.starts_with("--requestheader-allowed-names="))
            .filter(|a| !mvp.flags(addr).contains(a))
            .collect();
        let plain_args = args_of(&apiserver_command(&plain, None, binary, "b", addr, &probe, &dir));
        let plain_rest: Vec<&String> =
            plain_args.iter().filter(|a| !a.starts_with("--requestheader-allowed-names=")).collect();
        assert_eq!(rest[..rest.len() - 2], plain_rest[..]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn specs_parse_and_print_back() {
        for (text, emulated, flags) in [
            ("kube-apiserver", None, vec![]),
            ("kube-apiserver@1.33", Some("1.33"), vec![]),
            (
                "kube-apiserver@1.33:--runtime-config=api/beta=true",
                Some("1.33"),
                vec!["--runtime-config=api/beta=true"],
            ),
            (
                "kube-apiserver:--feature-gates=A=true,B=false:--v=2",
                None,
                vec!["--feature-gates=A=true,B=false", "--v=2"],
            ),
        ] {
            let spec = Spec::parse(text).unwrap();
            assert_eq!(spec.binary, None, "{text}");
            assert_eq!(spec.emulated.as_deref(), emulated, "{text}");
            assert_eq!(spec.flags, flags, "{text}");
            assert_eq!(spec.to_string(), text);
            assert!(Spec::is_real(text));
        }
        assert_eq!(
            Spec::parse("kube-apiserver@1.33:--runtime-config=api/beta=true").unwrap().args(),
            ["--emulated-version=1.33", "--runtime-config=api/beta=true"]
        );
    }

    #[test]
    fn a_spec_can_name_its_own_binary() {
        for (text, binary, emulated, flags) in [
            ("/opt/k8s/v1.33.5/kube-apiserver", "/opt/k8s/v1.33.5/kube-apiserver", None, vec![]),
            ("/opt/old/kas@1.32", "/opt/old/kas", Some("1.32"), vec![]),
            ("/opt/old/kas:--v=2", "/opt/old/kas", None, vec!["--v=2"]),
            (
                "/opt/k8s/kube-apiserver@1.33:--runtime-config=api/beta=true",
                "/opt/k8s/kube-apiserver",
                Some("1.33"),
                vec!["--runtime-config=api/beta=true"],
            ),
        ] {
            let spec = Spec::parse(text).unwrap();
            assert_eq!(spec.binary.as_deref(), Some(Path::new(binary)), "{text}");
            assert_eq!(spec.emulated.as_deref(), emulated, "{text}");
            assert_eq!(spec.flags, flags, "{text}");
            assert_eq!(spec.to_string(), text);
            assert!(Spec::is_real(text));
        }
    }

    #[test]
    fn stand_in_profiles_are_not_real_specs() {
        for text in ["1.33", "1.36:disable=resource.k8s.io/v1", "kube-apiserverx", "kube", ""] {
            assert!(!Spec::is_real(text), "{text}");
            assert!(Spec::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn bad_specs_say_why() {
        for (text, why) in [
            ("kube-apiserver@1", "MAJOR.MINOR"),
            ("kube-apiserver@v1.33", "MAJOR.MINOR"),
            ("kube-apiserver@1.33x", "MAJOR.MINOR"),
            ("kube-apiserver@", "MAJOR.MINOR"),
            ("kube-apiserver:--", "not a flag"),
            ("kube-apiserver:--a b", "not a flag"),
            ("kube-apiserver:-v=2", "expected"),
            ("kube-apiserver@1.33:--secure-port=1", "set by the launcher"),
            ("kube-apiserver:--emulated-version=1.33", "set by the launcher"),
            ("kube-apiserver:--etcd-servers=http://x", "set by the launcher"),
        ] {
            let e = format!("{:#}", Spec::parse(text).unwrap_err());
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
