//! The OpenAPI documents the edge serves, as data (docs/openapi.md): [`merge`] makes one
//! document of one per apiserver, for v3 group/version documents and v2 JSON alike, and
//! [`v2proto`] does the same for v2 in its protobuf form. Fetching, caching and serving them is
//! the sidecar's (`skewgate sync`); the stand-in apiservers encode their v2 protobuf with
//! [`v2proto`], so that what the edge parses and what the stand-ins write are one codec.

pub mod merge;
pub mod v2proto;
