//! README's "In Docker" section, run for real: every command of it, as written, from a clean copy
//! of the repository, on a real Docker engine with Compose v2, each step's outcome asserted.
//! `make compose` runs it (scripts/docker-env.sh starts the engine and makes the registry images
//! where no registry answers). Not part of `cargo test`: it needs an engine, and fails without one
//! rather than skip.
//!
//! Beyond README's commands it checks what they promise: that c alone serves resourceclaims/v1
//! until b is upgraded, that objects outlive a recreated apiserver, that Envoy serves the last
//! table while the sidecar is down and the sidecar catches up with a change made meanwhile, that
//! Docker restarts a sidecar that crashes, and that `down -v` leaves nothing of the project.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use skewgate_core::table::RoutingTable;
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::scenario::serving;
use skewgate_harness::{kubectl, paths};

/// The compose project the test runs under: not README's `skewgate`, so that a cluster of the
/// user's own is left alone.
const PROJECT: &str = "skewgate-compose-test";
/// Envoy's published port, which the kubeconfig names.
const FRONT_DOOR: &str = "127.0.0.1:6443";
/// What docker-compose.yml asks for Envoy unless ENVOY_NOFILE says otherwise.
const ENVOY_NOFILE: u64 = 262_144;

/// The commands of README's "In Docker" block, without their comments.
fn readme_commands() -> Result<Vec<String>> {
    let readme = std::fs::read_to_string(paths::workspace_root().join("README.md"))?;
    let section = readme.split("### In Docker").nth(1).context("README has no \"### In Docker\"")?;
    let block = section.split("```sh").nth(1).and_then(|b| b.split("```").next()).context("no sh block")?;
    Ok(block
        .lines()
        .map(|l| l.split("  #").next().unwrap_or_default().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// A clean clone: the files git tracks, as they are in the work tree (uncommitted edits included,
/// so that what is tested is what is about to be committed), and nothing else: no `out/`, no
/// `target/`, no venv.
fn clean_copy(to: &Path) -> Result<()> {
    let root = paths::workspace_root();
    let files = Command::new("git").arg("-C").arg(&root).args(["ls-files", "-z"]).output()?;
    ensure!(files.status.success(), "git ls-files: {}", String::from_utf8_lossy(&files.stderr));
    for name in files.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name)?;
        let (from, dest) = (root.join(name), to.join(name));
        if !from.exists() {
            continue; // deleted in the work tree, not yet committed
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&from, &dest).with_context(|| format!("copying {name}"))?;
    }
    Ok(())
}

struct Step {
    ok: bool,
    text: String,
    took: Duration,
}

/// The clone, the environment every command runs in, and `down -v` if the test stops early.
struct Compose {
    dir: PathBuf,
    path: String,
    done: bool,
}

impl Compose {
    fn sh(&self, command: &str) -> Result<Step> {
        println!("$ {command}");
        let started = Instant::now();
        let out = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(&self.dir)
            .env("PATH", &self.path)
            .env("COMPOSE_PROJECT_NAME", PROJECT)
            .output()
            .with_context(|| format!("running {command}"))?;
        let step = Step { ok: out.status.success(), text: text(&out), took: started.elapsed() };
        println!("  ({:.1} s, {})", step.took.as_secs_f64(), if step.ok { "ok" } else { "failed" });
        Ok(step)
    }

    /// A command that must succeed; its output.
    fn run(&self, command: &str) -> Result<String> {
        let step = self.sh(command)?;
        ensure!(step.ok, "`{command}` failed:\n{}", step.text);
        Ok(step.text)
    }

    fn kubectl(&self, args: &str) -> Result<String> {
        self.run(&format!("kubectl --kubeconfig out/kubeconfig {args}"))
    }

    /// Who answered a GET of resourceclaims/v1 through Envoy (the stand-ins name themselves in
    /// `x-skewgate-served-by`, which kubectl logs at -v=8).
    fn claims_answered_by(&self) -> Result<String> {
        let text = self.kubectl("get resourceclaims.v1.resource.k8s.io -A -v=8")?;
        served_by(&text).context(format!("no x-skewgate-served-by in kubectl's log:\n{text}"))
    }

    /// Every apiserver that answers resourceclaims through Envoy within `tries` GETs. Envoy picks
    /// at random among a set's servers: 40 GETs miss one of two with a chance of 2^-40.
    fn claims_answerers(&self, want: usize) -> Result<BTreeSet<String>> {
        let mut seen = BTreeSet::new();
        for _ in 0..40 {
            seen.insert(self.claims_answered_by()?);
            if seen.len() >= want {
                break;
            }
        }
        Ok(seen)
    }

    /// The apiservers that serve resourceclaims/v1 in the table on Envoy's volume.
    fn claims_in_table(&self) -> Result<Vec<String>> {
        let ecds = self.run("docker compose exec -T sidecar cat /var/lib/skewgate/envoy/ecds/ecds.json")?;
        claims_of(&ecds)
    }

    fn wait_for_table(&self, want: &[&str], within: Duration) -> Result<Duration> {
        let started = Instant::now();
        loop {
            let now = self.claims_in_table()?;
            if now == want {
                return Ok(started.elapsed());
            }
            ensure!(
                started.elapsed() < within,
                "the table still says {now:?} serve resourceclaims, not {want:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn container(&self, service: &str) -> Result<Value> {
        let id = self.run(&format!("docker compose ps -aq {service}"))?;
        let inspect = self.run(&format!("docker inspect {}", id.trim()))?;
        let all: Value = serde_json::from_str(&inspect)?;
        all.get(0).cloned().context("docker inspect returned nothing")
    }

    fn wait_healthy(&self, service: &str, within: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let c = self.container(service)?;
            if c["State"]["Health"]["Status"] == "healthy" {
                return Ok(());
            }
            ensure!(started.elapsed() < within, "{service} not healthy after {within:?}: {}", c["State"]);
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Containers, networks and volumes Docker still has of the project.
    fn leftovers(&self) -> Result<Vec<String>> {
        let label = format!("label=com.docker.compose.project={PROJECT}");
        let mut left = Vec::new();
        for kind in ["ps -a", "network ls", "volume ls"] {
            let out = self.run(&format!("docker {kind} -q --filter {label}"))?;
            left.extend(out.lines().filter(|l| !l.trim().is_empty()).map(|l| format!("{kind}: {l}")));
        }
        Ok(left)
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.sh("docker compose logs --no-color --tail 40 sidecar envoy");
            let _ = self.sh("docker compose down -v --timeout 5");
        }
        // ./out is written by the containers as root; the test runs as root too.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Who answered the last request of a `kubectl -v=8` log (the stand-ins name themselves).
fn served_by(kubectl_log: &str) -> Option<String> {
    kubectl::exchanges(kubectl_log).last()?.header(SERVED_BY).map(str::to_owned)
}

/// Who serves resourceclaims/v1 in the table an ecds.json carries.
fn claims_of(ecds: &str) -> Result<Vec<String>> {
    let ecds: Value = serde_json::from_str(ecds)?;
    let table = skewgate_envoy::table_from_ecds(&ecds).context("no table in ecds.json")?;
    let table = RoutingTable::from_json(table.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(serving(&table, "resourceclaims.v1.resource.k8s.io"))
}

/// The hard file limit this machine gives its processes, and with them the engine's containers.
fn hard_nofile() -> Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let line = limits.lines().find(|l| l.starts_with("Max open files")).context("no open-files limit")?;
    let hard = line.split_whitespace().nth(4).context("limits line")?;
    Ok(if hard == "unlimited" { u64::MAX } else { hard.parse()? })
}

fn image_size(c: &Compose, image: &str) -> Result<String> {
    let bytes: u64 = c.run(&format!("docker image inspect -f '{{{{.Size}}}}' {image}"))?.trim().parse()?;
    Ok(format!("{image}: {:.0} MB", bytes as f64 / 1e6))
}

#[test]
fn readme_in_docker_runs_as_written() -> Result<()> {
    let expected = [
        "docker compose up -d --wait --build",
        "kubectl --kubeconfig out/kubeconfig get resourceclaims.v1.resource.k8s.io -A",
        "kubectl --kubeconfig out/kubeconfig api-resources",
        "kubectl --kubeconfig out/kubeconfig auth whoami",
        "kubectl --kubeconfig out/kubeconfig --context skewgate-admin auth whoami",
        "STANDIN_B_PROFILE=1.36 docker compose up -d --no-deps --force-recreate apiserver-b",
        "docker compose exec sidecar skewgate table --table /var/lib/skewgate/envoy/ecds/ecds.json",
        "docker compose kill sidecar",
        "docker compose start sidecar",
        "docker compose exec sidecar curl -s 127.0.0.1:9901/stats/prometheus | grep ^skewgate_",
        "docker compose down -v",
    ];
    let readme = readme_commands()?;
    assert_eq!(readme, expected, "README's \"In Docker\" commands are what this test runs, in this order");
    let mut readme = readme.into_iter();
    let mut next = || readme.next().context("README's commands ran out");

    let kubectl = paths::kubectl_binary()?;
    let kubectl_dir = kubectl.parent().context("kubectl's folder")?;
    let dir = std::env::temp_dir().join(format!("skewgate-compose-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    clean_copy(&dir)?;
    let path = format!("{}:{}", kubectl_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Compose { dir, path, done: false };

    ensure!(
        std::net::TcpStream::connect(FRONT_DOOR).is_err(),
        "something already listens on {FRONT_DOOR}, where the compose file publishes Envoy"
    );
    let left = c.leftovers()?;
    ensure!(left.is_empty(), "Docker still has a project {PROJECT} from an earlier run: {left:?}");
    let nofile = hard_nofile()?;
    if nofile < ENVOY_NOFILE {
        println!(
            "this machine's hard file limit is {nofile}, below Envoy's {ENVOY_NOFILE}: .env sets ENVOY_NOFILE={nofile}, as README says"
        );
        std::fs::write(c.dir.join(".env"), format!("ENVOY_NOFILE={nofile}\n"))?;
    }

    // The image on its own first, so that its build time and `up`'s are two figures.
    let build = c.sh("docker compose build")?;
    ensure!(build.ok, "docker compose build:\n{}", build.text);
    let up = c.sh(&next()?)?;
    ensure!(up.ok, "docker compose up:\n{}", up.text);
    for service in ["store", "apiserver-a", "apiserver-b", "apiserver-c", "envoy", "sidecar"] {
        let state = c.container(service)?;
        ensure!(state["State"]["Health"]["Status"] == "healthy", "{service}: {}", state["State"]);
    }

    let claims = c.run(&next()?)?;
    ensure!(claims.contains("No resources found"), "{claims}");
    // What the empty list does not show: only c serves resourceclaims/v1, and Envoy knows it.
    c.kubectl("--context skewgate-admin create namespace upgrade")?;
    c.kubectl("--context skewgate-admin create configmap kept -n upgrade --from-literal=k=v")?;
    assert_eq!(c.claims_answerers(2)?, BTreeSet::from(["c".to_string()]));

    // One API: resources of the 1.36 era (only c) beside the 1.33 era's versions (only a and b).
    let resources = c.run(&next()?)?;
    ensure!(
        resources
            .lines()
            .any(|l| l.starts_with("mutatingadmissionpolicies ")
                && l.contains("admissionregistration.k8s.io/v1 ")),
        "api-resources lacks c's mutatingadmissionpolicies:\n{resources}"
    );
    ensure!(resources.lines().any(|l| l.starts_with("resourceclaims ") && l.contains("resource.k8s.io/v1 ")));
    let versions = c.kubectl("api-versions")?;
    for gv in ["resource.k8s.io/v1", "networking.k8s.io/v1beta1", "certificates.k8s.io/v1alpha1"] {
        ensure!(versions.lines().any(|l| l == gv), "api-versions lacks {gv}:\n{versions}");
    }

    let alice = c.run(&next()?)?;
    ensure!(
        alice.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Username", "alice"]),
        "{alice}"
    );
    let admin = c.run(&next()?)?;
    ensure!(
        admin.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Username", "admin"]),
        "{admin}"
    );
    ensure!(admin.contains("system:masters"), "{admin}");

    // b upgraded in place: a new container at the 1.36 profile, the object store kept.
    let before = c.container("apiserver-b")?["Id"].clone();
    c.run(&next()?)?;
    ensure!(c.container("apiserver-b")?["Id"] != before, "apiserver-b was not recreated");
    c.wait_healthy("apiserver-b", Duration::from_secs(60))?;
    let followed = c.wait_for_table(&["b", "c"], Duration::from_secs(30))?;
    println!("the table named b for resourceclaims {:.1} s after b was healthy", followed.as_secs_f64());
    let answerers = c.claims_answerers(2)?;
    ensure!(
        answerers == BTreeSet::from(["b".into(), "c".into()]),
        "resourceclaims answered by {answerers:?}"
    );
    ensure!(c.kubectl("get configmap kept -n upgrade -o jsonpath={.data.k}")? == "v", "the object was lost");

    let table = c.run(&next()?)?;
    let row =
        table.lines().find(|l| l.contains("resource.k8s.io/v1/resourceclaims ")).context(table.clone())?;
    ensure!(row.split_whitespace().rev().take(3).collect::<Vec<_>>() == ["✓", "✓", "-"], "{row}");

    // The sidecar down: Envoy keeps the last table, and the sidecar catches up when it is back
    // with a change it missed (a upgraded meanwhile).
    c.run(&next()?)?;
    ensure!(c.container("sidecar")?["State"]["Running"] == false, "the sidecar still runs");
    c.run("STANDIN_A_PROFILE=1.36 docker compose up -d --no-deps --force-recreate --wait apiserver-a")?;
    let answerers = c.claims_answerers(2)?;
    ensure!(answerers == BTreeSet::from(["b".into(), "c".into()]), "with the sidecar down: {answerers:?}");
    ensure!(c.kubectl("get configmap kept -n upgrade -o jsonpath={.data.k}")? == "v");
    c.run(&next()?)?;
    let caught_up = c.wait_for_table(&["a", "b", "c"], Duration::from_secs(30))?;
    println!("the restarted sidecar named a for resourceclaims within {:.1} s", caught_up.as_secs_f64());
    let answerers = c.claims_answerers(3)?;
    ensure!(answerers.contains("a"), "Envoy never sent resourceclaims to the upgraded a: {answerers:?}");

    // A crash, not a stop: Docker's restart policy brings the sidecar back by itself.
    let sidecar = c.container("sidecar")?;
    let (pid, restarts) = (sidecar["State"]["Pid"].as_u64().context("pid")?, sidecar["RestartCount"].clone());
    c.run(&format!("kill -KILL {pid}"))?;
    let started = Instant::now();
    loop {
        let now = c.container("sidecar")?;
        if now["RestartCount"] != restarts && now["State"]["Health"]["Status"] == "healthy" {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the crashed sidecar did not come back: {}",
            now["State"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("Docker restarted the crashed sidecar, healthy in {:.1} s", started.elapsed().as_secs_f64());

    let metrics = c.run(&next()?)?;
    let value = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    ensure!(value("skewgate_requests_total").is_some_and(|v| v > 0.0), "no requests counted:\n{metrics}");
    ensure!(
        value("skewgate_rerouted_requests_total{group=\"resource.k8s.io\",version=\"v1\",resource=\"resourceclaims\"}")
            .is_some_and(|v| v > 0.0),
        "no resourceclaims rerouted:\n{metrics}"
    );

    println!(
        "images: {}",
        [image_size(&c, "skewgate-local:dev")?, image_size(&c, "envoyproxy/envoy:v1.40.0")?,].join(", ")
    );
    println!(
        "docker compose build: {:.1} s; docker compose up -d --wait --build (built already): {:.1} s",
        build.took.as_secs_f64(),
        up.took.as_secs_f64()
    );

    c.run(&next()?)?;
    c.done = true;
    let left = c.leftovers()?;
    ensure!(left.is_empty(), "`docker compose down -v` left: {left:?}");
    if let Ok(extra) = next() {
        bail!("README command not run: {extra}");
    }
    Ok(())
}
