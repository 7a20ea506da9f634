use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, Parser, Subcommand, ValueEnum};
use skewgate::config::{Overrides, SyncConfig};
use skewgate::explain::{self, Request};
use skewgate::offline::{Documents, Spec};
use skewgate::{offline, plan, skew, sync};
use skewgate_envoy as envoy;
use tracing_subscriber::EnvFilter;

/// skewgate: GVR-aware routing for kube-apiservers of mixed versions, at the Envoy edge.
#[derive(Debug, Parser)]
#[command(name = "skewgate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what the filter does with one request, and why (prints one JSON object).
    Explain {
        /// Routing table (or an ecds.json that carries one).
        #[arg(long)]
        table: PathBuf,
        /// The request's Accept header.
        #[arg(long)]
        accept: Option<String>,
        /// A request header, NAME:VALUE (repeatable).
        #[arg(long = "header", value_name = "NAME:VALUE")]
        headers: Vec<String>,
        /// Subject of a verified client certificate, as Envoy renders it (e.g. "CN=alice,O=devs").
        #[arg(long)]
        client_cert_subject: Option<String>,
        /// That certificate (PEM): its names are checked as kube-apiserver reads them, as the
        /// filter does on a connection's first request. Without it they are taken as checked.
        #[arg(long, value_name = "FILE", requires = "client_cert_subject")]
        client_cert: Option<PathBuf>,
        /// The OpenAPI composer's summary (`openapi.json` in Envoy's directory): shows which
        /// apiservers' documents an OpenAPI path is composed from.
        #[arg(long, value_name = "FILE")]
        openapi: Option<PathBuf>,
        /// HTTP method, e.g. GET.
        method: String,
        /// Path and query as the client sends them, e.g.
        /// /apis/resource.k8s.io/v1/namespaces/default/resourceclaims?watch=1. Envoy's path
        /// normalisation (shipped bootstrap: dot segments, `\`, escapes) is applied first; the
        /// output shows the path as received and as forwarded.
        path: String,
    },
    /// The discovery sidecar: poll every apiserver's discovery and keep Envoy's cds.json and
    /// ecds.json current. Logs go to stderr (RUST_LOG filters, default info).
    Sync {
        /// Configuration file, .json or .toml.
        #[arg(long)]
        config: PathBuf,
        /// One sync, print its report as JSON, exit (0: Envoy's files hold the table).
        #[arg(long)]
        once: bool,
        /// Check the configuration and print it as the sidecar would run it (every default
        /// filled in, the files it writes, the API paths it reads from the cluster) as JSON;
        /// exit 2 with every error when it is wrong. Asks nothing, writes nothing.
        #[arg(long, conflicts_with = "once")]
        check: bool,
        /// Overrides envoy.dir.
        #[arg(long)]
        envoy_dir: Option<PathBuf>,
        /// Overrides envoy.wasm.
        #[arg(long)]
        wasm: Option<PathBuf>,
        /// Overrides envoy.adminUrl.
        #[arg(long)]
        admin_url: Option<String>,
        /// Overrides pollPeriod, e.g. 5s.
        #[arg(long)]
        poll_period: Option<String>,
        /// Overrides probePeriod, e.g. 250ms.
        #[arg(long)]
        probe_period: Option<String>,
        /// Deprecated and ignored (as the gracePeriod key): accepted so that old command lines
        /// still start.
        #[arg(long, hide = true)]
        grace_period: Option<String>,
        /// Overrides listen, e.g. 127.0.0.1:9090.
        #[arg(long)]
        listen: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        log_format: Format,
    },
    /// Build a routing table from saved discovery (--discovery), or show the skew of a table
    /// (--table FILE, or --config FILE to fetch it live): GVR × apiserver, rerouted rows first.
    #[command(group(ArgGroup::new("source").required(true).args(["discovery", "config", "table"])))]
    Table {
        /// Build mode, one per apiserver in order: ID=APIS_FILE[,API_FILE], the saved
        /// `kubectl get --raw /apis` (aggregated, nopeer) and optionally `/api` or `/api/v1`.
        #[arg(long = "discovery", value_name = "ID=APIS[,API]")]
        discovery: Vec<Spec>,
        /// Build mode: write the table here and show its skew; without it the table goes to stdout.
        #[arg(long, value_name = "TABLE", conflicts_with_all = ["config", "table"])]
        out: Option<PathBuf>,
        /// Show mode: fetch every apiserver's discovery once, with this `skewgate sync` config.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Show mode: a routing table, or an ecds.json that carries one.
        #[arg(long, value_name = "FILE")]
        table: Option<PathBuf>,
        /// How to show the skew.
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// A rolling upgrade's preflight: every state the control plane passes through while its
    /// apiservers are upgraded one at a time (each restarting, then upgraded), and in each the
    /// APIs served by some apiservers but not all, by one only, and by none after being served.
    /// Exit status 0: every API served at any point stays served throughout; 1: not (listed);
    /// 2: bad input.
    #[command(group(ArgGroup::new("now").required(true).args(["discovery", "config", "table"])))]
    Plan {
        /// Who serves what now, one per apiserver in upgrade order: ID=APIS_FILE[,API_FILE],
        /// as for `skewgate table --discovery`.
        #[arg(long = "discovery", value_name = "ID=APIS[,API]")]
        discovery: Vec<Spec>,
        /// Who serves what now, fetched from the apiservers of this `skewgate sync` config.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Who serves what now, from a routing table (or an ecds.json that carries one).
        #[arg(long, value_name = "FILE")]
        table: Option<PathBuf>,
        /// The target release's discovery: APIS_FILE[,API_FILE], saved from an apiserver of
        /// that release (`skewgate-harness discovery` saves them from its binary).
        #[arg(long, value_name = "APIS[,API]")]
        to: Documents,
        /// The apiservers to upgrade, in order, e.g. b,a (default: all, in the apiservers' order);
        /// the others stay as they are.
        #[arg(long, value_delimiter = ',')]
        order: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Explain {
            table,
            accept,
            headers,
            client_cert_subject,
            client_cert,
            openapi,
            method,
            path,
        } => {
            let client_cert = match client_cert
                .map(|p| std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display())))
            {
                None => None,
                Some(Ok(pem)) => Some(pem),
                Some(Err(e)) => {
                    eprintln!("skewgate explain: --client-cert {e}");
                    return ExitCode::from(2);
                }
            };
            let client = ClientCert { subject: client_cert_subject, pem: client_cert };
            explain_command(table, accept, headers, client, openapi, method, path)
        }
        Command::Sync {
            config,
            once,
            check,
            envoy_dir,
            wasm,
            admin_url,
            poll_period,
            probe_period,
            grace_period,
            listen,
            log_format,
        } => {
            init_logs(log_format);
            let overrides =
                Overrides { envoy_dir, wasm, admin_url, poll_period, probe_period, grace_period, listen };
            let config = match SyncConfig::load(&config, &overrides) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("skewgate sync: {}: {e}", config.display());
                    return ExitCode::from(2);
                }
            };
            match (check, once) {
                (true, _) => {
                    emit(&format!("{:#}\n", config.effective()));
                    ExitCode::SUCCESS
                }
                (false, true) => sync_once(config).await,
                (false, false) => sync_forever(config).await,
            }
        }
        Command::Table { discovery, out, config, table, format } => {
            init_logs(Format::Text);
            table_command(discovery, out, config, table, format).await
        }
        Command::Plan { discovery, config, table, to, order, format } => {
            init_logs(Format::Text);
            plan_command(discovery, config, table, &to, &order, format).await
        }
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn init_logs(format: Format) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        Format::Text => builder.try_init(),
        Format::Json => builder.json().try_init(),
    };
}

async fn sync_once(config: SyncConfig) -> ExitCode {
    match sync::sync_once(config).await {
        Ok(report) => {
            emit(&format!("{}\n", report.to_json()));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skewgate sync: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn sync_forever(config: SyncConfig) -> ExitCode {
    match sync::run(config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "skewgate sync failed");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn table_command(
    discovery: Vec<Spec>,
    out: Option<PathBuf>,
    config: Option<PathBuf>,
    table: Option<PathBuf>,
    format: Format,
) -> ExitCode {
    let fail = |e: String| {
        eprintln!("skewgate table: {e}");
        ExitCode::FAILURE
    };
    let mut sources = Vec::new();
    let routing = if !discovery.is_empty() {
        let built = match offline::build(&discovery) {
            Ok(t) => t,
            Err(e) => return fail(format!("{e:#}")),
        };
        let Ok(mut text) = serde_json::to_string_pretty(&built) else {
            return fail("cannot serialise the table".into());
        };
        text.push('\n');
        let Some(out) = out else {
            emit(&text);
            return ExitCode::SUCCESS;
        };
        if let Err(e) = envoy::write_atomic(&out, text.as_bytes()) {
            return fail(format!("{}: {e}", out.display()));
        }
        match skewgate_core::table::RoutingTable::compile(built) {
            Ok(t) => t,
            Err(e) => return fail(e.to_string()),
        }
    } else if let Some(path) = config {
        match live_table("skewgate table", &path).await {
            Ok((t, s)) => {
                sources = s;
                t
            }
            Err(code) => return code,
        }
    } else if let Some(path) = table {
        match read_table(&path) {
            Ok(t) => t,
            Err(e) => return fail(e),
        }
    } else {
        return fail("one of --discovery, --config, --table is required".into());
    };
    let mut matrix = skew::matrix(&routing);
    matrix.sources = sources;
    match format {
        Format::Text => {
            let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            emit(&skew::render_text(&matrix, color));
        }
        Format::Json => emit(&format!("{}\n", skew::render_json(&matrix))),
    }
    ExitCode::SUCCESS
}

/// Every apiserver's discovery fetched once with a `skewgate sync` config, as a table, and where
/// each apiserver came from. Errors are printed as `command`'s.
async fn live_table(
    command: &str,
    path: &std::path::Path,
) -> Result<(skewgate_core::table::RoutingTable, Vec<String>), ExitCode> {
    let config = SyncConfig::load(path, &Overrides::default()).map_err(|e| {
        eprintln!("{command}: {}: {e}", path.display());
        ExitCode::from(2)
    })?;
    let (built, reports) = sync::fetch_table(config).await.map_err(|e| {
        eprintln!("{command}: {e:#}");
        ExitCode::FAILURE
    })?;
    for r in reports.iter().filter(|r| r.error.is_some()) {
        let error = r.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
        eprintln!("{command}: apiserver {} serves nothing here: {error}", r.id);
    }
    let source = |id: &str| reports.iter().find(|r| r.id == id).map(|r| r.source.to_string());
    let sources = built.apiservers.iter().map(|a| source(&a.id).unwrap_or_default()).collect();
    let table = skewgate_core::table::RoutingTable::compile(built).map_err(|e| {
        eprintln!("{command}: {e}");
        ExitCode::FAILURE
    })?;
    Ok((table, sources))
}

async fn plan_command(
    discovery: Vec<Spec>,
    config: Option<PathBuf>,
    table: Option<PathBuf>,
    to: &Documents,
    order: &[String],
    format: Format,
) -> ExitCode {
    let bad = |e: String| {
        eprintln!("skewgate plan: {e}");
        ExitCode::from(2)
    };
    let now = if !discovery.is_empty() {
        match offline::build(&discovery).map(skewgate_core::table::RoutingTable::compile) {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return bad(e.to_string()),
            Err(e) => return bad(format!("{e:#}")),
        }
    } else if let Some(path) = config {
        match live_table("skewgate plan", &path).await {
            Ok((t, _)) => t,
            Err(code) => return code,
        }
    } else if let Some(path) = table {
        match read_table(&path) {
            Ok(t) => t,
            Err(e) => return bad(e),
        }
    } else {
        return bad("one of --discovery, --config, --table is required".into());
    };
    let documents = match to.load() {
        Ok(d) => d,
        Err(e) => return bad(format!("--to {e}")),
    };
    let target = plan::gvrs_of(&documents.iter().collect::<Vec<_>>());
    let planned = match plan::plan(&skew::matrix(&now), &target, order) {
        Ok(p) => p,
        Err(e) => return bad(e.to_string()),
    };
    match format {
        Format::Text => emit(&plan::render_text(&planned)),
        Format::Json => emit(&format!("{:#}\n", plan::render_json(&planned))),
    }
    if planned.keeps_everything_served() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// A routing table, or an ecds.json that carries one; the error names the file.
fn read_table(path: &std::path::Path) -> Result<skewgate_core::table::RoutingTable, String> {
    std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| explain::load_table(&bytes))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The verified client certificate of an explained request.
struct ClientCert {
    subject: Option<String>,
    pem: Option<String>,
}

fn explain_command(
    table: PathBuf,
    accept: Option<String>,
    headers: Vec<String>,
    client: ClientCert,
    openapi: Option<PathBuf>,
    method: String,
    path: String,
) -> ExitCode {
    let openapi_summary =
        match openapi.map(|p| std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))) {
            None => None,
            Some(Ok(bytes)) => match serde_json::from_slice(&bytes) {
                Ok(summary) => Some(summary),
                Err(e) => {
                    eprintln!("skewgate explain: --openapi: not JSON: {e}");
                    return ExitCode::from(2);
                }
            },
            Some(Err(e)) => {
                eprintln!("skewgate explain: --openapi {e}");
                return ExitCode::from(2);
            }
        };
    let table = match read_table(&table) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skewgate explain: {e}");
            return ExitCode::from(2);
        }
    };
    let mut parsed = Vec::with_capacity(headers.len() + 1);
    for h in &headers {
        let Some((name, value)) = h.split_once(':') else {
            eprintln!("skewgate explain: --header {h:?}: expected NAME:VALUE");
            return ExitCode::from(2);
        };
        parsed.push((name.trim().to_string(), value.trim_start().to_string()));
    }
    if let Some(accept) = accept {
        parsed.retain(|(n, _)| !n.eq_ignore_ascii_case("accept"));
        parsed.push(("accept".into(), accept));
    }
    let req = Request {
        method,
        target: path,
        headers: parsed,
        client_cert_subject: client.subject,
        client_cert: client.pem,
        openapi_summary,
    };
    println!("{}", explain::explain(&table, &req));
    ExitCode::SUCCESS
}
