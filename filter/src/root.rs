//! The root context: turns plugin configuration into a routing table, or refuses it so that Envoy
//! keeps serving with the previous one.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use skewgate_core::table::{self, RoutingTable};

use crate::host;
use crate::http::Http;
use crate::metrics::{self, Metrics};

const FLUSH_PERIOD: Duration = Duration::from_secs(1);

/// A compiled table and the metric ids that go with it; shared by every HTTP context that
/// started while it was current.
pub struct Active {
    pub table: RoutingTable,
    pub metrics: Metrics,
}

#[derive(Default)]
pub struct Root {
    active: Option<Rc<Active>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        // Before the configuration is copied into the VM, whose memory never shrinks again.
        if let Err(e) = table::check_table_bytes(size) {
            log::error!("skewgate: {e}; keeping the previous table");
            metrics::count_config(false);
            return false;
        }
        let Some(bytes) = host::plugin_configuration() else {
            log::error!("skewgate: no plugin configuration: a routing table is required");
            metrics::count_config(false);
            return false;
        };
        match RoutingTable::from_json(&bytes) {
            Ok(table) => {
                log::info!(
                    "skewgate: routing table {:?} accepted: {} apiservers, {} sets, {} GVRs",
                    table.generation(),
                    table.apiservers().len(),
                    table.sets().len(),
                    table.gvrs().len()
                );
                let metrics = Metrics::define(&table);
                if let Some(previous) = self.active.replace(Rc::new(Active { table, metrics })) {
                    previous.metrics.flush();
                }
                // Counts kept in the VM reach Envoy's stats at most this late.
                if let Err(e) = hostcalls::set_tick_period(FLUSH_PERIOD) {
                    log::warn!("skewgate: setting the metrics flush period: {e:?}");
                }
                metrics::count_config(true);
                true
            }
            Err(e) => {
                log::error!("skewgate: {e}; keeping the previous table");
                metrics::count_config(false);
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(active) = &self.active {
            active.metrics.flush();
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http::new(self.active.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
