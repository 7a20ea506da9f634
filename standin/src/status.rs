//! `metav1.Status` error bodies, worded as kube-apiserver words them (`apimachinery/pkg/api/errors`),
//! because clients and tests match on reason, code and often the message.

pub use skewgate_core::status::{Status, StatusCause as Cause, StatusDetails as Details};

/// What a resource error names: group and resource (plural), e.g. ("", "configmaps").
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub group: &'a str,
    pub resource: &'a str,
}

impl Target<'_> {
    /// `configmaps` or `resourceclaims.resource.k8s.io`, as upstream's `GroupResource.String()`.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self, name: &str) -> Details {
        Details {
            name: name.to_string(),
            group: self.group.to_string(),
            kind: self.resource.to_string(),
            ..Details::default()
        }
    }
}

/// kube-apiserver's error wording (`apimachinery/pkg/api/errors`) for the stand-ins.
pub trait Errors {
    fn success(details: Details) -> Status {
        Status { status: "Success", ..Status::failure(200, "", "") }.with_details(details)
    }

    /// A path no handler serves (an unserved group/version/resource included), with the empty
    /// `details` upstream's NotFound handler writes.
    fn no_route() -> Status {
        Status::failure(404, "NotFound", "the server could not find the requested resource")
            .with_details(Details::default())
    }

    fn unauthorized() -> Status {
        Status::failure(401, "Unauthorized", "Unauthorized")
    }

    /// What RBAC answers a user it grants nothing on a path (system:anonymous off the public
    /// paths), with the empty `details` upstream writes.
    fn forbidden_path(user: &str, verb: &str, path: &str) -> Status {
        Status::failure(403, "Forbidden", format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\""))
            .with_details(Details::default())
    }

    fn method_not_allowed() -> Status {
        Status::failure(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(Details::default())
    }

    fn not_found(target: Target<'_>, name: &str) -> Status {
        Status::failure(404, "NotFound", format!("{} \"{name}\" not found", target.qualified()))
            .with_details(target.details(name))
    }

    fn already_exists(target: Target<'_>, name: &str) -> Status {
        Status::failure(409, "AlreadyExists", format!("{} \"{name}\" already exists", target.qualified()))
            .with_details(target.details(name))
    }

    fn conflict(target: Target<'_>, name: &str) -> Status {
        Status::failure(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                target.qualified()
            ),
        )
        .with_details(target.details(name))
    }

    fn forbidden(target: Target<'_>, name: &str, why: &str) -> Status {
        Status::failure(403, "Forbidden", format!("{} \"{name}\" is forbidden: {why}", target.qualified()))
            .with_details(target.details(name))
    }

    /// 422 with one cause, as field validation reports it: `ConfigMap "x" is invalid: <field>: <detail>`.
    fn invalid(kind: &str, group: &str, name: &str, field: &str, detail: &str) -> Status {
        let cause =
            Cause { reason: "FieldValueInvalid", message: detail.to_string(), field: field.to_string() };
        Status::failure(422, "Invalid", format!("{kind} \"{name}\" is invalid: {field}: {detail}"))
            .with_details(Details {
                name: name.to_string(),
                group: group.to_string(),
                kind: kind.to_string(),
                causes: vec![cause],
                ..Details::default()
            })
    }

    fn bad_request(message: impl Into<String>) -> Status {
        Status::failure(400, "BadRequest", message)
    }

    /// A revision older than the kept history.
    fn expired(requested: u64, oldest: u64) -> Status {
        Status::failure(410, "Expired", format!("too old resource version: {requested} ({oldest})"))
    }

    fn too_large(limit: usize) -> Status {
        Status::failure(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {limit}"))
    }

    fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Status {
        Status::failure(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}{}",
                accepted.join(", "),
                if content_type.is_empty() { String::new() } else { format!(" (got {content_type})") }
            ),
        )
    }

    fn not_acceptable() -> Status {
        Status::failure(
            406,
            "NotAcceptable",
            "the server was unable to respond with a content type that the client supports",
        )
    }

    /// A streaming list on a server without the `WatchList` feature (`validateWatchOptions`).
    fn watch_list_forbidden() -> Status {
        let field = "sendInitialEvents";
        let detail = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
        Status::failure(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: Forbidden: {detail}"),
        )
        .with_details(Details {
            group: "meta.k8s.io".to_string(),
            kind: "ListOptions".to_string(),
            causes: vec![Cause {
                reason: "FieldValueForbidden",
                message: format!("Forbidden: {detail}"),
                field: field.to_string(),
            }],
            ..Details::default()
        })
    }

    fn internal(message: impl Into<String>) -> Status {
        Status::failure(500, "InternalError", message)
    }
}

impl Errors for Status {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording_matches_kube_apiserver() {
        assert_eq!(
            Status::no_route().to_json(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#
        );
        assert_eq!(
            Status::unauthorized().to_json(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
        );
        let cm = Target { group: "", resource: "configmaps" };
        assert_eq!(
            Status::not_found(cm, "x").to_json(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"configmaps"},"code":404}"#
        );
        let claims = Target { group: "resource.k8s.io", resource: "resourceclaims" };
        assert_eq!(
            Status::already_exists(claims, "c").message,
            r#"resourceclaims.resource.k8s.io "c" already exists"#
        );
        assert!(
            Status::conflict(cm, "x").message.starts_with(
                r#"Operation cannot be fulfilled on configmaps "x": the object has been modified"#
            )
        );
        assert_eq!(Status::expired(3, 10).message, "too old resource version: 3 (10)");
        let ok =
            Status::success(Details { name: "x".into(), kind: "configmaps".into(), ..Details::default() });
        assert_eq!(
            ok.to_json(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","details":{"name":"x","kind":"configmaps"},"code":200}"#
        );
    }
}
