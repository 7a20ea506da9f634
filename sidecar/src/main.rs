use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use skewgate::explain::{self, Request};

/// skewgate: GVR-aware routing for kube-apiservers of mixed versions, at the Envoy edge.
#[derive(Debug, Parser)]
#[command(name = "skewgate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        /// HTTP method, e.g. GET.
        method: String,
        /// Path and query, e.g. /apis/resource.k8s.io/v1/namespaces/default/resourceclaims?watch=1
        path: String,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Explain { table, accept, headers, client_cert_subject, method, path } => {
            let table = match std::fs::read(&table)
                .map_err(|e| e.to_string())
                .and_then(|bytes| explain::load_table(&bytes))
            {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("skewgate explain: {}: {e}", table.display());
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
            let req = Request { method, target: path, headers: parsed, client_cert_subject };
            println!("{}", explain::explain(&table, &req));
            ExitCode::SUCCESS
        }
    }
}
