//! Striping the redemption sink over K sub-accounts, a fix for the hot row.
//!
//! Every debit credits the one `sys-redeem` row, so every debit in the system takes that
//! row's lock and holds it until COMMIT, including the commit's WAL flush: a global
//! serialization point. With striping, a debit credits `sys-redeem-NN`, chosen from the
//! debited account by a stable hash, so debits of different accounts mostly lock
//! different rows. The invariants are unchanged: each stripe is an ordinary account with
//! entries, the sum of all balances stays 0, and the total redeemed is the sum over
//! `sys-redeem` and its stripes ([`total_redeemed`]). The choice is a pure function of the
//! account, so a retry carries the same `to` and the same fingerprint.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::LedgerError;
use crate::schema::SYS_REDEEM;
use crate::transfer::TransferRequest;

/// Most stripes supported (two-digit suffix).
pub const MAX_REDEEM_STRIPES: u32 = 100;

/// The id of stripe `index` (0-based): `sys-redeem-00` … `sys-redeem-99`.
pub fn redeem_stripe(index: u32) -> String {
    format!("{SYS_REDEEM}-{index:02}")
}

/// The redemption account a debit of `account` credits: [`SYS_REDEEM`] when `stripes` is
/// 0 or 1, else stripe `h(account) mod stripes`, where h is the first 4 bytes of the
/// SHA-256 of the account id (stable across processes and versions).
pub fn redeem_account_for(account: &str, stripes: u32) -> String {
    if stripes <= 1 {
        return SYS_REDEEM.to_owned();
    }
    let digest = Sha256::digest(account.as_bytes());
    let h = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    redeem_stripe(h % stripes.min(MAX_REDEEM_STRIPES))
}

/// The index of redemption stripe `account` (`sys-redeem-07` → 7), `None` for any other
/// account (the plain `sys-redeem` among them).
pub fn stripe_index(account: &str) -> Option<u32> {
    let digits = account.strip_prefix(SYS_REDEEM)?.strip_prefix('-')?;
    if digits.len() != 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A DEBIT request of `amount` points from `account` to its redemption stripe.
pub fn striped_debit(
    client_id: impl Into<String>,
    idem_key: impl Into<String>,
    account: &str,
    amount: i64,
    stripes: u32,
) -> TransferRequest {
    TransferRequest::debit_into(
        client_id,
        idem_key,
        account,
        redeem_account_for(account, stripes),
        amount,
    )
}

/// Creates the stripe accounts `sys-redeem-00` … (balance 0; existing ones are kept).
///
/// Errors: [`LedgerError::Db`].
pub async fn create_redeem_stripes(client: &Client, stripes: u32) -> Result<(), LedgerError> {
    let ids: Vec<String> = (0..stripes.min(MAX_REDEEM_STRIPES))
        .map(redeem_stripe)
        .collect();
    client
        .execute_typed(
            "INSERT INTO account (account_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            &[(&ids, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(())
}

/// Points redeemed in total: the balance of `sys-redeem` plus all its stripes.
///
/// Errors: [`LedgerError::Db`].
pub async fn total_redeemed(client: &Client) -> Result<i64, LedgerError> {
    let row = client
        .query_one(
            "SELECT COALESCE(SUM(balance), 0)::bigint FROM account \
             WHERE account_id = $1 OR account_id LIKE $1 || '-__'",
            &[&SYS_REDEEM],
        )
        .await?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stripe_is_the_plain_sink() {
        assert_eq!(redeem_account_for("acct-0001", 0), "sys-redeem");
        assert_eq!(redeem_account_for("acct-0001", 1), "sys-redeem");
    }

    #[test]
    fn stripes_are_stable_and_spread() {
        let first = redeem_account_for("acct-0001", 16);
        assert_eq!(first, redeem_account_for("acct-0001", 16));
        assert!(first.starts_with("sys-redeem-"));
        let used: std::collections::BTreeSet<String> = (0..1000)
            .map(|n| redeem_account_for(&format!("bench-{n:04}"), 16))
            .collect();
        assert_eq!(used.len(), 16, "1000 accounts reach every stripe");
    }

    #[test]
    fn a_stripe_tells_its_index() {
        assert_eq!(stripe_index(&redeem_stripe(7)), Some(7));
        assert_eq!(stripe_index(&redeem_stripe(99)), Some(99));
        for other in [
            "sys-redeem",
            "sys-redeem-",
            "sys-redeem-7",
            "sys-redeem-1x",
            "acct-0001",
        ] {
            assert_eq!(stripe_index(other), None, "{other}");
        }
    }

    #[test]
    fn striped_debit_keeps_the_fingerprint_stable() {
        let a = striped_debit("c", "k", "acct-0002", 7, 8);
        let b = striped_debit("c", "k", "acct-0002", 7, 8);
        assert_eq!(a.request_hash(), b.request_hash());
        assert_eq!(a.to, redeem_account_for("acct-0002", 8));
    }
}
