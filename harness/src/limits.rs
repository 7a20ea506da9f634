//! Pieces of `make limits` and of the limit tests: synthetic CRD-like discovery and tables of any
//! size, and a loopback apiserver double whose `/apis` can be swapped while it runs.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Map;
use skewgate_core::discovery::{
    ApiGroupDiscovery, ApiGroupDiscoveryList, ApiResourceDiscovery, ApiSubresourceDiscovery,
    ApiVersionDiscovery, Freshness, GroupVersionKind, ObjectMeta,
};
use skewgate_core::table::GroupVersionConfig;

use crate::echo::{self, SERVED_BY};
use skewgate_pki::Pki;

/// How much each synthetic group holds.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub versions: usize,
    pub resources: usize,
    /// Verbs, a `status` subresource, short names: what a CRD's discovery entry carries.
    pub full: bool,
}

/// `count` group-versions `g<N>.<suffix>/v1` of ten resources `r0`..`r9`, each served by all of
/// `members`: table entries that add GVRs ten at a time.
pub fn filler_group_versions(count: usize, suffix: &str, members: &[&str]) -> Vec<GroupVersionConfig> {
    let all: Vec<String> = members.iter().map(|m| m.to_string()).collect();
    (0..count)
        .map(|g| GroupVersionConfig {
            group: format!("g{g}.{suffix}"),
            version: "v1".into(),
            served_by: all.clone(),
            resources: (0..10).map(|r| (format!("r{r}"), all.clone())).collect(),
            extension: false,
        })
        .collect()
}

/// `count` CRD-like groups `g<N>.<suffix>`, numbered from `first`.
pub fn crd_groups(first: usize, count: usize, suffix: &str, shape: Shape) -> Vec<ApiGroupDiscovery> {
    (first..first + count)
        .map(|g| {
            let group = format!("g{g}.{suffix}");
            let versions = (0..shape.versions)
                .map(|v| {
                    let version = format!("v{}", v + 1);
                    let resources = (0..shape.resources)
                        .map(|r| resource(&group, &version, &format!("widget{r}s"), shape.full))
                        .collect();
                    ApiVersionDiscovery { version, resources, freshness: Some(Freshness::Current) }
                })
                .collect();
            ApiGroupDiscovery {
                kind: String::new(),
                api_version: String::new(),
                metadata: ObjectMeta { name: group, creation_timestamp: None, other: Map::new() },
                versions,
            }
        })
        .collect()
}

fn resource(group: &str, version: &str, plural: &str, full: bool) -> ApiResourceDiscovery {
    let singular = plural.trim_end_matches('s').to_string();
    let kind = format!("W{}", singular.trim_start_matches('w'));
    let gvk =
        |kind: &str| GroupVersionKind { group: group.into(), version: version.into(), kind: kind.into() };
    let verbs = |list: &[&str]| list.iter().map(|v| v.to_string()).collect::<Vec<_>>();
    ApiResourceDiscovery {
        resource: plural.into(),
        response_kind: Some(gvk(&kind)),
        scope: "Namespaced".into(),
        singular_resource: singular.clone(),
        verbs: if full {
            verbs(&["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"])
        } else {
            verbs(&["get", "list"])
        },
        short_names: if full { vec![format!("{singular}x")] } else { Vec::new() },
        categories: if full { vec!["all".into()] } else { Vec::new() },
        subresources: if full {
            vec![ApiSubresourceDiscovery {
                subresource: "status".into(),
                response_kind: Some(gvk(&kind)),
                accepted_types: Vec::new(),
                verbs: verbs(&["get", "patch", "update"]),
            }]
        } else {
            Vec::new()
        },
    }
}

/// An apiserver double over mTLS (the stand-ins' serving certificate, front-proxy clients only):
/// `/api` and `/apis` as given (`/apis` swappable), `/version`, and a small JSON object marked
/// with `x-skewgate-served-by` for any other path.
pub struct DiscoveryServer {
    pub id: String,
    pub addr: SocketAddr,
    apis: Arc<RwLock<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DiscoveryServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DiscoveryServer {
    pub async fn start(
        id: &str,
        pki: &Pki,
        api: &ApiGroupDiscoveryList,
        apis: &ApiGroupDiscoveryList,
    ) -> Result<Self> {
        let tls = echo::tls_config(&pki.apiserver, &pki.requestheader_ca.cert_path)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let core = Bytes::from(serde_json::to_vec(api)?);
        let apis = Arc::new(RwLock::new(Bytes::from(serde_json::to_vec(apis)?)));
        let (served_by, shared) = (id.to_string(), apis.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (acceptor, core, apis, served_by) =
                    (acceptor.clone(), core.clone(), shared.clone(), served_by.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else { return };
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let body = match req.uri().path() {
                            "/api" => core.clone(),
                            "/apis" => apis.read().map(|b| b.clone()).unwrap_or_default(),
                            "/version" => Bytes::from_static(br#"{"gitVersion":"v1.36.0"}"#),
                            _ => Bytes::from_static(br#"{"kind":"ConfigMap","apiVersion":"v1"}"#),
                        };
                        let mut response = hyper::Response::new(Full::new(body));
                        let headers = response.headers_mut();
                        headers.insert(
                            "content-type",
                            hyper::header::HeaderValue::from_static("application/json"),
                        );
                        if let Ok(v) = hyper::header::HeaderValue::from_str(&served_by) {
                            headers.insert(SERVED_BY, v);
                        }
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { id: id.to_string(), addr, apis, task })
    }

    /// Serves `apis` at `/apis` from now on; returns its size in bytes.
    pub fn set_apis(&self, apis: &ApiGroupDiscoveryList) -> Result<usize> {
        let body = Bytes::from(serde_json::to_vec(apis)?);
        let len = body.len();
        if let Ok(mut slot) = self.apis.write() {
            *slot = body;
        }
        Ok(len)
    }
}
