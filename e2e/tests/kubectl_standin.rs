//! A real kubectl (the pinned one in .venv) against one stand-in apiserver, no Envoy: the stand-in
//! must be indistinguishable from kube-apiserver for what skewgate routes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skewgate_harness::cluster::{self, ApiserverSpec, Cluster};
use skewgate_harness::paths;
use skewgate_harness::scenario::claim_yaml;

async fn one_standin(name: &str, profile: &str) -> Result<Cluster> {
    let out = std::env::temp_dir().join(format!("skewgate-kubectl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let options = cluster::Options {
        apiservers: vec![ApiserverSpec { id: "a".into(), profile: profile.into() }],
        envoy: false,
        sidecar: false,
        ..cluster::Options::ephemeral(&out, &[])
    };
    cluster::start(&options).await
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn new(kubeconfig: &Path) -> Result<Self> {
        Ok(Self { bin: paths::kubectl_binary()?, kubeconfig: kubeconfig.to_path_buf() })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--request-timeout=10s").args(args);
        c
    }

    /// (success, stdout, stderr)
    fn run(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let out = self.command(args).output().with_context(|| format!("kubectl {args:?}"))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        ))
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let (ok, stdout, stderr) = self.run(args)?;
        if !ok {
            bail!("kubectl {}: {stderr}{stdout}", args.join(" "));
        }
        println!("$ kubectl {}\n{}", args.join(" "), stdout.trim_end());
        Ok(stdout)
    }

    fn fails(&self, args: &[&str]) -> Result<String> {
        let (ok, stdout, stderr) = self.run(args)?;
        if ok {
            bail!("kubectl {} succeeded: {stdout}", args.join(" "));
        }
        println!("$ kubectl {}\n{}", args.join(" "), stderr.trim_end());
        Ok(stderr)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_talks_to_a_standin() -> Result<()> {
    let c = one_standin("basic", "1.33").await?;
    let k = Kubectl::new(&c.kubeconfig)?;

    let resources = k.ok(&["api-resources"])?;
    for want in ["configmaps", "namespaces", "deviceclasses", "resourceclaims", "deployments"] {
        assert!(resources.lines().any(|l| l.starts_with(want)), "api-resources lacks {want}:\n{resources}");
    }
    let groups: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/apis"])?)?;
    assert_eq!(groups["kind"], "APIGroupList", "{groups}");
    assert!(k.ok(&["version", "-o", "json"])?.contains("v1.33"));

    assert!(k.ok(&["create", "configmap", "t1", "--from-literal=a=1"])?.contains("configmap/t1 created"));
    let obj: Value = serde_json::from_str(&k.ok(&["get", "configmap", "t1", "-o", "json"])?)?;
    assert_eq!(obj["data"]["a"], "1");
    assert!(obj["metadata"]["resourceVersion"].as_str().is_some_and(|rv| !rv.is_empty()));
    assert!(k.ok(&["get", "configmaps", "-o", "name"])?.lines().any(|l| l == "configmap/t1"));
    assert!(k.ok(&["patch", "configmap", "t1", "-p", r#"{"data":{"a":"2"}}"#])?.contains("patched"));
    assert_eq!(k.ok(&["get", "configmap", "t1", "-o", "jsonpath={.data.a}"])?, "2");
    let e = k.fails(&["create", "configmap", "t1", "--from-literal=a=1"])?;
    assert!(e.contains(r#"configmaps "t1" already exists"#), "{e}");

    // A watch sees an event written after it started.
    let mut watch = k
        .command(&["get", "configmaps", "-w", "--output-watch-events", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = watch.stdout.take().context("watch stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // t1 is printed from the list the watch then continues from: anything created after it
    // arrives as an event, whether or not the watch request is out yet.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !seen.iter().any(|l: &String| l.contains("configmap/t1")) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(line);
        }
    }
    assert!(seen.iter().any(|l| l.contains("configmap/t1")), "the watch never listed: {seen:?}");
    k.ok(&["create", "configmap", "t2", "--from-literal=b=1"])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !seen.iter().any(|l: &String| l.contains("configmap/t2")) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(line);
        }
    }
    let _ = watch.kill();
    // t2 did not exist when the watch listed, so seeing it proves a streamed event.
    assert!(seen.iter().any(|l| l.contains("configmap/t2")), "watch saw {seen:?}");

    assert!(k.ok(&["delete", "configmap", "t1"])?.contains(r#"configmap "t1" deleted"#));
    let e = k.fails(&["get", "configmap", "t1"])?;
    assert!(e.contains("NotFound") && e.contains(r#"configmaps "t1" not found"#), "{e}");

    // resource.k8s.io/v1 does not exist in the 1.33 era: the server's own 404 wording.
    let e = k.fails(&["get", "--raw", "/apis/resource.k8s.io/v1/resourceclaims"])?;
    assert!(e.contains("NotFound") && e.contains("the server could not find the requested resource"), "{e}");

    assert!(k.ok(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])?.contains("admin"));

    // kubectl will not send a request without credentials (it prompts for a password), so give
    // it a token nobody issued: the stand-in answers 401 and kubectl says so. (Credential-less
    // requests get the same 401: standin/tests/standin.rs.)
    let stranger = c.kubeconfig.with_file_name("stranger.kubeconfig");
    let text = std::fs::read_to_string(&c.kubeconfig)?;
    let head = text.split("users:").next().unwrap_or("");
    std::fs::write(&stranger, format!("{head}users:\n- name: admin\n  user: {{token: not-a-real-token}}\n"))?;
    let k = Kubectl::new(&stranger)?;
    let e = k.fails(&["get", "--raw", "/api/v1/namespaces"])?;
    assert!(e.contains("Unauthorized"), "{e}");
    Ok(())
}

/// `kubectl explain` of a nested field of a new-API kind and `kubectl apply -f` (default
/// validation) straight against the real profile and the 1.36 era: both read the OpenAPI v3
/// documents of a real kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_and_applies_with_real_openapi() -> Result<()> {
    for (profile, api_version) in [
        ("1.36-real", "resource.k8s.io/v1"),
        ("1.36", "resource.k8s.io/v1"),
        ("1.33-real", "resource.k8s.io/v1beta2"),
    ] {
        let c = one_standin(&format!("explain-{}", profile.replace('.', "")), profile).await?;
        let cache = c.out.join("kube-cache");
        let cache_arg = format!("--cache-dir={}", cache.display());
        let k = Kubectl::new(&c.kubeconfig)?;
        let explained = k.ok(&[
            &cache_arg,
            "explain",
            "resourceclaims.spec.devices.requests.exactly",
            &format!("--api-version={api_version}"),
        ])?;
        assert!(explained.contains("FIELD: exactly <ExactDeviceRequest>"), "{profile}: {explained}");
        assert!(explained.contains("deviceClassName"), "{profile}: {explained}");
        if api_version != "resource.k8s.io/v1" {
            continue;
        }
        let manifest = c.out.join("claim.yaml");
        std::fs::write(&manifest, claim_yaml("gpu", "default", "gpu.example.com"))?;
        let applied = k.ok(&[&cache_arg, "apply", "-f", &manifest.display().to_string()])?;
        assert!(applied.contains("resourceclaim.resource.k8s.io/gpu created"), "{profile}: {applied}");
        // kubectl found the fieldValidation parameter in the v3 document: server-side validation.
        let posts: Vec<String> = c
            .standin("a")?
            .recent()
            .into_iter()
            .filter(|s| s.method == "POST" && s.target.contains("/resourceclaims"))
            .map(|s| s.target)
            .collect();
        assert!(posts.iter().any(|t| t.contains("fieldValidation=Strict")), "{profile}: {posts:?}");
        let again = k.ok(&[&cache_arg, "apply", "-f", &manifest.display().to_string()])?;
        assert!(again.contains("resourceclaim.resource.k8s.io/gpu unchanged"), "{profile}: {again}");
        c.shutdown().await?;
    }
    Ok(())
}
