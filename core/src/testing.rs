//! Fixtures for the tests of core and of the crates built on it (feature `testing`).

use serde_json::{Value, json};

/// Apiservers `a` and `b` at `old`, `c` at `new`, their clusters `{cluster_prefix}a` and so on:
/// the skew most tests set up.
pub fn apiservers(old: &str, new: &str, cluster_prefix: &str) -> Value {
    let server = |id: &str, version: &str| json!({"id": id, "cluster": format!("{cluster_prefix}{id}"), "version": version});
    json!([server("a", old), server("b", old), server("c", new)])
}

/// A routing table of three apiservers, c the newest: resourceclaims v1 and evictions only on c,
/// deviceclasses v1alpha3 only on a and b, everything else on all three.
pub fn sample() -> Value {
    json!({
        "schema": 1,
        "generation": "t1",
        "apiservers": apiservers("v1.33.4", "v1.36.0", "apiserver-"),
        "poolCluster": "pool",
        "sets": [
            {"cluster": "set-c", "members": ["c"]},
            {"cluster": "set-a-b", "members": ["a", "b"]}
        ],
        "groupVersions": [
            {"group": "", "version": "v1", "servedBy": ["a", "b", "c"],
             "resources": {"pods": ["a", "b", "c"], "configmaps": ["a", "b", "c"]}},
            {"group": "resource.k8s.io", "version": "v1", "servedBy": ["c"],
             "resources": {"resourceclaims": ["c"]}},
            {"group": "resource.k8s.io", "version": "v1beta1", "servedBy": ["a", "b", "c"],
             "resources": {"resourceclaims": ["a", "b", "c"]}},
            {"group": "resource.k8s.io", "version": "v1alpha3", "servedBy": ["a", "b", "c"],
             "resources": {"deviceclasses": ["a", "b"], "devicetaintrules": ["a", "b", "c"]}},
            {"group": "lifecycle.k8s.io", "version": "v1alpha1", "servedBy": ["c"],
             "resources": {"evictions": ["c"]}}
        ],
        "discovery": {"etag": "ABC123", "document": "{\"kind\":\"APIGroupDiscoveryList\"}"}
    })
}

/// `table` sealed with the clusters it names ([`crate::seal::seal_as_named`]): the filter and
/// the native module take only sealed tables. A value that is no table comes back unchanged,
/// for the filter to refuse.
pub fn sealed(table: &Value) -> Value {
    let Ok(mut config) = serde_json::from_value::<crate::table::TableConfig>(table.clone()) else {
        return table.clone();
    };
    crate::seal::seal_as_named(&mut config);
    serde_json::to_value(config).unwrap_or_else(|_| table.clone())
}

/// One DER element.
pub fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let len = contents.len();
    let mut out = vec![tag];
    match len {
        0..0x80 => out.push(len as u8),
        0x80..0x100 => out.extend([0x81, len as u8]),
        _ => out.extend([0x82, (len >> 8) as u8, len as u8]),
    }
    out.extend_from_slice(contents);
    out
}

/// A name's attributes, one RDN each: (the attribute type's OID contents, the value's tag, its
/// bytes).
pub type Attributes<'a> = &'a [(&'a [u8], u8, &'a [u8])];

/// CN and O's OID contents (2.5.4.3, 2.5.4.10).
pub const CN: &[u8] = &[0x55, 0x04, 0x03];
pub const O: &[u8] = &[0x55, 0x04, 0x0a];

/// A certificate with these names, as far as [`crate::certificate`] reads one: version, serial,
/// signature algorithm, issuer, validity, subject; no key, no extensions, no signature value.
pub fn certificate_der(issuer: Attributes<'_>, subject: Attributes<'_>) -> Vec<u8> {
    let name = |attributes: Attributes<'_>| {
        let rdns: Vec<u8> = attributes
            .iter()
            .flat_map(|(oid, tag, value)| der(0x31, &der(0x30, &[der(0x06, oid), der(*tag, value)].concat())))
            .collect();
        der(0x30, &rdns)
    };
    // ecdsa-with-SHA256.
    let algorithm = der(0x30, &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]));
    let validity = der(0x30, &[der(0x17, b"260101000000Z"), der(0x17, b"270101000000Z")].concat());
    let tbs = [
        der(0xa0, &der(0x02, &[2])),
        der(0x02, &[1]),
        algorithm.clone(),
        name(issuer),
        validity,
        name(subject),
        // An id-ecPublicKey P-256 key (its point is not read).
        der(
            0x30,
            &[
                der(
                    0x30,
                    &[
                        der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]),
                        der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]),
                    ]
                    .concat(),
                ),
                der(0x03, &[0, 4, 1, 2]),
            ]
            .concat(),
        ),
    ]
    .concat();
    der(0x30, &[der(0x30, &tbs), algorithm, der(0x03, &[0])].concat())
}

/// `der` as Envoy's `%DOWNSTREAM_PEER_CERT%` renders it: PEM, URL-encoded.
pub fn url_encoded_pem(der: &[u8]) -> String {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body.as_bytes().chunks(64).filter_map(|c| std::str::from_utf8(c).ok()).collect();
    let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"));
    pem.replace(' ', "%20").replace('\n', "%0A").replace('+', "%2B").replace('/', "%2F").replace('=', "%3D")
}

/// A client certificate kube-apiserver reads, as Envoy hands it to the filter: issuer CN `ca`,
/// subject CN `alice` (UTF8String) and O `devs` (PrintableString). The filter takes the identity
/// from Envoy's rendered subject; this shows it the names are of types Go reads.
pub fn peer_certificate() -> String {
    url_encoded_pem(&certificate_der(&[(CN, 12, b"ca")], &[(CN, 12, b"alice"), (O, 19, b"devs")]))
}

/// A request whose client sent every header skewgate reserves, for a rerouted watch with a
/// token: what it must lose, and what the plan sets instead.
pub const SPOOFED_WATCH: &[(&str, &str)] = &[
    (":method", "GET"),
    (":path", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims?watch=1"),
    ("authorization", "Bearer t"),
    ("x-remote-user", "admin"),
    ("x-remote-group", "system:masters"),
    ("x-remote-extra-scopes", "all"),
    ("x-kubernetes-peer-proxied", "true"),
    ("x-skewgate-cluster", "skewgate-pool"),
    ("x-skewgate-route", "native"),
    ("accept", "application/json"),
];

/// A local reply a [`FakeStream`] was asked to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub body: Vec<u8>,
    /// What Envoy's access log would record.
    pub details: String,
    pub headers: Vec<(String, String)>,
}

/// An Envoy stream as [`crate::stream::Stream`] sees it: its headers, the attributes it answers,
/// a response body that arrives in pieces, and what the pipeline did to all of it.
#[derive(Debug, Default)]
pub struct FakeStream {
    pub request: Vec<(Vec<u8>, Vec<u8>)>,
    pub response: Vec<(Vec<u8>, Vec<u8>)>,
    pub attributes: Vec<(crate::stream::Attribute, Vec<u8>)>,
    /// The response body Envoy holds for the stream: what the hooks received and kept.
    pub body: Vec<u8>,
    /// The answer ended with trailers and no data: no body to put anything in.
    pub bodiless: bool,
    pub reply: Option<LocalReply>,
    pub route_cleared: usize,
}

impl FakeStream {
    pub fn request(headers: &[(&str, &str)]) -> Self {
        let request = headers.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect();
        FakeStream { request, ..FakeStream::default() }
    }

    pub fn request_headers(&self) -> Vec<(&[u8], &[u8])> {
        self.request.iter().map(|(n, v)| (&n[..], &v[..])).collect()
    }

    /// Every value of a request header.
    pub fn header(&self, name: &str) -> Vec<String> {
        let values = self.request.iter().filter(|(n, _)| n == name.as_bytes());
        values.map(|(_, v)| String::from_utf8_lossy(v).into_owned()).collect()
    }

    pub fn response_value(&self, name: &str) -> Option<String> {
        let value = self.response.iter().find(|(n, _)| n == name.as_bytes());
        value.map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn attribute_is(mut self, which: crate::stream::Attribute, value: &[u8]) -> Self {
        self.attributes.push((which, value.to_vec()));
        self
    }

    /// The local reply's status and JSON body.
    pub fn reply_json(&self) -> Option<(u32, Value)> {
        let reply = self.reply.as_ref()?;
        Some((reply.status, serde_json::from_slice(&reply.body).ok()?))
    }

    pub fn reply_header(&self, name: &str) -> Option<&str> {
        self.reply.as_ref()?.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl crate::stream::Stream for FakeStream {
    fn attribute(&self, which: crate::stream::Attribute) -> Option<std::borrow::Cow<'_, [u8]>> {
        self.attributes.iter().find(|(a, _)| *a == which).map(|(_, v)| std::borrow::Cow::Borrowed(&v[..]))
    }
    fn response_header(&self, name: &str) -> Option<std::borrow::Cow<'_, [u8]>> {
        let value = self.response.iter().find(|(n, _)| n == name.as_bytes());
        value.map(|(_, v)| std::borrow::Cow::Borrowed(&v[..]))
    }
    fn response_header_names(&self) -> Vec<String> {
        self.response.iter().map(|(n, _)| String::from_utf8_lossy(n).into_owned()).collect()
    }
    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        self.request.retain(|(n, _)| n != name.as_bytes());
        if let Some(value) = value {
            self.request.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.request.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
    }
    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        self.response.retain(|(n, _)| n != name.as_bytes());
        if let Some(value) = value {
            self.response.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
    }
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str) {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        self.reply = Some(LocalReply { status, body: body.to_vec(), details: details.to_owned(), headers });
    }
    fn drop_response_body(&mut self, size: usize) {
        let kept = self.body.len().saturating_sub(size);
        self.body.truncate(kept);
    }
    fn end_response_body(&mut self, size: usize, body: &[u8], _at_trailers: bool) -> bool {
        if self.bodiless {
            return false;
        }
        self.drop_response_body(size);
        self.body.extend_from_slice(body);
        true
    }
    fn clear_route_cache(&mut self) {
        self.route_cleared += 1;
    }
}
