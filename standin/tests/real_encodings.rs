//! Discovery in protobuf, and content negotiation, against what real kube-apiservers v1.36.2 (one
//! at its own API set, one at `--emulated-version=1.33 --runtime-config=api/beta=true`) answered
//! (testdata/real-apiserver/encodings.tar.xz, see the README inside): the edge's protobuf
//! encoder, given a server's JSON document, writes that server's protobuf body byte for byte, and
//! the edge's negotiation picks what the server picked for every Accept header tried on it.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skewgate_core::accept::{DiscoveryAccept, Encoding, negotiate};
use skewgate_core::discovery::ApiGroupDiscoveryList;
use skewgate_core::discovery::protobuf::{self, MEDIA_TYPE_PROTOBUF, MEDIA_TYPE_V2_PROTOBUF, ToProtobuf};
use skewgate_core::table::{LegacyPath, legacy_protobuf};
use skewgate_standin::captured;

const ARCHIVE: &[u8] = include_bytes!("../../testdata/real-apiserver/encodings.tar.xz");
const SERVERS: [&str; 2] = ["real-1.36.2", "real-1.36.2-emulated-1.33-betas"];

fn files() -> Result<BTreeMap<String, Vec<u8>>> {
    captured::files_of(ARCHIVE)
}

/// `apis__apps__v1` → `/apis/apps/v1`.
fn path_of(name: &str) -> String {
    format!("/{}", name.replace("__", "/"))
}

#[test]
fn legacy_documents_encode_as_the_apiserver_encodes_them() -> Result<()> {
    let files = files()?;
    let mut checked = 0;
    for server in SERVERS {
        let content_types: BTreeMap<String, String> = serde_json::from_slice(
            files.get(&format!("{server}/content-types.json")).context("content types")?,
        )?;
        for (name, json) in files.range(format!("{server}/")..) {
            let Some(stem) = name.strip_prefix(&format!("{server}/")).and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if !name.starts_with(server) || stem.contains("aggregated") || stem == "content-types" {
                continue;
            }
            let real =
                files.get(&format!("{server}/{stem}.pb")).with_context(|| format!("{name}: no .pb"))?;
            let ours =
                legacy_protobuf(&path_of(stem), json).with_context(|| format!("{name} does not decode"))?;
            if &ours != real {
                let at = ours
                    .iter()
                    .zip(real.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(ours.len().min(real.len()));
                bail!(
                    "{server} {}: {} bytes, the apiserver's {}, first difference at byte {at}",
                    path_of(stem),
                    ours.len(),
                    real.len()
                );
            }
            assert_eq!(
                content_types.get(&format!("{stem}.pb")).map(String::as_str),
                Some(MEDIA_TYPE_PROTOBUF)
            );
            checked += 1;
        }
    }
    // /api, /apis, /api/v1 and each group and group/version: 44 paths, less the emulated server's 404.
    assert_eq!(checked, 87, "documents compared");
    Ok(())
}

#[test]
fn aggregated_discovery_encodes_as_the_apiserver_encodes_it() -> Result<()> {
    let files = files()?;
    for server in SERVERS {
        let content_types: BTreeMap<String, String> = serde_json::from_slice(
            files.get(&format!("{server}/content-types.json")).context("content types")?,
        )?;
        for root in ["api", "apis"] {
            let get = |ext: &str| {
                files
                    .get(&format!("{server}/{root}.aggregated_v2.{ext}"))
                    .with_context(|| format!("{server} {root} {ext}"))
            };
            let list = ApiGroupDiscoveryList::from_json(get("json")?)?;
            let ours = list.to_protobuf();
            assert!(
                &ours == get("pb")?,
                "{server} /{root}: {} bytes, the apiserver's {}",
                ours.len(),
                get("pb")?.len()
            );
            assert_eq!(protobuf::type_meta(&ours), Some(("apidiscovery.k8s.io/v2", "APIGroupDiscoveryList")));
            // The same ETag for both encodings: it names the document.
            let header = |ext: &str| {
                content_types.get(&format!("{root}.aggregated_v2.{ext}")).cloned().unwrap_or_default()
            };
            let (json_type, json_etag) = header("json")
                .split_once(" etag=")
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .unwrap_or_default();
            let (pb_type, pb_etag) = header("pb")
                .split_once(" etag=")
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .unwrap_or_default();
            assert_eq!(pb_type, MEDIA_TYPE_V2_PROTOBUF);
            assert_eq!(json_type, skewgate_core::discovery::MEDIA_TYPE_V2_JSON);
            assert!(!json_etag.is_empty() && json_etag == pb_etag, "{server} /{root}");
        }
    }
    Ok(())
}

/// What the server's answer says it chose: `None` for a 406.
fn served(entry: &Value) -> Option<(bool, Encoding)> {
    if entry["status"] != 200 {
        return None;
    }
    let content_type = entry["contentType"].as_str().unwrap_or_default();
    let (media, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    let encoding = match media {
        "application/json" => Encoding::Json,
        "application/yaml" => Encoding::Yaml,
        "application/vnd.kubernetes.protobuf" => Encoding::Protobuf,
        other => panic!("unexpected content type {other}"),
    };
    Some((params.contains("as=APIGroupDiscoveryList"), encoding))
}

#[test]
fn negotiation_picks_what_the_apiserver_picked() -> Result<()> {
    let files = files()?;
    let entries: Vec<Value> =
        serde_json::from_slice(files.get("negotiation.json").context("negotiation.json")?)?;
    let mut compared = 0;
    for entry in &entries {
        let path = entry["path"].as_str().unwrap_or_default();
        let accept = entry["accept"].as_str();
        let ours = negotiate(LegacyPath::parse(path).context("a discovery path")?, accept);
        let ours = match ours {
            DiscoveryAccept::MergedV2(encoding) | DiscoveryAccept::NoPeerV2(encoding) => {
                Some((true, encoding))
            }
            DiscoveryAccept::Legacy(encoding) => Some((false, encoding)),
            // An apiserver answers: right only where every apiserver answers alike, a 406.
            DiscoveryAccept::Local => None,
        };
        assert_eq!(ours, served(entry), "{path} Accept: {accept:?}");
        compared += 1;
    }
    assert_eq!(compared, 255);
    Ok(())
}
