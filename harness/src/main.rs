use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use skewgate_harness::cluster::{self, ApiserverSpec};

/// skewgate's test harness: stand-in kube-apiservers and the local skewed cluster.
#[derive(Debug, Parser)]
#[command(name = "skewgate-harness", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run stand-in apiservers (one shared store) with Envoy and the skewgate filter in front.
    /// Prints one JSON line when ready; runs until SIGINT or SIGTERM.
    Cluster {
        /// ID=PROFILE[:disable=GROUP/VERSION,...], e.g. a=1.33 or c=1.36:disable=resource.k8s.io/v1beta1.
        #[arg(long = "apiserver", required = true)]
        apiservers: Vec<ApiserverSpec>,
        /// Where certificates, Envoy's files and the kubeconfig go.
        #[arg(long)]
        out: PathBuf,
        /// Stand-ins only, no Envoy.
        #[arg(long)]
        no_envoy: bool,
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
        /// Port of the first stand-in; the others follow.
        #[arg(long, default_value_t = 7001)]
        apiserver_port: u16,
        /// Store events kept for watches from a revision; older revisions get 410 Gone.
        #[arg(long, default_value_t = 10_000)]
        history: usize,
    },
}

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
            no_envoy,
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
                sidecar: !no_sidecar,
                sidecar_port,
                poll_period: std::time::Duration::from_millis(poll_ms),
            };
            let running = cluster::start(&options).await?;
            println!("{}", cluster::ready_line(&running));
            wait_for_signal().await?;
            eprintln!("skewgate-harness: stopping");
            running.shutdown().await
        }
    }
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
