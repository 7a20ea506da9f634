//! How a starting kube-apiserver answers, phase by phase, as measured on real v1.36.2 servers:
//! connections refused for 0.9–2.2 s (not listening yet), then 403 for 0.1–1.3 s
//! (listening, but RBAC's informers not synced: every user outside `system:masters` is denied,
//! `/readyz` included), then `/readyz` 500 while post-start hooks run (discovery and everything
//! else already served), then ready at 2.0–4.2 s.

use std::time::Duration;

use skewgate_core::request_info::RequestInfo;

use super::auth::Identity;
use super::status::{Details, Errors, Status};

/// The phases' lengths; each may be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Startup {
    /// Not listening: connections are refused.
    pub refusing: Duration,
    /// Listening, authorization not ready: 403 for everyone but `system:masters`.
    pub forbidding: Duration,
    /// Authorizing, `/readyz` failing (500).
    pub unready: Duration,
}

impl Startup {
    /// Ready at once.
    pub const NONE: Startup =
        Startup { refusing: Duration::ZERO, forbidding: Duration::ZERO, unready: Duration::ZERO };

    /// A real kube-apiserver's sequence scaled to be ready `ready_after` from start: refusing
    /// for 30 % of it, forbidding for 10 %, unready for the rest (a typical real start: 0.9 s,
    /// 0.3 s, ready at 3 s).
    pub fn like_kube_apiserver(ready_after: Duration) -> Startup {
        let refusing = ready_after.mul_f64(0.3);
        let forbidding = ready_after.mul_f64(0.1);
        Startup { refusing, forbidding, unready: ready_after.saturating_sub(refusing + forbidding) }
    }

    /// From start to `/readyz` 200.
    pub fn total(&self) -> Duration {
        self.refusing + self.forbidding + self.unready
    }
}

/// `/readyz`'s body while post-start hooks still run (upstream lists every check, failing ones
/// with the reason withheld, then `readyz check failed`).
pub const STARTING_READYZ: &str = "[+]ping ok\n[+]log ok\n[+]etcd ok\n[+]etcd-readiness ok\n\
[+]informer-sync ok\n[+]poststarthook/start-apiserver-admission-initializer ok\n\
[+]poststarthook/generic-apiserver-start-informers ok\n\
[+]poststarthook/priority-and-fairness-config-consumer ok\n\
[+]poststarthook/priority-and-fairness-filter ok\n\
[+]poststarthook/storage-object-count-tracker-hook ok\n\
[+]poststarthook/start-apiextensions-informers ok\n\
[+]poststarthook/start-apiextensions-controllers ok\n\
[+]poststarthook/crd-informer-synced ok\n\
[+]poststarthook/start-service-ip-repair-controllers ok\n\
[-]poststarthook/rbac/bootstrap-roles failed: reason withheld\n\
[-]poststarthook/scheduling/bootstrap-system-priority-classes failed: reason withheld\n\
[+]poststarthook/priority-and-fairness-config-producer ok\n\
[+]poststarthook/bootstrap-controller ok\n\
[+]poststarthook/start-kube-aggregator-informers ok\n\
[+]poststarthook/apiservice-registration-controller ok\n\
[+]poststarthook/apiservice-discovery-controller ok\n\
[+]shutdown ok\nreadyz check failed\n";

/// What RBAC answers while its informers have not synced: 403 to anyone outside
/// `system:masters` (whom the privileged-group authorizer lets through first), worded as
/// upstream's `responsewriters.Forbidden` words it.
pub fn forbidden_while_starting(identity: &Identity, info: &RequestInfo<'_>, path: &str) -> Option<Status> {
    if identity.groups.iter().any(|g| g == "system:masters") {
        return None;
    }
    let user = &identity.user;
    let verb: &str = &info.verb;
    if !info.is_resource_request {
        return Some(Status::forbidden_path(user, verb, path));
    }
    let mut resource = info.resource.to_string();
    if !info.subresource.is_empty() {
        resource = format!("{resource}/{}", info.subresource);
    }
    let group = info.api_group;
    let scope = match info.namespace {
        "" => "at the cluster scope".to_string(),
        namespace => format!("in the namespace \"{namespace}\""),
    };
    let why =
        format!("User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}");
    let qualified =
        if group.is_empty() { info.resource.to_string() } else { format!("{}.{group}", info.resource) };
    let name: &str = &info.name;
    let message = match name {
        "" => format!("{qualified} is forbidden: {why}"),
        name => format!("{qualified} \"{name}\" is forbidden: {why}"),
    };
    let mut status = Status::failure(403, "Forbidden", message);
    status.details = Some(Box::new(Details {
        name: name.to_string(),
        group: group.to_string(),
        kind: info.resource.to_string(),
        ..Details::default()
    }));
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        let mut id = Identity::anonymous();
        id.user = "alice".into();
        id.groups = vec!["devs".into(), "system:authenticated".into()];
        id
    }

    #[test]
    fn phases_scale_to_the_total() {
        let s = Startup::like_kube_apiserver(Duration::from_secs(3));
        assert_eq!(s.total(), Duration::from_secs(3));
        assert_eq!((s.refusing, s.forbidding), (Duration::from_millis(900), Duration::from_millis(300)));
        assert_eq!(Startup::NONE.total(), Duration::ZERO);
    }

    #[test]
    fn forbidden_as_upstream_words_it() {
        let get = RequestInfo::parse("GET", "/api/v1/namespaces/default/configmaps/x", "");
        let status = forbidden_while_starting(&alice(), &get, "/api/v1/namespaces/default/configmaps/x");
        assert_eq!(
            status.map(|s| s.to_json()).unwrap_or_default(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"x\" is forbidden: User \"alice\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"default\"","reason":"Forbidden","details":{"name":"x","kind":"configmaps"},"code":403}"#
        );
        let list = RequestInfo::parse("GET", "/apis/resource.k8s.io/v1/deviceclasses", "");
        let status = forbidden_while_starting(&alice(), &list, "/apis/resource.k8s.io/v1/deviceclasses");
        assert_eq!(
            status.map(|s| s.message).unwrap_or_default(),
            r#"deviceclasses.resource.k8s.io is forbidden: User "alice" cannot list resource "deviceclasses" in API group "resource.k8s.io" at the cluster scope"#
        );
        let readyz = RequestInfo::parse("GET", "/readyz", "");
        assert_eq!(
            forbidden_while_starting(&alice(), &readyz, "/readyz").map(|s| s.to_json()).unwrap_or_default(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"alice\" cannot get path \"/readyz\"","reason":"Forbidden","details":{},"code":403}"#
        );
        let mut admin = alice();
        admin.groups.push("system:masters".into());
        assert!(forbidden_while_starting(&admin, &readyz, "/readyz").is_none());
    }
}
