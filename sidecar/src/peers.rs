//! Apiservers from the cluster, and the group/versions that CRDs and aggregated APIServices
//! back (docs/upstream-facts.md, "Peer identity and endpoints", "Extension exclusion").
//!
//! With `[cluster] members = "endpointSlice"` or `"leases"`, the apiservers are those the
//! cluster publishes; `apiservers` in the configuration is only where to start (the bootstrap).
//! Every poll period (and whenever an apiserver's discovery changes, for extensions), one
//! apiserver is asked — the current members first (`bootstrap = "pool"`), then the configured
//! ones — and answers for the cluster, since all of them read the same etcd:
//!
//! - `endpointSlice`: the EndpointSlices of the `kubernetes` service in `default` (the one
//!   kube-apiserver's lease endpoint reconciler keeps: every apiserver's advertise address, one
//!   port). Each ready address with the `https` port is a member; its id is the configured one
//!   with that address and port, else the endpoint's `hostname` if it is a DNS label, else one
//!   made from the address and port (`ep-10-0-0-11-6443`).
//! - `leases`: the identity Leases in `kube-system` labelled
//!   `apiserver.kubernetes.io/identity=kube-apiserver` with a holder. The id is the lease name
//!   (`apiserver-<hash>`); the address is the lease's `kubernetes.io/hostname` label with
//!   `[cluster] port`, or its `skewgate.io/address` annotation (`host:port`) where whoever runs
//!   the apiservers sets one. A Lease outlives a killed apiserver by up to its duration (1 h):
//!   such a member stays, unreachable, its GVRs answering 503 as with a static one.
//!
//! Joining: a new member enters the table only once its discovery has been fetched, and Envoy
//! sends it requests only once the table built from that discovery is live (the eligibility
//! rules, [`crate::eligibility`]).
//!
//! Leaving: a member no longer published is `DRAINING` at once (the cluster says it is going:
//! a stopping kube-apiserver removes itself from the EndpointSlice before it stops serving),
//! and leaves the table `leaveAfter` later (default 1 m) unless it is published again. Until
//! then the GVRs only it serves answer 503, as for any unreachable apiserver; after, 404, as a
//! cluster without it answers. A restart (out and back within `leaveAfter`) thus costs no
//! table change. A listing that names no apiserver at all is not believed.
//!
//! Extensions (`extensions = true`): `customresourcedefinitions` and `apiservices` are listed
//! ([`skewgate_core::extensions`] says why listing, rather than discovery, tells them apart), and
//! their group/versions go to the pool. A table built from a discovery change waits for a
//! listing that started after the change was seen: a CRD is in etcd before any apiserver's
//! discovery shows it, so that listing knows it, and the CRD is never sent to the subset of
//! apiservers whose discovery happened to show it first.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde_json::Value;
use skewgate_core::build::is_valid_apiserver_id;
use skewgate_core::extensions::Extensions;

use crate::cluster::{APISERVICES, Bootstrap, CRDS, ClusterConfig, ENDPOINT_SLICES, LEASES, Members};
use crate::config::SyncConfig;
use crate::fetch::{ClientTls, FetchError, Fetcher};
use skewgate_envoy::Endpoint;

/// Where a Lease may say how to reach its apiserver (`host:port`).
pub const ADDRESS_ANNOTATION: &str = "skewgate.io/address";
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Where a member came from (`skewgate table` shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    #[default]
    Config,
    EndpointSlice,
    Lease,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Config => "config",
            Source::EndpointSlice => "EndpointSlice",
            Source::Lease => "Lease",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub endpoint: Endpoint,
    pub source: Source,
}

/// What one look at the cluster found; `None` where that part was not asked or failed.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub members: Option<Vec<Member>>,
    pub extensions: Option<Extensions>,
}

/// The members an EndpointSlice list publishes (see the module doc for ids).
pub fn from_endpoint_slices(list: &Value, configured: &[Endpoint]) -> Vec<Member> {
    let mut found: Vec<(String, u16, Option<String>)> = Vec::new();
    for slice in items(list) {
        let ports: Vec<&Value> = slice["ports"].as_array().into_iter().flatten().collect();
        let port = ports
            .iter()
            .find(|p| p["name"] == "https")
            .or_else(|| ports.first().filter(|_| ports.len() == 1))
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port else { continue };
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            // Unset means ready (EndpointSlice API); a terminating apiserver is going.
            if endpoint["conditions"]["ready"] == Value::Bool(false) {
                continue;
            }
            let hostname = endpoint["hostname"].as_str().map(str::to_owned);
            for address in endpoint["addresses"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                found.push((address.to_owned(), port, hostname.clone()));
            }
        }
    }
    name(found, configured, Source::EndpointSlice)
}

/// The members a Lease list publishes, dialled on `port` unless a lease says otherwise.
pub fn from_leases(list: &Value, port: u16, configured: &[Endpoint]) -> Vec<Member> {
    let mut found = Vec::new();
    for lease in items(list) {
        let meta = &lease["metadata"];
        if meta["labels"][IDENTITY_LABEL] != "kube-apiserver" {
            continue;
        }
        // Upstream's rule for a valid peer lease: a holder (a stopped server clears it).
        if lease["spec"]["holderIdentity"].as_str().is_none_or(str::is_empty) {
            continue;
        }
        let address = match meta["annotations"][ADDRESS_ANNOTATION].as_str().and_then(split_host_port) {
            Some((host, port)) => Some((host, port)),
            None => meta["labels"][HOSTNAME_LABEL].as_str().map(|h| (h.to_owned(), port)),
        };
        if let Some((host, port)) = address {
            found.push((host, port, meta["name"].as_str().map(str::to_owned)));
        }
    }
    name(found, configured, Source::Lease)
}

fn split_host_port(text: &str) -> Option<(String, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_owned(), port.parse().ok()?))
}

/// Ids for (address, port, suggested id): the configured one, the suggestion, or a made one;
/// the first of duplicate addresses wins.
fn name(found: Vec<(String, u16, Option<String>)>, configured: &[Endpoint], source: Source) -> Vec<Member> {
    let mut members: Vec<Member> = Vec::new();
    let mut seen = BTreeSet::new();
    for (address, port, suggested) in found {
        if !seen.insert((address.clone(), port)) {
            continue;
        }
        let taken = |id: &str| {
            members.iter().any(|m| m.endpoint.id == id)
                || configured.iter().any(|e| e.id == id && (e.address != address || e.port != port))
        };
        let id = match configured.iter().find(|e| e.address == address && e.port == port) {
            Some(e) => e.id.clone(),
            None => match suggested.filter(|s| is_valid_apiserver_id(s) && !taken(s)) {
                Some(s) => s,
                None => made_id(&address, port),
            },
        };
        members.push(Member { endpoint: Endpoint { id, address, port }, source });
    }
    members
}

fn made_id(address: &str, port: u16) -> String {
    let cleaned: String = address
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect();
    let id = format!("ep-{}-{port}", cleaned.trim_matches('-'));
    match is_valid_apiserver_id(&id) {
        true => id,
        // Too long (a long host name): a hash keeps it unique and short.
        false => {
            // FNV-1a: stable across builds and platforms, unlike std's hasher.
            let hash = format!("{address}:{port}")
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            format!("ep-{hash:016x}")
        }
    }
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list["items"].as_array().into_iter().flatten()
}

/// Asks the cluster through one apiserver after another until one answers.
pub struct Asker {
    config: ClusterConfig,
    configured: Vec<Endpoint>,
    server_name: String,
    tls: ClientTls,
    identity: crate::config::Identity,
    limits: crate::config::Limits,
    fetchers: HashMap<(String, u16), Fetcher>,
}

impl Asker {
    pub fn new(config: &SyncConfig, tls: ClientTls) -> Self {
        Self {
            config: config.cluster,
            configured: config.apiservers.clone(),
            server_name: config.server_name.clone(),
            tls,
            identity: config.identity.clone(),
            limits: config.limits,
            fetchers: HashMap::new(),
        }
    }

    /// Fetchers to ask, in order, for the current `members`.
    pub fn candidates(&mut self, members: &[Endpoint]) -> Vec<Fetcher> {
        let pool = match self.config.bootstrap {
            Bootstrap::Pool => members,
            Bootstrap::Apiservers => &[],
        };
        let mut order: Vec<Endpoint> = Vec::new();
        for e in pool.iter().chain(&self.configured) {
            if !order.iter().any(|o| o.address == e.address && o.port == e.port) {
                order.push(e.clone());
            }
        }
        let mut fetchers = Vec::new();
        for e in order {
            let key = (e.address.clone(), e.port);
            if !self.fetchers.contains_key(&key) {
                match Fetcher::new(&e, &self.server_name, &self.tls, &self.identity, self.limits) {
                    Ok(f) => {
                        self.fetchers.insert(key.clone(), f);
                    }
                    Err(error) => {
                        tracing::warn!(apiserver = %e.id, %error, "cannot ask it about the cluster")
                    }
                }
            }
            fetchers.extend(self.fetchers.get(&key).cloned());
        }
        fetchers
    }

    pub fn config(&self) -> ClusterConfig {
        self.config
    }

    pub fn configured(&self) -> Vec<Endpoint> {
        self.configured.clone()
    }
}

/// One look at the cluster through the first of `candidates` that answers each part.
pub async fn look(
    config: ClusterConfig,
    configured: &[Endpoint],
    candidates: &[Fetcher],
) -> Result<Published, FetchError> {
    let mut published = Published::default();
    let mut last_error = None;
    for fetcher in candidates {
        if published.members.is_none() && config.members != Members::Static {
            let path = match config.members {
                Members::Leases => LEASES,
                Members::Static | Members::EndpointSlice => ENDPOINT_SLICES,
            };
            match get_json(fetcher, path).await {
                Ok(list) => {
                    let members = match config.members {
                        Members::Leases => from_leases(&list, config.port, configured),
                        _ => from_endpoint_slices(&list, configured),
                    };
                    published.members = Some(members);
                }
                Err(error) => {
                    tracing::debug!(apiserver = %fetcher.id, %error, "cannot list the apiservers");
                    last_error = Some(error);
                    continue;
                }
            }
        }
        if published.extensions.is_none() && config.extensions {
            let (crds, apiservices) = tokio::join!(get_json(fetcher, CRDS), get_json(fetcher, APISERVICES));
            match (crds, apiservices) {
                (Ok(crds), Ok(apiservices)) => {
                    published.extensions = Some(Extensions::from_lists(&crds, &apiservices));
                }
                (Err(error), _) | (_, Err(error)) => {
                    tracing::debug!(apiserver = %fetcher.id, %error, "cannot list CRDs and APIServices");
                    last_error = Some(error);
                    continue;
                }
            }
        }
        return Ok(published);
    }
    match (published.members.is_some() || published.extensions.is_some(), last_error) {
        (false, Some(error)) => Err(error),
        _ => Ok(published),
    }
}

async fn get_json(fetcher: &Fetcher, path: &str) -> Result<Value, FetchError> {
    let body = fetcher.get(path, "application/json").await?;
    serde_json::from_slice(&body)
        .map_err(|e| FetchError::new(path, crate::fetch::ErrorKind::NotJson, format!("not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn endpoint(id: &str, address: &str, port: u16) -> Endpoint {
        Endpoint { id: id.into(), address: address.into(), port }
    }

    #[test]
    fn endpoint_slices_give_ready_addresses_with_the_https_port() {
        let list = json!({"items": [
            {"metadata": {"name": "kubernetes"}, "addressType": "IPv4",
             "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
             "endpoints": [
                {"addresses": ["10.0.0.11"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.12"]},
                {"addresses": ["10.0.0.13"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.14"], "hostname": "d"},
                {"addresses": ["10.0.0.11"]}]},
            {"metadata": {"name": "kubernetes-7001"}, "ports": [{"port": 7001}],
             "endpoints": [{"addresses": ["127.0.0.1"], "hostname": "a"}]},
            {"metadata": {"name": "no-port"}, "ports": [], "endpoints": [{"addresses": ["10.9.9.9"]}]}
        ]});
        let configured = [endpoint("a", "10.0.0.11", 6443)];
        let members = from_endpoint_slices(&list, &configured);
        let got: Vec<(&str, &str, u16)> = members
            .iter()
            .map(|m| (m.endpoint.id.as_str(), m.endpoint.address.as_str(), m.endpoint.port))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "10.0.0.11", 6443),
                ("ep-10-0-0-12-6443", "10.0.0.12", 6443),
                ("d", "10.0.0.14", 6443),
                // "a" is configured with another address: the hostname cannot have it.
                ("ep-127-0-0-1-7001", "127.0.0.1", 7001),
            ]
        );
        assert!(members.iter().all(|m| m.source == Source::EndpointSlice));
        assert_eq!(made_id("fd00::1", 6443), "ep-fd00--1-6443");
        assert!(made_id(&"x".repeat(80), 6443).len() < 30);
    }

    #[test]
    fn leases_with_a_holder_give_members() {
        let lease = |name: &str, holder: Option<&str>, labels: Value, annotations: Value| {
            json!({"metadata": {"name": name, "namespace": "kube-system", "labels": labels, "annotations": annotations},
                   "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3600}})
        };
        let id = |host: &str| json!({IDENTITY_LABEL: "kube-apiserver", HOSTNAME_LABEL: host});
        let list = json!({"items": [
            lease("apiserver-abc", Some("apiserver-abc_1"), id("cp-1.example"), json!({})),
            lease("apiserver-def", None, id("cp-2.example"), json!({})),
            lease("apiserver-ghi", Some("x"), id("cp-3"), json!({ADDRESS_ANNOTATION: "127.0.0.1:7003"})),
            lease("other", Some("x"), json!({"k8s.io/component": "kube-apiserver"}), json!({})),
        ]});
        let members = from_leases(&list, 6443, &[]);
        let got: Vec<(&str, &str, u16, Source)> = members
            .iter()
            .map(|m| (m.endpoint.id.as_str(), m.endpoint.address.as_str(), m.endpoint.port, m.source))
            .collect();
        assert_eq!(
            got,
            [
                ("apiserver-abc", "cp-1.example", 6443, Source::Lease),
                ("apiserver-ghi", "127.0.0.1", 7003, Source::Lease)
            ]
        );
    }

    #[test]
    fn sources_read_as_the_table_shows_them() {
        assert_eq!(
            [Source::Config, Source::EndpointSlice, Source::Lease].map(|s| s.to_string()),
            ["config", "EndpointSlice", "Lease"]
        );
        assert!(!ClusterConfig::default().asks());
    }
}
