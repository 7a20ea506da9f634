//! docs/deploy.md followed end to end on real kube-apiservers: a kubeadm control plane's files, the
//! guide's own commands, and docs/kubeadm/skewgate.yaml run by Docker as a kubelet would run it.
//! `make compose KUBE_APISERVER=PATH ETCD=PATH` runs it after the compose test; it fails, never
//! skips, without them.
//!
//! What stands in for kubeadm and the kubelet, and why it is faithful where it matters:
//! - three control-plane nodes are three addresses of this machine, the guide's own
//!   (10.0.0.11-13, added to `lo` for the test), each with a kube-apiserver on :6443 started
//!   with the flags kubeadm writes plus the guide's `--requestheader-allowed-names`; cp-1 and
//!   cp-2 emulate 1.33 (mid-upgrade), cp-3 is the binary's own release. One etcd serves all three;
//! - `/etc/kubernetes` is a folder of a scratch root laid out as kubeadm lays it out, its
//!   certificates made with openssl as kubeadm makes them, and the guide's openssl recipe run as
//!   written for skewgate's front-proxy certificate;
//! - the guide's image build command, then every init container and container of skewgate.yaml
//!   with its image, command, arguments, environment and mounts (hostPath under the scratch
//!   root), on the host network, init containers to completion in order: what a kubelet does
//!   with a static pod. docs/kubeadm/envoy.yaml, sidecar.toml and rbac.yaml are used unchanged.
//!
//! Then the guide's checks, through Envoy on cp-1:7443 with a kubeconfig like the guide's
//! `canary.conf`: /readyz, `auth whoami`, resourceclaims/v1 (only cp-3 serves it), and
//! `skewgate table --config` in the sidecar container.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use skewgate_harness::paths;

const NODES: [(&str, &str); 3] = [("cp-1", "10.0.0.11"), ("cp-2", "10.0.0.12"), ("cp-3", "10.0.0.13")];
/// The pod's name prefix for its containers, so that they are found and removed.
const POD: &str = "skewgate-static-pod";
/// What the guide tells operators to build and push; tagged here, never pushed.
const GUIDE_IMAGE: &str = "registry.example.com/skewgate:0.1.0";

fn sh(command: &str, dir: &Path) -> Result<String> {
    let out = Command::new("bash").arg("-c").arg(command).current_dir(dir).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "`{command}` failed:\n{text}");
    Ok(text)
}

fn run(program: &str, args: &[String]) -> Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "{program} {}: {text}", args.join(" "));
    Ok(text)
}

/// The fenced `sh` block of docs/deploy.md that follows `after`.
fn guide_block(after: &str) -> Result<String> {
    let guide = std::fs::read_to_string(paths::workspace_root().join("docs/deploy.md"))?;
    let rest = guide.split(after).nth(1).with_context(|| format!("docs/deploy.md has no \"{after}\""))?;
    let block = rest.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).context("no sh block")?;
    Ok(block.to_string())
}

/// `/etc/kubernetes/pki` as `kubeadm init phase certs` leaves it (the certificates skewgate's pod
/// and this test use), made with openssl.
fn kubeadm_pki(pki: &Path) -> Result<()> {
    std::fs::create_dir_all(pki)?;
    let sans = "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
                DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1,IP:10.0.0.11,IP:10.0.0.12,IP:10.0.0.13";
    sh(
        &format!(
            r#"set -e
ca() {{ openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$1.key" -out "$1.crt" -days 2 -subj "/CN=$2" \
  -addext keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign 2>/dev/null; }}
leaf() {{ # name, CA, subject, extensions
  openssl req -new -nodes -newkey rsa:2048 -keyout "$1.key" -subj "$3" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 2 -out "$1.crt" \
    -extfile <(printf "$4") 2>/dev/null
  rm "$1.csr"; chmod 600 "$1.key"; }}
ca ca kubernetes
ca front-proxy-ca front-proxy-ca
leaf apiserver ca /CN=kube-apiserver "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName={sans}\n"
leaf front-proxy-client front-proxy-ca /CN=front-proxy-client "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
leaf admin ca "/O=system:masters/CN=kubernetes-admin" "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
"#
        ),
        pki,
    )?;
    Ok(())
}

/// kube-apiserver's flags as kubeadm writes them into its static pod (etcd without TLS here:
/// etcd is not what is under test), with the guide's extra allowed name.
fn kubeadm_flags(pki: &Path, address: &str, etcd: &str) -> Vec<String> {
    let p = |f: &str| pki.join(f).display().to_string();
    vec![
        format!("--advertise-address={address}"),
        format!("--bind-address={address}"),
        "--secure-port=6443".into(),
        "--allow-privileged=true".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--client-ca-file={}", p("ca.crt")),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--enable-bootstrap-token-auth=true".into(),
        format!("--etcd-servers={etcd}"),
        format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
        format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
        "--requestheader-allowed-names=front-proxy-client,skewgate-front-proxy".into(),
        format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-uid-headers=X-Remote-Uid".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        "--service-cluster-ip-range=10.96.0.0/12".into(),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
    ]
}

/// A PATH whose `docker` builds with BuildKit, as the guide's command needs (its Dockerfile caches
/// cargo's folders across builds). Docker's CLI since 23.0 does it through its buildx plugin, 20.10
/// (Debian 12's docker.io) when DOCKER_BUILDKIT=1 asks; a newer CLI without the plugin cannot, and
/// then the engine's own CLI from its package is taken, said out loud.
fn builder_path() -> Result<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let buildx =
        Command::new("docker").args(["buildx", "version"]).output().is_ok_and(|o| o.status.success());
    let client = run("docker", &["version".into(), "--format".into(), "{{.Client.Version}}".into()])?;
    let major: u32 = client.trim().split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if buildx || major < 23 {
        return Ok(path);
    }
    let engine_cli = Path::new("/usr/bin/docker");
    ensure!(
        engine_cli.exists(),
        "docker {} has no buildx plugin, and no other docker CLI is at /usr/bin",
        client.trim()
    );
    println!(
        "docker {} on PATH has no buildx plugin: the guide's build runs with /usr/bin/docker",
        client.trim()
    );
    Ok(format!("/usr/bin:{path}"))
}

fn kubeconfig(path: &Path, pki: &Path, server: &str) -> Result<()> {
    let p = |f: &str| pki.join(f).display().to_string();
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
             certificate-authority: {}\nusers:\n- name: admin\n  user:\n    client-certificate: {}\n    \
             client-key: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: admin}}\ncurrent-context: c\n",
            p("ca.crt"),
            p("admin.crt"),
            p("admin.key")
        ),
    )?;
    Ok(())
}

/// A container of the pod, as `docker run` arguments: a kubelet's translation of the spec.
fn docker_args(pod: &Value, container: &Value, root: &Path, detach: bool) -> Result<Vec<String>> {
    let name = container["name"].as_str().context("container name")?;
    let mut args = vec!["run".to_string(), "--name".into(), format!("{POD}-{name}")];
    args.push(if detach { "--detach".into() } else { "--rm".into() });
    if pod["spec"]["hostNetwork"] == true {
        args.extend(["--network".into(), "host".into()]);
    }
    for env in container["env"].as_array().into_iter().flatten() {
        let (Some(k), Some(v)) = (env["name"].as_str(), env["value"].as_str()) else { bail!("env {env}") };
        args.extend(["--env".into(), format!("{k}={v}")]);
    }
    let volumes = pod["spec"]["volumes"].as_array().context("volumes")?;
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let volume = mount["name"].as_str().context("mount name")?;
        let target = mount["mountPath"].as_str().context("mountPath")?;
        let host = volumes
            .iter()
            .find(|v| v["name"] == volume)
            .and_then(|v| v["hostPath"]["path"].as_str())
            .with_context(|| format!("volume {volume} is not a hostPath"))?;
        let source = root.join(host.trim_start_matches('/'));
        let kind = volumes.iter().find(|v| v["name"] == volume).map(|v| &v["hostPath"]["type"]);
        match kind.and_then(Value::as_str) {
            Some("DirectoryOrCreate") => std::fs::create_dir_all(&source)?,
            Some("Directory") => ensure!(source.is_dir(), "hostPath {host} is not a directory"),
            Some("File") => ensure!(source.is_file(), "hostPath {host} is not a file"),
            other => bail!("hostPath type {other:?}"),
        }
        let ro = if mount["readOnly"] == true { ":ro" } else { "" };
        args.extend(["--volume".into(), format!("{}:{target}{ro}", source.display())]);
    }
    // A pod's `command` replaces the image's entrypoint and `args` its command, as here.
    let command: Vec<String> = container["command"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    if let Some((first, _)) = command.split_first() {
        args.extend(["--entrypoint".into(), first.clone()]);
    }
    args.push(container["image"].as_str().context("image")?.to_string());
    args.extend(command.iter().skip(1).cloned());
    for a in container["args"].as_array().into_iter().flatten() {
        args.push(a.as_str().context("arg")?.to_string());
    }
    Ok(args)
}

/// Everything the test started, undone in reverse order whatever happens.
struct Node {
    root: PathBuf,
    addresses: Vec<String>,
    processes: Vec<(String, Child)>,
    containers: Vec<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        for name in &self.containers {
            if std::thread::panicking() || std::env::var_os("SKEWGATE_KEEP").is_some() {
                let _ = Command::new("docker").args(["logs", "--tail", "30", name]).status();
            }
            let _ = Command::new("docker").args(["rm", "-f", name]).stdout(Stdio::null()).status();
        }
        for (_, child) in self.processes.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for a in &self.addresses {
            let _ = Command::new("ip").args(["addr", "del", &format!("{a}/32"), "dev", "lo"]).status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn wait_for(what: &str, within: Duration, mut ready: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let started = Instant::now();
    loop {
        if ready()? {
            return Ok(started.elapsed());
        }
        ensure!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The nodes whose apiservers answered the `n` requests whose path holds `marker`, from Envoy's
/// access log (`upstream=<address>:6443`).
fn wait_for_answers(container: &str, marker: &str, n: usize) -> Result<BTreeSet<String>> {
    let mut lines = Vec::new();
    wait_for(&format!("{n} access log lines with {marker}"), Duration::from_secs(10), || {
        let log = run("docker", &["logs".into(), container.into()])?;
        lines = log.lines().filter(|l| l.contains(marker)).map(str::to_string).collect();
        Ok(lines.len() >= n)
    })?;
    lines
        .iter()
        .map(|l| {
            let upstream =
                l.split_whitespace().find_map(|f| f.strip_prefix("upstream=")).context(l.clone())?;
            let address = upstream.split(':').next().unwrap_or_default();
            NODES
                .iter()
                .find(|(_, a)| *a == address)
                .map(|(id, _)| id.to_string())
                .with_context(|| format!("answered by {upstream}, no node: {l}"))
        })
        .collect()
}

#[test]
fn the_deploy_guide_runs_on_real_apiservers() -> Result<()> {
    let kube_apiserver = std::env::var("SKEWGATE_KUBE_APISERVER").context(
        "SKEWGATE_KUBE_APISERVER: the kube-apiserver binary (make compose KUBE_APISERVER=PATH ETCD=PATH)",
    )?;
    let etcd_binary = std::env::var("SKEWGATE_ETCD").context("SKEWGATE_ETCD: the etcd binary")?;
    let kubectl = paths::kubectl_binary()?;
    let repo = paths::workspace_root();
    let leftover = run("docker", &["ps".into(), "-aq".into(), "--filter".into(), format!("name={POD}-")])?;
    ensure!(leftover.trim().is_empty(), "containers of an earlier run are still there: {leftover}");

    let root = std::env::temp_dir().join(format!("skewgate-static-pod-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut node =
        Node { root: root.clone(), addresses: Vec::new(), processes: Vec::new(), containers: Vec::new() };
    let pki = root.join("etc/kubernetes/pki");
    kubeadm_pki(&pki)?;
    // The guide's recipe, as written, in kubeadm's folder.
    let recipe = guide_block("Issue the front-proxy client certificate once")?;
    ensure!(
        recipe.starts_with("cd /etc/kubernetes/pki\n"),
        "the recipe no longer starts in kubeadm's folder:\n{recipe}"
    );
    sh(recipe.trim_start_matches("cd /etc/kubernetes/pki\n"), &pki)?;
    let subject = sh("openssl x509 -in skewgate-front-proxy.crt -noout -subject -issuer", &pki)?;
    ensure!(
        subject.contains("CN = skewgate-front-proxy") && subject.contains("CN = front-proxy-ca"),
        "{subject}"
    );

    for (_, address) in NODES {
        run("ip", &["addr".into(), "add".into(), format!("{address}/32"), "dev".into(), "lo".into()])?;
        node.addresses.push(address.to_string());
    }
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs)?;
    let etcd_port = skewgate_harness::envoy::free_port()?;
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let log = |name: &str| -> Result<Stdio> { Ok(Stdio::from(std::fs::File::create(logs.join(name))?)) };
    let etcd = Command::new(&etcd_binary)
        .args(["--data-dir", &root.join("etcd").display().to_string()])
        .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{}", skewgate_harness::envoy::free_port()?)])
        .stdout(log("etcd.log")?)
        .stderr(log("etcd.err")?)
        .spawn()?;
    node.processes.push(("etcd".into(), etcd));
    for (i, (id, address)) in NODES.iter().enumerate() {
        let mut flags = kubeadm_flags(&pki, address, &etcd_url);
        // Mid-upgrade: cp-1 and cp-2 still at the old release's APIs.
        if i < 2 {
            flags.push("--emulated-version=1.33".into());
        }
        let child = Command::new(&kube_apiserver)
            .args(&flags)
            .stdout(log(&format!("{id}.log"))?)
            .stderr(log(&format!("{id}.err"))?)
            .spawn()?;
        node.processes.push((id.to_string(), child));
    }
    let direct = root.join("admin.conf");
    kubeconfig(&direct, &pki, "https://10.0.0.11:6443")?;
    let kubectl_at = |config: &Path, args: &[&str]| -> Result<String> {
        let mut all = vec!["--kubeconfig".to_string(), config.display().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        run(&kubectl.display().to_string(), &all)
    };
    for (id, address) in NODES {
        let url = format!("https://{address}:6443/readyz");
        let took = wait_for(&format!("{id}'s /readyz"), Duration::from_secs(120), || {
            let out = Command::new("curl")
                .args(["-fsS", "--cacert", "ca.crt", "--cert", "admin.crt", "--key", "admin.key", &url])
                .current_dir(&pki)
                .output()?;
            Ok(out.status.success())
        })?;
        println!("{id} ({address}:6443) ready after {:.1} s", took.as_secs_f64());
    }
    // The guide's one-time RBAC for the sidecar's identity, applied as written.
    kubectl_at(&direct, &["apply", "-f", &repo.join("docs/kubeadm/rbac.yaml").display().to_string()])?;

    // The node's files: the guide's, unchanged.
    let config = root.join("etc/kubernetes/skewgate");
    std::fs::create_dir_all(&config)?;
    for file in ["envoy.yaml", "sidecar.toml"] {
        std::fs::copy(repo.join("docs/kubeadm").join(file), config.join(file))?;
    }
    // The guide's build command, from the repository (the push is left out: the engine is local).
    let build = guide_block("Build skewgate's image and push it where the nodes pull from")?;
    let build =
        build.lines().find(|l| l.contains("docker build ")).context("no docker build in the guide")?;
    ensure!(build.contains(GUIDE_IMAGE), "{build}");
    let started = Instant::now();
    sh(&format!("PATH={}; {build}", builder_path()?), &repo)?;
    println!("$ {build}  ({:.1} s)", started.elapsed().as_secs_f64());

    let manifest: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo.join("docs/kubeadm/skewgate.yaml"))?)
            .map_err(|e| anyhow::anyhow!("docs/kubeadm/skewgate.yaml: {e}"))?;
    let started = Instant::now();
    for init in manifest["spec"]["initContainers"].as_array().context("initContainers")? {
        let args = docker_args(&manifest, init, &root, false)?;
        println!("$ docker {}", args.join(" "));
        run("docker", &args)?;
    }
    for container in manifest["spec"]["containers"].as_array().context("containers")? {
        let args = docker_args(&manifest, container, &root, true)?;
        println!("$ docker {}", args.join(" "));
        node.containers.push(format!("{POD}-{}", container["name"].as_str().unwrap_or_default()));
        run("docker", &args)?;
    }
    // The manifest's probes, as the kubelet would make them (host network: the node's loopback).
    for (what, url) in [
        ("envoy's /ready", "http://127.0.0.1:9901/ready"),
        ("the sidecar's /readyz", "http://127.0.0.1:9090/readyz"),
    ] {
        wait_for(what, Duration::from_secs(60), || {
            Ok(Command::new("curl").args(["-fsS", url]).output()?.status.success())
        })?;
    }
    println!(
        "the pod's containers ready {:.1} s after the first init container",
        started.elapsed().as_secs_f64()
    );

    // The guide's step 3, "Try one node directly", with a canary kubeconfig on cp-1:7443.
    let canary = root.join("canary.conf");
    kubeconfig(&canary, &pki, "https://10.0.0.11:7443")?;
    let readyz = kubectl_at(&canary, &["get", "--raw", "/readyz"])?;
    ensure!(readyz.trim() == "ok", "{readyz}");
    let whoami = kubectl_at(&canary, &["auth", "whoami"])?;
    println!("{whoami}");
    ensure!(whoami.contains("kubernetes-admin") && whoami.contains("system:masters"), "{whoami}");
    // Real apiservers do not say who answered: the guide's access log does, by upstream address.
    let access = guide_block("use `skewgate explain`, Envoy's")?;
    let access =
        access.lines().find(|l| l.starts_with("curl ")).context("no access-log command in the guide")?;
    sh(access.split("  #").next().unwrap_or(access), &root)?;
    for i in 0..20 {
        kubectl_at(
            &canary,
            &["get", "resourceclaims.v1.resource.k8s.io", "-A", "-l", &format!("static-pod-mark={i}")],
        )?;
    }
    let answered = wait_for_answers(&format!("{POD}-envoy"), "static-pod-mark", 20)?;
    ensure!(answered == BTreeSet::from(["cp-3".to_string()]), "resourceclaims answered by {answered:?}");
    // Straight to an old node: the wrong answer skewgate exists for.
    let direct_claims = Command::new(&kubectl)
        .args([
            "--kubeconfig",
            &direct.display().to_string(),
            "get",
            "resourceclaims.v1.resource.k8s.io",
            "-A",
        ])
        .output()?;
    ensure!(!direct_claims.status.success(), "cp-1 (emulating 1.33) served resourceclaims/v1");
    println!("straight to cp-1: {}", String::from_utf8_lossy(&direct_claims.stderr).trim());
    // A client's own identity headers without credentials are no identity: kubeadm leaves
    // anonymous requests on, and the apiserver sees system:anonymous.
    let spoof = sh(
        "curl -s -w '\\n%{http_code}' --cacert ca.crt -H 'X-Remote-User: system:admin' \
         -H 'X-Remote-Group: system:masters' https://10.0.0.11:7443/api/v1/namespaces/kube-system/secrets",
        &pki,
    )?;
    ensure!(
        spoof.ends_with("\n403") && spoof.contains("User \\\"system:anonymous\\\" cannot list"),
        "a spoofed X-Remote-User got: {spoof}"
    );
    let resources = kubectl_at(&canary, &["api-resources"])?;
    ensure!(resources.lines().any(|l| l.starts_with("resourceclaims ") && l.contains("resource.k8s.io/v1 ")));

    let table = run(
        "docker",
        &[
            "exec".into(),
            format!("{POD}-sidecar"),
            "skewgate".into(),
            "table".into(),
            "--config".into(),
            "/etc/skewgate/sidecar.toml".into(),
        ],
    )?;
    println!("{}", table.lines().take(12).collect::<Vec<_>>().join("\n"));
    // The guide's sidecar.toml takes the members from the cluster: all three, from the
    // `kubernetes` EndpointSlice the apiservers publish at their advertise addresses.
    let from = table.lines().find(|l| l.trim_start().starts_with("(from)")).context(table.clone())?;
    ensure!(from.matches("EndpointSlice").count() == 3, "{from}");
    let row =
        table.lines().find(|l| l.contains("resource.k8s.io/v1/resourceclaims ")).context(table.clone())?;
    ensure!(row.split_whitespace().rev().take(3).collect::<Vec<_>>() == ["✓", "-", "-"], "{row}");
    Ok(())
}
