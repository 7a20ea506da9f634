//! The scenario steps the stand-in scenarios (`e2e/`) and the same scenarios on real
//! kube-apiservers (`e2e_real.rs`) share: one implementation of each, parameterised by a
//! [`Suite`], what differs between the stand-ins and the real binaries. Each test binary
//! includes this folder as its module `common`.

pub mod discovery;
pub mod peer_loss;
pub mod shared_state;
pub mod watch;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use skewgate_core::table::RoutingTable;
use skewgate_harness::cluster::{Cluster, Credentials};
use skewgate_harness::load::{Load, Record, Settings, Target};
use skewgate_harness::scenario::{ids, serving, ten_targets};

/// Only the 1.36 era serves it.
pub const CLAIMS: &str = "resourceclaims.v1.resource.k8s.io";
pub const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
pub const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json";
/// The user extra kube-apiserver's x509 authenticator adds.
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
/// The client's per-request timeout in the load loops.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// What differs between a cluster of stand-ins and one of real kube-apiservers, a and b of
/// the 1.33 era and c of the 1.36 era in both.
pub struct Suite {
    /// The version of resource.k8s.io's deviceclasses only the 1.33 era serves.
    pub old_classes: &'static str,
    /// The 1.36 era's profile, to start c again.
    pub new_profile: &'static str,
    /// Stand-ins name themselves in `x-skewgate-served-by`; real apiservers do not (Envoy's
    /// access log does).
    pub names_itself: bool,
}

impl Suite {
    pub fn ten_targets(&self) -> Vec<Target> {
        ten_targets(self.old_classes)
    }

    pub fn ten_names(&self) -> Vec<String> {
        self.ten_targets().iter().map(Target::name).collect()
    }

    /// The ten targets' names by who serves them in `table`, checked against the eras' facts.
    pub fn ten_by_servers(&self, table: &RoutingTable) -> Result<BTreeMap<Vec<String>, Vec<String>>> {
        let mut by: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for name in self.ten_names() {
            by.entry(serving(table, &name)).or_default().push(name);
        }
        let sizes: Vec<(Vec<String>, usize)> = by.iter().map(|(k, v)| (k.clone(), v.len())).collect();
        ensure!(
            sizes == [(ids(&["a", "b"]), 3), (ids(&["a", "b", "c"]), 4), (ids(&["c"]), 3)],
            "unexpected serving sets for the ten GVRs: {by:?}"
        );
        Ok(by)
    }

    /// A load loop over the ten targets as alice.
    pub fn load(&self, c: &Cluster, workers: usize, pause: Duration) -> Result<Load> {
        let client = c.client(Credentials::Alice, TIMEOUT)?;
        let settings = Settings { workers, pause, timeout: TIMEOUT };
        Ok(Load::start(&client, &c.envoy_url()?, self.ten_targets(), settings))
    }
}

/// Waits until every one of `names` has `n` answers that started after `after` and match.
pub async fn answers_after(
    load: &Load,
    names: &[String],
    after: Duration,
    n: usize,
    timeout: Duration,
    matches: impl Fn(&Record) -> bool,
) -> Result<()> {
    load.wait_for(&format!("{n} matching answers each for {names:?}"), timeout, |targets, records| {
        names.iter().all(|name| {
            let index = targets.iter().position(|t| t.name() == *name);
            records.iter().filter(|r| Some(r.target) == index && r.started > after && matches(r)).count() >= n
        })
    })
    .await?;
    Ok(())
}
