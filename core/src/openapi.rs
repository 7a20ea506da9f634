//! OpenAPI documents composed at the edge: what the filter sends to the apiserver
//! that authorizes the request, and which of the composer's answer it passes on.

/// Media types an apiserver answers OpenAPI in; the authorizing request asks for JSON, which
/// every apiserver serves, whatever the client asked for.
pub const AUTHORIZE_ACCEPT: &str = "application/json";

/// Asked of the authorizing apiserver, whose body is dropped anyway.
pub const AUTHORIZE_RANGE: &str = "bytes=0-0";

/// The path without the query: without `?hash=` the apiserver answers 200 (not a 301 to its own
/// hash), the answer the filter needs to know that the request is allowed.
pub fn authorize_target(target: &str) -> &str {
    target.split_once('?').map_or(target, |(path, _)| path)
}

/// Whether the apiserver's status says it let the request through: a document (2xx, 206 for
/// the range asked), or no document of its own for this path (404; 416 for an empty one) while
/// another apiserver's may exist. 401, 403, 429, 5xx and anything else reach the client as the
/// apiserver sent them.
pub fn authorized(status: u16) -> bool {
    (200..300).contains(&status) || matches!(status, 304 | 404 | 416)
}

/// Headers of the composer's answer the client gets (as kube-openapi sends them).
pub const PASSED_HEADERS: [&str; 7] =
    ["content-type", "etag", "cache-control", "expires", "last-modified", "location", "vary"];

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn authorizing_request_and_status() {
        assert_eq!(authorize_target("/openapi/v3/apis/g/v1?hash=AB&x=1"), "/openapi/v3/apis/g/v1");
        assert_eq!(authorize_target("/openapi/v2"), "/openapi/v2");
        for (status, ok) in
            [(200, true), (304, true), (404, true), (401, false), (403, false), (406, false), (503, false)]
        {
            assert_eq!(authorized(status), ok, "{status}");
        }
    }
}
