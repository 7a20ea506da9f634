//! The host functions proxy-wasm 0.2.5 imports from Envoy (`hostcalls.rs`), defined natively.
//!
//! A native test binary of the filter pulls in the proxy-wasm object that holds every hostcall
//! wrapper, and those name these imports; without a definition it does not link. The filter's
//! tests talk to `host::fake::Fake`, never to the ABI: a stub that runs means a test went around
//! the fake, so it stops the test binary saying which call.
#![allow(unsafe_code)]

macro_rules! stubs {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> u32 {
            eprintln!(concat!("proxy-wasm host function ", stringify!($name), " called outside Envoy: use the fake host"));
            std::process::abort()
        }
    )*};
}

stubs!(
    proxy_add_header_map_value,
    proxy_call_foreign_function,
    proxy_close_stream,
    proxy_continue_stream,
    proxy_define_metric,
    proxy_dequeue_shared_queue,
    proxy_done,
    proxy_enqueue_shared_queue,
    proxy_get_buffer_bytes,
    proxy_get_current_time_nanoseconds,
    proxy_get_header_map_pairs,
    proxy_get_header_map_value,
    proxy_get_log_level,
    proxy_get_metric,
    proxy_get_property,
    proxy_get_shared_data,
    proxy_get_status,
    proxy_grpc_call,
    proxy_grpc_cancel,
    proxy_grpc_close,
    proxy_grpc_send,
    proxy_grpc_stream,
    proxy_http_call,
    proxy_increment_metric,
    proxy_log,
    proxy_record_metric,
    proxy_register_shared_queue,
    proxy_remove_header_map_value,
    proxy_replace_header_map_value,
    proxy_resolve_shared_queue,
    proxy_send_local_response,
    proxy_set_buffer_bytes,
    proxy_set_effective_context,
    proxy_set_header_map_pairs,
    proxy_set_property,
    proxy_set_shared_data,
    proxy_set_tick_period_milliseconds,
);
