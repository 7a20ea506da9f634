//! docker-compose.yml run without Docker: every service's command, read from the compose file,
//! started as a plain process on loopback in the compose file's order, each waited for with its
//! own health check. What a container would give it is given another way: its mounts are
//! folders of a temporary root, its network is 127.0.0.1 with every port moved to a free one,
//! and the image's programs are this workspace's binaries and the Envoy 1.40 of the venv.
//! Then kubectl reads a 1.36-only API through Envoy, and apiserver-b is recreated with
//! STANDIN_B_PROFILE=1.36 as the README shows: the table follows and no object is lost.
//!
//! Needs `make wasm` and `make setup` (Envoy and kubectl in .venv), and `skewgate` built next to
//! `skewgate-harness` (`cargo test --workspace` builds both): fails, never skips.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use skewgate_harness::envoy::free_port;
use skewgate_harness::paths;

use crate::compose::{interpolate, strings};

mod compose;

/// Files of skewgate's image that commands name, and what stands in for them here.
fn image_files() -> Result<Vec<(&'static str, PathBuf)>> {
    Ok(vec![("/usr/local/share/skewgate/skewgate_filter.wasm", paths::filter_wasm()?)])
}

fn root() -> PathBuf {
    paths::workspace_root()
}

/// The compose file, read once, with what the processes need to know about it.
struct Topology {
    compose: Value,
    dir: PathBuf,
    /// (network owner, container port) → port on 127.0.0.1 here.
    ports: BTreeMap<(String, u16), u16>,
    /// Host port published → (network owner, container port).
    published: BTreeMap<u16, (String, u16)>,
    /// Container path of a shared mount → folder here.
    shared: BTreeMap<String, PathBuf>,
}

impl Topology {
    fn service(&self, name: &str) -> Result<&Value> {
        self.compose["services"].get(name).with_context(|| format!("no service {name}"))
    }

    fn names(&self) -> Vec<String> {
        self.compose["services"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }

    /// The service whose network a service uses (`network_mode: service:X`).
    fn network(&self, name: &str) -> String {
        self.service(name)
            .ok()
            .and_then(|s| s["network_mode"].as_str())
            .and_then(|m| m.strip_prefix("service:"))
            .unwrap_or(name)
            .to_string()
    }

    fn mounts(&self, name: &str) -> Result<Vec<(String, String)>> {
        strings(&self.service(name)?["volumes"])
            .iter()
            .map(|m| {
                let mut parts = m.split(':');
                let (Some(source), Some(target)) = (parts.next(), parts.next()) else { bail!("volume {m}") };
                Ok((source.to_string(), target.to_string()))
            })
            .collect()
    }

    /// `text` as service `name` sees it, moved to this machine: ports, host names, paths.
    fn localize(&self, name: &str, text: &str, files: &BTreeMap<String, PathBuf>) -> String {
        let net = self.network(name);
        let mut out = text.to_string();
        // Ports a process listens on or connects to, in its own network or published.
        let local = |port: u16| -> Option<u16> {
            self.ports
                .get(&(net.clone(), port))
                .copied()
                .or_else(|| self.published.get(&port).and_then(|k| self.ports.get(k).copied()))
        };
        for form in ["0.0.0.0:", "127.0.0.1:", "localhost:", "/dev/tcp/127.0.0.1/"] {
            out = replace_ports(&out, form, |p| {
                local(p).map(|q| {
                    if form.starts_with("/dev") {
                        format!("/dev/tcp/127.0.0.1/{q}")
                    } else {
                        format!("127.0.0.1:{q}")
                    }
                })
            });
        }
        // Other services by name.
        for other in self.names() {
            let owner = self.network(&other);
            out = replace_ports(&out, &format!("://{other}:"), |p| {
                self.ports.get(&(owner.clone(), p)).map(|q| format!("://127.0.0.1:{q}"))
            });
        }
        // Envoy's YAML and the sidecar's TOML name ports apart from addresses.
        out = replace_ports(&out, "port_value: ", |p| local(p).map(|q| format!("port_value: {q}")));
        out = out.replace("address: 0.0.0.0", "address: 127.0.0.1");
        if out.contains("[[apiservers]]") {
            out = sidecar_endpoints(&out, |host, port| {
                let owner = self.names().into_iter().find(|n| n == host).map(|n| self.network(&n))?;
                self.ports.get(&(owner, port)).copied()
            });
        }
        // Paths: the service's mounts (longest first), then the image's files.
        let mut targets: Vec<(String, PathBuf)> = files.iter().map(|(t, p)| (t.clone(), p.clone())).collect();
        targets.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        for (target, here) in targets {
            out = replace_path(&out, &target, &here.display().to_string());
        }
        out
    }
}

/// Replaces `FORM<port>` where `map` knows the port.
fn replace_ports(text: &str, form: &str, map: impl Fn(u16) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(form) {
        out.push_str(&rest[..at]);
        let after = &rest[at + form.len()..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        match digits.parse::<u16>().ok().and_then(&map) {
            Some(new) => {
                out.push_str(&new);
                rest = &after[digits.len()..];
            }
            None => {
                out.push_str(form);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A path prefix replaced where it is a whole path or a parent folder.
fn replace_path(text: &str, from: &str, to: &str) -> String {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/._-".contains(c);
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let before_ok = rest[..at].chars().last().is_none_or(|c| !path_char(c));
        let after = &rest[at + from.len()..];
        let after_ok = after.chars().next().is_none_or(|c| c == '/' || !path_char(c));
        out.push_str(&rest[..at]);
        out.push_str(if before_ok && after_ok { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `address = "HOST"` then `port = N` in the sidecar's TOML, to 127.0.0.1 and the local port.
fn sidecar_endpoints(text: &str, local: impl Fn(&str, u16) -> Option<u16>) -> String {
    let mut host: Option<String> = None;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(value) = trimmed.strip_prefix("address = \"").and_then(|v| v.strip_suffix('"')) {
            host = Some(value.to_string());
            lines.push("address = \"127.0.0.1\"".to_string());
            continue;
        }
        if let (Some(h), Some(port)) =
            (&host, trimmed.strip_prefix("port = ").and_then(|p| p.parse::<u16>().ok()))
        {
            if let Some(mapped) = local(h, port) {
                lines.push(format!("port = {mapped}"));
                host = None;
                continue;
            }
        }
        lines.push(line.to_string());
    }
    lines.join("\n") + "\n"
}

/// Every port some process of the compose file listens on, by network.
fn listening(c: &Value, net: impl Fn(&str) -> String) -> Result<BTreeSet<(String, u16)>> {
    let mut found = BTreeSet::new();
    let port_of = |s: &str| s.rsplit_once(':').and_then(|(_, p)| p.trim_end_matches('"').parse::<u16>().ok());
    for (name, svc) in c["services"].as_object().context("services")? {
        let args = strings(&svc["command"]);
        for w in args.windows(2).filter(|w| w[0] == "--listen") {
            found.insert((net(name), port_of(&w[1]).context("--listen port")?));
        }
        for volume in strings(&svc["volumes"]) {
            let source = volume.split(':').next().unwrap_or_default();
            let file = root().join(source);
            if !source.starts_with("./") || !file.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&file)?;
            for line in text.lines().map(str::trim) {
                if let Some(v) = line.split_once("port_value: ").map(|(_, v)| v) {
                    let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
                    found.insert((net(name), digits.parse()?));
                }
                if let Some(v) = line.strip_prefix("listen = ") {
                    found.insert((net(name), port_of(v).context("listen")?));
                }
            }
        }
    }
    Ok(found)
}

/// The running processes; killed (and reaped) when dropped.
struct Running {
    children: BTreeMap<String, Child>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Harness {
    topo: Topology,
    bin: PathBuf,
    running: Running,
}

impl Harness {
    fn new(dir: &Path) -> Result<Harness> {
        let compose: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(root().join("docker-compose.yml"))?)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        let net = |name: &str| {
            compose["services"][name]["network_mode"]
                .as_str()
                .and_then(|m| m.strip_prefix("service:"))
                .unwrap_or(name)
                .to_string()
        };
        let mut ports = BTreeMap::new();
        for key in listening(&compose, net)? {
            ports.insert(key, free_port()?);
        }
        let mut published = BTreeMap::new();
        for (name, svc) in compose["services"].as_object().context("services")? {
            for p in strings(&svc["ports"]) {
                let parts: Vec<&str> = p.split(':').collect();
                let (host, container) =
                    (parts[parts.len() - 2].parse::<u16>()?, parts[parts.len() - 1].parse::<u16>()?);
                published.insert(host, (net(name), container));
            }
        }
        // Shared mounts: the same container path is the same folder for every service.
        let mut shared = BTreeMap::new();
        for (name, svc) in compose["services"].as_object().context("services")? {
            for volume in strings(&svc["volumes"]) {
                let mut parts = volume.split(':');
                let (source, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                if source.starts_with("./") && root().join(source).is_file() {
                    continue; // a configuration file: localized per service
                }
                let here = dir.join("mounts").join(source.trim_start_matches("./"));
                std::fs::create_dir_all(&here)?;
                if let Some(before) = shared.insert(target.to_string(), here.clone()) {
                    ensure!(before == here, "{name}: {target} is another mount elsewhere");
                }
            }
        }
        // The image's programs: this workspace's binaries and the venv's Envoy.
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        let harness = PathBuf::from(env!("CARGO_BIN_EXE_skewgate-harness"));
        let skewgate = paths::skewgate_binary()?;
        for (name, target) in [("skewgate-harness", harness), ("skewgate", skewgate)] {
            std::os::unix::fs::symlink(target, bin.join(name))?;
        }
        // Other Envoys may run on this machine: containers would not share their shared memory.
        let envoy =
            format!("#!/bin/sh\nexec {} \"$@\" --use-dynamic-base-id\n", paths::envoy_binary()?.display());
        std::fs::write(bin.join("envoy"), envoy)?;
        Command::new("chmod").arg("+x").arg(bin.join("envoy")).status()?;
        std::fs::create_dir_all(dir.join("logs"))?;
        Ok(Harness {
            topo: Topology { compose, dir: dir.to_path_buf(), ports, published, shared },
            bin,
            running: Running { children: BTreeMap::new() },
        })
    }

    /// Container paths of a service → paths here, its configuration files localized for it.
    fn files(&self, name: &str) -> Result<BTreeMap<String, PathBuf>> {
        let mut files: BTreeMap<String, PathBuf> =
            image_files()?.into_iter().map(|(t, p)| (t.to_string(), p)).collect();
        files.extend(self.topo.shared.iter().map(|(t, p)| (t.clone(), p.clone())));
        for (source, target) in self.topo.mounts(name)? {
            let file = root().join(&source);
            if source.starts_with("./") && file.is_file() {
                let here =
                    self.topo.dir.join("config").join(name).join(file.file_name().context("file name")?);
                files.insert(target.clone(), here);
            }
        }
        // The configuration files, written after every path is known.
        let localized = files.clone();
        for (source, target) in self.topo.mounts(name)? {
            let file = root().join(&source);
            if source.starts_with("./") && file.is_file() {
                let here = &localized[&target];
                std::fs::create_dir_all(here.parent().context("parent")?)?;
                let text = std::fs::read_to_string(&file)?;
                std::fs::write(here, self.topo.localize(name, &text, &localized))?;
            }
        }
        Ok(files)
    }

    fn command(&self, name: &str, env: &BTreeMap<&str, &str>) -> Result<Command> {
        let svc = self.topo.service(name)?;
        let files = self.files(name)?;
        let args: Vec<String> = strings(&svc["command"])
            .iter()
            .map(|a| self.topo.localize(name, &interpolate(a, env), &files))
            .collect();
        let (program, rest) = args.split_first().context("empty command")?;
        // The image's programs first, as its PATH would find them.
        let mine = self.bin.join(program);
        let mut cmd = if mine.exists() { Command::new(mine) } else { Command::new(program) };
        cmd.args(rest).current_dir(&self.topo.dir).stdin(Stdio::null());
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default());
        cmd.env("PATH", path);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(name))?;
        cmd.stdout(log.try_clone()?).stderr(log);
        Ok(cmd)
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.topo.dir.join("logs").join(format!("{name}.log"))
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// The service's own health check, localized, until it passes.
    fn wait_healthy(&mut self, name: &str, timeout: Duration) -> Result<()> {
        let test = strings(&self.topo.service(name)?["healthcheck"]["test"]);
        ensure!(test.first().map(String::as_str) == Some("CMD"), "{name}: health check {test:?}");
        let files = self.files(name)?;
        let args: Vec<String> = test[1..].iter().map(|a| self.topo.localize(name, a, &files)).collect();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.running.children.get_mut(name) {
                if let Some(status) = child.try_wait()? {
                    bail!("{name} exited ({status}) before it was healthy:\n{}", self.log(name));
                }
            }
            let ok = Command::new(&args[0])
                .args(&args[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            if ok.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{name} not healthy after {timeout:?} ({args:?}):\n{}", self.log(name));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn start(&mut self, name: &str, env: &BTreeMap<&str, &str>) -> Result<()> {
        let mut cmd = self.command(name, env)?;
        let svc = self.topo.service(name)?;
        if svc.get("healthcheck").is_some() {
            let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
            self.running.children.insert(name.to_string(), child);
            self.wait_healthy(name, Duration::from_secs(60))
        } else {
            let status = cmd.status().with_context(|| format!("running {name}"))?;
            ensure!(status.success(), "{name} failed ({status}):\n{}", self.log(name));
            Ok(())
        }
    }

    fn stop(&mut self, name: &str) -> Result<()> {
        let mut child =
            self.running.children.remove(name).with_context(|| format!("{name} is not running"))?;
        Command::new("kill").arg("-TERM").arg(child.id().to_string()).status()?;
        child.wait()?;
        Ok(())
    }

    /// Every service, dependencies first (the compose file's `depends_on`).
    fn order(&self) -> Result<Vec<String>> {
        let mut done: Vec<String> = Vec::new();
        let names = self.topo.names();
        while done.len() < names.len() {
            let before = done.len();
            for name in &names {
                if done.contains(name) {
                    continue;
                }
                let svc = self.topo.service(name)?;
                let deps: Vec<String> =
                    svc["depends_on"].as_object().map(|d| d.keys().cloned().collect()).unwrap_or_default();
                if deps.iter().all(|d| done.contains(d)) {
                    done.push(name.clone());
                }
            }
            ensure!(done.len() > before, "depends_on has a cycle: {done:?} of {names:?}");
        }
        Ok(done)
    }

    fn mount(&self, target: &str) -> Result<PathBuf> {
        self.topo.shared.get(target).cloned().with_context(|| format!("nothing mounted at {target}"))
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String)> {
    let out =
        Command::new(paths::kubectl_binary()?).arg("--kubeconfig").arg(kubeconfig).args(args).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

/// Who serves resourceclaims.v1.resource.k8s.io in the table Envoy runs.
fn claims_served_by(ecds: &Path) -> Result<Vec<String>> {
    let ecds: Value = serde_json::from_slice(&std::fs::read(ecds)?)?;
    let table: Value = serde_json::from_str(skewgate_envoy::table_from_ecds(&ecds).context("no table")?)?;
    let gv = table["groupVersions"]
        .as_array()
        .and_then(|gvs| gvs.iter().find(|gv| gv["group"] == "resource.k8s.io" && gv["version"] == "v1"))
        .context("no resource.k8s.io/v1")?;
    Ok(strings(&gv["resources"]["resourceclaims"]))
}

fn served_by(verbose: &str) -> Vec<String> {
    verbose
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("X-Skewgate-Served-By: ")
                .or_else(|| l.trim().strip_prefix("x-skewgate-served-by: "))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_compose_file_runs_as_plain_processes() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("skewgate-compose-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut h = Harness::new(&dir)?;
    let none = BTreeMap::new();
    let order = h.order()?;
    assert_eq!(order.last().map(String::as_str), Some("sidecar"));
    for name in &order {
        h.start(name, &none)?;
    }

    let out = h.mount("/out")?;
    let kubeconfig = out.join("kubeconfig");
    // From another folder: the kubeconfig's certificate paths are relative to it.
    let (ok, text) = kubectl(&kubeconfig, &["get", "resourceclaims.v1.resource.k8s.io", "-A", "-v=8"])?;
    ensure!(ok, "{text}");
    ensure!(
        served_by(&text).last().map(String::as_str) == Some("c"),
        "only c serves resourceclaims/v1:\n{text}"
    );
    let (ok, text) = kubectl(&kubeconfig, &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])?;
    ensure!(ok && text == "alice", "{text}");
    let (ok, text) = kubectl(
        &kubeconfig,
        &["--context", "skewgate-admin", "create", "configmap", "kept", "--from-literal=k=v"],
    )?;
    ensure!(ok, "{text}");

    // STANDIN_B_PROFILE=1.36 docker compose up -d --no-deps --force-recreate apiserver-b
    let ecds = h.mount("/var/lib/skewgate/envoy")?.join("ecds/ecds.json");
    assert_eq!(claims_served_by(&ecds)?, ["c"]);
    h.stop("apiserver-b")?;
    h.start("apiserver-b", &BTreeMap::from([("STANDIN_B_PROFILE", "1.36")]))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while claims_served_by(&ecds)? != ["b", "c"] {
        ensure!(Instant::now() < deadline, "the table did not follow b's upgrade:\n{}", h.log("sidecar"));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The table on disk is not enough: Envoy must send resourceclaims to b as well, and to
    // nobody else. Random balancing between b and c: 40 gets without b would be a 2^-40 chance.
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        let (ok, text) = kubectl(&kubeconfig, &["get", "resourceclaims.v1.resource.k8s.io", "-A", "-v=8"])?;
        ensure!(ok, "{text}");
        let by = served_by(&text).last().cloned().context("no x-skewgate-served-by in kubectl's log")?;
        ensure!(by == "b" || by == "c", "resourceclaims served by {by}");
        seen.insert(by);
        if seen.len() == 2 {
            break;
        }
    }
    ensure!(seen.contains("b"), "Envoy never sent resourceclaims to the upgraded b: {seen:?}");
    // The store outlives the stand-in, as etcd outlives an apiserver.
    let (ok, text) = kubectl(&kubeconfig, &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"])?;
    ensure!(ok && text == "v", "{text}");

    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
