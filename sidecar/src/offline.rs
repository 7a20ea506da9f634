//! `skewgate table --discovery ID=APIS_FILE[,API_FILE]`: the routing table from saved discovery
//! documents, built by the same code as `skewgate sync` (`skewgate_core::build`).
//!
//! `APIS_FILE` is what `kubectl get --raw /apis` returns with the aggregated (nopeer) Accept;
//! `API_FILE`, optional, is `/api` the same way, or the legacy `/api/v1` resource list.

use std::path::{Path, PathBuf};

use skewgate_core::discovery::{
    ApiGroupDiscoveryList, ApiResourceList, KIND_API_GROUP_LIST, KIND_API_RESOURCE_LIST, core_group_list,
};
use skewgate_core::table::TableConfig;

use crate::fetch::kind_of;
use skewgate_core::build::{ClusterNames, ServerApis, build_table};

/// One apiserver's saved documents: `APIS_FILE[,API_FILE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documents {
    pub apis: PathBuf,
    pub api: Option<PathBuf>,
}

impl std::str::FromStr for Documents {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (apis, api) = match s.split_once(',') {
            Some((apis, api)) => (apis, Some(api)),
            None => (s, None),
        };
        if apis.is_empty() || api.is_some_and(str::is_empty) {
            return Err(format!("{s:?}: expected APIS_FILE[,API_FILE]"));
        }
        Ok(Documents { apis: apis.into(), api: api.map(PathBuf::from) })
    }
}

impl Documents {
    /// The core group (empty without API_FILE), then the named groups.
    pub fn load(&self) -> Result<Vec<ApiGroupDiscoveryList>, LoadError> {
        let core = match &self.api {
            Some(path) => load_api(path)?,
            None => ApiGroupDiscoveryList::v2(Vec::new()),
        };
        Ok(vec![core, load_apis(&self.apis)?])
    }
}

/// One `--discovery` argument: `ID=APIS_FILE[,API_FILE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub id: String,
    pub documents: Documents,
}

impl std::str::FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("{s:?}: expected ID=APIS_FILE[,API_FILE]");
        let (id, files) = s.split_once('=').ok_or_else(usage)?;
        if id.is_empty() {
            return Err(usage());
        }
        Ok(Spec { id: id.to_owned(), documents: files.parse().map_err(|_| usage())? })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct LoadError {
    pub path: String,
    pub reason: String,
}

fn load_error(path: &Path, reason: impl Into<String>) -> LoadError {
    LoadError { path: path.display().to_string(), reason: reason.into() }
}

/// A saved `/apis` (aggregated only: a legacy `APIGroupList` lists no resources).
pub fn load_apis(path: &Path) -> Result<ApiGroupDiscoveryList, LoadError> {
    let bytes = std::fs::read(path).map_err(|e| load_error(path, e.to_string()))?;
    ApiGroupDiscoveryList::from_json(&bytes).map_err(|e| {
        let hint = if kind_of(&bytes).as_deref() == Some(KIND_API_GROUP_LIST) {
            " (a legacy APIGroupList names no resources: save /apis with \
             -H 'Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer')"
        } else {
            ""
        };
        load_error(path, format!("{e}{hint}"))
    })
}

/// A saved `/api` (aggregated) or `/api/v1` (`APIResourceList`).
pub fn load_api(path: &Path) -> Result<ApiGroupDiscoveryList, LoadError> {
    let bytes = std::fs::read(path).map_err(|e| load_error(path, e.to_string()))?;
    if kind_of(&bytes).as_deref() == Some(KIND_API_RESOURCE_LIST) {
        let list = ApiResourceList::from_json(&bytes).map_err(|e| load_error(path, e.to_string()))?;
        return Ok(core_group_list(&list));
    }
    ApiGroupDiscoveryList::from_json(&bytes).map_err(|e| load_error(path, e.to_string()))
}

/// The table for the given apiservers, in argument order.
pub fn build(specs: &[Spec]) -> anyhow::Result<TableConfig> {
    let mut loaded: Vec<(String, Vec<ApiGroupDiscoveryList>)> = Vec::new();
    for spec in specs {
        loaded.push((spec.id.clone(), spec.documents.load()?));
    }
    let servers: Vec<ServerApis<'_>> = loaded
        .iter()
        .map(|(id, documents)| ServerApis {
            id,
            documents: documents.iter().collect(),
            ..ServerApis::default()
        })
        .collect();
    Ok(build_table(&servers, &ClusterNames::default())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let s: Spec = "a=x/apis.json".parse().unwrap();
        assert_eq!(
            s,
            Spec { id: "a".into(), documents: Documents { apis: "x/apis.json".into(), api: None } }
        );
        let s: Spec = "b=apis.json,api.json".parse().unwrap();
        assert_eq!(s.documents.api, Some(PathBuf::from("api.json")));
        for bad in ["", ",api.json", "apis.json,"] {
            assert!(bad.parse::<Documents>().is_err(), "{bad}");
        }
        for bad in ["a", "=x", "a=", "a=x,"] {
            assert!(bad.parse::<Spec>().is_err(), "{bad}");
        }
    }
}
