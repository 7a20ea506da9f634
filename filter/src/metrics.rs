//! Counters, named so that Envoy's `stats_tags` (shipped in envoy-config/) turn the `name=value;`
//! segments into Prometheus labels: `skewgate_rerouted_requests_total{group,version,resource}`.

use std::cell::Cell;

use skewgate_core::table::{RoutingTable, Serving};

use crate::host::Host;

/// Metric ids for one table. Envoy returns the same id for the same name, so redefining them on
/// every `on_configure` keeps counting where the previous table left off.
#[derive(Debug)]
pub struct Metrics<H: Host> {
    host: H,
    /// Indexed by `Gvr::id`; only GVRs served by a subset get one. Counted in the VM and handed
    /// to Envoy by [`Metrics::flush`] (every tick, and when the table is retired): a host call
    /// per rerouted request cost more than the rest of the counting.
    rerouted: Vec<(Option<u32>, Cell<u64>)>,
    /// Every request the filter saw, counted as `rerouted`: Envoy's `downstream_rq_total` less
    /// this is what the bypass routes took, which Envoy does not count for the pool.
    seen: (Option<u32>, Cell<u64>),
    /// Indexed like `RoutingTable::sets`, pool last.
    unavailable: Vec<Option<u32>>,
    merged_ok: Option<u32>,
    merged_not_modified: Option<u32>,
    refused: Option<u32>,
    /// Indexed like [`Gated::ALL`].
    gated: [Option<u32>; 3],
}

fn increment(host: &impl Host, id: Option<u32>) {
    if let Some(id) = id {
        host.increment_metric(id, 1);
    }
}

/// How long requests waited at the edge, released or answered ([`crate::hold`]), in ms.
pub const HOLD_MILLISECONDS: &str = "skewgate.hold_milliseconds";

/// Requests that met a down `cluster`, by what became of them ([`crate::hold`]).
pub fn held_requests(cluster: &str, outcome: &str) -> String {
    format!("skewgate.held_requests_total.cluster={cluster};outcome={outcome};")
}

/// Where the body of a write of gated fields ([`skewgate_core::features::GATED`]) sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gated {
    /// To the apiservers with the gates of the fields it sets.
    Narrowed,
    /// It sets none of them: where it was routed.
    AsRouted,
    /// Too long to read, or followed by trailers: narrowed unread.
    Unread,
}

impl Gated {
    const ALL: [Gated; 3] = [Gated::Narrowed, Gated::AsRouted, Gated::Unread];

    fn name(self) -> &'static str {
        match self {
            Gated::Narrowed => "narrowed",
            Gated::AsRouted => "as_routed",
            Gated::Unread => "unread",
        }
    }
}

/// Counts configurations, by outcome, on each VM (the main thread's and every worker's).
pub fn count_config(host: &impl Host, accepted: bool) {
    let result = if accepted { "accepted" } else { "rejected" };
    increment(host, host.define_counter(&format!("skewgate.configs_total.result={result};")));
}

impl<H: Host> Drop for Metrics<H> {
    /// The last stream of a retired table ends here; its counts must not be lost with it.
    fn drop(&mut self) {
        self.flush();
    }
}

impl<H: Host> Metrics<H> {
    pub fn define(host: H, table: &RoutingTable) -> Self {
        let counter = |name: &str| host.define_counter(name);
        let rerouted = table
            .gvrs()
            .iter()
            .map(|g| match g.serving {
                Serving::Set(_) => counter(&format!(
                    "skewgate.rerouted_requests_total.group={};version={};resource={};",
                    g.group, g.version, g.resource
                )),
                Serving::All => None,
            })
            .map(|id| (id, Cell::new(0)))
            .collect();
        let unavailable = table
            .sets()
            .iter()
            .map(|s| s.cluster.as_str())
            .chain([table.pool_cluster()])
            .map(|c| counter(&format!("skewgate.unavailable_replies_total.cluster={c};")))
            .collect();
        Self {
            seen: (counter("skewgate.requests_total"), Cell::new(0)),
            merged_ok: counter("skewgate.merged_discovery_total.code=200;"),
            merged_not_modified: counter("skewgate.merged_discovery_total.code=304;"),
            refused: counter("skewgate.refused_certificates_total"),
            gated: Gated::ALL.map(|g| counter(&format!("skewgate.gated_writes_total.outcome={};", g.name()))),
            host,
            rerouted,
            unavailable,
        }
    }

    pub fn rerouted(&self, gvr_id: usize) {
        if let Some((Some(_), pending)) = self.rerouted.get(gvr_id) {
            pending.set(pending.get() + 1);
        }
    }

    pub fn gated_write(&self, outcome: Gated) {
        increment(&self.host, self.gated[outcome as usize]);
    }

    pub fn seen(&self) {
        self.seen.1.set(self.seen.1.get() + 1);
    }

    /// Hands the counts kept in the VM to Envoy.
    pub fn flush(&self) {
        for (id, pending) in self.rerouted.iter().chain([&self.seen]) {
            let (Some(id), n) = (id, pending.take()) else { continue };
            if n == 0 {
                continue;
            }
            self.host.increment_metric(*id, n);
        }
    }

    pub fn unavailable(&self, serving: Option<Serving>) {
        let index = match serving {
            Some(Serving::Set(i)) => i,
            _ => self.unavailable.len().saturating_sub(1),
        };
        increment(&self.host, self.unavailable.get(index).copied().flatten());
    }

    /// A client certificate whose identity cannot be forwarded unchanged got a 401.
    pub fn refused(&self) {
        increment(&self.host, self.refused);
    }

    pub fn merged_discovery(&self, status: u16) {
        increment(&self.host, if status == 304 { self.merged_not_modified } else { self.merged_ok });
    }
}
