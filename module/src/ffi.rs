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

use std::borrow::Cow;

use skewgate_core::stream::{Attribute, Next, Stream};

use crate::filter::{Config, Filter, RequestHeaders};

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

impl RequestHeaders for EnvoyStream {
    fn request_headers(&self) -> Vec<(&[u8], &[u8])> {
        self.headers(REQUEST_HEADER)
    }
}

impl EnvoyStream {
    fn set_header(&mut self, kind: u32, name: &str, value: Option<&str>) {
        let value = value.map_or(Buffer::NULL, |v| Buffer::of(v.as_bytes()));
        // SAFETY: `envoy` is the live filter of the current hook; Envoy copies both buffers.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.envoy,
                kind,
                Buffer::of(name.as_bytes()),
                value,
            );
        }
    }

    /// Drops all of that body buffer.
    fn drain(&mut self, body: Body) {
        // SAFETY: `envoy` is the live filter of the current hook.
        unsafe {
            let size = envoy_dynamic_module_callback_http_get_body_size(self.envoy, body as u32);
            if size > 0 {
                envoy_dynamic_module_callback_http_drain_body(self.envoy, body as u32, size);
            }
        }
    }
}

/// `envoy_dynamic_module_type_http_body_type` values for the response.
#[derive(Clone, Copy)]
#[repr(u32)]
enum Body {
    /// The chunk of the current body hook.
    Received = 2,
    /// What Envoy buffered (also where data added from the trailers hook goes).
    Buffered = 3,
}

/// `envoy_dynamic_module_type_attribute_id` values.
fn attribute_id(which: Attribute) -> u32 {
    match which {
        Attribute::ResponseDetails => 16,
        Attribute::ClientSubject => 33,
        Attribute::ClientCertificateDigest => 38,
    }
}

impl Stream for EnvoyStream {
    fn attribute(&self, which: Attribute) -> Option<Cow<'_, [u8]>> {
        let mut out = Buffer::NULL;
        // SAFETY: `envoy` is the live filter of the current hook; the buffer Envoy returns
        // lives in the stream's info, which outlives `&self`.
        unsafe {
            let found = envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.envoy,
                attribute_id(which),
                &mut out,
            );
            found.then(|| Cow::Borrowed(out.bytes()))
        }
    }

    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let mut out = Buffer::NULL;
        // SAFETY: as for `headers`: the value is a buffer into Envoy's header map.
        unsafe {
            let found = envoy_dynamic_module_callback_http_get_header(
                self.envoy,
                RESPONSE_HEADER,
                Buffer::of(name.as_bytes()),
                &mut out,
                0,
                ptr::null_mut(),
            );
            (found && !out.ptr.is_null()).then(|| Cow::Borrowed(out.bytes()))
        }
    }

    fn response_header_names(&self) -> Vec<String> {
        let headers = self.headers(RESPONSE_HEADER);
        headers.into_iter().map(|(name, _)| String::from_utf8_lossy(name).into_owned()).collect()
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        self.set_header(REQUEST_HEADER, name, value);
    }

    fn add_request_header(&mut self, name: &str, value: &str) {
        // SAFETY: `envoy` is the live filter of the current hook; Envoy copies both buffers.
        unsafe {
            envoy_dynamic_module_callback_http_add_header(
                self.envoy,
                REQUEST_HEADER,
                Buffer::of(name.as_bytes()),
                Buffer::of(value.as_bytes()),
            );
        }
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        self.set_header(RESPONSE_HEADER, name, value);
    }

    /// The whole chunk of this hook, whatever `size` says: the ABI's hook does not pass one.
    fn drop_response_body(&mut self, _size: usize) {
        self.drain(Body::Received);
    }

    fn end_response_body(&mut self, _size: usize, body: &[u8], at_trailers: bool) -> bool {
        let into = if at_trailers { Body::Buffered } else { Body::Received };
        if !at_trailers {
            self.drain(Body::Received);
        }
        // SAFETY: `envoy` is the live filter of the current hook; Envoy copies the data.
        unsafe { envoy_dynamic_module_callback_http_append_body(self.envoy, into as u32, Buffer::of(body)) }
    }

    fn clear_route_cache(&mut self) {
        // SAFETY: `envoy` is the live filter of the current hook.
        unsafe { envoy_dynamic_module_callback_http_clear_route_cache(self.envoy) }
    }

    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str) {
        let headers: Vec<Header> = headers
            .iter()
            .map(|(k, v)| Header { key: Buffer::of(k.as_bytes()), value: Buffer::of(v.as_bytes()) })
            .collect();
        // SAFETY: `envoy` is the live filter of the current hook; the header array and the
        // buffers outlive the call, which copies them.
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
        Next::Pause => STOP_ITERATION,
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
    // No size: the module's stream drops or replaces this hook's whole chunk.
    // SAFETY: as request_headers.
    match unsafe { on_stream(envoy, module, |f, s| f.on_response_body(s, 0, end_of_stream)) } {
        Next::Continue => BODY_CONTINUE,
        Next::Pause => BODY_STOP_NO_BUFFER,
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
