//! skewgate as a native Envoy dynamic module (`libskewgate_module.so`): the request path of the
//! proxy-wasm filter without entering a wasm VM, on the same `skewgate-core` decision. It sits in
//! front of the proxy-wasm filter, which stays the portable default and keeps the composed
//! answers (discovery, OpenAPI) — see envoy-config/bootstrap-native.yaml.

// Envoy's ABI: in the shared library only (a test binary has no Envoy to call back).
#[cfg(not(test))]
mod ffi;
pub mod filter;

#[cfg(test)]
mod tests;
