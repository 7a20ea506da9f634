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
