//! Authentication as kube-apiserver's union authenticator does it (spec §7): front-proxy
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

impl Auth {
    /// The identity, or None (401).
    pub fn authenticate(&self, peer: &PeerCert, headers: &HeaderMap) -> Option<Identity> {
        let mut identity = self
            .front_proxy(peer, headers)
            .or_else(|| client_cert(peer))
            .or_else(|| self.bearer_token(headers))?;
        if !identity.groups.iter().any(|g| g == AUTHENTICATED) {
            identity.groups.push(AUTHENTICATED.into());
        }
        Some(identity)
    }

    fn front_proxy(&self, peer: &PeerCert, headers: &HeaderMap) -> Option<Identity> {
        let subject = peer.front_proxy.as_ref()?;
        let allowed = self.requestheader_allowed_names.is_empty()
            || self.requestheader_allowed_names.contains(&subject.common_name);
        if !allowed {
            return None;
        }
        let values = |name: &str| -> Vec<String> {
            headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect()
        };
        let user = values("x-remote-user").into_iter().find(|u| !u.is_empty())?;
        let uid = values("x-remote-uid").into_iter().next().unwrap_or_default();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            let Some(key) = name.as_str().strip_prefix("x-remote-extra-") else { continue };
            let Ok(value) = value.to_str() else { continue };
            extra.entry(unescape_extra_key(key)).or_default().push(value.to_string());
        }
        Some(Identity { user, uid, groups: values("x-remote-group"), extra, method: Method::FrontProxy })
    }

    fn bearer_token(&self, headers: &HeaderMap) -> Option<Identity> {
        let value = headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?.trim();
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim();
        let found = self.tokens.iter().find(|t| !token.is_empty() && t.token == token)?;
        Some(Identity {
            user: found.user.clone(),
            uid: String::new(),
            groups: found.groups.clone(),
            extra: BTreeMap::new(),
            method: Method::Token,
        })
    }
}

fn client_cert(peer: &PeerCert) -> Option<Identity> {
    let subject = peer.client.as_ref().filter(|s| !s.common_name.is_empty())?;
    Some(Identity {
        user: subject.common_name.clone(),
        uid: String::new(),
        groups: subject.organizations.clone(),
        extra: BTreeMap::new(),
        method: Method::ClientCert,
    })
}

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
        }
    }

    fn subject(cn: &str, orgs: &[&str]) -> Option<Subject> {
        Some(Subject { common_name: cn.into(), organizations: orgs.iter().map(|s| s.to_string()).collect() })
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
        assert!(auth(&[]).authenticate(&peer, &h).is_some());
        assert!(auth(&["other"]).authenticate(&peer, &h).is_none());
        assert!(auth(&["proxy"]).authenticate(&peer, &headers(&[])).is_none());
    }

    #[test]
    fn headers_mean_nothing_without_the_requestheader_cert() {
        let peer = PeerCert { front_proxy: None, client: subject("alice", &["devs"]) };
        let id = auth(&[]).authenticate(&peer, &headers(&[("X-Remote-User", "root")])).unwrap();
        assert_eq!((id.user.as_str(), id.method), ("alice", Method::ClientCert));
        assert_eq!(id.groups, ["devs", "system:authenticated"]);
        assert!(
            auth(&[]).authenticate(&PeerCert::default(), &headers(&[("X-Remote-User", "root")])).is_none()
        );
    }

    #[test]
    fn bearer_tokens() {
        let none = PeerCert::default();
        let id = auth(&[]).authenticate(&none, &headers(&[("Authorization", "Bearer t0k3n")])).unwrap();
        assert_eq!((id.user.as_str(), id.method), ("bob", Method::Token));
        for bad in ["Bearer nope", "Basic t0k3n", "Bearer ", "t0k3n"] {
            assert!(auth(&[]).authenticate(&none, &headers(&[("Authorization", bad)])).is_none(), "{bad}");
        }
    }

    #[test]
    fn anonymous_paths() {
        assert!(anonymous_allowed("/version") && anonymous_allowed("/readyz"));
        assert!(!anonymous_allowed("/api") && !anonymous_allowed("/readyz/etcd"));
    }
}
