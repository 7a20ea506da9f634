//! Scenario 2: Discovery.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use serde_json::Value;
use skewgate_testkit::cluster::Credentials;
use skewgate_testkit::echo::SERVED_BY;
use skewgate_testkit::scenario::{Row, header, kubectl, scenario};

use crate::support::{ERAS, NOPEER, TIMEOUT, V2, finish, start};

/// (group, version, resource) of the top-level resources in an aggregated discovery document.
fn gvrs_of(doc: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for group in doc["items"].as_array().into_iter().flatten() {
        let g = group["metadata"]["name"].as_str().unwrap_or("").to_string();
        for version in group["versions"].as_array().into_iter().flatten() {
            let v = version["version"].as_str().unwrap_or("").to_string();
            for resource in version["resources"].as_array().into_iter().flatten() {
                let r = resource["resource"].as_str().unwrap_or("").to_string();
                out.insert((g.clone(), v.clone(), r));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s02_discovery() -> Result<()> {
    scenario("02", "discovery", discovery()).await
}

async fn discovery() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s02", ERAS, |_| {}).await?;
    // Each stand-in's own documents, straight from it.
    let direct = c.direct_client(TIMEOUT)?;
    let mut own: BTreeMap<String, (Value, Value)> = BTreeMap::new();
    for id in ["a", "b", "c"] {
        let url = c.apiserver_url(id)?;
        let core: Value =
            direct.get(format!("{url}/api")).header("accept", NOPEER).send().await?.json().await?;
        let apis: Value =
            direct.get(format!("{url}/apis")).header("accept", NOPEER).send().await?.json().await?;
        own.insert(id.to_string(), (core, apis));
        row.requests += 2;
    }
    let mut union: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (core, apis) in own.values() {
        union.extend(gvrs_of(core));
        union.extend(gvrs_of(apis));
    }
    let union_names: BTreeSet<String> = union
        .iter()
        .filter(|(_, _, r)| !r.contains('/'))
        .map(|(g, _, r)| if g.is_empty() { r.clone() } else { format!("{r}.{g}") })
        .collect();
    let union_versions: BTreeSet<String> =
        union.iter().map(|(g, v, _)| if g.is_empty() { v.clone() } else { format!("{g}/{v}") }).collect();

    // kubectl, discovery from scratch, through Envoy: the union of both eras.
    let k = kubectl(&c)?.with_cache(&c.out.join("fresh-cache"));
    let names: BTreeSet<String> =
        k.ok(&["api-resources", "-o", "name"]).await?.lines().map(str::to_owned).collect();
    let versions: BTreeSet<String> = k.ok(&["api-versions"]).await?.lines().map(str::to_owned).collect();
    row.requests += 2;
    assert_eq!(names, union_names, "kubectl api-resources ≠ the union of the apiservers' resources");
    assert_eq!(versions, union_versions, "kubectl api-versions ≠ the union of the apiservers' versions");
    for era_only in [
        "resource.k8s.io/v1",
        "resource.k8s.io/v1alpha3",
        "networking.k8s.io/v1beta1",
        "storage.k8s.io/v1alpha1",
    ] {
        assert!(versions.contains(era_only), "{era_only} missing");
    }
    let old_only = union_versions.iter().filter(|v| !gv_in(&own["c"], v)).count();
    let new_only = union_versions.iter().filter(|v| !gv_in(&own["a"], v)).count();
    row.figure(format!(
        "api-resources {} names, api-versions {} ({old_only} only 1.33, {new_only} only 1.36)",
        names.len(),
        versions.len()
    ));

    // The merged document, from the filter: same bytes and ETag twice, then 304.
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let url = format!("{}/apis", c.envoy_url()?);
    let table = c.table_on_disk()?;
    let merged = table.merged_discovery().context("no merged document in the table")?;
    let mut etags = BTreeSet::new();
    for _ in 0..2 {
        let r = alice.get(&url).header("accept", V2).send().await?;
        row.requests += 1;
        assert_eq!(r.status(), 200);
        let h = r.headers().clone();
        assert_eq!(
            header(&h, "content-type").as_deref(),
            Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
        );
        assert_eq!(header(&h, "vary").as_deref(), Some("Accept"));
        assert!(h.get(SERVED_BY).is_none(), "answered by an apiserver, not the filter");
        let body = r.text().await?;
        assert_eq!(body, merged.document);
        let doc: Value = serde_json::from_str(&body)?;
        let served: BTreeSet<_> = gvrs_of(&doc);
        let union_apis: BTreeSet<_> = union.iter().filter(|(g, _, _)| !g.is_empty()).cloned().collect();
        assert_eq!(served, union_apis, "the merged /apis is not the union of the apiservers' /apis");
        etags.insert(header(&h, "etag").context("no ETag")?);
    }
    assert_eq!(etags.len(), 1, "{etags:?}");
    let etag = etags.into_iter().next().unwrap_or_default();
    assert_eq!(etag, merged.quoted_etag);
    let r = alice.get(&url).header("accept", V2).header("if-none-match", &etag).send().await?;
    row.requests += 1;
    assert_eq!(r.status(), 304);
    assert!(r.text().await?.is_empty());

    // profile=nopeer: one apiserver's own document.
    let mut nopeer_by: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..12 {
        let r = alice.get(&url).header("accept", NOPEER).send().await?;
        row.requests += 1;
        assert_eq!(r.status(), 200);
        let by = header(r.headers(), SERVED_BY).context("nopeer must be answered by an apiserver")?;
        let body: Value = r.json().await?;
        assert_eq!(body, own[&by].1, "nopeer /apis through Envoy ≠ {by}'s own document");
        *nopeer_by.entry(by).or_default() += 1;
    }
    assert_ne!(own["a"].1, own["c"].1);
    row.figure(format!("merged /apis ETag stable, 304 on If-None-Match; nopeer ×12 → {nopeer_by:?}"));
    finish(c, &mut row).await?;
    Ok(row)
}

/// Whether an apiserver's own documents list `group/version` (or `v1`).
fn gv_in(docs: &(Value, Value), gv: &str) -> bool {
    let all: BTreeSet<String> = gvrs_of(&docs.0)
        .into_iter()
        .chain(gvrs_of(&docs.1))
        .map(|(g, v, _)| if g.is_empty() { v } else { format!("{g}/{v}") })
        .collect();
    all.contains(gv)
}
