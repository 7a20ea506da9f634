//! [`Host`] on the proxy-wasm ABI: one hostcall per method, failures logged or returned as values.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, Bytes, MapType, MetricType, Status};

use super::Host;

#[derive(Debug, Clone, Copy, Default)]
pub struct ProxyWasm;

impl Host for ProxyWasm {
    fn plugin_configuration(&self) -> Option<Bytes> {
        hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX).ok().flatten()
    }

    fn request_headers(&self) -> Vec<(String, Bytes)> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_default()
    }

    fn request_body(&self, size: usize) -> Option<Bytes> {
        hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size).ok().flatten()
    }

    fn response_header(&self, name: &str) -> Option<Bytes> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok().flatten()
    }

    fn response_headers(&self) -> Vec<(String, Bytes)> {
        hostcalls::get_map_bytes(MapType::HttpResponseHeaders).unwrap_or_default()
    }

    fn property(&self, path: &[&str]) -> Option<Bytes> {
        hostcalls::get_property(path.to_vec()).ok().flatten()
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) {
        if let Err(e) = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value) {
            log::warn!("skewgate: setting request header {name}: {e:?}");
        }
    }

    fn add_request_header(&self, name: &str, value: &str) {
        if let Err(e) = hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value) {
            log::warn!("skewgate: adding request header {name}: {e:?}");
        }
    }

    fn send_response(&self, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) {
        if let Err(e) = hostcalls::send_http_response(status, headers, body) {
            log::error!("skewgate: sending local response {status}: {e:?}");
        }
    }

    fn set_response_header(&self, name: &str, value: Option<&str>) {
        if let Err(e) = hostcalls::set_map_value(MapType::HttpResponseHeaders, name, value) {
            log::warn!("skewgate: setting response header {name}: {e:?}");
        }
    }

    fn replace_response_body(&self, size: usize, with: &[u8]) -> bool {
        match hostcalls::set_buffer(BufferType::HttpResponseBody, 0, size, with) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("skewgate: replacing a response body: {e:?}");
                false
            }
        }
    }

    fn dispatch_call(
        &self,
        cluster: &str,
        headers: Vec<(&str, &str)>,
        timeout: Duration,
    ) -> Result<u32, Status> {
        hostcalls::dispatch_http_call(cluster, headers, None, vec![], timeout)
    }

    fn call_response_headers(&self) -> Vec<(String, Bytes)> {
        hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default()
    }

    fn call_response_body(&self, size: usize) -> Option<Bytes> {
        hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size).ok().flatten()
    }

    fn declare_connection_property(&self, name: &str) -> bool {
        match hostcalls::call_foreign_function("declare_property", Some(&declare_property_arguments(name))) {
            Ok(_) => true,
            Err(e) => {
                log::warn!("skewgate: declaring connection property {name}: {e:?}");
                false
            }
        }
    }

    fn set_connection_property(&self, name: &str, value: &str) -> bool {
        match hostcalls::set_property(vec![name], Some(value.as_bytes())) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("skewgate: setting connection property {name}: {e:?}");
                false
            }
        }
    }

    fn define_counter(&self, name: &str) -> Option<u32> {
        match hostcalls::define_metric(MetricType::Counter, name) {
            Ok(id) => Some(id),
            Err(e) => {
                log::warn!("skewgate: defining metric {name}: {e:?}");
                None
            }
        }
    }

    fn increment_metric(&self, id: u32, by: u64) {
        let by = i64::try_from(by).unwrap_or(i64::MAX);
        if let Err(e) = hostcalls::increment_metric(id, by) {
            log::warn!("skewgate: incrementing metric {id}: {e:?}");
        }
    }

    fn set_tick_period(&self, period: Duration) {
        if let Err(e) = hostcalls::set_tick_period(period) {
            log::warn!("skewgate: setting the tick period: {e:?}");
        }
    }

    fn now(&self) -> Duration {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .unwrap_or_default()
    }

    fn resume_request(&self, id: u32) {
        // The stream may be gone (its client left): Envoy then knows no such context.
        let resumed = hostcalls::set_effective_context(id).and_then(|()| hostcalls::resume_http_request());
        if let Err(e) = resumed {
            log::debug!("skewgate: resuming held stream {id}: {e:?}");
        }
    }

    fn send_response_to(&self, id: u32, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) {
        let sent = hostcalls::set_effective_context(id)
            .and_then(|()| hostcalls::send_http_response(status, headers, body));
        if let Err(e) = sent {
            log::debug!("skewgate: answering held stream {id}: {e:?}");
        }
    }

    fn shared_data(&self, key: &str) -> (Option<Bytes>, Option<u32>) {
        hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => true,
            Err(Status::CasMismatch) => false,
            Err(e) => {
                log::warn!("skewgate: setting shared data {key}: {e:?}");
                false
            }
        }
    }

    fn define_histogram(&self, name: &str) -> Option<u32> {
        match hostcalls::define_metric(MetricType::Histogram, name) {
            Ok(id) => Some(id),
            Err(e) => {
                log::warn!("skewgate: defining metric {name}: {e:?}");
                None
            }
        }
    }

    fn record_metric(&self, id: u32, value: u64) {
        if let Err(e) = hostcalls::record_metric(id, value) {
            log::warn!("skewgate: recording metric {id}: {e:?}");
        }
    }
}

/// Envoy's `DeclarePropertyArguments` (source/extensions/common/wasm/ext/declare_property.proto),
/// serialised: `name` (1), `readonly` (2) true, `type` (3) Bytes (0, the default, omitted),
/// `span` (5) DownstreamConnection (2).
fn declare_property_arguments(name: &str) -> Vec<u8> {
    let mut out = vec![0x0a];
    let mut len = name.len();
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&[0x10, 1, 0x28, 2]);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn declare_property_arguments_are_protobuf() {
        assert_eq!(super::declare_property_arguments("ab"), [0x0a, 2, b'a', b'b', 0x10, 1, 0x28, 2]);
        let long = "x".repeat(200);
        let encoded = super::declare_property_arguments(&long);
        assert_eq!(encoded[..3], [0x0a, 0xc8, 0x01]);
        assert_eq!(encoded.len(), 3 + 200 + 4);
    }
}
