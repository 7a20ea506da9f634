//! The root context: turns plugin configuration into a routing table, or refuses it so that Envoy
//! keeps serving with the previous one.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use skewgate_core::table::{self, RoutingTable};
use skewgate_core::{bypass, hold};

use crate::active::Active;
use crate::hold::Holding;
use crate::host::Host;
use crate::http::Http;
use crate::metrics::{self, Metrics};

/// Half the probe period of held requests' clusters, so that a probe is never a period late.
const TICK_PERIOD: Duration = Duration::from_millis(100);
/// Counts kept in the VM reach Envoy's stats at most this late.
const FLUSH_PERIOD: Duration = Duration::from_secs(1);

pub struct Root<H: Host> {
    /// This root context's id: Envoy makes a root context for every configuration (each table
    /// the sidecar pushes), in the same VM, and keeps the older ones while streams decided on
    /// their tables last.
    id: u32,
    host: H,
    active: Option<Rc<Active<H>>>,
    /// Whether Envoy took the connection properties, once declared (with the first table).
    connection_identity: Option<bool>,
    holding: Rc<Holding<H>>,
    /// The tick period asked of Envoy last.
    tick: Option<Duration>,
    flushed: Duration,
}

impl<H: Host> Root<H> {
    /// Root context `id` of a VM whose waiting requests `holding` keeps (one for all of the VM's
    /// root contexts: a new table must see the requests waiting under the tables before it).
    pub fn new(id: u32, host: H, holding: Rc<Holding<H>>) -> Self {
        Self {
            id,
            host,
            active: None,
            connection_identity: None,
            holding,
            tick: None,
            flushed: Duration::ZERO,
        }
    }

    /// The root context Envoy makes, in the same VM, for the next configuration.
    #[cfg(test)]
    pub fn next_configuration(&self, id: u32) -> Self {
        Self::new(id, self.host.clone(), self.holding.clone())
    }

    /// Ticks at [`hold::BUSY_TICK`] while answers to waiting requests are queued (the live root
    /// context only: it carries out the hold), at [`TICK_PERIOD`] otherwise.
    fn pace(&mut self) {
        let busy = self.holding.is_live(self.id) && self.holding.busy();
        let period = if busy { hold::BUSY_TICK } else { TICK_PERIOD };
        if self.tick != Some(period) {
            self.host.set_tick_period(period);
            self.tick = Some(period);
        }
    }

    /// Declares the properties a mapped certificate identity is left in on its connection. If
    /// Envoy refuses one, none is ever set: certificate clients then always meet the filter.
    fn declare_connection_identity(&mut self) -> bool {
        *self.connection_identity.get_or_insert_with(|| {
            let names = [bypass::MARKER, bypass::USER, bypass::CREDENTIAL_ID]
                .map(String::from)
                .into_iter()
                .chain((0..bypass::MAX_GROUPS).map(bypass::group_property));
            let declared = names.into_iter().all(|name| self.host.declare_connection_property(&name));
            if !declared {
                log::warn!(
                    "skewgate: Envoy refused connection properties; certificate clients skip no filter"
                );
            }
            declared
        })
    }
}

impl<H: Host> Context for Root<H> {
    /// The only calls the root context makes are the held requests' probes.
    fn on_http_call_response(&mut self, token: u32, _headers: usize, _body_size: usize, _trailers: usize) {
        let status = self
            .host
            .call_response_headers()
            .into_iter()
            .find(|(name, _)| name == ":status")
            .and_then(|(_, v)| std::str::from_utf8(&v).ok().and_then(|s| s.parse::<u16>().ok()));
        self.holding.probed(token, status);
    }
}

impl<H: Host> RootContext for Root<H> {
    fn on_configure(&mut self, size: usize) -> bool {
        // Before the configuration is copied into the VM, whose memory never shrinks again.
        if let Err(e) = table::check_table_bytes(size) {
            log::error!("skewgate: {e}; keeping the previous table");
            metrics::count_config(&self.host, false);
            return false;
        }
        let Some(bytes) = self.host.plugin_configuration() else {
            log::error!("skewgate: no plugin configuration: a routing table is required");
            metrics::count_config(&self.host, false);
            return false;
        };
        match RoutingTable::from_sealed_json(&bytes) {
            Ok(table) => {
                log::info!(
                    "skewgate: routing table {:?} accepted: {} apiservers, {} sets, {} GVRs",
                    table.generation(),
                    table.apiservers().len(),
                    table.sets().len(),
                    table.gvrs().len()
                );
                let metrics = Metrics::define(self.host.clone(), &table);
                let connection_identity = self.declare_connection_identity();
                let active = Rc::new(Active { table, metrics, connection_identity });
                self.holding.set_live(self.id, &active);
                if let Some(previous) = self.active.replace(active) {
                    previous.metrics.flush();
                }
                self.pace();
                metrics::count_config(&self.host, true);
                true
            }
            Err(e) => {
                log::error!("skewgate: {e}; keeping the previous table");
                metrics::count_config(&self.host, false);
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if self.holding.is_live(self.id) {
            self.holding.tick();
        }
        self.pace();
        let now = self.host.now();
        if now.saturating_sub(self.flushed) >= FLUSH_PERIOD {
            self.flushed = now;
            if let Some(active) = &self.active {
                active.metrics.flush();
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The root context Envoy makes streams on is the current configuration's. Envoy does not
        // configure a root context again for a table it already has one for (the same table
        // pushed back after another): that one becomes current without `on_configure`, and the
        // hold would otherwise stay with a root context that no longer ticks.
        if let Some(active) = &self.active
            && !self.holding.is_live(self.id)
        {
            self.holding.set_live(self.id, active);
        }
        Some(Box::new(Http::new(self.host.clone(), self.active.clone(), context_id, self.holding.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
