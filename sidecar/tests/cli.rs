//! `skewgate table` and `skewgate sync` as a user runs them.

// Helpers outside #[test] functions count as production code to clippy; here a panic is how a
// test fails.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use skewgate_core::table::{RoutingTable, TableConfig};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/discovery");

fn skewgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skewgate")).args(args).env("NO_COLOR", "1").output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skewgate-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// a and b of the 1.33 era, c of the 1.36 era, each with /apis and /api/v1.
fn discovery_args() -> Vec<String> {
    let core = format!("{FIXTURES}/legacy_core-v1/api__v1.json");
    [
        ("a", "k8s-1.33-era_resource-v1beta2"),
        ("b", "k8s-1.33-era_resource-v1beta2"),
        ("c", "k8s-1.36-era_resource-v1"),
    ]
    .iter()
    .flat_map(|(id, era)| {
        ["--discovery".to_string(), format!("{id}={FIXTURES}/{era}/aggregated_v2.json,{core}")]
    })
    .collect()
}

#[test]
fn table_builds_from_saved_discovery_and_shows_the_skew() {
    let d = dir("build");
    let out = d.join("table.json");
    let mut args: Vec<String> = vec!["table".into()];
    args.extend(discovery_args());
    args.extend(["--out".into(), out.display().to_string()]);
    let o = skewgate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("  GROUP/VERSION/RESOURCE") && lines[0].ends_with("a  b  c"), "{text}");
    let first_plain = lines.iter().skip(1).position(|l| l.starts_with("  ")).unwrap_or(0);
    assert!(lines[1..=first_plain].iter().all(|l| l.starts_with("! ")), "rerouted rows come first:\n{text}");
    assert!(text.contains("! resource.k8s.io/v1/resourceclaims "), "{text}");
    let summary = lines.last().unwrap();
    assert!(summary.starts_with("36 GVRs need rerouting, 2 apiservers lack resource.k8s.io/v1"), "{summary}");

    let table = RoutingTable::from_json(&std::fs::read(&out).unwrap()).unwrap();
    let claims = table.gvr("resource.k8s.io", "v1", "resourceclaims").unwrap();
    assert_eq!(table.members(claims.serving).collect::<Vec<_>>(), ["c"]);
    let classes = table.gvr("resource.k8s.io", "v1alpha3", "deviceclasses").unwrap();
    assert_eq!(table.members(classes.serving).collect::<Vec<_>>(), ["a", "b"]);

    // Without --out the table itself goes to stdout, identical to the file.
    let o = skewgate(&args[..args.len() - 2].iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let printed: TableConfig = serde_json::from_str(&stdout(&o)).unwrap();
    let written: TableConfig = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(printed, written);

    // Show mode, from the table and from an ecds.json carrying it, as JSON.
    let ecds = d.join("ecds.json");
    let carried = skewgate_envoy::ecds(&serde_json::to_string(&written).unwrap(), Path::new("/f.wasm"));
    std::fs::write(&ecds, carried.to_string()).unwrap();
    for file in [&out, &ecds] {
        let o = skewgate(&["table", "--table", &file.display().to_string(), "--format", "json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["rerouted"], 36);
        assert_eq!(v["gvrs"][0]["rerouted"], true);
        assert_eq!(v["summary"].as_str().map(|s| s.starts_with("36 GVRs need rerouting")), Some(true));
    }
}

#[test]
fn table_modes_do_not_mix() {
    let o = skewgate(&["table"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = skewgate(&["table", "--table", "x.json", "--config", "y.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = skewgate(&["table", "--table", "x.json", "--out", "t.json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = skewgate(&["table", "--discovery", "a"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("ID=APIS_FILE"), "{}", stderr(&o));
    let legacy = format!("a={FIXTURES}/legacy_core-v1/api.json");
    let o = skewgate(&["table", "--discovery", &legacy]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("APIVersions"), "{}", stderr(&o));
}

/// `--check` asks and writes nothing: it prints the configuration as it would run, or every
/// error.
#[test]
fn sync_check_prints_the_configuration_it_would_run() {
    let d = dir("check");
    let ca = skewgate_pki::Ca::new(&d, "ca").unwrap();
    let pair = ca.client(&d, "front-proxy", "front-proxy", &[]).unwrap();
    std::fs::write(d.join("f.wasm"), b"\0asm").unwrap();
    let config = json!({
        "apiservers": [{"id": "a", "address": "127.0.0.1", "port": 1}],
        "tls": {"peerCa": ca.cert_path, "clientCert": pair.cert, "clientKey": pair.key},
        "envoy": {"dir": "out", "wasm": "f.wasm"},
        "cluster": {"members": "endpointSlice", "extensions": true}
    });
    let path = d.join("sync.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let o = skewgate(&["sync", "--config", &path.display().to_string(), "--check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let effective: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(effective["config"]["pollPeriod"], "5s", "the default filled in");
    assert_eq!(effective["config"]["envoy"]["dir"], json!(d.join("out")), "relative to the file");
    assert_eq!(effective["writes"]["cds"], json!(d.join("out/cds/cds.json")));
    let reads: Vec<&str> = effective["reads"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert!(
        reads[0].starts_with("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?"),
        "{reads:?}"
    );
    assert!(!d.join("out").exists(), "nothing written");

    let mut bad = config.clone();
    bad["pollPeriod"] = json!("fast");
    std::fs::write(&path, bad.to_string()).unwrap();
    let o = skewgate(&["sync", "--config", &path.display().to_string(), "--check"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("pollPeriod: "), "{}", stderr(&o));
}

#[test]
fn sync_names_bad_config_fields_and_fails_without_apiservers() {
    let d = dir("sync");
    let ca = skewgate_pki::Ca::new(&d, "ca").unwrap();
    let pair = ca.server(&d, "c", "c", &["kubernetes.default.svc"]).unwrap();
    let (ca, cert, key) = (ca.cert_path, pair.cert, pair.key);
    // A key of another pair: refused before any request, naming the files.
    let other = skewgate_pki::Ca::new(&d, "other-ca").unwrap().client(&d, "other", "other", &[]).unwrap().key;
    std::fs::write(d.join("f.wasm"), b"\0asm").unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = json!({
        "apiservers": [{"id": "a", "address": "127.0.0.1", "port": closed}],
        "tls": {"peerCa": ca, "clientCert": cert, "clientKey": key},
        "envoy": {"dir": "out", "wasm": "f.wasm"},
        "limits": {"requestTimeout": "1s"}
    });
    let path = d.join("sync.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let p = path.display().to_string();

    let o = skewgate(&["sync", "--config", &p, "--once", "--poll-period", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("pollPeriod: "), "{}", stderr(&o));
    let mut bad = config.clone();
    bad["apiservers"][0]["port"] = json!(0);
    std::fs::write(&path, bad.to_string()).unwrap();
    let o = skewgate(&["sync", "--config", &p, "--once"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("apiservers[0].port: "), "{}", stderr(&o));

    bad = config.clone();
    bad["tls"]["clientKey"] = json!(other);
    std::fs::write(&path, bad.to_string()).unwrap();
    let o = skewgate(&["sync", "--config", &p, "--once"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("tls.clientCert/clientKey"), "{}", stderr(&o));

    // Nobody answers: nothing is written, and the exit code says so.
    std::fs::write(&path, config.to_string()).unwrap();
    let o = skewgate(&["sync", "--config", &p, "--once"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no apiserver has discovery documents"), "{}", stderr(&o));
    assert!(stderr(&o).contains("connect"), "{}", stderr(&o));
    assert!(!d.join("out/ecds/ecds.json").exists());
}

/// a and b (1.33 era) to be upgraded to the 1.36 era c already runs: the APIs the 1.36 era
/// dropped go unserved once b restarts (exit 1), and the JSON names them per state.
#[test]
fn plan_lists_each_state_of_the_upgrade_and_gates_on_apis_left_unserved() {
    let to = format!(
        "{FIXTURES}/k8s-1.36-era_resource-v1/aggregated_v2.json,{FIXTURES}/legacy_core-v1/api__v1.json"
    );
    let mut args: Vec<String> = vec!["plan".into()];
    args.extend(discovery_args());
    args.extend([
        "--to".into(),
        to.clone(),
        "--order".into(),
        "a,b".into(),
        "--format".into(),
        "json".into(),
    ]);
    let o = skewgate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let labels: Vec<String> = plan["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {} {}",
                s["step"],
                s["apiserver"].as_str().unwrap_or("-"),
                s["phase"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(labels, ["0 - now", "1 a restarting", "1 a upgraded", "2 b restarting", "2 b upgraded"]);
    assert_eq!(plan["staying"][0]["id"], "c");
    // Now: c alone serves resource.k8s.io/v1; once b restarts, nobody serves the 1.33 era's betas.
    assert_eq!(plan["states"][0]["oneOnly"]["resource.k8s.io/v1/resourceclaims"], "c");
    assert_eq!(plan["states"][3]["none"].as_array().map(Vec::len), plan["removed"].as_array().map(Vec::len));
    assert!(
        plan["states"][3]["none"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g == "resource.k8s.io/v1alpha3/resourceclaims")
    );
    assert!(
        plan["alsoServedAs"]["resource.k8s.io/v1alpha3/resourceclaims"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "resource.k8s.io/v1")
    );
    assert_eq!(plan["keepsEverythingServed"], false);

    // Only a: while it restarts b serves the 1.33 era's APIs and c the 1.36 era's, exit 0.
    let mut args: Vec<String> = vec!["plan".into()];
    args.extend(discovery_args());
    args.extend(["--to".into(), to, "--order".into(), "a".into()]);
    let o = skewgate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("stays served by some apiserver throughout"), "{}", stdout(&o));

    // Bad input: exit 2 with the reason.
    let o = skewgate(&["plan", "--table", "/nonexistent", "--to", "/nonexistent"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent"), "{}", stderr(&o));
    let mut args: Vec<String> = vec!["plan".into()];
    args.extend(discovery_args());
    args.extend([
        "--to".into(),
        format!("{FIXTURES}/k8s-1.36-era_resource-v1/aggregated_v2.json"),
        "--order".into(),
        "x".into(),
    ]);
    let o = skewgate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("\"x\", which is not one of the apiservers (a, b, c)"), "{}", stderr(&o));
}
