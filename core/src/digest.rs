//! The short names the table gives content: its generation (a content hash) and hashed set
//! names, as the builder writes them and the seal checks them.

use sha2::{Digest, Sha512};

/// Hex characters of SHA-512 kept for the generation and for hashed set names.
pub const SHORT_HASH: usize = 16;

/// Upper-case hex, like the discovery ETag, cut to [`SHORT_HASH`] characters.
pub fn short_hash(bytes: &[u8]) -> String {
    hex_prefix(&Sha512::digest(bytes))
}

/// The first [`SHORT_HASH`] hex characters of a finished SHA-512 `digest`.
pub fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(SHORT_HASH / 2).map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn the_short_hash_is_the_first_hex_of_sha512() {
        // SHA-512("abc") begins DDAF35A193617ABA.
        assert_eq!(short_hash(b"abc"), "DDAF35A193617ABA");
        assert_eq!(hex_prefix(&Sha512::digest(b"abc")), short_hash(b"abc"));
    }
}
