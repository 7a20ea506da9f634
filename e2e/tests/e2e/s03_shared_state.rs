//! Scenario 3: Shared state.

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_harness::cluster::Credentials;
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::kubectl::{self};
use skewgate_harness::scenario::{Row, header, scenario, serving};

use crate::common::shared_state::resource_version;
use crate::support::{CLAIMS, DEVICECLASSES, ERAS, SUITE, TIMEOUT, finish, start};

/// Who served the one request of a `-v=8` run whose URL path ends with `suffix`.
fn served_by_in(log: &str, suffix: &str) -> Result<String> {
    let exchanges = kubectl::exchanges(log);
    let e = exchanges
        .iter()
        .rev()
        .find(|e| e.url.split('?').next().is_some_and(|p| p.ends_with(suffix)))
        .with_context(|| format!("no request for …{suffix} in {exchanges:?}"))?;
    Ok(e.header(SERVED_BY).context("no x-skewgate-served-by")?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s03_shared_state() -> Result<()> {
    scenario("03", "shared state", shared_state()).await
}

async fn shared_state() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s03", ERAS, |_| {}).await?;
    let table = c.table_on_disk()?;
    let mut s = SUITE.shared_state(&c, "resource.k8s.io/v1alpha3").await?;
    let (dc, claim) = (&s.dc.clone(), &s.claim.clone());
    // With kubectl's default validation: it reads the OpenAPI the edge composes.
    assert!(s.ok(&["create", "-f", dc]).await?.contains("deviceclass.resource.k8s.io/gpu-e2e created"));
    assert!(
        s.ok(&["create", "-f", claim]).await?.contains("resourceclaim.resource.k8s.io/claim-e2e created")
    );

    // Read back through Envoy, each from a server that serves it.
    let out = s.k.run(&["get", "-f", dc, "-o", "json", "-v=8"]).await?;
    s.runs += 1;
    ensure!(out.ok, "{}", out.stderr);
    let dc_v1: Value = serde_json::from_str(&out.stdout)?;
    let by = served_by_in(&out.stderr, "/deviceclasses/gpu-e2e")?;
    assert!(serving(&table, DEVICECLASSES).contains(&by), "deviceclass read from {by}");
    assert_eq!(dc_v1["spec"]["selectors"][0]["cel"]["expression"], "device.driver == \"gpu.example.com\"");
    let out = s.k.run(&["get", "-f", claim, "-o", "json", "-v=8"]).await?;
    s.runs += 1;
    ensure!(out.ok, "{}", out.stderr);
    let claim_v1: Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(served_by_in(&out.stderr, "/resourceclaims/claim-e2e")?, "c");
    assert_eq!(claim_v1["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"], "gpu-e2e");

    // One store: both old servers, asked directly, hold the same object.
    s.same_on_old_servers(DEVICECLASSES, "gpu-e2e", &dc_v1).await?;

    // Lists through Envoy.
    assert!(
        s.ok(&["get", DEVICECLASSES, "-o", "name"])
            .await?
            .lines()
            .any(|l| l == "deviceclass.resource.k8s.io/gpu-e2e")
    );
    assert!(
        s.ok(&["get", CLAIMS, "-n", "e2e-state", "-o", "name"])
            .await?
            .lines()
            .any(|l| l == "resourceclaim.resource.k8s.io/claim-e2e")
    );

    // Patches.
    s.label_patched(DEVICECLASSES, "gpu-e2e", None).await?;
    s.label_patched(CLAIMS, "claim-e2e", Some("e2e-state")).await?;
    for (gvr, ns, name, before) in
        [(DEVICECLASSES, None, "gpu-e2e", &dc_v1), (CLAIMS, Some("e2e-state"), "claim-e2e", &claim_v1)]
    {
        let mut args = vec!["get", gvr, name, "-o", "json"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let now: Value = serde_json::from_str(&s.ok(&args).await?)?;
        assert_eq!(now["metadata"]["labels"]["e2e"], "patched", "{gvr}");
        let (old, new): (u64, u64) = (resource_version(before).parse()?, resource_version(&now).parse()?);
        assert!(new > old, "{gvr}: resourceVersion {old} → {new}");
    }

    // A stale update: kubectl replace with the resourceVersion read before the patch.
    let mut stale = claim_v1.clone();
    stale["metadata"]["labels"] = json!({"e2e": "stale"});
    let out = s.k.run_with_stdin(&["replace", "-f", "-"], Some(&stale.to_string())).await?;
    s.runs += 1;
    ensure!(!out.ok, "a stale replace succeeded: {}", out.stdout);
    assert!(
        out.stderr.contains("Error from server (Conflict)")
            && out.stderr.contains(
                "the object has been modified; please apply your changes to the latest version and try again"
            ),
        "{}",
        out.stderr
    );
    // The same through the Rust client: 409 with the apiserver's own Status, untouched.
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let path = "/apis/resource.k8s.io/v1/namespaces/e2e-state/resourceclaims/claim-e2e";
    let via = alice.put(format!("{}{path}", c.envoy_url()?)).json(&stale).send().await?;
    assert_eq!(via.status(), 409);
    assert_eq!(header(via.headers(), SERVED_BY).as_deref(), Some("c"));
    let via: Value = via.json().await?;
    let direct =
        c.direct_client(TIMEOUT)?.put(format!("{}{path}", c.apiserver_url("c")?)).json(&stale).send().await?;
    assert_eq!(direct.status(), 409);
    let direct: Value = direct.json().await?;
    assert_eq!(
        (&via["kind"], &via["reason"], &via["code"]),
        (&json!("Status"), &json!("Conflict"), &json!(409))
    );
    assert_eq!(via, direct, "the 409 Status through Envoy differs from the apiserver's");
    let mut requests = 2;

    // Deletes.
    assert!(s.ok(&["delete", "-f", claim]).await?.contains("deleted"));
    assert!(s.ok(&["delete", "-f", dc]).await?.contains("deleted"));
    let e = s.fails(&["get", "-f", dc]).await?;
    assert!(e.contains("NotFound") && e.contains("\"gpu-e2e\" not found"), "{e}");
    let e = s.fails(&["get", "-f", claim]).await?;
    assert!(e.contains("NotFound") && e.contains("\"claim-e2e\" not found"), "{e}");
    assert!(!s.ok(&["get", DEVICECLASSES, "-o", "name"]).await?.contains("gpu-e2e"));
    requests += s.runs;
    row.requests = requests;
    row.figure(format!(
        "create/get/list/patch/delete of {DEVICECLASSES} (a,b) and {CLAIMS} (c) via kubectl; \
         stale update → 409 Conflict Status"
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
