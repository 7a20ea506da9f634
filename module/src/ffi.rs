//! The Envoy 1.40 dynamic-module ABI, as far as skewgate uses it: the HTTP filter event hooks
//! Envoy calls, and the callbacks the filter calls back. Written by hand from Envoy's
//! `source/extensions/dynamic_modules/abi.h` (there is no SDK crate on the registry); the only
//! unsafe code of the crate is here, behind [`EnvoyStream`], the filter logic's [`Stream`].
//!
//! Envoy's C types, in Rust: `envoy_dynamic_module_type_{envoy,module}_buffer` is a pointer and
//! a length ([`Buffer`]); a header is two of them ([`Header`]); C enums are `u32`; every
//! `*_envoy_ptr` and `*_module_ptr` is an opaque pointer.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};
use std::ptr;

use crate::filter::{BodyNext, Config, Filter, Next};
use crate::stream::{Attribute, Body, Stream};

/// What Envoy logs on load ("Dynamic module ABI version ... matched"); a mismatch only warns.
static ABI_VERSION: &[u8] = b"v0.2.0\0";

#[repr(C)]
#[derive(Clone, Copy)]
struct Buffer {
    ptr: *const u8,
    length: usize,
}

impl Buffer {
    const NULL: Buffer = Buffer { ptr: ptr::null(), length: 0 };

    fn of(bytes: &[u8]) -> Self {
        Buffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }

    /// SAFETY (callers): `self` must point to `length` readable bytes that outlive `'a`.
    unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: non-null, and the caller vouches for length and lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.length) }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Header {
    key: Buffer,
    value: Buffer,
}

// envoy_dynamic_module_type_http_header_type
const REQUEST_HEADER: u32 = 0;
const RESPONSE_HEADER: u32 = 2;

unsafe extern "C" {
    fn envoy_dynamic_module_callback_http_get_header(
        filter: *mut c_void,
        header_type: u32,
        key: Buffer,
        result: *mut Buffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_headers_size(filter: *mut c_void, header_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: *mut c_void,
        header_type: u32,
        result: *mut Header,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: *mut c_void,
        header_type: u32,
        key: Buffer,
        value: Buffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(
        filter: *mut c_void,
        header_type: u32,
        key: Buffer,
        value: Buffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        filter: *mut c_void,
        status: u32,
        headers: *const Header,
        headers_size: usize,
        body: Buffer,
        details: Buffer,
    );
    fn envoy_dynamic_module_callback_http_clear_route_cache(filter: *mut c_void);
    fn envoy_dynamic_module_callback_http_get_body_size(filter: *mut c_void, body_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_drain_body(
        filter: *mut c_void,
        body_type: u32,
        bytes: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_append_body(
        filter: *mut c_void,
        body_type: u32,
        data: Buffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: *mut c_void,
        id: u32,
        result: *mut Buffer,
    ) -> bool;
}

/// One HTTP stream's handle into Envoy, valid for the duration of one event hook. Envoy's
/// buffers handed out by the getters stay valid until the hook returns or a setter runs: they
/// borrow `&self`, and every setter takes `&mut self`.
pub struct EnvoyStream {
    envoy: *mut c_void,
}

impl EnvoyStream {
    fn headers(&self, kind: u32) -> Vec<(&[u8], &[u8])> {
        // SAFETY: `envoy` is the live filter Envoy passed to the current hook; the array has the
        // size Envoy reported, and Envoy fills every entry with buffers into its header map,
        // which outlive `&self` (no setter can run while they are borrowed).
        unsafe {
            let n = envoy_dynamic_module_callback_http_get_headers_size(self.envoy, kind);
            let mut headers = vec![Header { key: Buffer::NULL, value: Buffer::NULL }; n];
            if n == 0
                || !envoy_dynamic_module_callback_http_get_headers(self.envoy, kind, headers.as_mut_ptr())
            {
                return Vec::new();
            }
            headers.iter().map(|h| (h.key.bytes(), h.value.bytes())).collect()
        }
    }
}

impl Stream for EnvoyStream {
    fn request_headers(&self) -> Vec<(&[u8], &[u8])> {
        self.headers(REQUEST_HEADER)
    }

    fn response_headers(&self) -> Vec<(&[u8], &[u8])> {
        self.headers(RESPONSE_HEADER)
    }

    fn response_header(&self, name: &str) -> Option<&[u8]> {
        let mut out = Buffer::NULL;
        // SAFETY: live filter; `name` outlives the call; Envoy writes one buffer into `out`
        // pointing into its header map (see `request_headers` for its lifetime).
        unsafe {
            let found = envoy_dynamic_module_callback_http_get_header(
                self.envoy,
                RESPONSE_HEADER,
                Buffer::of(name.as_bytes()),
                &mut out,
                0,
                ptr::null_mut(),
            );
            (found && !out.ptr.is_null()).then(|| out.bytes())
        }
    }

    fn attribute(&self, id: Attribute) -> Option<&[u8]> {
        let mut out = Buffer::NULL;
        // SAFETY: live filter; Envoy writes a buffer owned by the stream or connection, valid
        // for the rest of the hook.
        unsafe {
            let found = envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.envoy, id as u32, &mut out,
            );
            found.then(|| out.bytes())
        }
    }

    fn set_request_header(&mut self, name: &[u8], value: Option<&[u8]>) {
        let value = value.map_or(Buffer::NULL, Buffer::of);
        // SAFETY: live filter; Envoy copies key and value before returning.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.envoy,
                REQUEST_HEADER,
                Buffer::of(name),
                value,
            );
        }
    }

    fn add_request_header(&mut self, name: &[u8], value: &[u8]) {
        // SAFETY: as `set_request_header`.
        unsafe {
            envoy_dynamic_module_callback_http_add_header(
                self.envoy,
                REQUEST_HEADER,
                Buffer::of(name),
                Buffer::of(value),
            );
        }
    }

    fn set_response_header(&mut self, name: &[u8], value: Option<&[u8]>) {
        let value = value.map_or(Buffer::NULL, Buffer::of);
        // SAFETY: live filter, during a response hook; Envoy copies key and value.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.envoy,
                RESPONSE_HEADER,
                Buffer::of(name),
                value,
            );
        }
    }

    fn drain_response_body(&mut self, body: Body) {
        // SAFETY: live filter, during a response hook; a missing buffer is reported, not used.
        unsafe {
            let size = envoy_dynamic_module_callback_http_get_body_size(self.envoy, body as u32);
            if size > 0 {
                envoy_dynamic_module_callback_http_drain_body(self.envoy, body as u32, size);
            }
        }
    }

    fn append_response_body(&mut self, body: Body, data: &[u8]) {
        // SAFETY: live filter, during a response hook; Envoy copies `data` before returning.
        unsafe {
            envoy_dynamic_module_callback_http_append_body(self.envoy, body as u32, Buffer::of(data));
        }
    }

    fn clear_route_cache(&mut self) {
        // SAFETY: live filter, during request headers.
        unsafe { envoy_dynamic_module_callback_http_clear_route_cache(self.envoy) }
    }

    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str) {
        let headers: Vec<Header> = headers
            .iter()
            .map(|(k, v)| Header { key: Buffer::of(k.as_bytes()), value: Buffer::of(v.as_bytes()) })
            .collect();
        // SAFETY: live filter; every buffer outlives the call and Envoy copies them.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self.envoy,
                status,
                headers.as_ptr(),
                headers.len(),
                Buffer::of(body),
                Buffer::of(details.as_bytes()),
            );
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Event hooks. Envoy calls them on the main thread (program init, configs) or on the worker that
// owns the stream (everything taking a filter). Module pointers are Boxes leaked to Envoy and
// taken back in the matching destroy hook.

// envoy_dynamic_module_type_on_http_filter_*_status
const CONTINUE: u32 = 0;
const STOP_ITERATION: u32 = 1;

/// Leaks `value` to Envoy as a module pointer, until [`take_back`].
fn hand_over<T>(value: T) -> *const c_void {
    Box::into_raw(Box::new(value)).cast_const().cast()
}

/// Drops what [`hand_over`] leaked.
///
/// SAFETY (callers): `module` is null or a pointer [`hand_over`] made from a `T`, not taken back
/// before and no longer used by Envoy.
unsafe fn take_back<T>(module: *const c_void) {
    if !module.is_null() {
        // SAFETY: see above.
        drop(unsafe { Box::from_raw(module.cast_mut().cast::<T>()) });
    }
}

fn status(next: Next) -> u32 {
    match next {
        Next::Continue => CONTINUE,
        Next::Stop => STOP_ITERATION,
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast()
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: *mut c_void,
    name: Buffer,
    config: Buffer,
) -> *const c_void {
    // SAFETY: Envoy's buffers are valid for the duration of this hook; `Config::new` copies what
    // it keeps.
    let (name, config) = unsafe { (name.bytes(), config.bytes()) };
    match Config::new(name, config) {
        Some(c) => hand_over(c),
        None => ptr::null(),
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    // SAFETY: a pointer from `config_new`, destroyed once, after every filter made from it.
    unsafe { take_back::<Config>(config) }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: Buffer,
    _config: Buffer,
) -> *const c_void {
    // No per-route configuration: refusing it makes a misconfiguration visible.
    ptr::null()
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _envoy: *mut c_void,
) -> *const c_void {
    if config.is_null() {
        return ptr::null();
    }
    // SAFETY: a live `Config` from `config_new`: Envoy keeps it until its filters are destroyed.
    let config = unsafe { &*config.cast::<Config>() };
    hand_over(Filter::new(config))
}

/// Runs `hook` of the filter behind `module` on its stream `envoy`: the one way a hook reaches
/// the filter.
///
/// SAFETY (callers): `module` is a pointer from `filter_new` not yet destroyed, used by this
/// stream's worker alone, and `envoy` the stream Envoy passed along with it.
unsafe fn on_stream<R>(
    envoy: *mut c_void,
    module: *const c_void,
    hook: impl FnOnce(&mut Filter, &mut EnvoyStream) -> R,
) -> R {
    // SAFETY: see above; Envoy never calls two hooks of one stream at once.
    let filter = unsafe { &mut *module.cast_mut().cast::<Filter>() };
    hook(filter, &mut EnvoyStream { envoy })
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: *mut c_void,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy passes this stream's filter and our pointer for it.
    status(unsafe { on_stream(envoy, module, Filter::on_request_headers) })
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: *mut c_void,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: as request_headers.
    status(unsafe { on_stream(envoy, module, |f, s| f.on_response_headers(s, end_of_stream)) })
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _: *mut c_void,
    _: *const c_void,
    _: bool,
) -> u32 {
    CONTINUE
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(_: *mut c_void, _: *const c_void) -> u32 {
    CONTINUE
}

// envoy_dynamic_module_type_on_http_filter_response_body_status
const BODY_CONTINUE: u32 = 0;
const BODY_STOP_NO_BUFFER: u32 = 3;

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: *mut c_void,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: as request_headers.
    match unsafe { on_stream(envoy, module, |f, s| f.on_response_body(s, end_of_stream)) } {
        BodyNext::Continue => BODY_CONTINUE,
        BodyNext::StopNoBuffer => BODY_STOP_NO_BUFFER,
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: *mut c_void,
    module: *const c_void,
) -> u32 {
    // SAFETY: as request_headers.
    status(unsafe { on_stream(envoy, module, Filter::on_response_trailers) })
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_: *mut c_void, _: *const c_void) {}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    // SAFETY: our pointer from `filter_new`, destroyed once.
    unsafe { take_back::<Filter>(module) }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _: *mut c_void,
    _: *const c_void,
    _response_code: u32,
    _details: Buffer,
    _reset_imminent: bool,
) -> u32 {
    CONTINUE
}

// Hooks for features skewgate's module does not use (callouts, scheduling, watermarks): Envoy
// resolves them when it loads the filter, and never calls them unless the module asked for them.

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _: *mut c_void,
    _: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut Header,
    _headers_size: usize,
    _body: *mut Buffer,
    _body_size: usize,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _headers: *mut Header,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _data: *const Buffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _trailers: *mut Header,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _: *mut c_void,
    _: *const c_void,
    _: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _: *mut c_void,
    _: *const c_void,
    _event_id: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _: *mut c_void,
    _: *const c_void,
    _event_id: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _: *mut c_void,
    _: *const c_void,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _: *mut c_void,
    _: *const c_void,
) {
}
