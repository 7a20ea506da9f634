mod certs;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::json;
use skewgate_harness::cluster::{self, ApiserverSpec};
use skewgate_harness::real::Binaries;
use skewgate_pki::{FRONT_PROXY_CN, Pair};
use skewgate_standin::{self as standin, Auth, Profile, RemoteStore, Store, StoreHandle, Token};

/// skewgate's test harness: stand-in kube-apiservers and the local skewed cluster.
#[derive(Debug, Parser)]
#[command(name = "skewgate-harness", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run stand-in apiservers (one shared store), or your own kube-apiserver and etcd binaries
    /// (one shared etcd), with Envoy and the skewgate filter in front. Prints one JSON line when
    /// ready; runs until SIGINT or SIGTERM.
    #[command(after_help = CLUSTER_HELP)]
    Cluster {
        /// ID=PROFILE[:disable=GROUP/VERSION,...] (a stand-in), e.g. a=1.33,
        /// c=1.36:disable=resource.k8s.io/v1beta1 or b=1.36-real (the documents a real
        /// kube-apiserver v1.36.2 served, as captured); or
        /// ID=kube-apiserver[@MAJOR.MINOR][:--flag=value]... (a real kube-apiserver, needs --etcd
        /// and --kube-apiserver or a path in place of `kube-apiserver`), e.g. a=kube-apiserver@1.33
        /// or c=kube-apiserver. All of one kind.
        #[arg(long = "apiserver", required = true)]
        apiservers: Vec<ApiserverSpec>,
        /// Where certificates, Envoy's files, the kubeconfig (and etcd's data and the apiservers'
        /// logs) go.
        #[arg(long, default_value = "skewgate-cluster")]
        out: PathBuf,
        /// Your kube-apiserver binary: the ID=kube-apiserver… specs run it (specs that start with
        /// a path run that binary instead).
        #[arg(long, requires = "etcd")]
        kube_apiserver: Option<PathBuf>,
        /// Your etcd binary (3.4 or later): one member on loopback that every real apiserver
        /// shares. Needed for real apiservers.
        #[arg(long)]
        etcd: Option<PathBuf>,
        /// etcd's client port (real binaries); 0: any free port.
        #[arg(long, default_value_t = 0)]
        etcd_port: u16,
        /// Your kube-controller-manager binary: run against Envoy's listener (skewgate or the
        /// plain load balancer) as a control plane's runs against its load balancer, with its
        /// garbage collector and namespace controller; log in OUT/kube-controller-manager.log.
        #[arg(long, requires = "etcd")]
        kube_controller_manager: Option<PathBuf>,
        /// The controller-manager's `--controllers`: `*` for all of them (Kubernetes' e2e specs
        /// need the service-account and quota controllers).
        #[arg(long, requires = "kube_controller_manager", default_value = skewgate_harness::real::CONTROLLERS)]
        controllers: String,
        /// Real binaries: run Kubernetes' own Mixed Version Proxy (UnknownVersionInteroperabilityProxy)
        /// on every apiserver, each in its own UTS namespace (hostname kas-ID, its identity), with
        /// the peer CA, peer address and proxy-client flags. Combine with --plain-lb for the
        /// in-apiserver MVP alone.
        #[arg(long, requires = "etcd")]
        mvp: bool,
        /// Envoy as a plain round-robin load balancer over every apiserver: no skewgate filter,
        /// no sidecar (what the drill compares skewgate with).
        #[arg(long, conflicts_with_all = ["no_sidecar", "from_cluster"])]
        plain_lb: bool,
        /// Stand-ins only, no Envoy.
        #[arg(long)]
        no_envoy: bool,
        /// The sidecar takes its apiservers from the cluster (the `kubernetes` EndpointSlice the
        /// stand-ins publish themselves in) and lists CRDs and APIServices.
        #[arg(long)]
        from_cluster: bool,
        /// No `skewgate sync`: the table is built once from the stand-ins' profiles.
        #[arg(long)]
        no_sidecar: bool,
        /// The sidecar's /healthz, /readyz and /metrics.
        #[arg(long, default_value_t = 9090)]
        sidecar_port: u16,
        /// How often the sidecar polls the apiservers' discovery, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        poll_ms: u64,
        #[arg(long, default_value_t = 6443)]
        envoy_port: u16,
        #[arg(long, default_value_t = 9901)]
        admin_port: u16,
        /// Port of the first apiserver; the others follow.
        #[arg(long, default_value_t = 7001)]
        apiserver_port: u16,
        /// Store events kept for watches from a revision; older revisions get 410 Gone.
        #[arg(long, default_value_t = 10_000)]
        history: usize,
    },
    /// The one-shot certificate job (docker-compose): writes DIR/pki (kept if complete),
    /// DIR/admin.token and DIR/kubeconfig (contexts skewgate: alice's certificate, and
    /// skewgate-admin: the token, both through Envoy). Prints one JSON line.
    Certs {
        #[arg(long)]
        out: PathBuf,
        /// Envoy's address as kubectl reaches it; the listener certificate names localhost and
        /// 127.0.0.1 only.
        #[arg(long, default_value = "https://127.0.0.1:6443")]
        server: String,
    },
    /// The object store that stand-ins in separate processes or containers share, as
    /// kube-apiservers share etcd: plain HTTP/JSON, no authentication, in memory (a new store
    /// is an empty cluster). Prints one JSON line when ready; runs until SIGINT or SIGTERM.
    Store {
        #[arg(long, default_value = "127.0.0.1:2379")]
        listen: SocketAddr,
        /// Events kept for watches from a revision; older revisions get 410 Gone.
        #[arg(long, default_value_t = 10_000)]
        history: usize,
    },
    /// The discovery documents of a kube-apiserver binary, for `skewgate plan --to`: starts it
    /// once on a throwaway etcd on loopback (as `cluster` does), saves its aggregated `/apis`
    /// and `/api` (profile nopeer) as OUT/apis.json and OUT/api.json, stops both. Prints one
    /// JSON line.
    Discovery {
        /// Your kube-apiserver binary (the target release).
        #[arg(long)]
        kube_apiserver: PathBuf,
        /// Your etcd binary (3.4 or later).
        #[arg(long)]
        etcd: PathBuf,
        /// Where apis.json and api.json go (and, under OUT/run, etcd's data and the logs).
        #[arg(long)]
        out: PathBuf,
        /// An extra kube-apiserver flag, e.g. --runtime-config=api/beta=true (repeatable): the
        /// flags the cluster's apiservers run with change what they serve.
        #[arg(long = "apiserver-flag", value_name = "--FLAG=VALUE", allow_hyphen_values = true)]
        flags: Vec<String>,
    },
    /// One stand-in apiserver with the certificates of `certs` (or `cluster`): serving
    /// certificate from the peer CA, front-proxy, x509 and token authentication. Prints one
    /// JSON line when ready; runs until SIGINT or SIGTERM.
    Standin {
        /// A DNS label; it names the apiserver in x-skewgate-served-by and in the routing table.
        #[arg(long)]
        id: String,
        /// PROFILE[:disable=GROUP/VERSION,...]: 1.30, 1.33 or 1.36; or 1.33-real / 1.36-real, every
        /// document a real kube-apiserver v1.36.2 served (emulating 1.33 with betas on, or native).
        #[arg(long)]
        profile: String,
        #[arg(long, default_value = "127.0.0.1:7001")]
        listen: SocketAddr,
        /// The folder with apiserver.crt/.key, requestheader-ca.crt and cluster-ca.crt.
        #[arg(long)]
        pki: PathBuf,
        /// URL of `skewgate-harness store` (e.g. http://store:2379); without it the stand-in
        /// keeps its objects to itself.
        #[arg(long)]
        store: Option<String>,
        /// A file holding the bearer token of `admin` (group system:masters).
        #[arg(long)]
        admin_token_file: Option<PathBuf>,
        /// Events kept by the stand-in's own store (without --store).
        #[arg(long, default_value_t = 10_000)]
        history: usize,
    },
}

const CLUSTER_HELP: &str = "\
Real kube-apiservers (rehearse an upgrade with your own binaries):
  skewgate-harness cluster --kube-apiserver /path/kube-apiserver --etcd /path/etcd \\
    --apiserver a=kube-apiserver@1.33 --apiserver b=kube-apiserver@1.33 --apiserver c=kube-apiserver

  ID=kube-apiserver          the --kube-apiserver binary at its own version
  ID=kube-apiserver@1.33     with --emulated-version=1.33
  ID=/opt/k8s/v1.33.5/kube-apiserver
                             another binary (your old release next to the new one), same
                             @VERSION and :--flag forms
  ID=kube-apiserver@1.33:--runtime-config=api/beta=true:--feature-gates=X=true
                             extra flags, each after a colon (they come after the launcher's, so
                             they override them; --secure-port, --etcd-servers, --etcd-prefix,
                             --bind-address, --tls-*-file and --emulated-version are refused)

One etcd (loopback, data in OUT/real/etcd) serves every apiserver. Each apiserver gets the
requestheader flags of docs/deploy.md, a serving certificate for kubernetes.default.svc and
127.0.0.1, --authorization-mode=Node,RBAC, the admin token (OUT/admin.token, system:masters)
and --shutdown-delay-duration=5s; group devs (alice) is bound to ClusterRole
skewgate-demo-devs. Logs: OUT/real/<id>.log, OUT/real/etcd.log.";

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skewgate-harness: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Cluster {
            apiservers,
            out,
            kube_apiserver,
            etcd,
            etcd_port,
            kube_controller_manager,
            controllers,
            mvp,
            plain_lb,
            no_envoy,
            from_cluster,
            no_sidecar,
            sidecar_port,
            poll_ms,
            envoy_port,
            admin_port,
            apiserver_port,
            history,
        } => {
            let options = cluster::Options {
                apiservers,
                out,
                envoy: !no_envoy,
                envoy_port,
                admin_port,
                first_apiserver_port: apiserver_port,
                history,
                sidecar: !no_sidecar && !plain_lb,
                sidecar_port,
                poll_period: std::time::Duration::from_millis(poll_ms),
                rogue: Default::default(),
                anonymous_auth: true,
                plain_lb,
                real: etcd
                    .as_deref()
                    .map(|e| {
                        Binaries::new(kube_apiserver.as_deref(), e)?
                            .with_controller_manager(kube_controller_manager.as_deref())
                            .map(|b| b.with_controllers(&controllers))
                    })
                    .transpose()?,
                etcd_port,
                from_cluster,
                from_leases: false,
                mvp,
                hold: None,
            };
            let running = cluster::start(&options).await?;
            println!("{}", cluster::ready_line(&running));
            wait_for_signal().await?;
            eprintln!("skewgate-harness: stopping");
            running.shutdown().await
        }
        Command::Discovery { kube_apiserver, etcd, out, flags } => {
            println!("{}", save_discovery(&kube_apiserver, &etcd, &out, &flags).await?);
            Ok(())
        }
        Command::Certs { out, server } => {
            println!("{}", certs::write(&out, &server)?);
            Ok(())
        }
        Command::Store { listen, history } => {
            let service = standin::serve_store(Store::new(history), listen).await?;
            println!("{}", json!({"store": service.url(), "revision": service.store.revision()}));
            wait_for_signal().await?;
            eprintln!("skewgate-harness: stopping");
            Ok(())
        }
        Command::Standin { id, profile, listen, pki, store, admin_token_file, history } => {
            run_standin(id, profile, listen, pki, store, admin_token_file, history).await
        }
    }
}

async fn run_standin(
    id: String,
    profile: String,
    listen: SocketAddr,
    pki: PathBuf,
    store: Option<String>,
    admin_token_file: Option<PathBuf>,
    history: usize,
) -> anyhow::Result<()> {
    if !skewgate_core::build::is_valid_apiserver_id(&id) {
        bail!("--id {id:?}: must be a DNS label (1-63 of [a-z0-9-], alphanumeric at both ends)");
    }
    let profile = Profile::parse(&profile).with_context(|| format!("--profile {profile:?}"))?;
    for file in ["apiserver.crt", "apiserver.key", "requestheader-ca.crt", "cluster-ca.crt"] {
        if !pki.join(file).is_file() {
            bail!("--pki {}: no {file} (`skewgate-harness certs` writes it)", pki.display());
        }
    }
    let mut tokens = Vec::new();
    if let Some(path) = &admin_token_file {
        let token = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        tokens.push(Token {
            token: token.trim().to_string(),
            user: "admin".into(),
            groups: vec!["system:masters".into()],
        });
    }
    let (handle, store_url) = match &store {
        // Containers start in any order: give the store a little time.
        Some(url) => {
            (StoreHandle::from(RemoteStore::connect(url, Duration::from_secs(30)).await?), url.clone())
        }
        None => (StoreHandle::from(Store::new(history)), "in-process".to_string()),
    };
    let git_version = profile.git_version.clone();
    let options = standin::Options {
        id,
        profile,
        listen,
        serving: Pair { cert: pki.join("apiserver.crt"), key: pki.join("apiserver.key") },
        auth: Auth {
            requestheader_ca: pki.join("requestheader-ca.crt"),
            requestheader_allowed_names: vec![FRONT_PROXY_CN.to_string()],
            client_ca: pki.join("cluster-ca.crt"),
            tokens,
            anonymous: true,
        },
        bookmark_interval: standin::Options::BOOKMARK_INTERVAL,
    };
    let running = standin::serve(options, handle).await?;
    println!(
        "{}",
        json!({"standin": running.id, "listen": format!("https://{}", running.addr), "version": git_version, "store": store_url})
    );
    wait_for_signal().await?;
    eprintln!("skewgate-harness: stopping");
    running.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// `skewgate-harness discovery`: one apiserver of `kube_apiserver` on a throwaway etcd, its
/// discovery saved, both stopped.
async fn save_discovery(
    kube_apiserver: &std::path::Path,
    etcd: &std::path::Path,
    out: &std::path::Path,
    flags: &[String],
) -> anyhow::Result<serde_json::Value> {
    use skewgate_harness::real::Spec;
    if let Some(bad) = flags.iter().find(|f| !f.starts_with("--") || f.contains(':')) {
        bail!("--apiserver-flag {bad:?}: expected --flag=value without a colon");
    }
    let binaries = Binaries::new(Some(kube_apiserver), etcd)?;
    let spec = Spec::parse(
        &std::iter::once("kube-apiserver".to_string())
            .chain(flags.iter().cloned())
            .collect::<Vec<_>>()
            .join(":"),
    )?;
    let documents = skewgate_harness::real::discovery_of(&binaries, &spec, &out.join("run")).await?;
    let mut written = Vec::new();
    for (body, file) in [(&documents.apis, "apis.json"), (&documents.api, "api.json")] {
        let dest = out.join(file);
        std::fs::write(&dest, body).with_context(|| format!("writing {}", dest.display()))?;
        written.push(dest.display().to_string());
    }
    let version = binaries.version().ok().flatten();
    Ok(json!({"kubeApiserver": version, "flags": flags, "written": written}))
}
