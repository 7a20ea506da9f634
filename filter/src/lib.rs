//! skewgate's proxy-wasm filter: glue between Envoy and `skewgate-core`.
//!
//! The root context compiles the routing table that arrives as plugin configuration (through
//! ECDS); each HTTP context reads the request head, asks `core::decision::decide`, and applies
//! the answer with as few host calls as the decision needs.

mod active;
mod hold;
mod host;
mod http;
mod metrics;
mod openapi;
mod root;
#[cfg(test)]
mod tests;

use std::rc::Rc;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;

thread_local! {
    /// The VM's waiting requests, whichever root context (table) they were decided under.
    static HOLDING: Rc<hold::Holding<host::ProxyWasm>> = Rc::new(hold::Holding::new(host::ProxyWasm));
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    // A panic traps the VM; leave a line in Envoy's log saying where before it does.
    std::panic::set_hook(Box::new(|info| log::error!("skewgate filter panicked: {info}")));
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(root::Root::new(id, host::ProxyWasm, HOLDING.with(Rc::clone)))
    });
}}
