//! What kube-apiserver's reading of a client certificate refuses that Envoy's does not.
//!
//! Envoy (BoringSSL) verifies the chain and renders the subject, converting every string type it
//! knows to UTF-8, so a CN of `admin` reads the same as a UTF8String, a PrintableString or a
//! UniversalString. kube-apiserver's TLS server parses every client certificate with Go's
//! `crypto/x509`, and its x509 authenticator verifies it for client authentication. Go refuses
//! the whole certificate for what BoringSSL lets through: an attribute of its issuer or subject
//! name of a string type it does not read or not valid for its type (`parseName`,
//! `parseASN1String`), a negative or badly encoded serial number, a version past 3, inner and
//! outer signature algorithms that differ, duplicate extensions, a critical flag that is not DER,
//! subject alternative names of the wrong syntax (an IP address of 5 bytes, a DNS name or e-mail
//! address not ASCII, a URI its URL parser refuses), key usage, basic constraints, extended key
//! usage and key identifiers that do not parse, a handshake message past 256 KiB; and its
//! verification refuses an unknown critical extension and an extended key usage without client
//! authentication. skewgate must not take an identity from a certificate the apiserver would
//! refuse, so the filter reads the certificate from its DER as Go does (Go's own verdicts:
//! testdata/x509-names, testdata/x509-certificates).

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
    /// Go's parser or its verification for client authentication refuses it, for this reason.
    Go(&'static str),
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
            Refusal::Go(reason) => write!(f, "kube-apiserver's x509 parser or verification refuses it: {reason}"),
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
const BOOLEAN: u8 = 0x01;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OBJECT_IDENTIFIER: u8 = 0x06;
const VERSION: u8 = 0xa0;
const ISSUER_UNIQUE_ID: u8 = 0x81;
const SUBJECT_UNIQUE_ID: u8 = 0x82;
const EXTENSIONS: u8 = 0xa3;

/// Go's TLS reads a certificate handshake message of at most 256 KiB (`maxHandshakeCertificateMsg`);
/// the message carries the certificate list's length, each certificate's length and, in TLS
/// 1.3, its extensions' and the request context's: a leaf this close to the limit is refused
/// at the handshake, whatever else the client sends with it.
pub const MAX_CERTIFICATE_DER: usize = 262_144 - 16;

/// id-ce (2.5.29) extensions Go's `processExtensions` reads, by their last arc, and the
/// authority information access extension (1.3.6.1.5.5.7.1.1): any other one marked critical
/// fails its verification (`UnhandledCriticalExtension`).
const SUBJECT_KEY_ID: u8 = 14;
const KEY_USAGE: u8 = 15;
const SUBJECT_ALT_NAME: u8 = 17;
const BASIC_CONSTRAINTS: u8 = 19;
const NAME_CONSTRAINTS: u8 = 30;
const CRL_DISTRIBUTION_POINTS: u8 = 31;
const CERTIFICATE_POLICIES: u8 = 32;
const AUTHORITY_KEY_ID: u8 = 35;
const EXT_KEY_USAGE: u8 = 37;
const AUTHORITY_INFO_ACCESS: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x01];
/// Extended key usages that allow client authentication: id-kp-clientAuth, anyExtendedKeyUsage.
const CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];
const ANY_EXTENDED_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25, 0x00];

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

/// Checks a DER certificate as Go's `x509.ParseCertificate` (kube-apiserver's TLS server) and its
/// verification for client authentication (kube-apiserver's x509 authenticator) would, for what
/// BoringSSL does not check.
pub fn check_der(der: &[u8]) -> Result<(), Refusal> {
    if der.len() > MAX_CERTIFICATE_DER {
        return Err(Refusal::Go("the TLS handshake message that carries it is over 256 KiB"));
    }
    let (certificate, _) = read(der, SEQUENCE)?;
    let (mut tbs, rest) = read(certificate, SEQUENCE)?;
    let outer_algorithm = element(rest)?.whole;
    let mut version = 1;
    if tbs.first() == Some(&VERSION) {
        let (explicit, rest) = read(tbs, VERSION)?;
        let (number, _) = read(explicit, INTEGER)?;
        version = match integer(number) {
            Some(Sign::Positive(&[n])) if n <= 2 => n + 1,
            Some(Sign::Zero) => 1,
            Some(Sign::Negative) | None => return Err(Refusal::Go("x509: malformed version")),
            Some(Sign::Positive(_)) => return Err(Refusal::Go("x509: invalid version")),
        };
        tbs = rest;
    }
    let (serial, rest) = read(tbs, INTEGER)?;
    match integer(serial) {
        None => return Err(Refusal::Go("x509: malformed serial number")),
        Some(Sign::Negative) => return Err(Refusal::Go("x509: negative serial number")),
        Some(_) => {}
    }
    let Element { whole: algorithm, rest, .. } = element(rest)?;
    if algorithm != outer_algorithm {
        return Err(Refusal::Go("x509: inner and outer signature algorithm identifiers don't match"));
    }
    let (issuer, rest) = read(rest, SEQUENCE)?;
    let (_validity, rest) = read(rest, SEQUENCE)?;
    let (subject, rest) = read(rest, SEQUENCE)?;
    check_name(issuer, Name::Issuer)?;
    check_name(subject, Name::Subject)?;
    let (_key, mut rest) = read(rest, SEQUENCE)?;
    if version > 1 {
        for optional in [ISSUER_UNIQUE_ID, SUBJECT_UNIQUE_ID] {
            if rest.first() == Some(&optional) {
                rest = read(rest, optional)?.1;
            }
        }
    }
    if version == 3 && rest.first() == Some(&EXTENSIONS) {
        let (explicit, _) = read(rest, EXTENSIONS)?;
        let (extensions, _) =
            read(explicit, SEQUENCE).map_err(|_| Refusal::Go("x509: malformed extensions"))?;
        check_extensions(extensions)?;
    }
    Ok(())
}

/// An INTEGER's sign, as Go's cryptobyte reads one: `None` when it is empty or not minimally
/// encoded; a positive one's contents.
enum Sign<'a> {
    Negative,
    Zero,
    Positive(&'a [u8]),
}

fn integer(contents: &[u8]) -> Option<Sign<'_>> {
    match contents {
        [] => None,
        [0, next, ..] if next & 0x80 == 0 => None,
        [0xff, next, ..] if next & 0x80 != 0 => None,
        [first, ..] if first & 0x80 != 0 => Some(Sign::Negative),
        [0] => Some(Sign::Zero),
        [0, rest @ ..] => Some(Sign::Positive(rest)),
        _ => Some(Sign::Positive(contents)),
    }
}

/// Go's reading of an OBJECT IDENTIFIER's contents: base-128 arcs, minimal, each below 2^31.
fn valid_oid(contents: &[u8]) -> bool {
    let below_2_31 = |arc: &[u8]| {
        arc.iter()
            .try_fold(0u64, |n, b| Some((n << 7) | u64::from(b & 0x7f)).filter(|n| *n < 1 << 31))
            .is_some()
    };
    contents.last().is_some_and(|b| b & 0x80 == 0)
        && contents
            .split_inclusive(|b| b & 0x80 == 0)
            .all(|arc| arc.first() != Some(&0x80) && below_2_31(arc))
}

/// The extensions, as Go's `parseExtension` and `processExtensions` read them, and what its
/// verification for client authentication asks of them.
fn check_extensions(mut extensions: &[u8]) -> Result<(), Refusal> {
    let mut seen: Vec<&[u8]> = Vec::new();
    while !extensions.is_empty() {
        let (extension, rest) =
            read(extensions, SEQUENCE).map_err(|_| Refusal::Go("x509: malformed extension"))?;
        extensions = rest;
        let (oid, rest) = read(extension, OBJECT_IDENTIFIER)
            .map_err(|_| Refusal::Go("x509: malformed extension OID field"))?;
        if !valid_oid(oid) {
            return Err(Refusal::Go("x509: malformed extension OID field"));
        }
        let (critical, rest) = match rest.first() {
            Some(&BOOLEAN) => match read(rest, BOOLEAN) {
                Ok(([0x00], rest)) => (false, rest),
                Ok(([0xff], rest)) => (true, rest),
                _ => return Err(Refusal::Go("x509: malformed extension critical field")),
            },
            _ => (false, rest),
        };
        let (value, _) =
            read(rest, OCTET_STRING).map_err(|_| Refusal::Go("x509: malformed extension value field"))?;
        if seen.contains(&oid) {
            return Err(Refusal::Go("x509: certificate contains duplicate extensions"));
        }
        seen.push(oid);
        let handled = match oid {
            [0x55, 0x1d, arc] => check_id_ce(*arc, value)?,
            _ => oid == AUTHORITY_INFO_ACCESS,
        };
        if critical && !handled {
            return Err(Refusal::Go("x509: unhandled critical extension"));
        }
    }
    Ok(())
}

/// An id-ce extension's value; whether Go handles it (else, critical, it fails verification).
fn check_id_ce(arc: u8, value: &[u8]) -> Result<bool, Refusal> {
    let whole = |tag: u8, reason: &'static str| match read(value, tag) {
        Ok((contents, [])) => Ok(contents),
        _ => Err(Refusal::Go(reason)),
    };
    match arc {
        KEY_USAGE => {
            let bits = whole(BIT_STRING, "x509: invalid key usage")?;
            if !valid_bit_string(bits) {
                return Err(Refusal::Go("x509: invalid key usage"));
            }
        }
        BASIC_CONSTRAINTS => {
            let mut fields = whole(SEQUENCE, "x509: invalid basic constraints")?;
            if fields.first() == Some(&BOOLEAN) {
                match read(fields, BOOLEAN) {
                    Ok(([0x00 | 0xff], rest)) => fields = rest,
                    _ => return Err(Refusal::Go("x509: invalid basic constraints")),
                }
            }
            if fields.first() == Some(&INTEGER) {
                let (length, _) = read(fields, INTEGER)?;
                if !matches!(
                    integer(length),
                    Some(Sign::Zero | Sign::Positive([_] | [_, _] | [_, _, _] | [_, _, _, _]))
                ) {
                    return Err(Refusal::Go("x509: invalid basic constraints"));
                }
            }
        }
        SUBJECT_ALT_NAME => {
            return check_alt_names(whole(SEQUENCE, "x509: invalid subject alternative names")?);
        }
        EXT_KEY_USAGE => {
            let mut usages = whole(SEQUENCE, "x509: invalid extended key usages")?;
            let mut client = usages.is_empty();
            while !usages.is_empty() {
                let (oid, rest) = read(usages, OBJECT_IDENTIFIER)
                    .map_err(|_| Refusal::Go("x509: invalid extended key usages"))?;
                if !valid_oid(oid) {
                    return Err(Refusal::Go("x509: invalid extended key usages"));
                }
                client |= oid == CLIENT_AUTH || oid == ANY_EXTENDED_KEY_USAGE;
                usages = rest;
            }
            if !client {
                return Err(Refusal::Go(
                    "x509: certificate specifies an incompatible key usage (no client authentication)",
                ));
            }
        }
        SUBJECT_KEY_ID => {
            whole(OCTET_STRING, "x509: invalid subject key identifier")?;
        }
        AUTHORITY_KEY_ID => {
            whole(SEQUENCE, "x509: invalid authority key identifier")?;
        }
        NAME_CONSTRAINTS | CRL_DISTRIBUTION_POINTS | CERTIFICATE_POLICIES => {}
        _ => return Ok(false),
    }
    Ok(true)
}

/// A BIT STRING's contents as Go's cryptobyte takes them: the count of unused bits (0 to 7, 0
/// when empty), and those bits zero.
fn valid_bit_string(bits: &[u8]) -> bool {
    match bits {
        [unused, rest @ ..] => {
            *unused <= 7
                && (!rest.is_empty() || *unused == 0)
                && rest.last().is_none_or(|last| last & ((1u8 << unused) - 1) == 0)
        }
        [] => false,
    }
}

/// The subject alternative names, as Go's `parseSANExtension` reads them; whether one of the
/// kinds Go keeps was there (a critical extension with none is unhandled).
fn check_alt_names(mut names: &[u8]) -> Result<bool, Refusal> {
    let mut kept = false;
    while !names.is_empty() {
        let Element { tag, contents, rest, .. } =
            element(names).map_err(|_| Refusal::Go("x509: invalid subject alternative name"))?;
        names = rest;
        let ascii = contents.is_ascii();
        match tag {
            0x81 if !ascii => return Err(Refusal::Go("x509: SAN rfc822Name is malformed")),
            0x82 if !ascii => return Err(Refusal::Go("x509: SAN dNSName is malformed")),
            0x86 if !ascii => return Err(Refusal::Go("x509: SAN uniformResourceIdentifier is malformed")),
            0x86 if !go_parses_uri(contents) => return Err(Refusal::Go("x509: cannot parse URI")),
            0x87 if contents.len() != 4 && contents.len() != 16 => {
                return Err(Refusal::Go("x509: cannot parse IP address"));
            }
            0x81 | 0x82 | 0x86 | 0x87 => kept = true,
            _ => {}
        }
    }
    Ok(kept)
}

/// Whether Go's `url.Parse` takes an ASCII URI, and its host is a domain Go's x509 takes
/// (`domainToReverseLabels`): no control character, escapes of two hex digits, a scheme of
/// letters, digits, `+`, `-` and `.` before its first colon if that colon comes before any `/`,
/// a bracketed host closed, a port of digits, labels that are neither empty nor outside `!`..`~`.
fn go_parses_uri(uri: &[u8]) -> bool {
    if uri.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return false;
    }
    let mut escapes = uri.split(|&b| b == b'%').skip(1);
    if escapes.any(|after| after.len() < 2 || !after[..2].iter().all(u8::is_ascii_hexdigit)) {
        return false;
    }
    let end_of_first_segment =
        uri.iter().position(|&b| b == b'/' || b == b'?' || b == b'#').unwrap_or(uri.len());
    let rest = match uri[..end_of_first_segment].iter().position(|&b| b == b':') {
        Some(colon) => {
            let scheme = &uri[..colon];
            let valid = scheme.first().is_some_and(u8::is_ascii_alphabetic)
                && scheme.iter().all(|&b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
            if !valid {
                return false;
            }
            &uri[colon + 1..]
        }
        None => uri,
    };
    let Some(authority) = rest.strip_prefix(b"//") else { return true };
    let end = authority.iter().position(|&b| b == b'/' || b == b'?' || b == b'#').unwrap_or(authority.len());
    let authority = &authority[..end];
    let host = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    let port = if host.first() == Some(&b'[') {
        let Some(close) = host.iter().position(|&b| b == b']') else { return false };
        &host[close + 1..]
    } else {
        host.iter().rposition(|&b| b == b':').map_or(&[][..], |colon| &host[colon..])
    };
    match port {
        [] => {}
        [b':', digits @ ..] if digits.iter().all(u8::is_ascii_digit) => {}
        _ => return false,
    }
    host.is_empty()
        || (!host.ends_with(b".")
            && host
                .split(|&b| b == b'.')
                .all(|label| !label.is_empty() && label.iter().all(|&c| (33..=126).contains(&c))))
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

/// One element read off the front of some DER.
struct Element<'a> {
    tag: u8,
    /// Its whole encoding: tag, length and contents.
    whole: &'a [u8],
    contents: &'a [u8],
    /// What follows it.
    rest: &'a [u8],
}

fn element(input: &[u8]) -> Result<Element<'_>, Refusal> {
    let (tag, contents, rest) = read_any(input)?;
    Ok(Element { tag, whole: &input[..input.len() - rest.len()], contents, rest })
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

    /// Go 1.26's own verdicts on whole client certificates (testdata/x509-certificates/
    /// generate.go: a TLS handshake with Go's server asking for a client certificate, then the
    /// x509 authenticator's verification): each differs from a good one in one way, and the
    /// edge takes exactly those Go takes.
    #[test]
    fn certificates_are_judged_as_go_judges_them() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../testdata/x509-certificates/certificates.json")).unwrap();
        let mut judged = 0;
        for v in fixture["verdicts"].as_array().unwrap() {
            let Some(pem) = v["certificate"].as_str() else {
                // Described only: the largest. One of its length is refused, one just under taken.
                let length = usize::try_from(v["length"].as_u64().unwrap()).unwrap();
                assert!(length > MAX_CERTIFICATE_DER && !v["accepted"].as_bool().unwrap(), "{v}");
                continue;
            };
            let ours = check_pem(pem.replace('\n', "%0A").as_bytes());
            let go = v["accepted"].as_bool().unwrap();
            assert_eq!(
                ours.is_ok(),
                go,
                "{}: ours {ours:?}, Go's {} {}",
                v["name"],
                v["handshake"],
                v["verify"]
            );
            judged += 1;
        }
        assert_eq!(judged, 36);
        assert_eq!(
            check_der(&vec![0x30; MAX_CERTIFICATE_DER + 1]),
            Err(Refusal::Go("the TLS handshake message that carries it is over 256 KiB"))
        );
    }

    #[test]
    fn uris_are_read_as_gos_url_parser_reads_them() {
        for good in [
            "spiffe://cluster/ns/default/sa/x",
            "https://a.example:443/p?q#f",
            "urn:x:y",
            "mailto:a@b",
            "https://[::1]:8443/",
            "/relative",
            "a%20b",
        ] {
            assert!(go_parses_uri(good.as_bytes()), "{good}");
        }
        for bad in [
            "http://[::1",
            "https://a..b/",
            "https://a.example./",
            "http://h:port/",
            "1http://x",
            "a%2",
            "%zz",
            "a\tb",
            "https://a b/",
        ] {
            assert!(!go_parses_uri(bad.as_bytes()), "{bad}");
        }
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
