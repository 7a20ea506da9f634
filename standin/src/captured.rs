//! The documents captured from a real kube-apiserver v1.36.2 (`testdata/real-apiserver/`,
//! `documents.tar.xz`: discovery, `/version`, OpenAPI v3 and v2 of the server at its own API
//! set and at `--emulated-version=1.33 --runtime-config=api/beta=true`), unpacked once per
//! process and shared by every stand-in in it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;

const ARCHIVE: &[u8] = include_bytes!("../../testdata/real-apiserver/documents.tar.xz");

/// One of the two captured servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capture {
    /// v1.36.2 with default flags: the 1.36 API set.
    Native136,
    /// v1.36.2 with `--emulated-version=1.33 --runtime-config=api/beta=true`.
    Emulated133,
}

impl Capture {
    pub const ALL: [Capture; 2] = [Capture::Native136, Capture::Emulated133];

    /// Its folder in the archive (`testdata/real-apiserver/documents.tar.xz`).
    pub fn folder(self) -> &'static str {
        match self {
            Capture::Native136 => "real-1.36.2",
            Capture::Emulated133 => "real-1.36.2-emulated-1.33-betas",
        }
    }
}

/// One captured server's files, by path inside its folder (`discovery/apis.json`, ...).
#[derive(Debug)]
pub struct Documents {
    files: BTreeMap<String, Bytes>,
}

impl Documents {
    /// Every file, by path inside the server's folder.
    pub fn files(&self) -> &BTreeMap<String, Bytes> {
        &self.files
    }

    pub fn file(&self, path: &str) -> Result<&Bytes> {
        self.files.get(path).ok_or_else(|| anyhow!("the captured documents have no {path}"))
    }

    /// The legacy discovery document a GET of `path` (`/api`, `/api/v1`, `/apis`, `/apis/<g>`,
    /// `/apis/<g>/<v>`) answered with `Accept: application/json`.
    pub fn legacy_discovery(&self, path: &str) -> Option<&Bytes> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let file = match segments.as_slice() {
            ["api"] => "discovery/api.json".to_string(),
            ["api", version] => format!("discovery/api__{version}.json"),
            ["apis"] => "discovery/apis.json".to_string(),
            ["apis", group] => format!("discovery/apis/{group}.json"),
            ["apis", group, version] => format!("discovery/apis/{group}__{version}.json"),
            _ => return None,
        };
        self.files.get(&file)
    }

    /// The OpenAPI v3 document at `/openapi/v3/<key>`.
    pub fn openapi_v3(&self, key: &str) -> Option<&Bytes> {
        self.files.get(&format!("openapi/v3/{}.json", key.replace('/', "__")))
    }
}

/// The captured documents of one server; the archive is unpacked on first use.
pub fn documents(capture: Capture) -> Result<&'static Documents> {
    static UNPACKED: OnceLock<Result<[Documents; 2], String>> = OnceLock::new();
    let unpacked = UNPACKED.get_or_init(|| unpack().map_err(|e| format!("{e:#}")));
    match unpacked {
        Ok([native, emulated]) => Ok(match capture {
            Capture::Native136 => native,
            Capture::Emulated133 => emulated,
        }),
        Err(e) => Err(anyhow!("testdata/real-apiserver/documents.tar.xz: {e}")),
    }
}

fn untar_xz(archive: &[u8]) -> Result<Vec<u8>> {
    let mut tar = Vec::new();
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(archive), &mut tar)
        .map_err(|e| anyhow!("xz: {e:?}"))?;
    Ok(tar)
}

fn unpack() -> Result<[Documents; 2]> {
    let tar = untar_xz(ARCHIVE)?;
    let mut split = Capture::ALL.map(|_| BTreeMap::new());
    for (path, body) in tar_files(&tar)? {
        for (capture, files) in Capture::ALL.iter().zip(split.iter_mut()) {
            if let Some(inner) = path.strip_prefix(capture.folder()).and_then(|p| p.strip_prefix('/')) {
                files.insert(inner.to_string(), Bytes::copy_from_slice(body));
            }
        }
    }
    if split.iter().any(BTreeMap::is_empty) {
        bail!("a server's folder is missing");
    }
    Ok(split.map(|files| Documents { files }))
}

/// The regular files of a ustar archive: (path, contents).
fn tar_files(tar: &[u8]) -> Result<Vec<(String, &[u8])>> {
    const BLOCK: usize = 512;
    let mut files = Vec::new();
    let mut at = 0;
    while let Some(header) = tar.get(at..at + BLOCK) {
        if header.iter().all(|b| *b == 0) {
            break;
        }
        let text = |range: std::ops::Range<usize>| -> Result<String> {
            let field = header.get(range).unwrap_or_default();
            let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
            Ok(std::str::from_utf8(field.get(..end).unwrap_or_default())?.to_string())
        };
        let name = text(0..100)?;
        let prefix = text(345..500)?;
        let path = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let size_field = text(124..136)?;
        let size = usize::from_str_radix(size_field.trim(), 8)
            .map_err(|_| anyhow!("{path}: bad size {size_field:?}"))?;
        let kind = header.get(156).copied().unwrap_or_default();
        let start = at + BLOCK;
        let body = tar.get(start..start + size).ok_or_else(|| anyhow!("{path}: truncated"))?;
        if kind == b'0' || kind == 0 {
            files.push((path, body));
        }
        at = start + size.div_ceil(BLOCK) * BLOCK;
    }
    Ok(files)
}

/// The whole archive's files, by path (for tests that compare it with its source).
pub fn archive_files() -> Result<BTreeMap<String, Vec<u8>>> {
    files_of(ARCHIVE)
}

/// The files of any xz-compressed ustar archive, by path: the other captures of
/// `testdata/real-apiserver/` are packed the same way.
pub fn files_of(archive: &[u8]) -> Result<BTreeMap<String, Vec<u8>>> {
    let tar = untar_xz(archive)?;
    let mut out = BTreeMap::new();
    for (path, body) in tar_files(&tar)? {
        out.insert(path, body.to_vec());
    }
    Ok(out)
}
