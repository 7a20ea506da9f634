//! Scenario 2, discovery: kubectl sees the union of the apiservers' APIs through Envoy, the
//! filter answers the merged `/apis` with a stable ETag, and `profile=nopeer` gets one
//! apiserver's own document.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use skewgate_harness::cluster::{Cluster, Credentials};
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::scenario::{Row, header, kubectl};

use super::{NOPEER, Suite, TIMEOUT, V2};

type Gvr = (String, String, String);

/// (group, version, resource) of the top-level resources in an aggregated discovery document.
fn gvrs_of(doc: &Value) -> BTreeSet<Gvr> {
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

/// `group/version`, or `v1` for the core group.
fn group_version((g, v, _): &Gvr) -> String {
    if g.is_empty() { v.clone() } else { format!("{g}/{v}") }
}

/// Whether an apiserver's own documents list `group/version` (or `v1`).
fn gv_in(docs: &(Value, Value), gv: &str) -> bool {
    gvrs_of(&docs.0).iter().chain(&gvrs_of(&docs.1)).any(|gvr| group_version(gvr) == gv)
}

impl Suite {
    /// The whole scenario; `era_only` are group/versions only one of the eras serves, which
    /// kubectl must list all the same.
    pub async fn discovery(&self, c: &Cluster, row: &mut Row, era_only: &[&str]) -> Result<()> {
        // Each apiserver's own documents, straight from it.
        let direct = c.direct_client(TIMEOUT)?;
        let mut own: BTreeMap<String, (Value, Value)> = BTreeMap::new();
        for id in ["a", "b", "c"] {
            let url = c.apiserver_url(id)?;
            let get = |path: &str| direct.get(format!("{url}{path}")).header("accept", NOPEER).send();
            let core: Value = get("/api").await?.json().await?;
            let apis: Value = get("/apis").await?.json().await?;
            own.insert(id.to_string(), (core, apis));
            row.requests += 2;
        }
        let mut union: BTreeSet<Gvr> = BTreeSet::new();
        for (core, apis) in own.values() {
            union.extend(gvrs_of(core));
            union.extend(gvrs_of(apis));
        }
        let union_names: BTreeSet<String> = union
            .iter()
            .filter(|(_, _, r)| !r.contains('/'))
            .map(|(g, _, r)| if g.is_empty() { r.clone() } else { format!("{r}.{g}") })
            .collect();
        let union_versions: BTreeSet<String> = union.iter().map(group_version).collect();

        // kubectl, discovery from scratch, through Envoy: the union of both eras.
        let k = kubectl(c)?.with_cache(&c.out.join("fresh-cache"));
        let names: BTreeSet<String> =
            k.ok(&["api-resources", "-o", "name"]).await?.lines().map(str::to_owned).collect();
        let versions: BTreeSet<String> = k.ok(&["api-versions"]).await?.lines().map(str::to_owned).collect();
        row.requests += 2;
        ensure!(
            names == union_names,
            "kubectl api-resources ≠ the union of the apiservers' resources: {:?}",
            names.symmetric_difference(&union_names)
        );
        ensure!(
            versions == union_versions,
            "kubectl api-versions ≠ the union of the apiservers' versions: {:?}",
            versions.symmetric_difference(&union_versions)
        );
        for gv in era_only {
            ensure!(versions.contains(*gv), "{gv} missing from kubectl api-versions");
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
        let union_apis: BTreeSet<Gvr> = union.iter().filter(|(g, _, _)| !g.is_empty()).cloned().collect();
        let mut etags = BTreeSet::new();
        for _ in 0..2 {
            let r = alice.get(&url).header("accept", V2).send().await?;
            row.requests += 1;
            ensure!(r.status() == 200, "/apis: {}", r.status());
            let h = r.headers().clone();
            let content_type = header(&h, "content-type");
            ensure!(
                content_type.as_deref()
                    == Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
                "/apis content-type {content_type:?}"
            );
            ensure!(header(&h, "vary").as_deref() == Some("Accept"), "/apis vary {:?}", header(&h, "vary"));
            ensure!(h.get(SERVED_BY).is_none(), "answered by an apiserver, not the filter");
            let body = r.text().await?;
            ensure!(body == merged.document, "the merged /apis is not the table's document");
            let doc: Value = serde_json::from_str(&body)?;
            ensure!(
                gvrs_of(&doc) == union_apis,
                "the merged /apis is not the union of the apiservers' /apis"
            );
            etags.insert(header(&h, "etag").context("no ETag")?);
        }
        ensure!(etags.len() == 1, "{etags:?}");
        let etag = etags.into_iter().next().unwrap_or_default();
        ensure!(etag == merged.quoted_etag, "ETag {etag} ≠ the table's {}", merged.quoted_etag);
        let r = alice.get(&url).header("accept", V2).header("if-none-match", &etag).send().await?;
        row.requests += 1;
        ensure!(r.status() == 304, "If-None-Match: {}", r.status());
        ensure!(r.text().await?.is_empty(), "a body with the 304");

        // profile=nopeer: one apiserver's own document, never the merged one.
        let mut nopeer_by: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..12 {
            let r = alice.get(&url).header("accept", NOPEER).send().await?;
            row.requests += 1;
            ensure!(r.status() == 200, "nopeer: {}", r.status());
            let named = header(r.headers(), SERVED_BY);
            ensure!(named.is_some() || !self.names_itself, "nopeer must be answered by an apiserver");
            let body: Value = r.json().await?;
            let by = match named {
                Some(by) => {
                    ensure!(
                        own.get(&by).is_some_and(|docs| docs.1 == body),
                        "nopeer /apis through Envoy ≠ {by}'s own document"
                    );
                    by
                }
                None => own
                    .iter()
                    .find(|(_, docs)| docs.1 == body)
                    .map(|(id, _)| id.clone())
                    .context("nopeer /apis is no apiserver's own document")?,
            };
            *nopeer_by.entry(by).or_default() += 1;
        }
        ensure!(own["a"].1 != own["c"].1, "the eras' /apis are the same");
        row.figure(format!("merged /apis ETag stable, 304 on If-None-Match; nopeer ×12 → {nopeer_by:?}"));
        Ok(())
    }
}
