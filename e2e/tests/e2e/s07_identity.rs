//! Scenario 7: Identity and spoofing.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_harness::cluster::Credentials;
use skewgate_harness::echo::SERVED_BY;
use skewgate_harness::kubectl::{self, Kubectl};
use skewgate_harness::scenario::{Row, cert_sha256, header, ids, kubectl, scenario};

use crate::support::{CREDENTIAL_ID, ERAS, TIMEOUT, finish, served, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s07_identity() -> Result<()> {
    scenario("07", "identity and spoofing", identity()).await
}

async fn identity() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s07", ERAS, |_| {}).await?;
    let base = c.envoy_url()?;
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let token = c.client(Credentials::AdminToken, TIMEOUT)?;
    let anonymous = c.client(Credentials::Anonymous, TIMEOUT)?;
    let spoof = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-Uid", "0"),
        ("X-Remote-Extra-Scopes", "all"),
    ];
    let paths = [
        "/api/v1/namespaces/default/pods",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        "/apis/resource.k8s.io/v1alpha3/deviceclasses",
    ];
    let mut seen_by: BTreeSet<String> = BTreeSet::new();
    let alice_groups = ids(&["devs", "system:authenticated"]);
    // R3: what kube-apiserver 1.36's x509 authenticator adds for the certificate itself.
    let alice_extra = BTreeMap::from([(
        CREDENTIAL_ID.to_string(),
        vec![format!("X509SHA256={}", cert_sha256(&c.pki.alice.cert)?)],
    )]);
    for round in 0..30 {
        let path = paths[round % paths.len()];
        for spoofing in [false, true] {
            let mut req = alice.get(format!("{base}{path}"));
            if spoofing {
                for (k, v) in spoof {
                    req = req.header(k, v);
                }
            }
            let r = req.send().await?;
            row.requests += 1;
            assert_eq!(r.status(), 200, "{path}");
            let s = served(&c, r.headers())?;
            let who = s.identity.context("alice not authenticated")?;
            seen_by.insert(header(r.headers(), SERVED_BY).unwrap_or_default());
            // Exactly what the certificate says, through Envoy's front-proxy identity.
            assert_eq!(who.user, "alice", "{path} spoofing={spoofing}");
            assert_eq!(who.groups, alice_groups, "{path} spoofing={spoofing}");
            assert!(who.uid.is_empty(), "{who:?}");
            assert_eq!(who.extra, alice_extra, "{path} spoofing={spoofing}");
            assert_eq!(who.method, skewgate_standin::AuthMethod::FrontProxy);
        }
    }
    assert_eq!(seen_by, BTreeSet::from(["a", "b", "c"].map(String::from)));

    // What the apiserver itself says about the caller (SelfSubjectReview), spoofing or not.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let url = format!("{base}/apis/authentication.k8s.io/v1/selfsubjectreviews");
    let mut req = alice.post(&url).json(&review);
    for (k, v) in spoof {
        req = req.header(k, v);
    }
    let r: Value = req.send().await?.json().await?;
    row.requests += 1;
    assert_eq!(r["status"]["userInfo"]["username"], "alice", "{r}");
    assert_eq!(r["status"]["userInfo"]["groups"], json!(["devs", "system:authenticated"]), "{r}");
    let k = kubectl(&c)?;
    let whoami = k.ok(&["auth", "whoami", "-o", "json"]).await?;
    row.requests += 1;
    let whoami: Value = serde_json::from_str(&whoami)?;
    assert_eq!(whoami["status"]["userInfo"]["username"], "alice");

    // A bearer token passes through (the stand-in authenticates the token, not Envoy),
    // and spoofed headers next to it change nothing.
    for spoofing in [false, true] {
        let mut req = token.get(format!("{base}{}", paths[1]));
        if spoofing {
            for (k, v) in spoof {
                req = req.header(k, v);
            }
        }
        let r = req.send().await?;
        row.requests += 1;
        assert_eq!(r.status(), 200);
        let who = served(&c, r.headers())?.identity.context("token not authenticated")?;
        assert_eq!((who.user.as_str(), who.method), ("admin", skewgate_standin::AuthMethod::Token));
        assert_eq!(who.groups, ids(&["system:masters", "system:authenticated"]));
    }
    let admin = k
        .with_context("skewgate-admin")
        .ok(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])
        .await?;
    row.requests += 1;
    assert_eq!(admin, "admin");

    // No credentials: anonymous at the apiserver, as without Envoy (R2): RBAC's 403 for
    // resources, spoofed headers or not.
    let mut forbidden = 0;
    for spoofing in [false, true] {
        for path in paths {
            let mut req = anonymous.get(format!("{base}{path}"));
            if spoofing {
                for (k, v) in spoof {
                    req = req.header(k, v);
                }
            }
            let r = req.send().await?;
            row.requests += 1;
            assert_eq!(r.status(), 403, "{path} spoofing={spoofing}");
            let s = served(&c, r.headers())?;
            assert!(s.identity.is_none(), "{s:?}");
            let body: Value = r.json().await?;
            assert_eq!((&body["kind"], &body["reason"]), (&json!("Status"), &json!("Forbidden")));
            assert!(body["message"].as_str().unwrap_or_default().contains("system:anonymous"), "{body}");
            forbidden += 1;
        }
    }
    // kubectl with a token nobody issued: the 401 comes from an apiserver.
    let stranger = c.out.join("stranger.kubeconfig");
    let text = std::fs::read_to_string(&c.kubeconfig)?;
    let head = text.split("users:").next().unwrap_or("");
    std::fs::write(&stranger, format!("{head}users:\n- name: alice\n  user: {{token: not-a-real-token}}\n"))?;
    let out = Kubectl::new(&stranger, &c.out.join("kube-cache"))?
        .run(&["get", "--raw", "/api/v1/namespaces", "-v=8"])
        .await?;
    row.requests += 1;
    ensure!(!out.ok && out.stderr.contains("Unauthorized"), "{}", out.stderr);
    let e = kubectl::exchanges(&out.stderr);
    let last = e.last().context("no exchange")?;
    assert_eq!(last.status, 401);
    assert!(last.header(SERVED_BY).is_some(), "401 not from an apiserver: {last:?}");
    row.figure(format!(
        "alice (cert) seen as alice/[devs] on {seen_by:?}, spoofed X-Remote-* dropped; token → admin \
         (Token); {forbidden}×403 for system:anonymous from apiservers without credentials"
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
