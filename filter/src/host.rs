//! Host calls that report failure as a value. The SDK's `Context` helpers `unwrap()` host
//! results (e.g. `get_property` on a property Envoy cannot serialise), which would trap the VM.

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, Bytes, MapType};

pub fn plugin_configuration() -> Option<Bytes> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX).ok().flatten()
}

pub fn request_headers() -> Vec<(String, Bytes)> {
    hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_default()
}

pub fn response_header(name: &str) -> Option<Bytes> {
    hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten()
}

pub fn property(path: &[&str]) -> Option<Bytes> {
    hostcalls::get_property(path.to_vec()).ok().flatten()
}

pub fn set_request_header(name: &str, value: Option<&str>) {
    if let Err(e) = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value) {
        log::warn!("skewgate: setting request header {name}: {e:?}");
    }
}

pub fn add_request_header(name: &str, value: &str) {
    if let Err(e) = hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value) {
        log::warn!("skewgate: adding request header {name}: {e:?}");
    }
}

pub fn send_response(status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) {
    if let Err(e) = hostcalls::send_http_response(status, headers, body) {
        log::error!("skewgate: sending local response {status}: {e:?}");
    }
}

pub fn remove_request_header(name: &str) {
    set_request_header(name, None);
}

pub fn call_response_headers() -> Vec<(String, Bytes)> {
    hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default()
}

pub fn call_response_body(size: usize) -> Option<Bytes> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size).ok().flatten()
}

/// Drops the response body received so far (what the filter replaces anyway).
pub fn drop_response_body(size: usize) {
    if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, size, &[]) {
        log::warn!("skewgate: dropping a response body: {e:?}");
    }
}

pub fn dispatch_call(
    cluster: &str,
    headers: Vec<(&str, &str)>,
    timeout: std::time::Duration,
) -> Result<u32, proxy_wasm::types::Status> {
    hostcalls::dispatch_http_call(cluster, headers, None, vec![], timeout)
}
