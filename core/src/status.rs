//! Kubernetes `meta/v1 Status` bodies: what clients (client-go, kubectl, kube-rs) parse out of an
//! error response.

use serde::Serialize;

/// `metav1.Status`, fields in Go's order and omitted when empty as Go omits them, so the JSON
/// reads like an apiserver's. The one Status type of the project: the stand-in apiservers build
/// theirs with it too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: Empty,
    pub status: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Box<StatusDetails>>,
    pub code: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Empty {}

/// `metav1.StatusDetails`; Kubernetes puts the resource (plural) in `kind` for resource errors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatusDetails {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    /// When the client may send the request again (the response's `Retry-After` too).
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "is_zero")]
    pub retry_after_seconds: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusCause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

impl Status {
    pub fn failure(code: u16, reason: &'static str, message: impl Into<String>) -> Status {
        Status {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message: message.into(),
            reason,
            details: None,
            code,
        }
    }

    pub fn with_details(mut self, details: StatusDetails) -> Status {
        self.details = Some(Box::new(details));
        self
    }

    pub fn to_json(&self) -> String {
        // Serialising these plain fields cannot fail; keep a valid body regardless.
        serde_json::to_string(self).unwrap_or_else(|_| {
            String::from(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"InternalError","code":500}"#)
        })
    }
}

/// What Envoy could not do, for the 503 that replaces its own reply.
#[derive(Debug, Clone, Copy)]
pub struct Unavailable<'a> {
    /// (group, version, resource) when the request was for a resource.
    pub gvr: Option<(&'a str, &'a str, &'a str)>,
    pub cluster: &'a str,
    /// The apiservers behind `cluster`.
    pub members: &'a [&'a str],
    /// Envoy's `response.code_details`, e.g. `no_healthy_upstream`.
    pub envoy_detail: &'a str,
    /// Seconds after which the client may send the request again; `None` when it may have
    /// reached an apiserver and is not safe to send twice.
    pub retry_after: Option<u32>,
}

/// 503 ServiceUnavailable naming what could not be reached, so `kubectl` prints something an
/// operator can act on instead of Envoy's plain-text reply.
pub fn service_unavailable(u: &Unavailable<'_>) -> Status {
    let servers = u.members.join(",");
    let what = match u.gvr {
        Some((group, version, resource)) => {
            let gvr = if group.is_empty() {
                format!("{resource}.{version}")
            } else {
                format!("{resource}.{version}.{group}")
            };
            format!("{gvr} is served by [{servers}] and none of them answered")
        }
        None => format!("no apiserver of [{servers}] answered"),
    };
    let detail: String = u.envoy_detail.chars().take(200).collect();
    let resend = match u.retry_after {
        Some(_) => "",
        None => "; the request may have reached an apiserver: check before sending it again",
    };
    let status = Status::failure(
        503,
        "ServiceUnavailable",
        format!(
            "the server is currently unable to handle the request: skewgate: {what} (cluster {}; {detail}){resend}",
            u.cluster
        ),
    );
    match u.retry_after {
        Some(seconds) => {
            status.with_details(StatusDetails { retry_after_seconds: seconds, ..StatusDetails::default() })
        }
        None => status,
    }
}

/// 503 for an OpenAPI document the edge composes when the composer (the sidecar) cannot answer:
/// never an incomplete document from a single apiserver instead.
pub fn composer_unavailable(cluster: &str, detail: &str, retry_after: u32) -> Status {
    let detail: String = detail.chars().take(200).collect();
    Status::failure(
        503,
        "ServiceUnavailable",
        format!(
            "the server is currently unable to handle the request: skewgate: the composed OpenAPI document is unavailable (cluster {cluster}; {detail})"
        ),
    )
    .with_details(StatusDetails { retry_after_seconds: retry_after, ..StatusDetails::default() })
}

/// 401 Unauthorized, as kube-apiserver words it, with why skewgate refused the credential.
pub fn unauthorized(why: &str) -> Status {
    Status::failure(
        401,
        "Unauthorized",
        format!("Unauthorized: skewgate cannot forward the client certificate's identity: {why}"),
    )
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn names_the_gvr_and_the_servers() {
        let s = service_unavailable(&Unavailable {
            gvr: Some(("resource.k8s.io", "v1", "resourceclaims")),
            cluster: "skewgate-set-c",
            members: &["c"],
            envoy_detail: "no_healthy_upstream",
            retry_after: Some(1),
        });
        let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "ServiceUnavailable");
        assert_eq!(v["code"], 503);
        assert_eq!(
            v["message"],
            "the server is currently unable to handle the request: skewgate: resourceclaims.v1.resource.k8s.io is served by [c] and none of them answered (cluster skewgate-set-c; no_healthy_upstream)"
        );
        assert_eq!(v["details"], serde_json::json!({"retryAfterSeconds": 1}));
        assert!(s.to_json().starts_with(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"#
        ));
    }

    #[test]
    fn core_and_non_resource() {
        let core = service_unavailable(&Unavailable {
            gvr: Some(("", "v1", "pods")),
            cluster: "pool",
            members: &["a", "b"],
            envoy_detail: "x",
            retry_after: None,
        });
        assert!(core.message.contains("pods.v1 is served by [a,b]"));
        let nr = service_unavailable(&Unavailable {
            gvr: None,
            cluster: "pool",
            members: &["a"],
            envoy_detail: &"y".repeat(1000),
            retry_after: None,
        });
        assert!(nr.message.contains("no apiserver of [a] answered"));
        assert!(nr.message.len() < 400);
    }

    #[test]
    fn unauthorized_reads_like_the_apiservers() {
        let v: serde_json::Value = serde_json::from_str(&unauthorized("a reason").to_json()).unwrap();
        assert_eq!((v["reason"].as_str(), v["code"].as_u64()), (Some("Unauthorized"), Some(401)));
        assert!(
            v["message"].as_str().unwrap().starts_with("Unauthorized: ")
                && v["message"].as_str().unwrap().ends_with("a reason")
        );
    }
}
