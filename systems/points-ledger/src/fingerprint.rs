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
    request_hash_with_order(kind, from, to, amount, None)
}

/// Fingerprint of a transfer that may carry a business reference (a redemption order id,
/// [`crate::TransferRequest::order_id`]): without one, exactly [`request_hash`]'s text, so
/// requests without an order keep their fingerprint; with one, the text
/// `KIND|from|to|amount|order=ORDER_ID`. The amount is a decimal integer, so no text
/// without an order can equal one with an order. Same truncation and hex form.
///
/// Example: `request_hash_with_order(Kind::Debit, "acct-0001", "sys-redeem", 300,
/// Some("ord-1"))` hashes `DEBIT|acct-0001|sys-redeem|300|order=ord-1`.
pub fn request_hash_with_order(
    kind: Kind,
    from: &str,
    to: &str,
    amount: i64,
    order_id: Option<&str>,
) -> String {
    let mut text = format!("{}|{from}|{to}|{amount}", kind.as_str());
    if let Some(order_id) = order_id {
        text.push_str("|order=");
        text.push_str(order_id);
    }
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

    /// `printf 'DEBIT|acct-0001|sys-redeem|300|order=ord-1' | sha256sum`, first 32 hex
    /// characters; without an order the fingerprint is the one of [`known_vector`].
    #[test]
    fn order_id_is_part_of_it_and_absent_means_unchanged() {
        assert_eq!(
            request_hash_with_order(Kind::Debit, "acct-0001", "sys-redeem", 300, None),
            "71ee59fc88147037d30c4e785127a745"
        );
        assert_eq!(
            request_hash_with_order(Kind::Debit, "acct-0001", "sys-redeem", 300, Some("ord-1")),
            "06111c9782555b5d58ec1ceebbf5b532"
        );
        assert_ne!(
            request_hash_with_order(Kind::Debit, "acct-0001", "sys-redeem", 300, Some("ord-1")),
            request_hash_with_order(Kind::Debit, "acct-0001", "sys-redeem", 300, Some("ord-2"))
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
