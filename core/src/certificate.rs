//! What kube-apiserver's reading of a client certificate refuses that Envoy's does not.
//!
//! Envoy (BoringSSL) verifies the chain and renders the subject, converting every string type it
//! knows to UTF-8, so a CN of `admin` reads the same as a UTF8String, a PrintableString or a
//! UniversalString. kube-apiserver's x509 authenticator reads the certificate with Go's
//! `crypto/x509`, whose parser refuses the whole certificate when any attribute of its issuer or
//! subject name is of a string type it does not read (UniversalString, VisibleString, ...) or not
//! valid for its type (`parseName`, `parseASN1String`). skewgate must not take an identity from a
//! certificate the apiserver would refuse, so the filter reads the names from the DER as Go does.

use std::fmt;

/// The request header the bootstrap's `skewgate-certificate` filter (a header mutation ahead of
/// skewgate's) sets to Envoy's `%DOWNSTREAM_PEER_CERT%`, over anything a client sent. An
/// `x-skewgate-*` header: the filter removes it before the request goes on, and the routes that
/// skip the filter also skip the header mutation.
pub const PEER_CERTIFICATE_HEADER: &str = "x-skewgate-peer-certificate";

use base64::Engine;

/// Which of the certificate's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    Issuer,
    Subject,
}

/// The attribute whose value Go refuses, by its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    CommonName,
    Organization,
    OrganizationalUnit,
    Country,
    /// Any other attribute type: Go parses every value, whatever the attribute.
    Other,
}

/// Why Go's parser refuses a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A name attribute's value is of a string type Go does not read (its ASN.1 tag).
    UnsupportedStringType { name: Name, attribute: Attribute, tag: u8 },
    /// A name attribute's value is not valid for its string type (its ASN.1 tag).
    InvalidString { name: Name, attribute: Attribute, tag: u8 },
    /// The certificate's DER (or Envoy's PEM of it) could not be read this far.
    Malformed,
    /// The filter was not handed the certificate (a bootstrap without the header that carries
    /// it), so it cannot tell whether the apiserver would take it.
    Unseen,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Refusal::UnsupportedStringType { name, attribute, tag } => write!(
                f,
                "its {} {} is a{} (ASN.1 tag {tag}), a string type kube-apiserver's x509 parser does not read",
                name.as_str(),
                attribute.as_str(),
                string_type(tag).map_or_else(|| " value of another type".to_owned(), |t| format!(" {t}"))
            ),
            Refusal::InvalidString { name, attribute, tag } => write!(
                f,
                "its {} {} is not a valid {}, which kube-apiserver's x509 parser refuses",
                name.as_str(),
                attribute.as_str(),
                string_type(tag).unwrap_or("string")
            ),
            Refusal::Malformed => f.write_str("its names could not be read as kube-apiserver's x509 parser reads them"),
            Refusal::Unseen => f.write_str(
                "Envoy did not hand skewgate the certificate (x-skewgate-peer-certificate, set by the bootstrap's \
                 skewgate-certificate filter), so skewgate cannot tell whether kube-apiserver would read it",
            ),
        }
    }
}

impl Name {
    fn as_str(self) -> &'static str {
        match self {
            Name::Issuer => "issuer's",
            Name::Subject => "subject's",
        }
    }
}

impl Attribute {
    fn as_str(self) -> &'static str {
        match self {
            Attribute::CommonName => "CN",
            Attribute::Organization => "O",
            Attribute::OrganizationalUnit => "OU",
            Attribute::Country => "C",
            Attribute::Other => "attribute",
        }
    }

    /// By the OID's DER contents (id-at: 2.5.4.x).
    fn of(oid: &[u8]) -> Self {
        match oid {
            [0x55, 0x04, 0x03] => Attribute::CommonName,
            [0x55, 0x04, 0x0a] => Attribute::Organization,
            [0x55, 0x04, 0x0b] => Attribute::OrganizationalUnit,
            [0x55, 0x04, 0x06] => Attribute::Country,
            _ => Attribute::Other,
        }
    }
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const OBJECT_IDENTIFIER: u8 = 0x06;
const VERSION: u8 = 0xa0;

const UTF8_STRING: u8 = 12;
const NUMERIC_STRING: u8 = 18;
const PRINTABLE_STRING: u8 = 19;
const T61_STRING: u8 = 20;
const IA5_STRING: u8 = 22;
const BMP_STRING: u8 = 30;

fn string_type(tag: u8) -> Option<&'static str> {
    Some(match tag {
        UTF8_STRING => "UTF8String",
        NUMERIC_STRING => "NumericString",
        PRINTABLE_STRING => "PrintableString",
        T61_STRING => "T61String",
        21 => "VideotexString",
        IA5_STRING => "IA5String",
        25 => "GraphicString",
        26 => "VisibleString",
        27 => "GeneralString",
        28 => "UniversalString",
        BMP_STRING => "BMPString",
        _ => return None,
    })
}

/// Checks the names of the certificate Envoy renders as `%DOWNSTREAM_PEER_CERT%` (URL-encoded
/// PEM, the first certificate of the chain), without string conversions and with buffers sized
/// to the input once.
pub fn check_pem(url_encoded_pem: &[u8]) -> Result<(), Refusal> {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    let mut pem = Vec::with_capacity(url_encoded_pem.len());
    pem.extend(percent_encoding::percent_decode(url_encoded_pem));
    let start = pem.windows(BEGIN.len()).position(|w| w == BEGIN).ok_or(Refusal::Malformed)? + BEGIN.len();
    let rest = pem.get(start..).unwrap_or_default();
    let end = rest.iter().position(|&b| b == b'-').ok_or(Refusal::Malformed)?;
    let base64: Vec<u8> = rest.iter().take(end).copied().filter(|b| !b.is_ascii_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(base64).map_err(|_| Refusal::Malformed)?;
    check_der(&der)
}

/// Checks every attribute of the issuer and subject names of a DER certificate as Go's
/// `parseName` does.
pub fn check_der(der: &[u8]) -> Result<(), Refusal> {
    let (certificate, _) = read(der, SEQUENCE)?;
    let (mut tbs, _) = read(certificate, SEQUENCE)?;
    if tbs.first() == Some(&VERSION) {
        tbs = read(tbs, VERSION)?.1;
    }
    let (_serial, rest) = read(tbs, INTEGER)?;
    let (_signature, rest) = read(rest, SEQUENCE)?;
    let (issuer, rest) = read(rest, SEQUENCE)?;
    let (_validity, rest) = read(rest, SEQUENCE)?;
    let (subject, _) = read(rest, SEQUENCE)?;
    check_name(issuer, Name::Issuer)?;
    check_name(subject, Name::Subject)
}

fn check_name(mut rdns: &[u8], name: Name) -> Result<(), Refusal> {
    while !rdns.is_empty() {
        let (mut set, rest) = read(rdns, SET)?;
        rdns = rest;
        while !set.is_empty() {
            let (attribute, rest) = read(set, SEQUENCE)?;
            set = rest;
            let (oid, value) = read(attribute, OBJECT_IDENTIFIER)?;
            let (tag, contents, _) = read_any(value)?;
            let attribute = Attribute::of(oid);
            match go_reads(tag, contents) {
                Some(true) => {}
                Some(false) => return Err(Refusal::InvalidString { name, attribute, tag }),
                None => return Err(Refusal::UnsupportedStringType { name, attribute, tag }),
            }
        }
    }
    Ok(())
}

/// Go's `parseASN1String`: `None` for a type it does not read, else whether the contents are
/// valid for the type.
fn go_reads(tag: u8, contents: &[u8]) -> Option<bool> {
    Some(match tag {
        // Read as Latin-1: any byte.
        T61_STRING => true,
        PRINTABLE_STRING => contents.iter().all(|&b| is_printable(b)),
        UTF8_STRING => std::str::from_utf8(contents).is_ok(),
        BMP_STRING => is_bmp(contents),
        IA5_STRING => contents.is_ascii(),
        NUMERIC_STRING => contents.iter().all(|&b| b.is_ascii_digit() || b == b' '),
        _ => return None,
    })
}

/// PrintableString's characters, and the `*` and `&` Go lets through because CAs use them.
fn is_printable(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b" '()+,-./:=?*&".contains(&b)
}

/// UCS-2: whole code units (a trailing NUL terminator allowed), none a surrogate or a
/// permanent noncharacter.
fn is_bmp(contents: &[u8]) -> bool {
    if contents.len() % 2 != 0 {
        return false;
    }
    let units = contents.strip_suffix(&[0, 0]).unwrap_or(contents);
    units.chunks_exact(2).all(|pair| {
        let unit = u16::from_be_bytes([pair[0], pair[1]]);
        !(unit == 0xfffe
            || unit == 0xffff
            || (0xfdd0..=0xfdef).contains(&unit)
            || (0xd800..=0xdfff).contains(&unit))
    })
}

/// One element of tag `tag`: its contents and what follows it.
fn read(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), Refusal> {
    match read_any(input)? {
        (found, contents, rest) if found == tag => Ok((contents, rest)),
        _ => Err(Refusal::Malformed),
    }
}

/// One element: its tag, contents and what follows it. DER only, as Go's cryptobyte reads it:
/// definite, minimal lengths. A tag in the high-tag-number form (no string type) reads as 0xff.
fn read_any(input: &[u8]) -> Result<(u8, &[u8], &[u8]), Refusal> {
    let (&first, mut rest) = input.split_first().ok_or(Refusal::Malformed)?;
    let tag = if first & 0x1f == 0x1f {
        // The tag number's base-128 bytes, the last without the high bit.
        let end = rest.iter().position(|b| b & 0x80 == 0).ok_or(Refusal::Malformed)?;
        rest = &rest[end + 1..];
        0xff
    } else {
        first
    };
    let (&len_byte, after) = rest.split_first().ok_or(Refusal::Malformed)?;
    let (len, after) = if len_byte & 0x80 == 0 {
        (usize::from(len_byte), after)
    } else {
        let count = usize::from(len_byte & 0x7f);
        // Indefinite (0), longer than 4 bytes, or with a leading zero: not DER.
        if count == 0 || count > 4 || after.first() == Some(&0) {
            return Err(Refusal::Malformed);
        }
        let bytes = after.get(..count).ok_or(Refusal::Malformed)?;
        let len = bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
        if len < 0x80 {
            return Err(Refusal::Malformed);
        }
        (len, &after[count..])
    };
    if after.len() < len {
        return Err(Refusal::Malformed);
    }
    let (contents, rest) = after.split_at(len);
    Ok((tag, contents, rest))
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::testing::{CN, O, certificate_der, peer_certificate, url_encoded_pem};

    const OU: &[u8] = &[0x55, 0x04, 0x0b];

    /// Go 1.26's own verdicts (testdata/x509-names/generate.go, run against crypto/x509): one
    /// attribute value of each tag and contents, in the issuer's CN or the subject's CN, O or OU.
    #[test]
    fn names_are_read_as_go_reads_them() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../testdata/x509-names/go-verdicts.json")).unwrap();
        let verdicts = fixture["verdicts"].as_array().unwrap();
        assert_eq!(verdicts.len(), 1152);
        let mut accepted = 0;
        for v in verdicts {
            let tag = u8::try_from(v["tag"].as_u64().unwrap()).unwrap();
            let hex = v["contents"].as_str().unwrap();
            let contents: Vec<u8> =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            let oid = match v["attribute"].as_str().unwrap() {
                "CN" => CN,
                "O" => O,
                _ => OU,
            };
            let ours: &[(&[u8], u8, &[u8])] = &[(oid, tag, &contents)];
            let plain: &[(&[u8], u8, &[u8])] = &[(CN, 12, b"x")];
            let (issuer, subject) = if v["name"] == "issuer" { (ours, plain) } else { (plain, ours) };
            let read = check_der(&certificate_der(issuer, subject));
            let go = v["error"].as_str().unwrap_or("");
            match read {
                Ok(()) => assert!(v["accepted"].as_bool().unwrap(), "taken, Go refuses: {v}"),
                Err(Refusal::UnsupportedStringType { .. }) => {
                    assert!(go.contains("unsupported string type"), "{v}")
                }
                Err(Refusal::InvalidString { .. }) => {
                    assert!(go.contains("invalid") && !go.contains("unsupported"), "{v}")
                }
                Err(other) => panic!("{other:?} for {v}"),
            }
            accepted += usize::from(read.is_ok());
        }
        assert_eq!(accepted, 232);
    }

    #[test]
    fn the_refusal_names_the_name_the_attribute_and_the_type() {
        let universal = certificate_der(&[(CN, 12, b"ca")], &[(O, 19, b"devs"), (CN, 28, b"\0\0\0a")]);
        let refusal = check_der(&universal).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::UnsupportedStringType { name: Name::Subject, attribute: Attribute::CommonName, tag: 28 }
        );
        assert_eq!(
            refusal.to_string(),
            "its subject's CN is a UniversalString (ASN.1 tag 28), a string type kube-apiserver's x509 parser does not read"
        );
        let printable = certificate_der(&[(O, 19, b"a_b")], &[(CN, 12, b"alice")]);
        assert_eq!(
            check_der(&printable).unwrap_err().to_string(),
            "its issuer's O is not a valid PrintableString, which kube-apiserver's x509 parser refuses"
        );
    }

    #[test]
    fn envoys_pem_is_read() {
        assert_eq!(check_pem(peer_certificate().as_bytes()), Ok(()));
        let visible = certificate_der(&[(CN, 12, b"ca")], &[(CN, 26, b"admin")]);
        assert!(matches!(
            check_pem(url_encoded_pem(&visible).as_bytes()),
            Err(Refusal::UnsupportedStringType { tag: 26, .. })
        ));
        // An OpenSSL client certificate (CN alice, O devs: UTF8String) as Envoy 1.40's
        // `%DOWNSTREAM_PEER_CERT%` rendered it, captured from a request header.
        let envoy = "-----BEGIN%20CERTIFICATE-----%0AMIIBJTCBzQIUP68MSKLrDeM4ku913kTDcOjqcyswCgYIKoZIzj0EAwIwDTELMAkG%0AA1UEAwwCY2EwHhcNMjYxMTI3MDc0OTEwWhcNMjYxMTI5MDc0OTEwWjAfMQ4wDAYD%0AVQQDDAVhbGljZTENMAsGA1UECgwEZGV2czBZMBMGByqGSM49AgEGCCqGSM49AwEH%0AA0IABI5qr851eFOgn%2FjPV2o03%2BoA3G7tBgD01VXgiOICBHfupwKUnJKxrIeuuRqe%0AA5VgiNfnfdwtPXfWOpQzmsJtpfAwCgYIKoZIzj0EAwIDRwAwRAIgZV9awtrvGhF9%0AIzkUFh7UTJMWaK%2B2sas3t%2BKPkPGTRoQCIH%2B9nayM21qk41EXyYLHsSwz1CSqWrJT%0AGVm%2BAM9K2rls%0A-----END%20CERTIFICATE-----%0A";
        assert_eq!(check_pem(envoy.as_bytes()), Ok(()));
        for garbage in
            ["", "%ZZ", "-----BEGIN%20CERTIFICATE-----%0A!!!%0A-----END%20CERTIFICATE-----", "MIIB"]
        {
            assert_eq!(check_pem(garbage.as_bytes()), Err(Refusal::Malformed), "{garbage:?}");
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {

    use super::*;
    use crate::testing::{CN, certificate_der, url_encoded_pem};
    use proptest::prelude::*;

    proptest! {
        /// Any bytes, as DER or as Envoy's PEM: an answer, never a panic.
        #[test]
        fn any_input_is_answered(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = check_der(&bytes);
            let _ = check_pem(&bytes);
            let _ = check_pem(url_encoded_pem(&bytes).as_bytes());
        }

        /// Any tag and contents in a subject: taken exactly when the tag is a string type Go
        /// reads and the contents valid for it, and the refusal says which.
        #[test]
        fn any_string_type_is_judged(tag in any::<u8>(), contents in proptest::collection::vec(any::<u8>(), 0..40)) {
            // The tag's own encoding must stay one byte: the high-tag-number form is its own case.
            prop_assume!(tag & 0x1f != 0x1f);
            let der = certificate_der(&[(CN, 12, b"ca")], &[(CN, tag, &contents)]);
            let expected = go_reads(tag, &contents);
            match check_der(&der) {
                Ok(()) => prop_assert_eq!(expected, Some(true)),
                Err(Refusal::InvalidString { tag: t, .. }) => prop_assert_eq!((t, expected), (tag, Some(false))),
                Err(Refusal::UnsupportedStringType { tag: t, .. }) => prop_assert_eq!((t, expected), (tag, None)),
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        }
    }
}
