//! What a table asks of the edge besides routing: whose identity it maps, which headers it
//! strips, and how long and how many requests the hold keeps ([`crate::hold`]). Below the table
//! and the hold, which both read it; the sidecar writes it from its config under the same names.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyConfig {
    /// Remove a downstream `x-kubernetes-peer-proxied` header. Upstream does not authenticate it,
    /// so any client could otherwise switch off an apiserver's own peer proxying for its request.
    /// The shipped bootstraps remove it at the listener too, before routing, for the bypass
    /// routes ([`crate::bypass::LISTENER_STRIPS`]): `false` takes effect with that line gone.
    #[serde(default = "yes")]
    pub strip_downstream_peer_proxied: bool,
    /// Map a verified downstream client certificate to `X-Remote-User`/`X-Remote-Group`.
    #[serde(default = "yes")]
    pub client_cert_identity: bool,
    /// With a mapped certificate, also send the user extra kube-apiserver's x509 authenticator
    /// adds (`authentication.kubernetes.io/credential-id: X509SHA256=<fingerprint>`, 1.3x on),
    /// which audit logs record.
    #[serde(default = "yes")]
    pub x509_credential_id: bool,
    /// The sidecar config's `hold`, as it wrote it.
    #[serde(default, skip_serializing_if = "HoldPolicy::is_default")]
    pub hold: HoldPolicy,
}

fn yes() -> bool {
    true
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            strip_downstream_peer_proxied: true,
            client_cert_identity: true,
            x509_credential_id: true,
            hold: HoldPolicy::default(),
        }
    }
}

/// How long, and how many, requests may wait at the edge while every apiserver that serves them
/// is away. `maxWait` and `maxHeld` in the sidecar's config and in the table alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HoldPolicy {
    /// The longest a request waits before the 503 it would have had at once (with
    /// `Retry-After`); zero: none waits.
    #[serde(with = "crate::duration::text")]
    pub max_wait: Duration,
    /// Requests waiting at once, per Envoy worker; past it a request is not held (it gets the
    /// 503 at once), so that an outage cannot make Envoy keep an unbounded number of streams.
    pub max_held: usize,
}

impl Default for HoldPolicy {
    /// A real kube-apiserver restart (SIGTERM, then the same binary again) is refused for 0.9 to
    /// 2.2 s and ready 2.0 to 4.2 s after its start; Envoy's health check finds it within one
    /// interval (2 s) more, and the hold's probe within 200 ms. 10 s covers that twice over and
    /// stays far below every client's and the apiserver's own request timeout (60 s).
    fn default() -> Self {
        HoldPolicy { max_wait: Duration::from_secs(10), max_held: 1024 }
    }
}

impl HoldPolicy {
    /// No request waits: each gets its 503 at once.
    pub fn is_off(&self) -> bool {
        self.max_wait.is_zero()
    }

    fn is_default(&self) -> bool {
        *self == HoldPolicy::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hold's setting keeps its name and its form from the sidecar's config into the table
    /// (`policy.hold.maxWait`); the defaults are left out of the table, and come back.
    #[test]
    fn the_hold_travels_in_the_tables_policy_by_the_configs_names() {
        let shipped = PolicyConfig::default();
        assert_eq!(shipped.hold, HoldPolicy { max_wait: Duration::from_secs(10), max_held: 1024 });
        assert_eq!(
            serde_json::to_value(shipped).unwrap(),
            serde_json::json!({
                "stripDownstreamPeerProxied": true, "clientCertIdentity": true, "x509CredentialId": true
            })
        );
        let asked = PolicyConfig {
            hold: HoldPolicy { max_wait: Duration::from_millis(2500), max_held: 7 },
            ..shipped
        };
        let written = serde_json::to_value(asked).unwrap();
        assert_eq!(written["hold"], serde_json::json!({"maxWait": "2500ms", "maxHeld": 7}));
        assert_eq!(serde_json::from_value::<PolicyConfig>(written).unwrap(), asked);
        let off: PolicyConfig =
            serde_json::from_value(serde_json::json!({"hold": {"maxWait": "0s"}})).unwrap();
        assert!(off.hold.is_off() && off.hold.max_held == 1024);
        for wrong in [
            serde_json::json!({"maxWait": 10000}),
            serde_json::json!({"maxWait": "soon"}),
            serde_json::json!({"maxHoldMs": 0}),
        ] {
            assert!(serde_json::from_value::<HoldPolicy>(wrong.clone()).is_err(), "{wrong}");
        }
    }
}
