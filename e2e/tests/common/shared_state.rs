//! Scenario 3, shared state: objects written through Envoy to one server are the same objects
//! on the others (one store, or one etcd).

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use skewgate_harness::cluster::Cluster;
use skewgate_harness::kubectl::Kubectl;
use skewgate_harness::scenario::{claim_yaml, device_class_yaml, kubectl};

use super::Suite;

/// A merge patch that labels an object `e2e=patched`.
const PATCH: &str = r#"{"metadata":{"labels":{"e2e":"patched"}}}"#;

/// kubectl through Envoy, each run counted for the row, with the namespace e2e-state created
/// and two files: the DeviceClass gpu-e2e and the ResourceClaim claim-e2e of it.
pub struct State {
    /// For the runs a scenario counts itself.
    pub k: Kubectl,
    pub runs: usize,
    /// The DeviceClass's file.
    pub dc: String,
    /// The claim's file.
    pub claim: String,
}

pub fn resource_version(v: &Value) -> String {
    v["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string()
}

impl Suite {
    /// The state scenario 3 starts from; `class_api_version` is the DeviceClass's apiVersion.
    pub async fn shared_state(&self, c: &Cluster, class_api_version: &str) -> Result<State> {
        let (dc, claim) = (c.out.join("deviceclass.yaml"), c.out.join("claim.yaml"));
        std::fs::write(&dc, device_class_yaml(class_api_version, "gpu-e2e"))?;
        std::fs::write(&claim, claim_yaml("claim-e2e", "e2e-state", "gpu-e2e"))?;
        let path = |p: &std::path::Path| p.to_str().map(str::to_owned).context("path");
        let mut state = State { k: kubectl(c)?, runs: 0, dc: path(&dc)?, claim: path(&claim)? };
        state.ok(&["create", "namespace", "e2e-state"]).await?;
        Ok(state)
    }
}

impl State {
    pub async fn ok(&mut self, args: &[&str]) -> Result<String> {
        self.runs += 1;
        self.k.ok(args).await
    }

    pub async fn fails(&mut self, args: &[&str]) -> Result<String> {
        self.runs += 1;
        self.k.fails(args).await
    }

    /// Each 1.33-era apiserver, asked directly for `name` of `gvr`, holds the very object
    /// `seen` (the same resourceVersion).
    pub async fn same_on_old_servers(&mut self, gvr: &str, name: &str, seen: &Value) -> Result<()> {
        for id in ["a", "b"] {
            let direct = self.k.with_context(&format!("direct-{id}"));
            let v: Value = serde_json::from_str(&direct.ok(&["get", gvr, name, "-o", "json"]).await?)?;
            self.runs += 1;
            ensure!(resource_version(&v) == resource_version(seen), "{id} sees another {gvr}: {v}");
        }
        Ok(())
    }

    /// Labels `name` of `gvr` (in `namespace`, if namespaced) `e2e=patched`.
    pub async fn label_patched(&mut self, gvr: &str, name: &str, namespace: Option<&str>) -> Result<()> {
        let mut args = vec!["patch", gvr, name];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        args.extend(["--type=merge", "-p", PATCH]);
        let out = self.ok(&args).await?;
        ensure!(out.contains("patched"), "{gvr} {name}: {out}");
        Ok(())
    }
}
