//! The request fingerprint stored with every idempotency registration (SPEC §3).
//!
//! A retry must carry the same key *and* the same payload; the fingerprint is how a stored
//! registration is compared with a new request under the same key (the IETF draft
//! draft-ietf-httpapi-idempotency-key-header calls reuse of a key with a different payload
//! an error). Only the business payload goes in: no timestamps or client nonces, or a
//! legitimate retry would look like a different request.

use sha2::{Digest, Sha256};

use crate::vocabulary::Kind;

/// Number of leading SHA-256 bytes kept in a fingerprint.
pub const REQUEST_HASH_BYTES: usize = 16;

/// Fingerprint of a transfer: SHA-256 of the UTF-8 text `KIND|from|to|amount` (kind as
/// `DEBIT`/`GRANT`, amount in points as a decimal integer), truncated to the first
/// [`REQUEST_HASH_BYTES`] (16) bytes, as lower-case hex (32 characters).
///
/// Example: `request_hash(Kind::Debit, "acct-0001", "sys-redeem", 300)` hashes
/// `DEBIT|acct-0001|sys-redeem|300`.
pub fn request_hash(kind: Kind, from: &str, to: &str, amount: i64) -> String {
    let text = format!("{}|{from}|{to}|{amount}", kind.as_str());
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(REQUEST_HASH_BYTES * 2);
    for byte in &digest[..REQUEST_HASH_BYTES] {
        hex.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(HEX_DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    /// Known vector: `printf 'DEBIT|acct-0001|sys-redeem|300' | sha256sum` gives
    /// `71ee59fc88147037d30c4e785127a745c5a380aeff321941d50297bdf92ce238`; the first 32 hex
    /// characters are the fingerprint.
    #[test]
    fn known_vector() {
        assert_eq!(
            request_hash(Kind::Debit, "acct-0001", "sys-redeem", 300),
            "71ee59fc88147037d30c4e785127a745"
        );
    }

    #[test]
    fn shape_is_32_lower_hex() {
        let h = request_hash(Kind::Grant, "sys-issuer", "acct-0002", 1);
        assert_eq!(h.len(), 32);
        assert!(
            h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn every_field_changes_it() {
        let base = request_hash(Kind::Debit, "acct-0001", "sys-redeem", 300);
        assert_eq!(
            base,
            request_hash(Kind::Debit, "acct-0001", "sys-redeem", 300)
        );
        assert_ne!(
            base,
            request_hash(Kind::Debit, "acct-0001", "sys-redeem", 301)
        );
        assert_ne!(
            base,
            request_hash(Kind::Grant, "acct-0001", "sys-redeem", 300)
        );
        assert_ne!(
            base,
            request_hash(Kind::Debit, "acct-0002", "sys-redeem", 300)
        );
        assert_ne!(
            base,
            request_hash(Kind::Debit, "acct-0001", "sys-issuer", 300)
        );
    }
}
