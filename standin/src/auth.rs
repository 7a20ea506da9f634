//! Authentication as kube-apiserver's union authenticator does it (docs/upstream-facts.md, "Front-proxy authentication"): front-proxy
//! (requestheader) first, then x509 client certificates, then static bearer tokens. Every
//! authenticated user also gets `system:authenticated`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use hyper::HeaderMap;

use super::tls::PeerCert;

/// Who may call a stand-in, as kube-apiserver's flags say it.
#[derive(Debug, Clone)]
pub struct Auth {
    /// `--requestheader-client-ca-file`.
    pub requestheader_ca: PathBuf,
    /// `--requestheader-allowed-names`; empty allows any CN the CA signed.
    pub requestheader_allowed_names: Vec<String>,
    /// `--client-ca-file`: users' certificates (user = CN, groups = O).
    pub client_ca: PathBuf,
    /// `--token-auth-file`.
    pub tokens: Vec<Token>,
    /// `--anonymous-auth` (kube-apiserver's default: on).
    pub anonymous: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub token: String,
    pub user: String,
    pub groups: Vec<String>,
}

/// How a request was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    FrontProxy,
    ClientCert,
    Token,
    Anonymous,
}

/// The user a request was served as (`user.Info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    pub method: Method,
}

impl Identity {
    pub fn anonymous() -> Identity {
        Identity {
            user: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
            method: Method::Anonymous,
        }
    }
}

const AUTHENTICATED: &str = "system:authenticated";

/// Paths the `system:public-info-viewer` role opens to anonymous users.
pub fn anonymous_allowed(path: &str) -> bool {
    matches!(path, "/version" | "/version/" | "/readyz" | "/livez" | "/healthz")
}

/// A credential was presented and failed: kube-apiserver answers 401 even where anonymous
/// access is on (its union authenticator fails on an error before trying anonymous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unauthorized;

impl Auth {
    /// The identity: a user, anonymous (`--anonymous-auth` and no credential at all, or none
    /// that yields a user), or 401.
    pub fn authenticate(&self, peer: &PeerCert, headers: &HeaderMap) -> Result<Identity, Unauthorized> {
        // kube-apiserver's union goes on past an authenticator's error (a token still works next
        // to the front-proxy certificate without a user), but an error with no success is a 401
        // that anonymous access cannot turn into system:anonymous.
        let results = [self.front_proxy(peer, headers), client_cert(peer), self.bearer_token(headers)];
        let mut failed = false;
        for result in results {
            match result {
                Ok(Some(mut identity)) => {
                    if !identity.groups.iter().any(|g| g == AUTHENTICATED) {
                        identity.groups.push(AUTHENTICATED.into());
                    }
                    return Ok(identity);
                }
                Ok(None) => {}
                Err(Unauthorized) => failed = true,
            }
        }
        if self.anonymous && !failed { Ok(Identity::anonymous()) } else { Err(Unauthorized) }
    }

    /// The requestheader authenticator: a certificate of its CA with a name it does not allow
    /// is an error; without `X-Remote-User` it yields to the next authenticator.
    fn front_proxy(&self, peer: &PeerCert, headers: &HeaderMap) -> Result<Option<Identity>, Unauthorized> {
        let Some(subject) = peer.front_proxy.as_ref() else { return Ok(None) };
        let allowed = self.requestheader_allowed_names.is_empty()
            || self.requestheader_allowed_names.contains(&subject.common_name);
        if !allowed {
            return Err(Unauthorized);
        }
        let values = |name: &str| -> Vec<String> {
            headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect()
        };
        let Some(user) = values("x-remote-user").into_iter().find(|u| !u.is_empty()) else { return Ok(None) };
        let uid = values("x-remote-uid").into_iter().next().unwrap_or_default();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            let Some(key) = name.as_str().strip_prefix("x-remote-extra-") else { continue };
            let Ok(value) = value.to_str() else { continue };
            extra.entry(unescape_extra_key(key)).or_default().push(value.to_string());
        }
        let groups = values("x-remote-group").into_iter().filter(|g| !g.is_empty()).collect();
        Ok(Some(Identity { user, uid, groups, extra, method: Method::FrontProxy }))
    }

    /// A bearer token that no authenticator accepts is an error, not anonymous.
    fn bearer_token(&self, headers: &HeaderMap) -> Result<Option<Identity>, Unauthorized> {
        let Some(value) = headers.get(hyper::header::AUTHORIZATION) else { return Ok(None) };
        let value = value.to_str().map_err(|_| Unauthorized)?.trim();
        let Some((scheme, token)) = value.split_once(' ') else { return Ok(None) };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Ok(None);
        }
        let token = token.trim();
        if token.is_empty() {
            return Ok(None);
        }
        let found = self.tokens.iter().find(|t| t.token == token).ok_or(Unauthorized)?;
        Ok(Some(Identity {
            user: found.user.clone(),
            uid: String::new(),
            groups: found.groups.clone(),
            extra: BTreeMap::new(),
            method: Method::Token,
        }))
    }
}

/// The x509 authenticator: a certificate the client CA did not sign is an error (the
/// front-proxy certificate without `X-Remote-User` included); one without a CN yields. 1.36
/// records the certificate's fingerprint as the user's credential id.
fn client_cert(peer: &PeerCert) -> Result<Option<Identity>, Unauthorized> {
    let Some(subject) = peer.client.as_ref() else {
        return if peer.front_proxy.is_some() { Err(Unauthorized) } else { Ok(None) };
    };
    if subject.common_name.is_empty() {
        return Ok(None);
    }
    let credential_id = format!("X509SHA256={}", subject.fingerprint);
    Ok(Some(Identity {
        user: subject.common_name.clone(),
        uid: String::new(),
        groups: subject.organizations.clone(),
        extra: BTreeMap::from([(CREDENTIAL_ID.to_string(), vec![credential_id])]),
        method: Method::ClientCert,
    }))
}

/// `user.CredentialIDKey`.
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// Header names arrive lower-cased; the key is then path-unescaped (`%2F` → `/`), as upstream.
fn unescape_extra_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::super::tls::Subject;
    use super::*;

    fn auth(allowed: &[&str]) -> Auth {
        Auth {
            requestheader_ca: PathBuf::new(),
            requestheader_allowed_names: allowed.iter().map(|s| s.to_string()).collect(),
            client_ca: PathBuf::new(),
            tokens: vec![Token { token: "t0k3n".into(), user: "bob".into(), groups: vec!["ops".into()] }],
            anonymous: true,
        }
    }

    fn subject(cn: &str, orgs: &[&str]) -> Option<Subject> {
        Some(Subject {
            common_name: cn.into(),
            organizations: orgs.iter().map(|s| s.to_string()).collect(),
            fingerprint: "ab12".into(),
        })
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        map
    }

    #[test]
    fn front_proxy_needs_an_allowed_cn_and_a_user() {
        let peer = PeerCert { front_proxy: subject("proxy", &[]), client: None };
        let h = headers(&[
            ("X-Remote-User", "carol"),
            ("X-Remote-Group", "a,b"),
            ("X-Remote-Group", "c"),
            ("X-Remote-Extra-Scopes%2Fx", "s1"),
            ("X-Remote-Extra-Scopes%2Fx", "s2"),
        ]);
        let id = auth(&["proxy"]).authenticate(&peer, &h).unwrap();
        assert_eq!(id.user, "carol");
        assert_eq!(id.groups, ["a,b", "c", "system:authenticated"]);
        assert_eq!(id.extra["scopes/x"], ["s1", "s2"]);
        assert_eq!(id.method, Method::FrontProxy);
        assert!(auth(&[]).authenticate(&peer, &h).is_ok());
        assert_eq!(auth(&["other"]).authenticate(&peer, &h), Err(Unauthorized));
        // As kube-apiserver: the front-proxy certificate without a user is an x509 client
        // certificate the client CA did not sign, so 401 even with anonymous access on (R1).
        assert_eq!(auth(&["proxy"]).authenticate(&peer, &headers(&[])), Err(Unauthorized));
        // A token next to it still authenticates: the union goes on past the x509 error.
        let token = headers(&[("Authorization", "Bearer t0k3n")]);
        assert_eq!(auth(&["proxy"]).authenticate(&peer, &token).map(|i| i.user), Ok("bob".to_string()));
    }

    #[test]
    fn anonymous_only_without_any_credential() {
        let none = PeerCert::default();
        assert_eq!(auth(&[]).authenticate(&none, &headers(&[])).unwrap().method, Method::Anonymous);
        let mut off = auth(&[]);
        off.anonymous = false;
        assert_eq!(off.authenticate(&none, &headers(&[])), Err(Unauthorized));
        // A certificate without a CN yields: anonymous, or the token.
        let no_cn = PeerCert { front_proxy: None, client: subject("", &["devs"]) };
        assert_eq!(auth(&[]).authenticate(&no_cn, &headers(&[])).unwrap().method, Method::Anonymous);
        let token = headers(&[("Authorization", "Bearer t0k3n")]);
        assert_eq!(auth(&[]).authenticate(&no_cn, &token).unwrap().user, "bob");
    }

    #[test]
    fn headers_mean_nothing_without_the_requestheader_cert() {
        let peer = PeerCert { front_proxy: None, client: subject("alice", &["devs"]) };
        let id = auth(&[]).authenticate(&peer, &headers(&[("X-Remote-User", "root")])).unwrap();
        assert_eq!((id.user.as_str(), id.method), ("alice", Method::ClientCert));
        assert_eq!(id.groups, ["devs", "system:authenticated"]);
        assert_eq!(id.extra[CREDENTIAL_ID], ["X509SHA256=ab12"]);
        let spoofed = auth(&[]).authenticate(&PeerCert::default(), &headers(&[("X-Remote-User", "root")]));
        assert_eq!(spoofed.unwrap().method, Method::Anonymous);
    }

    #[test]
    fn bearer_tokens() {
        let none = PeerCert::default();
        let id = auth(&[]).authenticate(&none, &headers(&[("Authorization", "Bearer t0k3n")])).unwrap();
        assert_eq!((id.user.as_str(), id.method), ("bob", Method::Token));
        assert_eq!(
            auth(&[]).authenticate(&none, &headers(&[("Authorization", "Bearer nope")])),
            Err(Unauthorized)
        );
        for ignored in ["Basic t0k3n", "Bearer ", "t0k3n"] {
            let id = auth(&[]).authenticate(&none, &headers(&[("Authorization", ignored)]));
            assert_eq!(id.map(|i| i.method), Ok(Method::Anonymous), "{ignored}");
        }
    }

    #[test]
    fn anonymous_paths() {
        assert!(anonymous_allowed("/version") && anonymous_allowed("/readyz"));
        assert!(!anonymous_allowed("/api") && !anonymous_allowed("/readyz/etcd"));
    }
}
