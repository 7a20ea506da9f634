//! The OpenAPI merge on the documents captured from a real kube-apiserver v1.36.2 (at its own
//! API set and at `--emulated-version=1.33 --runtime-config=api/beta=true`; see
//! testdata/real-apiserver/README.md): the composed documents hold every path and schema of
//! every input, are idempotent, follow the priority rule and keep their hashes stable.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::Value;
use skewgate::openapi::{Composer, Doc, Fetched};
use skewgate_openapi::merge::{self, Flavor, Outcome};
use skewgate_standin::captured::{self, Capture};

/// A captured server as the composer's fetch would have left it.
fn fetched(capture: Capture, level: (u32, u32)) -> Result<Fetched> {
    let documents = captured::documents(capture)?;
    let index: Value = serde_json::from_slice(documents.file("openapi/v3/index.json")?)?;
    let mut fetched = Fetched { level, ..Fetched::default() };
    for (key, entry) in index["paths"].as_object().context("paths")? {
        let url = entry["serverRelativeURL"].as_str().context("url")?;
        let hash = url.split_once("?hash=").context("hash")?.1.to_string();
        let body = documents.openapi_v3(key).with_context(|| format!("no {key}"))?.clone();
        fetched.v3.insert(key.clone(), Doc { body, etag: hash });
    }
    fetched.v2 = Some(Doc::new(documents.file("openapi/v2.json")?.clone()));
    Ok(fetched)
}

fn servers() -> Result<[Fetched; 3]> {
    Ok([
        fetched(Capture::Emulated133, (1, 33))?,
        fetched(Capture::Emulated133, (1, 33))?,
        fetched(Capture::Native136, (1, 36))?,
    ])
}

fn names(flavor: Flavor, body: &Bytes) -> Result<BTreeSet<String>> {
    Ok(merge::names(flavor, &serde_json::from_slice(body)?).into_iter().collect())
}

#[test]
fn composed_documents_hold_every_input() -> Result<()> {
    let [a, b, c] = servers()?;
    let composed = Composer::default().compose(&[("a", &a), ("b", &b), ("c", &c)]);
    let keys: BTreeSet<&String> = [&a, &c].iter().flat_map(|f| f.v3.keys()).collect();
    assert_eq!(composed.v3.keys().collect::<BTreeSet<_>>(), keys);
    let mut merged = 0;
    for (key, composite) in &composed.v3 {
        let have = names(Flavor::V3, &composite.doc.body)?;
        for (id, f) in [("a", &a), ("c", &c)] {
            let Some(doc) = f.v3.get(key) else { continue };
            let want = names(Flavor::V3, &doc.body)?;
            let missing: Vec<&String> = want.difference(&have).collect();
            assert!(missing.is_empty(), "{key} lacks {id}'s {missing:?}");
        }
        // Newest first: a document only the emulated servers have comes from a; a shared one
        // starts from c's.
        assert_eq!(
            composite.inputs.first().map(String::as_str),
            Some(if c.v3.contains_key(key) { "c" } else { "a" }),
            "{key}"
        );
        match &composite.verbatim {
            Some(id) => {
                let from = if id == "c" { &c } else { &a };
                assert_eq!(composite.doc, from.v3[key], "{key}: verbatim is the apiserver's bytes and hash");
            }
            None => {
                merged += 1;
                assert_eq!(
                    composite.doc,
                    Doc::new(composite.doc.body.clone()),
                    "{key}: hash of the merged bytes"
                );
            }
        }
    }
    // On these captures every group/version both servers have is covered by 1.36's document
    // (served unchanged); the rest are one server's.
    println!("{} documents, {merged} merged", composed.v3.len());
    let index: Value = serde_json::from_slice(&composed.index.body)?;
    assert!(
        index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"]
            .as_str()
            .is_some_and(|u| u.ends_with(&c.v3["apis/resource.k8s.io/v1"].etag))
    );

    let v2 = composed.v2.context("no v2")?;
    // v2 is one document for all group/versions: 1.36's lacks the betas only 1.33 serves.
    assert_eq!((v2.verbatim.as_deref(), v2.inputs.first().map(String::as_str)), (None, Some("c")));
    let have = names(Flavor::V2, &v2.doc.body)?;
    for f in [&a, &c] {
        let want = names(Flavor::V2, &f.v2.as_ref().context("v2")?.body)?;
        assert!(want.is_subset(&have), "v2 lacks {:?}", want.difference(&have).collect::<Vec<_>>());
    }
    Ok(())
}

#[test]
fn merging_is_idempotent_and_stable() -> Result<()> {
    let [a, b, c] = servers()?;
    let first = Composer::default().compose(&[("a", &a), ("b", &b), ("c", &c)]);
    // A fresh composer, the same inputs: the same bytes and hashes (ETags survive a restart).
    let again = Composer::default().compose(&[("a", &a), ("b", &b), ("c", &c)]);
    assert_eq!(first.index, again.index);
    assert_eq!(first.v2, again.v2);
    // Configured order does not matter between servers of different levels.
    let reordered = Composer::default().compose(&[("c", &c), ("a", &a), ("b", &b)]);
    assert_eq!(first.index, reordered.index);
    for (key, composite) in &first.v3 {
        let doc: Value = serde_json::from_slice(&composite.doc.body)?;
        let inputs: Vec<Value> = [&a, &c]
            .iter()
            .filter_map(|f| f.v3.get(key))
            .map(|d| serde_json::from_slice(&d.body))
            .collect::<Result<_, _>>()?;
        let mut with: Vec<&Value> = vec![&doc];
        with.extend(inputs.iter());
        // Merging the merged document with its inputs again changes nothing.
        assert_eq!(merge::merge(Flavor::V3, &with), Outcome::Input(0), "{key}");
    }
    Ok(())
}

#[test]
fn composed_documents_fit_the_memory_budget() -> Result<()> {
    let [a, b, c] = servers()?;
    let composed = Composer::default().compose(&[("a", &a), ("b", &b), ("c", &c)]);
    let held = a.bytes() + b.bytes() + c.bytes() + composed.bytes();
    println!(
        "held: {held} bytes (inputs {} + {} + {}, composed {})",
        a.bytes(),
        b.bytes(),
        c.bytes(),
        composed.bytes()
    );
    assert!(held < skewgate::openapi::MEMORY_BUDGET_BYTES, "{held}");
    Ok(())
}
