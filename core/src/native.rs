//! Which decisions a native fast path (the Envoy dynamic module) may apply on its own: those
//! complete once the request headers are rewritten. A composed answer (merged or legacy
//! discovery, an OpenAPI document) needs the response path and a callout, which stay with the
//! proxy-wasm filter.

use crate::decision::{Action, Decision};

/// Whether `d` is fully applied by rewriting the request headers (or refusing the request): no
/// composed reply and no OpenAPI callout follow.
pub fn request_path_only(d: &Decision<'_, '_>) -> bool {
    match &d.action {
        Action::Refuse(_) => true,
        Action::Route(route) => route.compose.is_none() && d.openapi.is_none(),
    }
}
