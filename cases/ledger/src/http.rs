//! The ledger's calls on a running `ledger-svc` (SPEC §4), and what a case reads from
//! its replies.

use std::time::Duration;

use launch::service::{CLIENT_TIMEOUT_MS, Reply, Service};
use reqwest::header::CONTENT_TYPE;

/// The ledger's routes on [`Service`].
pub trait LedgerCalls {
    /// `POST /accounts/{account}/debits` (form body `amount=N`) as `client_id` with
    /// `key`, timing out after `timeout`.
    ///
    /// Errors: the transport's error (`is_timeout()` for a timeout; a connection closed
    /// without a response is another error).
    fn debit(
        &self,
        client_id: &str,
        key: &str,
        account: &str,
        amount: i64,
        timeout: Duration,
    ) -> impl Future<Output = Result<Reply, reqwest::Error>> + Send;

    /// [`LedgerCalls::debit`] with [`CLIENT_TIMEOUT_MS`].
    ///
    /// Errors: as [`LedgerCalls::debit`].
    fn debit_once(
        &self,
        client_id: &str,
        key: &str,
        account: &str,
        amount: i64,
    ) -> impl Future<Output = Result<Reply, reqwest::Error>> + Send {
        let timeout = Duration::from_millis(CLIENT_TIMEOUT_MS);
        self.debit(client_id, key, account, amount, timeout)
    }

    /// `POST /accounts/{account}/grants` on the admin listener (JSON body).
    ///
    /// Errors: transport errors, or a status other than 201.
    fn grant(
        &self,
        client_id: &str,
        key: &str,
        account: &str,
        amount: i64,
    ) -> impl Future<Output = anyhow::Result<Reply>> + Send;
}

impl LedgerCalls for Service {
    async fn debit(
        &self,
        client_id: &str,
        key: &str,
        account: &str,
        amount: i64,
        timeout: Duration,
    ) -> Result<Reply, reqwest::Error> {
        let request = self
            .http()
            .post(self.public_url(&format!("/accounts/{account}/debits")))
            .header("x-client-id", client_id)
            .header("idempotency-key", key)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(format!("amount={amount}"))
            .timeout(timeout);
        self.send(request).await
    }

    async fn grant(
        &self,
        client_id: &str,
        key: &str,
        account: &str,
        amount: i64,
    ) -> anyhow::Result<Reply> {
        let request = self
            .http()
            .post(self.admin_url(&format!("/accounts/{account}/grants")))
            .header("x-client-id", client_id)
            .header("idempotency-key", key)
            .header(CONTENT_TYPE, "application/json")
            .body(serde_json::json!({ "amount": amount }).to_string());
        let reply = self.send(request).await?;
        anyhow::ensure!(
            reply.status == 201,
            "grant of {amount} to {account} answered {}",
            reply.summary()
        );
        Ok(reply)
    }
}

/// What a case reads from a ledger reply.
pub trait LedgerReply {
    /// The body's `txn_id` member.
    fn txn_id(&self) -> Option<i64>;
    /// The body's `balance` member, points.
    fn balance(&self) -> Option<i64>;
    /// The body's `balance` as text, `none` when absent (for checks that compare text).
    fn balance_text(&self) -> String;
    /// `<status> <outcome> balance=<N> replayed=<bool>`: the stable part of a reply, for
    /// transcripts (no txn id).
    fn summary(&self) -> String;
}

impl LedgerReply for Reply {
    fn txn_id(&self) -> Option<i64> {
        self.integer("txn_id")
    }

    fn balance(&self) -> Option<i64> {
        self.integer("balance")
    }

    fn balance_text(&self) -> String {
        self.balance()
            .map_or_else(|| "none".to_string(), |b| b.to_string())
    }

    fn summary(&self) -> String {
        format!(
            "{} {} balance={} replayed={}",
            self.status,
            self.outcome(),
            self.balance_text(),
            self.replayed
        )
    }
}
