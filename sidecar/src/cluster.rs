//! How the sidecar follows its cluster (`cluster` in its config): where its members come from,
//! whom it asks first, how long a member that is no longer published stays, whether it lists
//! the CRD- and APIService-backed group/versions; and the API paths that makes it read. Below
//! the config, which parses it, and [`crate::peers`], which carries it out.

use std::time::Duration;

// The API paths `crate::peers::look` GETs, by what the config asks.
pub const ENDPOINT_SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dkubernetes";
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver";
pub const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
pub const APISERVICES: &str = "/apis/apiregistration.k8s.io/v1/apiservices";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Members {
    /// `apiservers` in the configuration, and nothing else.
    #[default]
    Static,
    EndpointSlice,
    Leases,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bootstrap {
    /// The current members, then the configured apiservers.
    #[default]
    Pool,
    /// Only the configured apiservers.
    Apiservers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterConfig {
    pub members: Members,
    pub bootstrap: Bootstrap,
    /// `leases`: the port of every apiserver.
    pub port: u16,
    pub leave_after: Duration,
    pub extensions: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            members: Members::Static,
            bootstrap: Bootstrap::Pool,
            port: 6443,
            leave_after: Duration::from_secs(60),
            extensions: false,
        }
    }
}

impl ClusterConfig {
    /// Whether the sidecar asks the cluster anything at all.
    pub fn asks(&self) -> bool {
        self.members != Members::Static || self.extensions
    }

    /// The API paths `crate::peers::look` GETs from the cluster: what the sidecar's RBAC must allow.
    pub fn reads(&self) -> Vec<&'static str> {
        let mut reads = match self.members {
            Members::Static => Vec::new(),
            Members::EndpointSlice => vec![ENDPOINT_SLICES],
            Members::Leases => vec![LEASES],
        };
        if self.extensions {
            reads.extend([CRDS, APISERVICES]);
        }
        reads
    }
}

impl Members {
    /// As the configuration names it.
    pub fn label(self) -> &'static str {
        match self {
            Members::Static => "static",
            Members::EndpointSlice => "endpointSlice",
            Members::Leases => "leases",
        }
    }
}

impl Bootstrap {
    /// As the configuration names it.
    pub fn label(self) -> &'static str {
        match self {
            Bootstrap::Pool => "pool",
            Bootstrap::Apiservers => "apiservers",
        }
    }
}
