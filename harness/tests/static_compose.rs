//! docker-compose.yml, docker/Dockerfile and envoy-config/compose/ checked without Docker
//! (none runs on the build machines): the YAML parses, every build context, Dockerfile and COPY
//! source exists, every command names a workspace binary and flags it has, the start order is
//! expressed with health checks and depends_on conditions, every mount exists or is made by the
//! certificate job, ports and paths line up with the Envoy and sidecar configurations, the
//! compose Envoy configuration is the shipped template rendered and passes `envoy --mode
//! validate`, and the sidecar configuration loads.
//!
//! `SKEWGATE_BLESS=1 cargo test -p skewgate-harness --test static_compose` rewrites
//! envoy-config/compose/envoy.yaml, envoy-config/bootstrap-native.yaml and docs/kubeadm/envoy.yaml
//! from envoy-config/bootstrap.yaml.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Map, Value};
use skewgate_harness::{envoy, native, paths};

use crate::compose::{interpolate, strings};

mod compose;

const COMPOSE: &str = "docker-compose.yml";
const ENVOY_YAML: &str = "envoy-config/compose/envoy.yaml";
const SIDECAR_TOML: &str = "envoy-config/compose/sidecar.toml";
const OUR_IMAGE: &str = "skewgate-local:dev";
const STANDINS: [(&str, &str, &str); 3] =
    [("apiserver-a", "a", "1.33"), ("apiserver-b", "b", "1.33"), ("apiserver-c", "c", "1.36")];
/// Services that run once and exit; the others run until stopped.
const ONE_SHOT: [&str; 3] = ["certs", "filter", "first-table"];
const LONG_RUNNING: [&str; 6] = ["store", "apiserver-a", "apiserver-b", "apiserver-c", "envoy", "sidecar"];

/// What the compose Envoy's bootstrap is rendered with: the mounts of the envoy service.
fn compose_envoy_values() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("ADMIN_PORT", "9901".into()),
        ("LISTEN_ADDRESS", "0.0.0.0".into()),
        ("LISTEN_PORT", "6443".into()),
        ("CDS_DIR", "/var/lib/skewgate/envoy/cds".into()),
        ("ECDS_DIR", "/var/lib/skewgate/envoy/ecds".into()),
        ("SERVING_CERT", "/out/pki/envoy-listener.crt".into()),
        ("SERVING_KEY", "/out/pki/envoy-listener.key".into()),
        ("CLIENT_CA", "/out/pki/cluster-ca.crt".into()),
        ("ROUTE_TIMEOUT", "65s".into()),
        ("MAX_CONNECTIONS", "50000".into()),
    ])
}

const RENDERED_HEADER: &str = "\
# GENERATED from envoy-config/bootstrap.yaml for docker-compose.yml: do not edit. Paths are the
# envoy service's mounts; the listener takes every address of the container (published on the
# host's 127.0.0.1:6443), the admin API only 127.0.0.1. harness/tests/static_compose.rs checks
# that this file is the template rendered, and rewrites it with
#   SKEWGATE_BLESS=1 cargo test -p skewgate-harness --test static_compose
";

fn root() -> PathBuf {
    paths::workspace_root()
}

fn read(relative: &str) -> Result<String> {
    std::fs::read_to_string(root().join(relative)).with_context(|| format!("reading {relative}"))
}

fn yaml(text: &str) -> Result<Value> {
    serde_saphyr::from_str::<Value>(text).map_err(|e| anyhow::anyhow!("{e}"))
}

fn compose() -> Result<Value> {
    yaml(&read(COMPOSE)?).context(COMPOSE)
}

fn services(c: &Value) -> Result<&Map<String, Value>> {
    c["services"].as_object().context("no services")
}

fn service<'c>(c: &'c Value, name: &str) -> Result<&'c Value> {
    services(c)?.get(name).filter(|s| s.is_object()).with_context(|| format!("no service {name}"))
}

/// Compose's `${NAME:-default}` as the default (what runs without the variable set).
fn interpolated(s: &str) -> String {
    interpolate(s, &BTreeMap::new())
}

fn command(svc: &Value) -> Vec<String> {
    strings(svc.get("command").unwrap_or(&Value::Null)).iter().map(|s| interpolated(s)).collect()
}

/// One short-syntax mount: `SOURCE:TARGET[:ro]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    source: String,
    target: String,
    read_only: bool,
}

impl Mount {
    fn is_bind(&self) -> bool {
        self.source.starts_with("./") || self.source.starts_with('/')
    }
}

fn mounts(svc: &Value) -> Result<Vec<Mount>> {
    strings(svc.get("volumes").unwrap_or(&Value::Null))
        .iter()
        .map(|m| {
            let parts: Vec<&str> = m.split(':').collect();
            match parts.as_slice() {
                [source, target] => {
                    Ok(Mount { source: source.to_string(), target: target.to_string(), read_only: false })
                }
                [source, target, "ro"] => {
                    Ok(Mount { source: source.to_string(), target: target.to_string(), read_only: true })
                }
                _ => bail!("volume {m:?}: expected SOURCE:TARGET[:ro]"),
            }
        })
        .collect()
}

/// The mount a path inside the container lives on (the longest matching target).
fn mount_of<'m>(mounts: &'m [Mount], path: &str) -> Option<&'m Mount> {
    mounts
        .iter()
        .filter(|m| path == m.target || path.starts_with(&format!("{}/", m.target)))
        .max_by_key(|m| m.target.len())
}

/// Every absolute path in a configuration: values of `filename`, `path`, and quoted strings
/// that start with `/`.
fn absolute_paths(text: &str) -> BTreeSet<String> {
    // Comments (YAML and TOML) name files for people, not for the program.
    let text: String = text
        .lines()
        .map(|l| match l.find(" #").or_else(|| l.trim_start().starts_with('#').then_some(0)) {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    for token in
        text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '{' | '}' | ',' | '[' | ']'))
    {
        let token = token.trim_end_matches(':');
        if token.starts_with('/') && token.len() > 1 && !token.starts_with("//") && token.contains('/') {
            // Route prefixes like "/" and regexes are not paths of files.
            if token.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
                && token.matches('/').count() > 1
            {
                found.insert(token.to_string());
            }
        }
    }
    found
}

/// `text` with every occurrence of the container paths `prefixes` moved under `root`.
fn rebase(text: &str, prefixes: &[&str], root: &Path) -> String {
    let mut out = text.to_string();
    for prefix in prefixes {
        let mut result = String::new();
        let mut rest = out.as_str();
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            let starts_path = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || "/._-".contains(c)));
            result.push_str(&rest[..at]);
            if starts_path {
                result.push_str(&root.display().to_string());
            }
            result.push_str(prefix);
            rest = &rest[at + prefix.len()..];
        }
        result.push_str(rest);
        out = result;
    }
    out
}

fn temp_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("skewgate-static-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn harness_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_skewgate-harness"))
}

/// Runs the certificate job as the compose file does, into `dir`/out.
fn cert_job(c: &Value, dir: &Path) -> Result<Value> {
    let args = command(service(c, "certs")?);
    ensure!(args.first().map(String::as_str) == Some("skewgate-harness"), "certs runs {args:?}");
    let args: Vec<String> = args[1..].iter().map(|a| rebase(a, &["/out"], dir)).collect();
    let out = Command::new(harness_binary()).args(&args).output()?;
    ensure!(out.status.success(), "certs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[test]
fn every_service_is_there_from_the_right_image() -> Result<()> {
    let c = compose()?;
    let names: BTreeSet<&str> = services(&c)?.keys().map(String::as_str).collect();
    let wanted: BTreeSet<&str> = ONE_SHOT.iter().chain(LONG_RUNNING.iter()).copied().collect();
    assert_eq!(names, wanted);
    for (name, svc) in services(&c)? {
        let image = svc.get("image").and_then(Value::as_str).unwrap_or_default();
        if name == "envoy" {
            ensure!(svc.get("build").is_none(), "envoy runs the official image, unbuilt");
            continue;
        }
        assert_eq!(image, OUR_IMAGE, "{name}");
        assert_eq!(svc["build"]["context"], ".", "{name}");
        assert_eq!(svc["build"]["dockerfile"], "docker/Dockerfile", "{name}");
    }
    // The official Envoy image, at the version every test here runs.
    let image = service(&c, "envoy")?["image"].as_str().unwrap_or_default().to_string();
    let out = Command::new(paths::envoy_binary()?).arg("--version").output()?;
    let version = String::from_utf8_lossy(&out.stdout).to_string();
    let tested = version
        .split_once(" version: ")
        .and_then(|(_, v)| v.split('/').nth(1))
        .context("envoy --version")?
        .to_string();
    assert!(tested.starts_with("1.40."), "{version}");
    assert_eq!(image, format!("envoyproxy/envoy:v{tested}"));
    // The skew: a and b 1.33-era, c 1.36-era, each overridable for the recreate drill.
    for (svc, id, profile) in STANDINS {
        let raw = strings(&service(&c, svc)?["command"]);
        let at = raw.iter().position(|a| a == "--profile").context("--profile")?;
        assert_eq!(raw[at + 1], format!("${{STANDIN_{}_PROFILE:-{profile}}}", id.to_uppercase()));
        let args = command(service(&c, svc)?);
        let id_at = args.iter().position(|a| a == "--id").context("--id")?;
        assert_eq!(args[id_at + 1], id);
    }
    Ok(())
}

/// Dockerfile instructions, continuation lines joined.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

#[test]
fn build_contexts_dockerfiles_and_copy_sources_exist() -> Result<()> {
    let c = compose()?;
    let svc = service(&c, "certs")?;
    let context = root().join(svc["build"]["context"].as_str().context("context")?);
    ensure!(context.is_dir(), "build context {}", context.display());
    let dockerfile = context.join(svc["build"]["dockerfile"].as_str().context("dockerfile")?);
    let text = std::fs::read_to_string(&dockerfile).with_context(|| dockerfile.display().to_string())?;
    let mut copied = BTreeSet::new();
    let mut final_files = BTreeSet::new();
    for line in instructions(&text) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !words.first().is_some_and(|w| w.eq_ignore_ascii_case("COPY")) {
            continue;
        }
        let (flags, rest): (Vec<&str>, Vec<&str>) = words[1..].iter().partition(|w| w.starts_with("--"));
        let Some((dest, sources)) = rest.split_last() else { bail!("COPY without operands: {line}") };
        if flags.iter().any(|f| f.starts_with("--from=")) {
            for s in sources {
                let name = Path::new(s).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                let into = if dest.ends_with('/') { format!("{dest}{name}") } else { dest.to_string() };
                final_files.insert(into);
            }
            continue;
        }
        for s in sources {
            ensure!(context.join(s).exists(), "{}: COPY source {s} does not exist", dockerfile.display());
            copied.insert(s.trim_end_matches('/').to_string());
        }
    }
    // Every workspace member, and whatever their sources compile in from outside them.
    let manifest: toml_like::Members = toml_like::members(&read("Cargo.toml")?);
    for member in &manifest.0 {
        // A member nested in another's directory (filter/hostcall-stubs) comes with it.
        let with_parent =
            Path::new(member).ancestors().any(|a| a.to_str().is_some_and(|a| copied.contains(a)));
        ensure!(with_parent, "workspace member {member} is not copied into the image");
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        ensure!(copied.contains(file), "{file} is not copied");
    }
    for included in compiled_in_files(&manifest.0)? {
        let top = included.split('/').next().unwrap_or_default().to_string();
        ensure!(copied.contains(&top), "{included} is compiled in but {top}/ is not copied into the image");
    }
    for wanted in [
        "/usr/local/bin/skewgate",
        "/usr/local/bin/skewgate-harness",
        "/usr/local/share/skewgate/skewgate_filter.wasm",
    ] {
        ensure!(final_files.contains(wanted), "the image lacks {wanted}: {final_files:?}");
    }
    // The filter job copies the image's filter to where Envoy and the sidecar read it.
    let filter = command(service(&c, "filter")?).join(" ");
    ensure!(filter.contains("/usr/local/share/skewgate/skewgate_filter.wasm"), "{filter}");
    // The build context is the repository: keep the build output and the venv out of it.
    let ignore = std::fs::read_to_string(dockerfile.with_file_name("Dockerfile.dockerignore"))?;
    let ignored: BTreeSet<&str> = ignore.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    for dir in ["target", ".venv", ".git", "out"] {
        ensure!(ignored.contains(dir), "docker/Dockerfile.dockerignore should list {dir}");
    }
    Ok(())
}

/// A minimal reader for the workspace `members = [...]` list (no TOML crate needed for one key).
mod toml_like {
    pub struct Members(pub Vec<String>);

    pub fn members(text: &str) -> Members {
        let list = text
            .split_once("members")
            .and_then(|(_, rest)| rest.split_once('['))
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list)
            .unwrap_or_default();
        Members(
            list.split(',')
                .map(|m| m.trim().trim_matches('"').to_string())
                .filter(|m| !m.is_empty())
                .collect(),
        )
    }
}

/// Files that `include_str!`/`include_bytes!` pull into the members' sources, relative to the
/// workspace root.
fn compiled_in_files(members: &[String]) -> Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    let mut stack: Vec<PathBuf> = members.iter().map(|m| root().join(m).join("src")).collect();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            for part in text.split("include_").skip(1) {
                let Some(rest) = part.strip_prefix("str!(").or_else(|| part.strip_prefix("bytes!(")) else {
                    continue;
                };
                let Some(literal) = rest.trim_start().strip_prefix('"').and_then(|r| r.split_once('"'))
                else {
                    continue;
                };
                let target = path.parent().unwrap_or(&dir).join(literal.0);
                let target = target
                    .canonicalize()
                    .with_context(|| format!("{} includes {}", path.display(), literal.0))?;
                let relative = target.strip_prefix(root().canonicalize()?)?.display().to_string();
                found.insert(relative);
            }
        }
    }
    Ok(found)
}

#[test]
fn commands_name_workspace_binaries_and_flags_they_have() -> Result<()> {
    let c = compose()?;
    // The binaries are this workspace's: `skewgate` (sidecar/) and `skewgate-harness` (harness/).
    assert!(read("sidecar/Cargo.toml")?.contains("name = \"skewgate\""));
    assert!(read("harness/Cargo.toml")?.contains("name = \"skewgate-harness\""));
    let mut checked = 0;
    for (name, svc) in services(&c)? {
        let args = command(svc);
        // `sh -c SCRIPT`: the invocations inside the script.
        let invocations: Vec<Vec<String>> = if args.first().map(String::as_str) == Some("sh") {
            ensure!(args.get(1).map(String::as_str) == Some("-c") && args.len() == 3, "{name}: {args:?}");
            args[2]
                .split("&&")
                .flat_map(|s| s.split("||"))
                .map(|s| s.split_whitespace().map(str::to_string).collect())
                .collect()
        } else {
            vec![args.clone()]
        };
        for inv in invocations {
            let inv: Vec<String> = inv.into_iter().skip_while(|w| w == "exec").collect();
            let Some(program) = inv.first() else { bail!("{name}: empty command") };
            let binary = match program.as_str() {
                "skewgate" => paths::skewgate_binary()?,
                "skewgate-harness" => harness_binary(),
                "envoy" if name == "envoy" => continue,
                "cp" | "mv" | "test" if ONE_SHOT.contains(&name.as_str()) => continue,
                other => bail!("{name}: runs {other:?}, which is no workspace binary"),
            };
            let sub = inv.get(1).context("no subcommand")?;
            let help = Command::new(&binary).args([sub.as_str(), "--help"]).output()?;
            ensure!(help.status.success(), "{name}: `{program} {sub}` is no subcommand");
            let help = String::from_utf8_lossy(&help.stdout);
            for flag in inv.iter().filter(|a| a.starts_with("--")) {
                ensure!(
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                    "{name}: `{program} {sub}` has no {flag}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 7, "certs, store, three stand-ins, first-table and sidecar");
    Ok(())
}

#[test]
fn start_order_is_depends_on_with_conditions_and_health_checks() -> Result<()> {
    let c = compose()?;
    let all = services(&c)?;
    for (name, svc) in all {
        let one_shot = ONE_SHOT.contains(&name.as_str());
        ensure!(
            one_shot != svc.get("healthcheck").is_some(),
            "{name}: long-running services have a health check, one-shot ones none"
        );
        ensure!(
            one_shot != svc.get("restart").is_some(),
            "{name}: long-running services restart, one-shot ones do not"
        );
        if let Some(check) = svc.get("healthcheck") {
            ensure!(
                strings(&check["test"]).first().map(String::as_str) == Some("CMD"),
                "{name}: health check {check}"
            );
        }
        for (dep, how) in svc.get("depends_on").and_then(Value::as_object).into_iter().flatten() {
            let target = all.get(dep).with_context(|| format!("{name} depends on unknown {dep}"))?;
            match how["condition"].as_str() {
                Some("service_healthy") => {
                    ensure!(target.get("healthcheck").is_some(), "{name}: {dep} has no health check")
                }
                Some("service_completed_successfully") => {
                    ensure!(ONE_SHOT.contains(&dep.as_str()), "{name}: {dep} never completes")
                }
                other => bail!(
                    "{name} → {dep}: condition {other:?}; want service_healthy or service_completed_successfully"
                ),
            }
        }
    }
    let needs = |name: &str, dep: &str, condition: &str| -> Result<()> {
        let got = service(&c, name)?
            .get("depends_on")
            .and_then(|d| d.get(dep))
            .and_then(|d| d["condition"].as_str());
        ensure!(got == Some(condition), "{name} should depend on {dep} ({condition}), has {got:?}");
        Ok(())
    };
    for (svc, _, _) in STANDINS {
        needs(svc, "certs", "service_completed_successfully")?;
        needs(svc, "store", "service_healthy")?;
        needs("first-table", svc, "service_healthy")?;
        needs("sidecar", svc, "service_healthy")?;
    }
    needs("first-table", "filter", "service_completed_successfully")?;
    needs("envoy", "first-table", "service_completed_successfully")?;
    needs("envoy", "certs", "service_completed_successfully")?;
    needs("sidecar", "envoy", "service_healthy")?;
    // `docker compose up --wait` counts a one-shot job's exit as done only when a long-running
    // service depends on it with service_completed_successfully (docker/compose#9572).
    for job in ONE_SHOT {
        let adopted = LONG_RUNNING.iter().any(|svc| {
            service(&c, svc)
                .ok()
                .and_then(|s| s.get("depends_on"))
                .and_then(|d| d.get(job))
                .and_then(|d| d["condition"].as_str())
                == Some("service_completed_successfully")
        });
        ensure!(adopted, "no long-running service waits for {job}: `up --wait` would fail on its exit");
    }
    // The sidecar reaches Envoy's admin API on 127.0.0.1: it lives in Envoy's network.
    assert_eq!(service(&c, "sidecar")?["network_mode"], "service:envoy");
    Ok(())
}

#[test]
fn mounts_exist_or_come_from_the_cert_job() -> Result<()> {
    let c = compose()?;
    let named: BTreeSet<String> =
        c["volumes"].as_object().context("top-level volumes")?.keys().cloned().collect();
    let mut used = BTreeSet::new();
    for (name, svc) in services(&c)? {
        for m in mounts(svc)? {
            ensure!(m.target.starts_with('/'), "{name}: {m:?}");
            if !m.is_bind() {
                ensure!(named.contains(&m.source), "{name}: volume {} is not declared", m.source);
                used.insert(m.source.clone());
                continue;
            }
            if m.source == "./out" {
                // Made (on the host, by the bind mount) and filled by the certificate job.
                ensure!(name == "certs" || m.read_only, "{name}: only certs writes ./out");
                continue;
            }
            ensure!(root().join(&m.source).exists(), "{name}: {} does not exist", m.source);
        }
    }
    assert_eq!(used, named, "declared volumes nobody mounts");
    let certs = mounts(service(&c, "certs")?)?;
    ensure!(
        certs.iter().any(|m| m.source == "./out" && m.target == "/out" && !m.read_only),
        "certs writes ./out"
    );
    // What the containers read from /out is what the job writes.
    let dir = temp_dir("mounts")?;
    let written = cert_job(&c, &dir)?;
    assert_eq!(written["pki"], "generated");
    let mut referenced = BTreeSet::new();
    for svc in services(&c)?.values() {
        let texts = [
            command(svc).join(" "),
            strings(&svc.get("healthcheck").map_or(Value::Null, |h| h["test"].clone())).join(" "),
        ];
        for text in texts {
            referenced.extend(absolute_paths(&text).into_iter().filter(|p| p.starts_with("/out/")));
        }
    }
    for config in [ENVOY_YAML, SIDECAR_TOML] {
        referenced.extend(absolute_paths(&read(config)?).into_iter().filter(|p| p.starts_with("/out/")));
    }
    ensure!(referenced.len() >= 8, "{referenced:?}");
    for path in &referenced {
        ensure!(dir.join(path.trim_start_matches('/')).exists(), "the cert job does not write {path}");
    }
    // The kubeconfig reaches Envoy where the host publishes it; a second run keeps the PKI.
    let kubeconfig = std::fs::read_to_string(dir.join("out/kubeconfig"))?;
    ensure!(kubeconfig.contains("server: https://127.0.0.1:6443\n"), "{kubeconfig}");
    assert_eq!(cert_job(&c, &dir)?["pki"], "kept");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn ports_and_paths_line_up_with_envoy_and_sidecar_configs() -> Result<()> {
    let c = compose()?;
    let envoy_svc = service(&c, "envoy")?;
    let envoy_mounts = mounts(envoy_svc)?;
    let bootstrap = yaml(&read(ENVOY_YAML)?)?;
    let listener = &bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"];
    let admin = &bootstrap["admin"]["address"]["socket_address"];
    assert_eq!(listener["address"], "0.0.0.0", "reachable through the published port");
    assert_eq!(admin["address"], "127.0.0.1", "the admin API stays inside");
    let (listen_port, admin_port) = (listener["port_value"].as_u64(), admin["port_value"].as_u64());
    let ports = strings(&envoy_svc["ports"]);
    assert_eq!(ports, [format!("127.0.0.1:6443:{}", listen_port.context("listener port")?)]);
    for (name, svc) in services(&c)? {
        for p in strings(svc.get("ports").unwrap_or(&Value::Null)) {
            ensure!(
                !p.ends_with(&format!(":{}", admin_port.context("admin port")?)),
                "{name} publishes the admin port"
            );
        }
    }
    assert_eq!(
        envoy_mounts.iter().find(|m| m.source == format!("./{ENVOY_YAML}")).map(|m| m.target.as_str()),
        Some("/etc/skewgate/envoy.yaml")
    );
    ensure!(command(envoy_svc).windows(2).any(|w| w == ["-c", "/etc/skewgate/envoy.yaml"]), "envoy -c");
    // Every file Envoy's configuration names is on one of its mounts.
    let envoy_text = read(ENVOY_YAML)?;
    for path in absolute_paths(&envoy_text) {
        ensure!(
            mount_of(&envoy_mounts, &path).is_some(),
            "envoy.yaml names {path}, which the envoy service does not mount"
        );
    }

    // The sidecar configuration: where it is mounted, what it names.
    let sidecar = service(&c, "sidecar")?;
    let sidecar_mounts = mounts(sidecar)?;
    let config_target = sidecar_mounts
        .iter()
        .find(|m| m.source == format!("./{SIDECAR_TOML}"))
        .context("sidecar.toml mount")?;
    ensure!(
        command(sidecar).windows(2).any(|w| w[0] == "--config" && w[1] == config_target.target),
        "sidecar --config"
    );
    let dir = temp_dir("lineup")?;
    let config = load_sidecar_config(&c, &dir)?;
    let rebased =
        |p: &Path| format!("/{}", p.strip_prefix(&dir).map(|p| p.display().to_string()).unwrap_or_default());
    // Envoy reads its files where the sidecar writes them, the same volume at the same place.
    let envoy_dir = rebased(&config.path("/config/envoy/dir"));
    let values = compose_envoy_values();
    assert_eq!(values["CDS_DIR"], format!("{envoy_dir}/cds"));
    assert_eq!(values["ECDS_DIR"], format!("{envoy_dir}/ecds"));
    // cds.json and ecds.json name the TLS files and the filter for Envoy: the same mount on both.
    for file in [
        "/config/envoy/wasm",
        "/config/tls/peerCa",
        "/config/tls/clientCert",
        "/config/tls/clientKey",
        "/config/envoy/dir",
    ]
    .map(|pointer| config.path(pointer))
    {
        let path = rebased(&file);
        let on_sidecar =
            mount_of(&sidecar_mounts, &path).with_context(|| format!("sidecar does not mount {path}"))?;
        let on_envoy =
            mount_of(&envoy_mounts, &path).with_context(|| format!("envoy does not mount {path}"))?;
        assert_eq!((&on_sidecar.source, &on_sidecar.target), (&on_envoy.source, &on_envoy.target), "{path}");
    }
    ensure!(
        mount_of(&sidecar_mounts, &envoy_dir).is_some_and(|m| !m.read_only),
        "the sidecar writes {envoy_dir}"
    );
    // first-table writes the same files from the same configuration.
    assert_eq!(mounts(service(&c, "first-table")?)?, sidecar_mounts);
    let filter_target =
        mounts(service(&c, "filter")?)?.first().map(|m| m.target.clone()).context("filter mount")?;
    assert_eq!(rebased(&config.path("/config/envoy/wasm")), format!("{filter_target}/skewgate_filter.wasm"));
    // The admin API the sidecar confirms through is Envoy's, in the shared network namespace.
    assert_eq!(
        config.str("/config/envoy/adminUrl"),
        Some(format!("http://127.0.0.1:{}", admin_port.unwrap_or_default()).as_str())
    );
    // One apiserver entry per stand-in service, at the port it listens on.
    let endpoints = config.apiservers();
    let mut wanted = Vec::new();
    for (svc, id, _) in STANDINS {
        let args = command(service(&c, svc)?);
        let listen =
            args.iter().position(|a| a == "--listen").and_then(|i| args.get(i + 1)).context("--listen")?;
        let port = listen.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).context("port")?;
        assert!(listen.starts_with("0.0.0.0:"), "{svc} listens on the container network");
        ensure!(args.windows(2).any(|w| w == ["--store", "http://store:2379"]), "{svc}: --store");
        wanted.push((id.to_string(), svc.to_string(), port));
    }
    assert_eq!(endpoints, wanted);
    let store = command(service(&c, "store")?);
    ensure!(store.windows(2).any(|w| w == ["--listen", "0.0.0.0:2379"]), "store listens on 2379");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// sidecar.toml loaded as `skewgate sync` loads it, its container paths moved under `dir`
/// (where the cert job's output and a filter stand-in are).
fn load_sidecar_config(c: &Value, dir: &Path) -> Result<Checked> {
    cert_job(c, dir)?;
    let wasm = dir.join("var/lib/skewgate/filter/skewgate_filter.wasm");
    std::fs::create_dir_all(wasm.parent().context("wasm dir")?)?;
    std::fs::write(&wasm, b"\0asm")?;
    let text = rebase(&read(SIDECAR_TOML)?, &["/out/", "/var/lib/skewgate/"], dir);
    let path = dir.join("sidecar.toml");
    std::fs::write(&path, text)?;
    Checked::of(&path).with_context(|| SIDECAR_TOML.to_string())
}

/// A sidecar configuration as `skewgate sync --check` reads it: the configuration it would run
/// (every default filled in, paths absolute), the files it writes and what it reads from the
/// cluster.
struct Checked(Value);

impl Checked {
    fn of(path: &Path) -> Result<Self> {
        let output = Command::new(paths::skewgate_binary()?)
            .arg("sync")
            .arg("--config")
            .arg(path)
            .arg("--check")
            .output()?;
        ensure!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr).trim());
        Ok(Self(serde_json::from_slice(&output.stdout)?))
    }

    fn path(&self, pointer: &str) -> PathBuf {
        PathBuf::from(self.0.pointer(pointer).and_then(Value::as_str).unwrap_or_default())
    }

    fn str(&self, pointer: &str) -> Option<&str> {
        self.0.pointer(pointer).and_then(Value::as_str)
    }

    /// The files it writes for Envoy.
    fn writes(&self) -> [PathBuf; 3] {
        [self.path("/writes/cds"), self.path("/writes/rds"), self.path("/writes/ecds")]
    }

    /// `(id, address, port)` of every configured apiserver.
    fn apiservers(&self) -> Vec<(String, String, u16)> {
        let list = self.0.pointer("/config/apiservers").and_then(Value::as_array);
        list.into_iter()
            .flatten()
            .map(|a| {
                let port = a["port"].as_u64().and_then(|p| u16::try_from(p).ok()).unwrap_or_default();
                (
                    a["id"].as_str().unwrap_or_default().to_owned(),
                    a["address"].as_str().unwrap_or_default().to_owned(),
                    port,
                )
            })
            .collect()
    }

    /// The API paths it reads from the cluster.
    fn reads(&self) -> Vec<String> {
        strings(&self.0["reads"])
    }
}

#[test]
fn compose_envoy_config_is_the_template_rendered() -> Result<()> {
    let template = std::fs::read_to_string(paths::envoy_config_dir().join("bootstrap.yaml"))?;
    let rendered = format!("{RENDERED_HEADER}{}", envoy::render(&template, &compose_envoy_values())?);
    ensure_generated(ENVOY_YAML, &rendered, "rendered for docker-compose")
}

/// The bypass routes remove no header: they rely on the listener having removed, from every
/// request before routing, what the filter strips from a client (core's `bypass::LISTENER_STRIPS`).
#[test]
fn the_listener_strips_what_the_bypass_routes_rely_on() -> Result<()> {
    let template = std::fs::read_to_string(paths::envoy_config_dir().join("bootstrap.yaml"))?;
    let (prefix, header) = skewgate_core::bypass::LISTENER_STRIPS;
    let mutations =
        template.split("early_header_mutation_extensions:").nth(1).context("no early header mutation")?;
    let mutations = mutations.split("http_filters:").next().unwrap_or_default();
    for matcher in [format!("{{prefix: {prefix}}}"), format!("{{exact: {header}}}")] {
        let line = format!("- remove_on_match: {{key_matcher: {matcher}}}");
        ensure!(mutations.contains(&line), "bootstrap.yaml's early header mutation lacks {line}");
    }
    Ok(())
}

/// `relative` holds exactly `generated` (from envoy-config/bootstrap.yaml, `how`); with
/// `SKEWGATE_BLESS` set, it is written first.
fn ensure_generated(relative: &str, generated: &str, how: &str) -> Result<()> {
    let path = root().join(relative);
    if std::env::var_os("SKEWGATE_BLESS").is_some() {
        std::fs::write(&path, generated)?;
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    ensure!(
        shipped == generated,
        "{relative} is not envoy-config/bootstrap.yaml {how}; regenerate it with\n  \
         SKEWGATE_BLESS=1 cargo test -p skewgate-harness --test static_compose"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// envoy-config/bootstrap-native.yaml: the native module ahead of the proxy-wasm filter.

const NATIVE_ENVOY: &str = "envoy-config/bootstrap-native.yaml";

const NATIVE_HEADER: &str = "\
# GENERATED from envoy-config/bootstrap.yaml by skewgate_harness::native::with_module: do not edit;
# harness/tests/static_compose.rs checks it and rewrites it with SKEWGATE_BLESS=1.
# The bootstrap with the native dynamic module (libskewgate_module.so) ahead of the proxy-wasm
# filter (docs/native-module.md), its routes static (those of the sidecar's rds.json without the
# bypass, skewgate_harness::envoy::with_static_routes): the same placeholders as bootstrap.yaml; Envoy needs
# ENVOY_DYNAMIC_MODULES_SEARCH_PATH set to the module's directory, and the sidecar
# `nativeModule = true` in [envoy] to write the module's table to ECDS_DIR/module/ecds.json.
";

#[test]
fn native_bootstrap_is_the_template_with_the_module() -> Result<()> {
    let template = std::fs::read_to_string(paths::envoy_config_dir().join("bootstrap.yaml"))?;
    let static_routes = envoy::with_static_routes(&template, "{{ROUTE_TIMEOUT}}")?;
    let with_module = native::with_module(&static_routes, Path::new("{{ECDS_DIR}}"), true)?;
    ensure_generated(NATIVE_ENVOY, &format!("{NATIVE_HEADER}{with_module}"), "with the native module")
}

/// `envoy --mode validate` on the shipped file, with its container paths moved into a temporary
/// root that holds what the containers would: the cert job's output and the sidecar's files.
#[test]
fn compose_envoy_config_validates() -> Result<()> {
    let c = compose()?;
    let dir = temp_dir("validate")?;
    let config = load_sidecar_config(&c, &dir)?;
    for file in config.writes() {
        std::fs::create_dir_all(file.parent().context("envoy dir")?)?;
        std::fs::write(&file, "{\"resources\":[]}")?;
    }
    let bootstrap = dir.join("envoy.yaml");
    std::fs::write(&bootstrap, rebase(&read(ENVOY_YAML)?, &["/out/", "/var/lib/skewgate/"], &dir))?;
    envoy::validate(&bootstrap)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// docs/kubeadm: the manifests docs/deploy.md ships for real control planes.

const KUBEADM_ENVOY: &str = "docs/kubeadm/envoy.yaml";
const KUBEADM_SIDECAR: &str = "docs/kubeadm/sidecar.toml";
const KUBEADM_POD: &str = "docs/kubeadm/skewgate.yaml";
/// Where the kubeadm files live on a node; the test moves them under a temporary root.
const KUBEADM_PREFIXES: [&str; 3] = ["/etc/kubernetes/", "/var/lib/skewgate/", "/etc/skewgate/"];

fn kubeadm_envoy_values() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("ADMIN_PORT", "9901".into()),
        ("LISTEN_ADDRESS", "0.0.0.0".into()),
        // kube-apiserver keeps 6443 on the same node (host network).
        ("LISTEN_PORT", "7443".into()),
        ("CDS_DIR", "/var/lib/skewgate/envoy/cds".into()),
        ("ECDS_DIR", "/var/lib/skewgate/envoy/ecds".into()),
        ("SERVING_CERT", "/etc/kubernetes/pki/apiserver.crt".into()),
        ("SERVING_KEY", "/etc/kubernetes/pki/apiserver.key".into()),
        ("CLIENT_CA", "/etc/kubernetes/pki/ca.crt".into()),
        ("ROUTE_TIMEOUT", "65s".into()),
        ("MAX_CONNECTIONS", "50000".into()),
    ])
}

const KUBEADM_HEADER: &str = "\
# /etc/kubernetes/skewgate/envoy.yaml on every kubeadm control-plane node (docs/deploy.md).
# GENERATED from envoy-config/bootstrap.yaml: do not edit; harness/tests/static_compose.rs checks
# it and rewrites it with SKEWGATE_BLESS=1. Listener: port 7443 of the node, kube-apiserver's
# own serving certificate, client certificates verified against the cluster CA (--client-ca-file).
";

/// A kubeadm node's files under `dir`: the PKI files the manifests name, the filter, the
/// configuration folder.
fn kubeadm_node(dir: &Path) -> Result<()> {
    let pki = skewgate_pki::Pki::generate(&dir.join("generated"))?;
    let node_pki = dir.join("etc/kubernetes/pki");
    std::fs::create_dir_all(&node_pki)?;
    let copies = [
        (&pki.cluster_ca.cert_path, "ca.crt"),
        (&pki.envoy_listener.cert, "apiserver.crt"),
        (&pki.envoy_listener.key, "apiserver.key"),
        (&pki.front_proxy.cert, "skewgate-front-proxy.crt"),
        (&pki.front_proxy.key, "skewgate-front-proxy.key"),
    ];
    for (from, to) in copies {
        std::fs::copy(from, node_pki.join(to))?;
    }
    let filter = dir.join("var/lib/skewgate/filter");
    std::fs::create_dir_all(&filter)?;
    std::fs::write(filter.join("skewgate_filter.wasm"), b"\0asm")?;
    std::fs::create_dir_all(dir.join("etc/skewgate"))?;
    Ok(())
}

#[test]
fn kubeadm_envoy_config_is_the_template_rendered_and_validates() -> Result<()> {
    let template = std::fs::read_to_string(paths::envoy_config_dir().join("bootstrap.yaml"))?;
    let rendered = format!("{KUBEADM_HEADER}{}", envoy::render(&template, &kubeadm_envoy_values())?);
    ensure_generated(KUBEADM_ENVOY, &rendered, "rendered for kubeadm")?;
    let dir = temp_dir("kubeadm-validate")?;
    kubeadm_node(&dir)?;
    let config = kubeadm_sidecar_config(&dir)?;
    for file in config.writes() {
        std::fs::create_dir_all(file.parent().context("envoy dir")?)?;
        std::fs::write(&file, "{\"resources\":[]}")?;
    }
    let bootstrap = dir.join("envoy.yaml");
    std::fs::write(&bootstrap, rebase(&rendered, &KUBEADM_PREFIXES, &dir))?;
    envoy::validate(&bootstrap)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn kubeadm_sidecar_config(dir: &Path) -> Result<Checked> {
    let path = dir.join("etc/skewgate/sidecar.toml");
    std::fs::write(&path, rebase(&read(KUBEADM_SIDECAR)?, &KUBEADM_PREFIXES, dir))?;
    Checked::of(&path).with_context(|| KUBEADM_SIDECAR.to_string())
}

/// The static pod mounts every file its two configurations name, in the container that reads
/// it, at the same place on the node.
#[test]
fn kubeadm_static_pod_mounts_what_the_configs_name() -> Result<()> {
    let pod = yaml(&read(KUBEADM_POD)?)?;
    assert_eq!(
        (pod["kind"].as_str(), pod["metadata"]["namespace"].as_str()),
        (Some("Pod"), Some("kube-system"))
    );
    assert_eq!(pod["spec"]["hostNetwork"], true, "Envoy's port and admin API are the node's");
    let volumes: BTreeMap<String, String> = pod["spec"]["volumes"]
        .as_array()
        .context("volumes")?
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_string(),
                v["hostPath"]["path"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let container = |list: &str, name: &str| -> Result<Value> {
        pod["spec"][list]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .cloned()
            .with_context(|| format!("no {list} {name}"))
    };
    // (container path, host path, read-only) of a container's mounts.
    let mounts_of = |c: &Value| -> Result<Vec<Mount>> {
        c["volumeMounts"]
            .as_array()
            .context("volumeMounts")?
            .iter()
            .map(|m| {
                let name = m["name"].as_str().unwrap_or_default();
                let host = volumes.get(name).with_context(|| format!("no volume {name}"))?;
                Ok(Mount {
                    source: host.clone(),
                    target: m["mountPath"].as_str().unwrap_or_default().to_string(),
                    read_only: m["readOnly"] == true,
                })
            })
            .collect()
    };
    let envoy_c = container("containers", "envoy")?;
    let sidecar_c = container("containers", "sidecar")?;
    let (envoy_m, sidecar_m) = (mounts_of(&envoy_c)?, mounts_of(&sidecar_c)?);
    assert_eq!(mounts_of(&container("initContainers", "first-table")?)?, sidecar_m);
    // Files the configurations name: mounted where the node keeps them.
    let check = |config: &str, mounts: &[Mount], who: &str| -> Result<()> {
        for path in absolute_paths(&read(config)?) {
            let m =
                mount_of(mounts, &path).with_context(|| format!("{who} does not mount {path} ({config})"))?;
            ensure!(
                m.target == m.source || m.target == "/etc/skewgate",
                "{who}: {path} is not where the node keeps it: {m:?}"
            );
        }
        Ok(())
    };
    check(KUBEADM_ENVOY, &envoy_m, "envoy")?;
    check(KUBEADM_SIDECAR, &sidecar_m, "sidecar")?;
    // cds.json names the TLS files, ecds.json the filter: Envoy reads what the sidecar names.
    check(KUBEADM_SIDECAR, &envoy_m, "envoy")?;
    let config_dir = |ms: &[Mount]| ms.iter().find(|m| m.target == "/etc/skewgate").map(|m| m.source.clone());
    assert_eq!(config_dir(&envoy_m).as_deref(), Some("/etc/kubernetes/skewgate"));
    assert_eq!(config_dir(&sidecar_m).as_deref(), Some("/etc/kubernetes/skewgate"));
    ensure!(
        strings(&envoy_c["args"]).windows(2).any(|w| w == ["-c", "/etc/skewgate/envoy.yaml"]),
        "envoy -c"
    );
    ensure!(
        strings(&sidecar_c["command"]).windows(2).any(|w| w == ["--config", "/etc/skewgate/sidecar.toml"]),
        "sidecar --config"
    );
    // The Envoy image of the compose file, the one the tests run.
    assert_eq!(envoy_c["image"], service(&compose()?, "envoy")?["image"]);
    // The sidecar configuration loads and lines up with the Envoy one and the probes.
    let dir = temp_dir("kubeadm-sidecar")?;
    kubeadm_node(&dir)?;
    let config = kubeadm_sidecar_config(&dir)?;
    assert_eq!(config.apiservers().len(), 3, "three control-plane nodes");
    assert_eq!(config.str("/config/envoy/adminUrl"), Some("http://127.0.0.1:9901"));
    assert_eq!(envoy_c["livenessProbe"]["httpGet"]["port"], 9901);
    let listen: std::net::SocketAddr = config.str("/config/listen").context("listen")?.parse()?;
    assert_eq!(sidecar_c["readinessProbe"]["httpGet"]["port"], listen.port());
    let bootstrap = yaml(&read(KUBEADM_ENVOY)?)?;
    assert_eq!(bootstrap["admin"]["address"]["socket_address"]["address"], "127.0.0.1");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// docs/deploy.md names the kube-apiserver flags of docs/upstream-facts.md, "Front-proxy authentication" and metrics the code exports.
#[test]
fn deploy_doc_names_the_flags_and_real_metrics() -> Result<()> {
    let doc = read("docs/deploy.md")?;
    for flag in [
        "--requestheader-client-ca-file",
        "--requestheader-allowed-names",
        "--requestheader-username-headers",
        "--requestheader-group-headers",
        "--requestheader-extra-headers-prefix",
        "--requestheader-uid-headers",
        "--client-ca-file",
        "kubernetes.default.svc",
        "serverName",
    ] {
        ensure!(doc.contains(flag), "docs/deploy.md does not mention {flag}");
    }
    let filter = read("filter/src/metrics.rs")?;
    for metric in
        ["rerouted_requests_total", "unavailable_replies_total", "merged_discovery_total", "configs_total"]
    {
        ensure!(filter.contains(&format!("skewgate.{metric}")), "the filter has no {metric}");
        ensure!(
            doc.contains(&format!("skewgate_{metric}")),
            "docs/deploy.md does not mention skewgate_{metric}"
        );
    }
    let sidecar = read("sidecar/src/metrics.rs")?;
    let starts_word =
        |at: usize| doc[..at].chars().last().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
    let words = doc.match_indices("skewgate_").filter(|(at, _)| starts_word(*at)).map(|(at, _)| {
        let word: String = doc[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        // `skewgate_filter.wasm` is a file, not a metric.
        let file = doc[at + word.len()..].starts_with('.');
        (word, file)
    });
    for (metric, _) in words.filter(|(_, file)| !file) {
        let metric = metric.as_str();
        let base = metric.trim_end_matches("_count").trim_end_matches("_sum");
        let in_filter = filter.contains(&format!("skewgate.{}", base.trim_start_matches("skewgate_")));
        ensure!(in_filter || sidecar.contains(base), "docs/deploy.md names {metric}, which nothing exports");
    }
    Ok(())
}

/// docs/kubeadm/rbac.yaml grants the sidecar's identity exactly `list` on what it reads from
/// the cluster (`skewgate sync --check`'s `reads`) with the shipped sidecar.toml and with its
/// other way of finding members (identity Leases), and sidecar.toml asks the cluster.
#[test]
fn kubeadm_rbac_grants_exactly_what_the_sidecar_lists() -> Result<()> {
    let dir = temp_dir("kubeadm-rbac")?;
    kubeadm_node(&dir)?;
    let config = kubeadm_sidecar_config(&dir)?;
    assert_eq!(config.str("/config/cluster/members"), Some("endpointSlice"));
    assert_eq!(config.0.pointer("/config/cluster/extensions"), Some(&Value::Bool(true)));
    let leases = dir.join("etc/skewgate/leases.json");
    let mut with_leases = config.0["config"].clone();
    with_leases["cluster"]["members"] = "leases".into();
    std::fs::write(&leases, with_leases.to_string())?;
    let reads: BTreeSet<String> = config.reads().into_iter().chain(Checked::of(&leases)?.reads()).collect();
    let list = yaml(&read("docs/kubeadm/rbac.yaml")?)?;
    let items = list["items"].as_array().context("items")?;
    let role = items.iter().find(|i| i["kind"] == "ClusterRole").context("no ClusterRole")?;
    let binding = items.iter().find(|i| i["kind"] == "ClusterRoleBinding").context("no binding")?;
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().context("rules")? {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                granted.insert((group.clone(), resource, strings(&rule["verbs"])));
            }
        }
    }
    let mut used = BTreeSet::new();
    ensure!(reads.len() == 4, "endpoint slices, leases, CRDs, APIServices: {reads:?}");
    for path in &reads {
        // /apis/<group>/<version>[/namespaces/<ns>]/<resource>[?query]
        let segments: Vec<&str> = path.split('?').next().unwrap_or(path).split('/').collect();
        let (group, resource) = (segments[2], segments[segments.len() - 1]);
        used.insert((group.to_string(), resource.to_string(), vec!["list".to_string()]));
    }
    assert_eq!(granted, used);
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["kind"], "User");
    assert_eq!(binding["subjects"][0]["name"].as_str(), config.str("/config/identity/user"));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
