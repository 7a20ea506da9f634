//! One apiserver's OpenAPI: `/version` (for the priority), the `/openapi/v3` index, each document
//! it lists (fetched again only when its hash changed) and `/openapi/v2` (conditional on its
//! ETag), with the discovery fetcher's identity, timeouts and body cap.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use skewgate_openapi::v2proto;

use super::{Doc, Fetched, api_level};
use crate::fetch::{Answer, ErrorKind, FetchError, Fetcher};

const JSON: &str = "application/json";
/// Documents fetched at once from one apiserver.
const PARALLELISM: usize = 8;
/// More index entries than any real apiserver lists (~90 with every group on).
pub const MAX_DOCUMENTS: usize = 1000;

/// Fetches what changed since `previous`.
pub async fn fetch(fetcher: &Fetcher, previous: Option<&Fetched>) -> Result<Fetched, FetchError> {
    let level = match fetcher.get("/version", JSON).await {
        Ok(body) => api_level(&body),
        Err(_) => previous.map_or((0, 0), |p| p.level),
    };
    let index = fetcher.get("/openapi/v3", JSON).await?;
    let entries = index_entries(&index)?;
    let limit = Arc::new(Semaphore::new(PARALLELISM));
    let mut tasks = JoinSet::new();
    let mut fetched = Fetched { level, ..Fetched::default() };
    for (key, url, hash) in entries {
        if let Some(doc) = previous.and_then(|p| p.v3.get(&key)).filter(|d| d.etag == hash) {
            fetched.v3.insert(key, doc.clone());
            continue;
        }
        let (fetcher, limit) = (fetcher.clone(), limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let body = fetcher.get(&url, JSON).await?;
            Ok::<_, FetchError>((key, Doc { body, etag: hash }))
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (key, doc) =
            joined.map_err(|e| FetchError::new("/openapi/v3", ErrorKind::HttpStatus, e.to_string()))??;
        fetched.v3.insert(key, doc);
    }
    // Conditional on the ETag the apiserver sent last (upstream's v2 ETag need not be ours).
    let tags = previous.map(|p| p.v2_etags.clone()).unwrap_or_default();
    let old_v2 = previous.and_then(|p| p.v2.as_ref());
    let [json_tag, proto_tag] = &tags;
    (fetched.v2, fetched.v2_etags[0]) =
        match fetcher.get_tagged("/openapi/v2", JSON, json_tag.as_deref()).await? {
            Answer::Body(body, etag) => (Some(Doc::new(body)), etag),
            Answer::NotModified => (old_v2.cloned(), json_tag.clone()),
        };
    let old_proto = previous.and_then(|p| p.v2_proto.as_ref());
    (fetched.v2_proto, fetched.v2_etags[1]) =
        match fetcher.get_tagged("/openapi/v2", v2proto::MEDIA_TYPE, proto_tag.as_deref()).await {
            Ok(Answer::Body(body, etag)) => (Some(Doc::new(body)), etag),
            Ok(Answer::NotModified) => (old_proto.cloned(), proto_tag.clone()),
            // 406: it does not offer protobuf; the composed protobuf is then not served at all.
            Err(e) if e.kind == ErrorKind::HttpStatus => (None, None),
            Err(e) => return Err(e),
        };
    Ok(fetched)
}

/// (key, serverRelativeURL, hash) of every index entry.
pub fn index_entries(index: &[u8]) -> Result<Vec<(String, String, String)>, FetchError> {
    let bad = |detail: String| FetchError::new("/openapi/v3", ErrorKind::HttpStatus, detail);
    let index: Value = serde_json::from_slice(index).map_err(|e| bad(format!("index: {e}")))?;
    let paths = index["paths"].as_object().ok_or_else(|| bad("index without paths".into()))?;
    if paths.len() > MAX_DOCUMENTS {
        return Err(bad(format!("{} documents, over the limit of {MAX_DOCUMENTS}", paths.len())));
    }
    let mut entries = Vec::with_capacity(paths.len());
    for (key, entry) in paths {
        let url = entry["serverRelativeURL"].as_str().unwrap_or_default();
        // Only the apiserver's own documents: a URL elsewhere would make the sidecar fetch it.
        let own = url.starts_with("/openapi/v3/") && !url.contains("..") && !url.contains("//");
        let hash = url.split_once("?hash=").map(|(_, h)| h).filter(|h| !h.is_empty());
        match (own, hash) {
            (true, Some(hash)) => entries.push((key.clone(), url.to_string(), hash.to_string())),
            _ => return Err(bad(format!("{key}: unexpected serverRelativeURL {url:?}"))),
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_are_checked() {
        let ok = br#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=AB"}}}"#;
        assert_eq!(
            index_entries(ok).unwrap(),
            [("api/v1".into(), "/openapi/v3/api/v1?hash=AB".into(), "AB".into())]
        );
        for bad in [
            &br#"{"paths":{"x":{"serverRelativeURL":"https://elsewhere/x?hash=AB"}}}"#[..],
            br#"{"paths":{"x":{"serverRelativeURL":"/openapi/v3/x"}}}"#,
            br#"{"nopaths":1}"#,
        ] {
            assert!(index_entries(bad).is_err());
        }
    }
}
