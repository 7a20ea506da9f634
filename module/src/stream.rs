//! What the module's filter needs of an HTTP stream in Envoy: implemented over Envoy's
//! dynamic-module ABI (`ffi`), and by a fake in the tests.

/// `envoy_dynamic_module_type_http_body_type` values for the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Body {
    /// The chunk of the current body hook.
    Received = 2,
    /// What Envoy buffered (also where data added from the trailers hook goes).
    Buffered = 3,
}

/// `envoy_dynamic_module_type_attribute_id` values the filter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Attribute {
    ResponseCodeDetails = 16,
    ConnectionSubjectPeerCertificate = 33,
    ConnectionSha256PeerCertificateDigest = 38,
}

/// One HTTP stream, for the duration of one event hook. The getters' slices borrow the stream:
/// no setter can run while they are held (Envoy's buffers may move once a header is set).
pub trait Stream {
    fn request_headers(&self) -> Vec<(&[u8], &[u8])>;
    fn response_headers(&self) -> Vec<(&[u8], &[u8])>;
    fn response_header(&self, name: &str) -> Option<&[u8]>;
    fn attribute(&self, id: Attribute) -> Option<&[u8]>;
    /// Sets a request header, or removes it with `None`.
    fn set_request_header(&mut self, name: &[u8], value: Option<&[u8]>);
    fn add_request_header(&mut self, name: &[u8], value: &[u8]);
    /// Sets a response header, or removes it with `None`.
    fn set_response_header(&mut self, name: &[u8], value: Option<&[u8]>);
    /// Drops all of that response body buffer.
    fn drain_response_body(&mut self, body: Body);
    fn append_response_body(&mut self, body: Body, data: &[u8]);
    /// Envoy picks the route again: the cluster header is what the route reads.
    fn clear_route_cache(&mut self);
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str);
}
