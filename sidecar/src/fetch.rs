//! Fetching one apiserver's own discovery over mTLS, as kube-apiserver fetches a peer's
//! (docs/upstream-facts.md, "Peer discovery fetch"): `GET /api` and `GET /apis` with the nopeer Accept header, as the front-proxy
//! identity, with a legacy walk for servers without aggregated discovery.
//!
//! Every failure is a [`FetchError`] with a [`ErrorKind`] that becomes a metrics label; nothing
//! here panics or retries: the sync loop decides what a failure means.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use skewgate_core::discovery::{
    ACCEPT_NOPEER, ApiGroupDiscoveryList, ApiGroupList, ApiResourceList, ApiVersions, DiscoveryError,
    KIND_API_GROUP_LIST, KIND_API_VERSIONS, group_from_resource_lists,
};
use skewgate_core::features;
use skewgate_core::identity::{PEER_PROXIED, REMOTE_GROUP, REMOTE_USER};

use skewgate_core::legacy_build::LegacySet;

use crate::config::{Identity, Limits, TlsFiles};
use skewgate_core::discovery::counts::{self, Counts};
use skewgate_envoy::Endpoint;

/// Legacy documents are plain JSON.
const ACCEPT_JSON: &str = "application/json";
/// Parallel requests of one legacy walk: enough to be quick, few enough not to look like a flood.
const LEGACY_PARALLELISM: usize = 8;
/// How much of an error body ends up in the message.
const ERROR_BODY_PREVIEW: usize = 512;

/// One apiserver's discovery, in the aggregated form whatever it served.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct Documents {
    /// `gitVersion` from `/version`; "" when it could not be read (informational only).
    pub version: String,
    /// `/api`: the core group.
    pub core: ApiGroupDiscoveryList,
    /// `/apis`: every other group.
    pub apis: ApiGroupDiscoveryList,
    /// Built from legacy discovery (`APIGroupList` + `APIResourceList`s).
    pub legacy: bool,
    /// The aggregated documents' ETags as the apiserver sent them: what a probe asks about.
    #[serde(default)]
    pub etags: Etags,
    /// Its legacy discovery documents, from which the edge composes the merged ones. `None`
    /// when they could not be read yet (the table then composes no legacy document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy_documents: Option<LegacySet>,
    /// The feature gates the edge routes on, from its `/metrics` ([`skewgate_core::features`]);
    /// empty when they could not be read (then none is taken as off).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, bool>,
}

/// `ETag`s of `/api` and `/apis` (quotes included, as sent).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Etags {
    pub api: Option<String>,
    pub apis: Option<String>,
}

impl Etags {
    /// Both, or nothing to probe with (legacy discovery, or a server that sends no ETag).
    pub fn both(&self) -> Option<(&str, &str)> {
        Some((self.api.as_deref()?, self.apis.as_deref()?))
    }
}

/// One GET's answer.
pub(crate) enum Answer {
    Body(Bytes, Option<String>),
    NotModified,
}

/// What went wrong, coarse enough to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No TCP connection (refused, unreachable, name lookup failed).
    Connect,
    /// The TLS handshake failed: unknown CA, wrong name, no client certificate accepted, ...
    Tls,
    /// No complete answer within the request timeout (a hang).
    Timeout,
    /// An answer other than 200 and 404.
    HttpStatus,
    /// 404: the apiserver does not serve the path.
    NotFound,
    /// A body over the size limit.
    TooLarge,
    /// A discovery that parses but lists more groups, group/versions or resources than
    /// `[limits]` allows.
    Limit,
    /// The body ended early, on the wire or as JSON.
    Truncated,
    Empty,
    NotJson,
    /// JSON of another kind or apiVersion than the path must serve.
    WrongKind,
    /// JSON of the right kind with fields of the wrong type.
    WrongShape,
    /// Anything else on the client side (e.g. an unusable certificate file).
    Request,
    /// The apiserver closed the connection the sidecar keeps open to it (it stopped).
    Closed,
}

impl ErrorKind {
    /// The `kind` label of `skewgate_sync_errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Tls => "tls",
            ErrorKind::Timeout => "timeout",
            ErrorKind::HttpStatus => "http_status",
            ErrorKind::NotFound => "not_found",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Limit => "limit",
            ErrorKind::Truncated => "truncated",
            ErrorKind::Empty => "empty",
            ErrorKind::NotJson => "not_json",
            ErrorKind::WrongKind => "wrong_kind",
            ErrorKind::WrongShape => "wrong_shape",
            ErrorKind::Request => "request",
            ErrorKind::Closed => "closed",
        }
    }

    fn of_discovery(error: &DiscoveryError) -> Self {
        match error {
            DiscoveryError::Empty => ErrorKind::Empty,
            DiscoveryError::NotJson(_) => ErrorKind::NotJson,
            DiscoveryError::Truncated(_) => ErrorKind::Truncated,
            DiscoveryError::WrongShape(_) => ErrorKind::WrongShape,
            DiscoveryError::WrongKind(_) | DiscoveryError::WrongApiVersion(_) => ErrorKind::WrongKind,
        }
    }
}

/// A failed fetch: which path, what kind of failure, and the detail for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    pub path: String,
    pub kind: ErrorKind,
    pub detail: String,
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GET {}: {}: {}", self.path, self.kind.label(), self.detail)
    }
}

impl std::error::Error for FetchError {}

impl FetchError {
    pub fn new(path: &str, kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self { path: path.to_owned(), kind, detail: detail.into() }
    }

    fn discovery(path: &str, error: &DiscoveryError) -> Self {
        Self::new(path, ErrorKind::of_discovery(error), error.to_string())
    }
}

/// Sorts a client error into a kind by what is underneath it.
pub fn classify(error: &reqwest::Error) -> ErrorKind {
    if error.is_timeout() {
        return ErrorKind::Timeout;
    }
    if source_chain(error).any(is_tls_error) {
        return ErrorKind::Tls;
    }
    if error.is_connect() {
        return ErrorKind::Connect;
    }
    if error.is_body() || error.is_decode() {
        return ErrorKind::Truncated;
    }
    if source_chain(error).any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(io.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset)
        })
    }) {
        return ErrorKind::Truncated;
    }
    ErrorKind::Request
}

fn source_chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| e.source())
}

/// rustls errors arrive directly or wrapped in (nested) `io::Error`s by the TLS stream; an
/// `io::Error`'s `source()` skips the error it wraps, so those are unwrapped by hand.
fn is_tls_error(error: &(dyn std::error::Error + 'static)) -> bool {
    if error.is::<rustls::Error>() {
        return true;
    }
    match error.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
        Some(inner) => {
            let inner: &(dyn std::error::Error + 'static) = inner;
            source_chain(inner).any(is_tls_error)
        }
        None => false,
    }
}

/// The full message of an error and its sources, which reqwest keeps apart.
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in source_chain(error) {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// Dials the configured address whatever host the URL names, so that the URL can carry the
/// server name for SNI and certificate verification (as `--resolve` does for curl).
struct FixedAddress {
    address: String,
    port: u16,
}

impl reqwest::dns::Resolve for FixedAddress {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let target = (self.address.clone(), self.port);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host(target).await?.collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Fetches one apiserver's discovery; cheap to clone, keeps its connections.
#[derive(Clone)]
pub struct Fetcher {
    pub id: String,
    client: reqwest::Client,
    base: String,
    limits: Limits,
    /// Sent with every request; not as the client's default headers, which keep only one
    /// value of a repeated header (and there is one `X-Remote-Group` per group).
    identity: HeaderMap,
    /// The last legacy set read, with the aggregated documents and version it was read with.
    legacy_cache: Arc<std::sync::Mutex<Option<LegacyCache>>>,
    /// The last feature gates read, with the version and ETags they were read under.
    features_cache: Arc<std::sync::Mutex<Option<FeaturesCache>>>,
}

type FeaturesCache = ((String, Etags), Instant, BTreeMap<String, bool>);

/// How long feature gates read from `/metrics` are trusted while nothing else changes.
pub const FEATURES_MAX_AGE: Duration = Duration::from_secs(600);

/// The legacy documents say what the aggregated ones say (plus `storageVersionHash`, set by the
/// binary's storage versions): they are walked again only when the aggregated documents or the
/// reported version change, not at every poll (a walk is one request per group/version).
#[derive(Debug, Clone)]
struct LegacyCache {
    core: ApiGroupDiscoveryList,
    apis: ApiGroupDiscoveryList,
    version: String,
    set: LegacySet,
}

impl fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher").field("id", &self.id).field("base", &self.base).finish()
    }
}

/// Why no client could be made: the message names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(pub String);

/// The TLS material, read once for every apiserver's client.
#[derive(Clone)]
pub struct ClientTls {
    roots: Vec<reqwest::Certificate>,
    identity: reqwest::Identity,
}

impl ClientTls {
    pub fn load(files: &TlsFiles) -> Result<Self, ClientError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| ClientError(format!("{}: {e}", path.display())))
        };
        let ca = read(&files.peer_ca)?;
        let roots = reqwest::Certificate::from_pem_bundle(&ca)
            .map_err(|e| ClientError(format!("tls.peerCa {}: {e}", files.peer_ca.display())))?;
        if roots.is_empty() {
            return Err(ClientError(format!("tls.peerCa {}: no certificate in it", files.peer_ca.display())));
        }
        let mut pem = read(&files.client_cert)?;
        pem.push(b'\n');
        pem.extend(read(&files.client_key)?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            ClientError(format!(
                "tls.clientCert/clientKey {} + {}: {}",
                files.client_cert.display(),
                files.client_key.display(),
                describe(&e)
            ))
        })?;
        // reqwest only checks that key and certificate belong together when a client is built.
        reqwest::Client::builder().use_rustls_tls().identity(identity.clone()).build().map_err(|e| {
            ClientError(format!(
                "tls.clientCert/clientKey {} + {}: unusable: {}",
                files.client_cert.display(),
                files.client_key.display(),
                describe(&e)
            ))
        })?;
        Ok(Self { roots, identity })
    }
}

/// What every request of the sidecar carries: its front-proxy identity, and what
/// kube-apiserver sends to a peer, so that an apiserver with its own peer proxy answers from its
/// own state instead of forwarding (docs/upstream-facts.md, "Rerouted header").
pub fn identity_headers(identity: &Identity) -> Result<HeaderMap, ClientError> {
    let mut headers = HeaderMap::new();
    let value = |v: &str| HeaderValue::from_str(v).map_err(|e| ClientError(format!("identity {v:?}: {e}")));
    headers.insert(HeaderName::from_static(REMOTE_USER), value(&identity.user)?);
    for group in &identity.groups {
        headers.append(HeaderName::from_static(REMOTE_GROUP), value(group)?);
    }
    headers.insert(HeaderName::from_static(PEER_PROXIED), HeaderValue::from_static("true"));
    Ok(headers)
}

impl Fetcher {
    pub fn new(
        endpoint: &Endpoint,
        server_name: &str,
        tls: &ClientTls,
        identity: &Identity,
        limits: Limits,
    ) -> Result<Self, ClientError> {
        let headers = identity_headers(identity)?;
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .https_only(true)
            // A redirect could lead anywhere, plaintext included; discovery never redirects.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .identity(tls.identity.clone())
            .timeout(limits.request_timeout)
            .connect_timeout(limits.request_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .dns_resolver(Arc::new(FixedAddress { address: endpoint.address.clone(), port: endpoint.port }));
        for root in &tls.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let client = builder.build().map_err(|e| ClientError(describe(&e)))?;
        Ok(Self {
            id: endpoint.id.clone(),
            client,
            base: format!("https://{server_name}:{}", endpoint.port),
            limits,
            identity: headers,
            legacy_cache: Arc::default(),
            features_cache: Arc::default(),
        })
    }

    /// `/api` and `/apis` (and `/version`), concurrently; legacy servers are walked.
    pub async fn fetch(&self) -> Result<Documents, FetchError> {
        let (api, apis, version) = tokio::join!(
            self.get_tagged("/api", ACCEPT_NOPEER, None),
            self.get_tagged("/apis", ACCEPT_NOPEER, None),
            self.version()
        );
        let body = |answer: Answer, path: &str| match answer {
            Answer::Body(body, etag) => Ok((body, etag)),
            Answer::NotModified => {
                Err(FetchError::new(path, ErrorKind::HttpStatus, "304 without If-None-Match"))
            }
        };
        let ((api, api_etag), (apis, apis_etag)) = (body(api?, "/api")?, body(apis?, "/apis")?);
        // Counted before they are parsed: bodies over the limits are dropped as bytes.
        let counted = counts::count(&api).unwrap_or_default() + counts::count(&apis).unwrap_or_default();
        self.check_counts(counted)?;
        let ((core, legacy_core), (apis, legacy_apis)) = tokio::try_join!(self.core(api), self.groups(apis))?;
        // Again for what a legacy walk brought in.
        self.check_counts(Counts::of(&[&core, &apis]))?;
        let legacy = legacy_core || legacy_apis;
        // A legacy document's ETag (if any) says nothing about the resource lists behind it.
        let etags = match legacy {
            true => Etags::default(),
            false => Etags { api: api_etag, apis: apis_etag },
        };
        // Side by side: a new apiserver's table waits for the slower of the two, not both.
        let (legacy_documents, features) =
            tokio::join!(self.legacy_documents(&core, &apis, &version), self.features(&version, &etags));
        Ok(Documents { version, core, apis, legacy, etags, legacy_documents, features })
    }

    /// The routed feature gates from `/metrics`: read again when the apiserver's version or
    /// discovery changes, or after [`FEATURES_MAX_AGE`]. `/metrics` is large and gates change
    /// only when an apiserver restarts, which a new binary or a new API set shows at once; a
    /// restart with new `--feature-gates` alone is seen within the age. An apiserver that does
    /// not let the sidecar's identity read it (403: see docs/kubeadm/rbac.yaml) leaves them
    /// unknown, and the edge then narrows nothing on them.
    async fn features(&self, version: &str, etags: &Etags) -> BTreeMap<String, bool> {
        let key = (version.to_owned(), etags.clone());
        if let Ok(cache) = self.features_cache.lock()
            && let Some((cached_key, read_at, gates)) = cache.as_ref()
            && *cached_key == key
            && read_at.elapsed() < FEATURES_MAX_AGE
        {
            return gates.clone();
        }
        let gates = match self.get("/metrics", "text/plain").await {
            Ok(body) => features::from_metrics(&String::from_utf8_lossy(&body)),
            Err(error) => {
                tracing::warn!(apiserver = %self.id, %error, "feature gates unknown (/metrics)");
                BTreeMap::new()
            }
        };
        if let Ok(mut cache) = self.features_cache.lock() {
            *cache = Some((key, Instant::now(), gates.clone()));
        }
        gates
    }

    /// The legacy set for these aggregated documents: cached, or walked. A failed walk keeps
    /// the previous set, if any (closer to what the server serves than none), and is retried at
    /// the next fetch; it never fails the fetch: routing needs only the aggregated documents.
    async fn legacy_documents(
        &self,
        core: &ApiGroupDiscoveryList,
        apis: &ApiGroupDiscoveryList,
        version: &str,
    ) -> Option<LegacySet> {
        let cached = self.legacy_cache.lock().ok().and_then(|cache| cache.clone());
        if let Some(cache) = &cached {
            if (&cache.core, &cache.apis, cache.version.as_str()) == (core, apis, version) {
                return Some(cache.set.clone());
            }
        }
        match self.legacy_walk().await {
            Ok(set) => {
                if let Ok(mut cache) = self.legacy_cache.lock() {
                    *cache = Some(LegacyCache {
                        core: core.clone(),
                        apis: apis.clone(),
                        version: version.to_owned(),
                        set: set.clone(),
                    });
                }
                Some(set)
            }
            Err(error) => {
                tracing::warn!(apiserver = %self.id, %error, "legacy discovery failed; keeping the previous set");
                cached.map(|cache| cache.set)
            }
        }
    }

    /// `/api`, `/apis` (legacy Accept) and every `APIResourceList` they name, with the limits
    /// of every other discovery request.
    pub async fn legacy_walk(&self) -> Result<LegacySet, FetchError> {
        let (api, apis) = tokio::try_join!(self.get("/api", ACCEPT_JSON), self.get("/apis", ACCEPT_JSON))?;
        let api = ApiVersions::from_json(&api).map_err(|e| FetchError::discovery("/api", &e))?;
        let apis = ApiGroupList::from_json(&apis).map_err(|e| FetchError::discovery("/apis", &e))?;
        // The composed legacy documents are held as long as the aggregated ones: same bounds.
        self.check_group_list(&apis)?;
        let core = api.versions.iter().filter(|v| is_segment(v)).map(|v| format!("/api/{v}"));
        let groups = apis.groups.iter().filter(|g| is_segment(&g.name)).flat_map(|g| {
            g.versions
                .iter()
                .filter(|v| is_segment(&v.version))
                .map(move |v| format!("/apis/{}/{}", g.name, v.version))
        });
        let mut paths: Vec<String> = core.chain(groups).collect();
        paths.dedup();
        let resource_lists = self.resource_lists(paths).await?;
        let resources = resource_lists.iter().map(|list| list.resources.len()).sum();
        if resources > self.limits.max_resources {
            let max = self.limits.max_resources;
            return Err(over_limit("(legacy walk)", resources, "resources", "maxResources", max));
        }
        Ok(LegacySet { api, apis, resource_lists })
    }

    /// Refuses a discovery over `[limits]`.
    fn check_counts(&self, counted: Counts) -> Result<(), FetchError> {
        let counts = [
            (counted.groups, self.limits.max_groups, "groups", "maxGroups"),
            (counted.group_versions, self.limits.max_group_versions, "group/versions", "maxGroupVersions"),
            (counted.resources, self.limits.max_resources, "resources", "maxResources"),
        ];
        for (count, max, what, key) in counts {
            if count > max {
                return Err(over_limit("/api + /apis", count, what, key, max));
            }
        }
        Ok(())
    }

    /// Refuses a legacy `APIGroupList` over `[limits]` before it is walked: each group/version
    /// would be one more request and document.
    fn check_group_list(&self, list: &ApiGroupList) -> Result<(), FetchError> {
        let listed = list.groups.len();
        if listed > self.limits.max_groups {
            return Err(over_limit("/apis", listed, "groups", "maxGroups", self.limits.max_groups));
        }
        let versions: usize = list.groups.iter().map(|g| g.versions.len()).sum();
        if versions > self.limits.max_group_versions {
            let max = self.limits.max_group_versions;
            return Err(over_limit("/apis", versions, "group/versions", "maxGroupVersions", max));
        }
        Ok(())
    }

    /// `/version` as a label; a failure only costs the label.
    async fn version(&self) -> String {
        match self.get("/version", ACCEPT_JSON).await {
            Ok(body) => version_label(&body),
            Err(e) => {
                tracing::debug!(apiserver = %self.id, error = %e, "no version");
                String::new()
            }
        }
    }

    /// The core group from `/api`: aggregated, or `APIVersions` + `/api/<v>`.
    async fn core(&self, body: Bytes) -> Result<(ApiGroupDiscoveryList, bool), FetchError> {
        if kind_of(&body).as_deref() == Some(KIND_API_VERSIONS) {
            let versions = ApiVersions::from_json(&body).map_err(|e| FetchError::discovery("/api", &e))?;
            let paths: Vec<String> =
                versions.versions.iter().filter(|v| is_segment(v)).map(|v| format!("/api/{v}")).collect();
            let lists = self.resource_lists(paths).await?;
            let group =
                group_from_resource_lists("", &lists).map_err(|e| FetchError::discovery("/api", &e))?;
            return Ok((ApiGroupDiscoveryList::v2(vec![group]), true));
        }
        let list = ApiGroupDiscoveryList::from_json(&body).map_err(|e| FetchError::discovery("/api", &e))?;
        Ok((list, false))
    }

    /// Every other group from `/apis`: aggregated, or `APIGroupList` + `/apis/<g>/<v>`.
    async fn groups(&self, body: Bytes) -> Result<(ApiGroupDiscoveryList, bool), FetchError> {
        if kind_of(&body).as_deref() == Some(KIND_API_GROUP_LIST) {
            let list = ApiGroupList::from_json(&body).map_err(|e| FetchError::discovery("/apis", &e))?;
            // Group and version names go into paths: anything that is not one plain segment
            // could not be a real group anyway.
            self.check_group_list(&list)?;
            let wanted: Vec<(&str, Vec<&str>)> = list
                .groups
                .iter()
                .filter(|g| is_segment(&g.name))
                .map(|g| {
                    (
                        g.name.as_str(),
                        g.versions_by_preference().into_iter().filter(|v| is_segment(v)).collect(),
                    )
                })
                .collect();
            let paths: Vec<String> = wanted
                .iter()
                .flat_map(|(g, versions)| versions.iter().map(move |v| format!("/apis/{g}/{v}")))
                .collect();
            let mut lists = self.resource_lists(paths).await?.into_iter();
            let mut groups = Vec::with_capacity(wanted.len());
            for (name, versions) in &wanted {
                let mine: Vec<ApiResourceList> = lists.by_ref().take(versions.len()).collect();
                let path = format!("/apis/{name}");
                groups.push(
                    group_from_resource_lists(name, &mine).map_err(|e| FetchError::discovery(&path, &e))?,
                );
            }
            return Ok((ApiGroupDiscoveryList::v2(groups), true));
        }
        let list = ApiGroupDiscoveryList::from_json(&body).map_err(|e| FetchError::discovery("/apis", &e))?;
        Ok((list, false))
    }

    /// `APIResourceList`s of `paths`, in order; the first failure fails the walk, since a
    /// partial picture would drop what the server does serve. A 404 is the server's own word
    /// that it serves nothing there: an empty list. (A real kube-apiserver 1.36 emulating 1.33
    /// lists `resource.k8s.io/v1` in its legacy `/apis` and answers 404 under it; failing the walk
    /// on that left the edge without composed legacy discovery for good.)
    async fn resource_lists(&self, paths: Vec<String>) -> Result<Vec<ApiResourceList>, FetchError> {
        let permits = Arc::new(tokio::sync::Semaphore::new(LEGACY_PARALLELISM));
        let mut tasks = tokio::task::JoinSet::new();
        for (index, path) in paths.into_iter().enumerate() {
            let (this, permits) = (self.clone(), permits.clone());
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let result = match this.get(&path, ACCEPT_JSON).await {
                    Ok(body) => {
                        ApiResourceList::from_json(&body).map_err(|e| FetchError::discovery(&path, &e))
                    }
                    Err(e) if e.kind == ErrorKind::NotFound => Ok(ApiResourceList {
                        group_version: group_version_of(&path).to_owned(),
                        ..ApiResourceList::default()
                    }),
                    Err(e) => Err(e),
                };
                (index, result)
            });
        }
        let mut lists: Vec<(usize, ApiResourceList)> = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (index, result) =
                joined.map_err(|e| FetchError::new("(legacy walk)", ErrorKind::Request, e.to_string()))?;
            lists.push((index, result?));
        }
        lists.sort_by_key(|(index, _)| *index);
        Ok(lists.into_iter().map(|(_, list)| list).collect())
    }

    /// One GET, status checked, body read up to the limit.
    pub async fn get(&self, path: &str, accept: &str) -> Result<Bytes, FetchError> {
        match self.get_tagged(path, accept, None).await? {
            Answer::Body(body, _) => Ok(body),
            Answer::NotModified => {
                Err(FetchError::new(path, ErrorKind::HttpStatus, "304 without If-None-Match"))
            }
        }
    }

    /// One GET, optionally conditional: 304 is then an answer too.
    pub(crate) async fn get_tagged(
        &self,
        path: &str,
        accept: &str,
        if_none_match: Option<&str>,
    ) -> Result<Answer, FetchError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.get(&url).headers(self.identity.clone()).header(ACCEPT, accept);
        if let Some(tag) = if_none_match {
            request = request.header(reqwest::header::IF_NONE_MATCH, tag);
        }
        let mut response =
            request.send().await.map_err(|e| FetchError::new(path, classify(&e), describe(&e)))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_MODIFIED && if_none_match.is_some() {
            return Ok(Answer::NotModified);
        }
        let etag =
            response.headers().get(reqwest::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if status != reqwest::StatusCode::OK {
            let preview =
                read_capped(&mut response, ERROR_BODY_PREVIEW as u64, true).await.unwrap_or_default();
            let text = String::from_utf8_lossy(&preview);
            let kind = match status {
                reqwest::StatusCode::NOT_FOUND => ErrorKind::NotFound,
                _ => ErrorKind::HttpStatus,
            };
            return Err(FetchError::new(path, kind, format!("{status}: {}", text.trim())));
        }
        let max_body = self.limits.max_body_bytes;
        if response.content_length().is_some_and(|len| len > max_body) {
            return Err(FetchError::new(
                path,
                ErrorKind::TooLarge,
                format!(
                    "Content-Length {} over the limit of {} bytes",
                    response.content_length().unwrap_or_default(),
                    max_body
                ),
            ));
        }
        let body = read_capped(&mut response, max_body, false).await.map_err(|e| match e {
            ReadError::TooLarge => {
                FetchError::new(path, ErrorKind::TooLarge, format!("body over the limit of {max_body} bytes"))
            }
            ReadError::Client(e) => FetchError::new(path, classify(&e), describe(&e)),
        })?;
        Ok(Answer::Body(body, etag))
    }
}

fn over_limit(path: &str, count: usize, what: &str, key: &str, max: usize) -> FetchError {
    FetchError::new(path, ErrorKind::Limit, format!("{count} {what}, over limits.{key} = {max}"))
}

enum ReadError {
    TooLarge,
    Client(reqwest::Error),
}

/// Reads the body chunk by chunk so that an oversized one is never held whole; `truncate`
/// keeps the first `max` bytes instead of failing (for error previews).
async fn read_capped(response: &mut reqwest::Response, max: u64, truncate: bool) -> Result<Bytes, ReadError> {
    // Sized once when the length is announced: growing by doubling would hold up to twice the body.
    let announced = response.content_length().unwrap_or(0).min(max);
    let mut body: Vec<u8> = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Client)? {
        let room = usize::try_from(max).unwrap_or(usize::MAX).saturating_sub(body.len());
        if chunk.len() > room {
            if truncate {
                body.extend_from_slice(chunk.get(..room).unwrap_or_default());
                break;
            }
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

/// The `kind` of a JSON object, when it has a string one.
pub(crate) fn kind_of(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(default)]
        kind: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Kind>(body).ok()?.kind? {
        serde_json::Value::String(kind) => Some(kind),
        _ => None,
    }
}

fn is_segment(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && value != "."
        && value != ".."
}

/// `gitVersion`, and the API level the apiserver serves when it emulates an older release
/// (`--emulated-version`): `v1.36.2 (emulating 1.33)`. "" for a body that is not `/version`.
pub fn version_label(body: &[u8]) -> String {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Info {
        #[serde(default)]
        git_version: String,
        #[serde(default)]
        major: String,
        #[serde(default)]
        minor: String,
        #[serde(default)]
        emulation_major: String,
        #[serde(default)]
        emulation_minor: String,
    }
    let Ok(info) = serde_json::from_slice::<Info>(body) else { return String::new() };
    // `minor` may carry a `+` (vendor builds); emulation fields are plain numbers.
    let number = |s: &str| s.trim_end_matches('+').to_string();
    let emulated = (number(&info.emulation_major), number(&info.emulation_minor));
    if emulated.0.is_empty() || emulated == (number(&info.major), number(&info.minor)) {
        return info.git_version;
    }
    format!("{} (emulating {}.{})", info.git_version, emulated.0, emulated.1)
}

/// `v1` for `/api/v1`, `group/version` for `/apis/group/version`.
fn group_version_of(path: &str) -> &str {
    path.strip_prefix("/apis/").or_else(|| path.strip_prefix("/api/")).unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Answer, Certs, json, serve};
    use skewgate_core::discovery::core_group_list;

    const APIS_133: &str =
        include_str!("../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json");
    const API_V1: &str = include_str!("../../testdata/discovery/legacy_core-v1/api__v1.json");
    const API_VERSIONS: &str = include_str!("../../testdata/discovery/legacy_core-v1/api.json");

    fn limits() -> Limits {
        Limits {
            request_timeout: Duration::from_millis(700),
            max_body_bytes: 256 * 1024,
            ..Limits::default()
        }
    }

    fn aggregated_core() -> Vec<u8> {
        let list = ApiResourceList::from_json(API_V1.as_bytes()).unwrap();
        serde_json::to_vec(&core_group_list(&list)).unwrap()
    }

    /// A well-behaved aggregated apiserver, except for `/apis`, which `apis` answers.
    fn with_apis(apis: Answer) -> crate::testing::Handler {
        let core = aggregated_core();
        Arc::new(move |path: &str| match path {
            "/api" => json(core.clone()),
            "/apis" => apis.clone(),
            "/version" => json(r#"{"gitVersion":"v1.33.2"}"#),
            _ => Answer::Json(404, "application/json", b"{}".to_vec()),
        })
    }

    #[tokio::test]
    async fn aggregated_discovery_as_the_front_proxy_identity() {
        let certs = Certs::new("fetch-aggregated");
        let (addr, seen, _task) = serve(&certs.serving, true, with_apis(json(APIS_133))).await;
        let docs = certs.fetcher(addr, limits()).fetch().await.unwrap();
        assert_eq!(docs.version, "v1.33.2");
        assert!(!docs.legacy);
        assert!(docs.core.gvrs().any(|g| g == ("", "v1", "pods")));
        assert!(docs.apis.gvrs().any(|g| g == ("resource.k8s.io", "v1alpha3", "deviceclasses")));
        let seen = seen.lock().unwrap();
        for path in ["/api", "/apis"] {
            let (_, h) = seen.iter().find(|(p, _)| p == path).unwrap();
            assert_eq!(h["accept"], ACCEPT_NOPEER);
            assert_eq!(h["x-remote-user"], "system:apiserver");
            assert_eq!(h["x-remote-group"], "g1|g2");
            assert_eq!(h["x-kubernetes-peer-proxied"], "true");
            assert_eq!(h["host"], format!("kubernetes.default.svc:{}", addr.port()));
        }
    }

    #[tokio::test]
    async fn legacy_servers_are_walked() {
        let certs = Certs::new("fetch-legacy");
        let group_list = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"resource.k8s.io",
            "versions":[{"groupVersion":"resource.k8s.io/v1beta1","version":"v1beta1"},
                        {"groupVersion":"resource.k8s.io/v1alpha3","version":"v1alpha3"}],
            "preferredVersion":{"groupVersion":"resource.k8s.io/v1beta1","version":"v1beta1"}}]}"#;
        let list = |gv: &str, name: &str| {
            format!(
                r#"{{"kind":"APIResourceList","groupVersion":"{gv}","resources":[{{"name":"{name}","singularName":"x","namespaced":true,"kind":"X","verbs":["get"]}},{{"name":"{name}/status","singularName":"","namespaced":true,"kind":"X","verbs":["get"]}}]}}"#
            )
        };
        let (beta, alpha) = (
            list("resource.k8s.io/v1beta1", "resourceclaims"),
            list("resource.k8s.io/v1alpha3", "deviceclasses"),
        );
        let handler: crate::testing::Handler = Arc::new(move |path: &str| match path {
            "/api" => json(API_VERSIONS),
            "/api/v1" => json(API_V1),
            "/apis" => json(group_list),
            "/apis/resource.k8s.io/v1beta1" => json(beta.clone()),
            "/apis/resource.k8s.io/v1alpha3" => json(alpha.clone()),
            _ => Answer::Json(404, "text/plain", b"404 page not found".to_vec()),
        });
        let (addr, seen, _task) = serve(&certs.serving, true, handler).await;
        let fetcher = certs.fetcher(addr, limits());
        let docs = fetcher.fetch().await.unwrap();
        // The legacy set is read as the server sent it (storageVersionHash and all).
        let set = docs.legacy_documents.as_ref().unwrap();
        assert_eq!(set.api.versions, ["v1"]);
        assert_eq!(set.apis.groups[0].name, "resource.k8s.io");
        let gvs: Vec<&str> = set.resource_lists.iter().map(|l| l.group_version.as_str()).collect();
        assert_eq!(gvs, ["v1", "resource.k8s.io/v1beta1", "resource.k8s.io/v1alpha3"]);
        let walks = |seen: &crate::testing::Seen| {
            seen.lock().unwrap().iter().filter(|(p, _)| p == "/apis/resource.k8s.io/v1alpha3").count()
        };
        // Once for the aggregated form, once for the legacy set.
        assert_eq!(walks(&seen), 2);
        // Unchanged discovery: the legacy set comes from the cache, not from another walk.
        let again = fetcher.fetch().await.unwrap();
        assert_eq!(again.legacy_documents, docs.legacy_documents);
        assert_eq!(walks(&seen), 3);
        assert!(docs.legacy);
        assert_eq!(docs.version, "");
        assert!(docs.core.gvrs().any(|g| g == ("", "v1", "pods")));
        let gvrs: Vec<_> = docs.apis.gvrs().collect();
        assert_eq!(
            gvrs,
            [
                ("resource.k8s.io", "v1beta1", "resourceclaims"),
                ("resource.k8s.io", "v1alpha3", "deviceclasses")
            ]
        );
        assert_eq!(docs.apis.items[0].versions[0].resources[0].subresources[0].subresource, "status");
        let seen = seen.lock().unwrap();
        let (_, h) = seen.iter().find(|(p, _)| p == "/apis/resource.k8s.io/v1beta1").unwrap();
        assert_eq!(h["accept"], "application/json");
        assert_eq!(h["x-remote-user"], "system:apiserver");
    }

    async fn kind_for(certs: &Certs, apis: Answer) -> FetchError {
        let (addr, _, _task) = serve(&certs.serving, true, with_apis(apis)).await;
        certs.fetcher(addr, limits()).fetch().await.unwrap_err()
    }

    #[tokio::test]
    async fn broken_answers_are_classified() {
        let certs = Certs::new("fetch-broken");
        let truncated_json = APIS_133.as_bytes()[..2000].to_vec();
        let big = format!("{{\"kind\":\"APIGroupDiscoveryList\",\"pad\":\"{}\"}}", "x".repeat(300 * 1024));
        let cut_short =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"kind\":"
                .to_vec();
        let mut chunked =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
        for _ in 0..40 {
            chunked.extend(format!("2000\r\n{}\r\n", "y".repeat(0x2000)).as_bytes());
        }
        chunked.extend(b"0\r\n\r\n");
        let cases: Vec<(Answer, ErrorKind)> = vec![
            (json("<html>oops</html>"), ErrorKind::NotJson),
            (json(truncated_json), ErrorKind::Truncated),
            (Answer::Raw(cut_short), ErrorKind::Truncated),
            (json(big), ErrorKind::TooLarge),
            (Answer::Raw(chunked), ErrorKind::TooLarge),
            (json(r#"{"kind":"Status","apiVersion":"v1","status":"Failure"}"#), ErrorKind::WrongKind),
            (
                json(r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":"x"}"#),
                ErrorKind::WrongShape,
            ),
            (json(r#"[1,2]"#), ErrorKind::WrongShape),
            (json(""), ErrorKind::Empty),
            (
                Answer::Json(500, "application/json", br#"{"kind":"Status","message":"etcd down"}"#.to_vec()),
                ErrorKind::HttpStatus,
            ),
            (Answer::Json(403, "application/json", b"forbidden".to_vec()), ErrorKind::HttpStatus),
            (Answer::Json(404, "text/plain", b"404 page not found".to_vec()), ErrorKind::NotFound),
            (Answer::Hang, ErrorKind::Timeout),
        ];
        for (answer, kind) in cases {
            let shown = format!("{answer:?}").chars().take(80).collect::<String>();
            let error = kind_for(&certs, answer).await;
            assert_eq!(error.kind, kind, "{shown}: {error}");
            assert_eq!(error.path, "/apis", "{error}");
        }
        let error = kind_for(&certs, Answer::Json(500, "application/json", br#"etcd down"#.to_vec())).await;
        assert!(error.to_string().contains("500") && error.to_string().contains("etcd down"), "{error}");
    }

    #[tokio::test]
    async fn transport_failures_are_classified() {
        let certs = Certs::new("fetch-transport");
        let handler = with_apis(json(APIS_133));
        // A closed port.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert_eq!(certs.fetcher(closed, limits()).fetch().await.unwrap_err().kind, ErrorKind::Connect);
        // A certificate for another name, one from an untrusted CA, and no TLS at all: never
        // accepted, never downgraded.
        let rogue = certs
            .rogue_ca
            .server(&certs.dir, "rogue-apiserver", "rogue-apiserver", &["kubernetes.default.svc"])
            .unwrap();
        for (leaf, tls) in [(&certs.wrong_name, true), (&rogue, true), (&certs.serving, false)] {
            let (addr, seen, _task) = serve(leaf, tls, handler.clone()).await;
            let error = certs.fetcher(addr, limits()).fetch().await.unwrap_err();
            assert_eq!(error.kind, ErrorKind::Tls, "{error}");
            assert!(seen.lock().unwrap().is_empty(), "a request went out: {error}");
        }
    }

    #[test]
    fn version_labels_name_the_emulated_release() {
        let emulated = include_bytes!("../../testdata/real-apiserver/version-emulated-1.33.json");
        assert_eq!(version_label(emulated), "v1.36.2 (emulating 1.33)");
        let native = br#"{"major":"1","minor":"36","emulationMajor":"1","emulationMinor":"36","gitVersion":"v1.36.2"}"#;
        assert_eq!(version_label(native), "v1.36.2");
        assert_eq!(
            version_label(br#"{"major":"1","minor":"30+","gitVersion":"v1.30.1-eks"}"#),
            "v1.30.1-eks"
        );
        assert_eq!(version_label(b"not json"), "");
    }

    /// Each `[limits]` count refuses a discovery one past it, by name; at the limit it passes.
    #[tokio::test]
    async fn discovery_over_a_limit_is_refused() {
        let certs = Certs::new("fetch-limits");
        let (addr, _, _task) = serve(&certs.serving, true, with_apis(json(APIS_133))).await;
        let docs = certs.fetcher(addr, limits()).fetch().await.unwrap();
        let lists = [&docs.core, &docs.apis];
        let groups = lists.iter().map(|l| l.items.len()).sum::<usize>();
        let versions = lists.iter().flat_map(|l| &l.items).map(|g| g.versions.len()).sum::<usize>();
        let resources = docs.core.gvrs().count() + docs.apis.gvrs().count();
        type Set = fn(&mut Limits, usize);
        let cases: [(usize, Set, &str); 3] = [
            (groups, |l, n| l.max_groups = n, "groups, over limits.maxGroups"),
            (versions, |l, n| l.max_group_versions = n, "group/versions, over limits.maxGroupVersions"),
            (resources, |l, n| l.max_resources = n, "resources, over limits.maxResources"),
        ];
        for (count, set, named) in cases {
            let mut at = limits();
            set(&mut at, count);
            certs.fetcher(addr, at).fetch().await.unwrap();
            let mut under = limits();
            set(&mut under, count - 1);
            let error = certs.fetcher(addr, under).fetch().await.unwrap_err();
            assert_eq!(error.kind, ErrorKind::Limit, "{error}");
            assert!(
                error.to_string().contains(&format!("limit: {count} {named} = {}", count - 1)),
                "{error}"
            );
        }
    }

    /// A legacy server listing too many groups is refused before one group/version is fetched.
    #[tokio::test]
    async fn a_legacy_walk_over_a_limit_never_starts() {
        let certs = Certs::new("fetch-legacy-limits");
        let groups: Vec<String> = (0..3)
            .map(|g| format!(r#"{{"name":"g{g}.example.com","versions":[{{"groupVersion":"g{g}.example.com/v1","version":"v1"}}]}}"#))
            .collect();
        let group_list = format!(r#"{{"kind":"APIGroupList","groups":[{}]}}"#, groups.join(","));
        let handler: crate::testing::Handler = Arc::new(move |path: &str| match path {
            "/api" => json(API_VERSIONS),
            "/api/v1" => json(API_V1),
            "/apis" => json(group_list.clone()),
            other => {
                let gv = other.trim_start_matches("/apis/");
                json(format!(r#"{{"kind":"APIResourceList","groupVersion":"{gv}","resources":[]}}"#))
            }
        });
        let (addr, seen, _task) = serve(&certs.serving, true, handler).await;
        for set in [|l: &mut Limits| l.max_groups = 2, |l: &mut Limits| l.max_group_versions = 2] {
            let mut small = limits();
            set(&mut small);
            let error = certs.fetcher(addr, small).fetch().await.unwrap_err();
            assert_eq!((error.kind, error.path.as_str()), (ErrorKind::Limit, "/apis"), "{error}");
        }
        assert!(!seen.lock().unwrap().iter().any(|(p, _)| p.starts_with("/apis/")), "the walk started");
        certs.fetcher(addr, limits()).fetch().await.unwrap();
    }

    #[tokio::test]
    async fn a_legacy_group_version_answering_404_is_served_empty() {
        let certs = Certs::new("fetch-legacy-404");
        // As a real kube-apiserver 1.36 emulating 1.33 answers: v1 listed, 404 under it.
        let group_list = r#"{"kind":"APIGroupList","groups":[{"name":"resource.k8s.io",
            "versions":[{"groupVersion":"resource.k8s.io/v1","version":"v1"},
                        {"groupVersion":"resource.k8s.io/v1beta1","version":"v1beta1"}]}]}"#;
        let beta = r#"{"kind":"APIResourceList","groupVersion":"resource.k8s.io/v1beta1","resources":[
            {"name":"deviceclasses","singularName":"deviceclass","namespaced":false,"kind":"DeviceClass","verbs":["get"]}]}"#;
        let handler: crate::testing::Handler = Arc::new(move |path: &str| match path {
            "/api" => json(API_VERSIONS),
            "/api/v1" => json(API_V1),
            "/apis" => json(group_list),
            "/apis/resource.k8s.io/v1beta1" => json(beta),
            _ => Answer::Json(404, "text/plain", b"404 page not found".to_vec()),
        });
        let (addr, _, _task) = serve(&certs.serving, true, handler).await;
        let set = certs.fetcher(addr, limits()).legacy_walk().await.unwrap();
        let lists: Vec<(&str, usize)> =
            set.resource_lists.iter().map(|l| (l.group_version.as_str(), l.resources.len())).collect();
        assert_eq!(lists, [("v1", 39), ("resource.k8s.io/v1", 0), ("resource.k8s.io/v1beta1", 1)]);
    }

    #[tokio::test]
    async fn a_failing_legacy_group_version_fails_the_fetch() {
        let certs = Certs::new("fetch-legacy-fail");
        let group_list = r#"{"kind":"APIGroupList","groups":[{"name":"metrics.k8s.io",
            "versions":[{"groupVersion":"metrics.k8s.io/v1beta1","version":"v1beta1"}]}]}"#;
        let handler: crate::testing::Handler = Arc::new(move |path: &str| match path {
            "/api" => json(API_VERSIONS),
            "/api/v1" => json(API_V1),
            "/apis" => json(group_list),
            _ => Answer::Json(503, "text/plain", b"service unavailable".to_vec()),
        });
        let (addr, _, _task) = serve(&certs.serving, true, handler).await;
        let error = certs.fetcher(addr, limits()).fetch().await.unwrap_err();
        assert_eq!(
            (error.kind, error.path.as_str()),
            (ErrorKind::HttpStatus, "/apis/metrics.k8s.io/v1beta1")
        );
    }
}
