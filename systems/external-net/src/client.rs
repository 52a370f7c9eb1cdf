//! The stand-in's HTTP client (reqwest over loopback, no proxy, a fresh connection per
//! request, so a dropped answer never poisons the next request).

use std::time::Duration;

use anyhow::{Context as _, bail};
use reqwest::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::wire::{
    Action, Broadcast, BroadcastAnswer, ControlRequest, ControlState, DepositState, QueryRecord,
    StatusAnswer, TransferRecord,
};

/// Timeout of the client's requests other than broadcasts, milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;

/// What became of a broadcast, as its sender knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The network accepted it (`new`: this call created the transfer).
    Accepted {
        /// Whether the transfer is new (false: the id was known).
        new: bool,
    },
    /// The network refused it (422).
    Refused,
    /// No answer: a timeout, a connection closed without an answer, or any other
    /// transport error. The transfer may or may not exist on the network.
    Lost(String),
}

/// A client of one stand-in.
#[derive(Debug, Clone)]
pub struct NetClient {
    base: String,
    http: reqwest::Client,
}

impl NetClient {
    /// A client of the stand-in at `base` (`http://127.0.0.1:PORT`).
    ///
    /// Errors: the HTTP client could not be built.
    pub fn new(base: impl Into<String>) -> anyhow::Result<NetClient> {
        Ok(NetClient {
            base: base.into().trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .build()?,
        })
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /transfers`, waiting at most `timeout` for the answer.
    pub async fn broadcast(&self, broadcast: &Broadcast, timeout: Duration) -> Answer {
        let sent = self
            .http
            .post(self.url("/transfers"))
            .timeout(timeout)
            .header(CONTENT_TYPE, "application/json")
            .body(serde_json::to_string(broadcast).unwrap_or_default())
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.is_timeout() => return Answer::Lost("timeout".into()),
            Err(_) => return Answer::Lost("connection closed without an answer".into()),
        };
        let status = response.status().as_u16();
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(_) => return Answer::Lost("answer cut off".into()),
        };
        match status {
            200 => match serde_json::from_slice::<BroadcastAnswer>(&body) {
                Ok(answer) => Answer::Accepted { new: answer.new },
                Err(_) => Answer::Lost("unreadable answer".into()),
            },
            422 => Answer::Refused,
            other => Answer::Lost(format!("status {other}")),
        }
    }

    /// `GET /transfers/{id}`: `CONFIRMED`, `REJECTED` or `NOT_FOUND`.
    ///
    /// Errors: transport errors, another status, an unreadable body.
    pub async fn status(&self, id: &str) -> anyhow::Result<String> {
        let response = self
            .http
            .get(self.url(&format!("/transfers/{id}")))
            .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .send()
            .await?;
        let code = response.status().as_u16();
        if code != 200 && code != 404 {
            bail!("status query of {id} answered {code}");
        }
        let answer: StatusAnswer = serde_json::from_slice(&response.bytes().await?)?;
        Ok(answer.status)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, member: &str) -> anyhow::Result<T> {
        let response = self
            .http
            .get(self.url(path))
            .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .send()
            .await?;
        if response.status() != 200 {
            bail!("GET {path} answered {}", response.status());
        }
        let mut body: Value = serde_json::from_slice(&response.bytes().await?)?;
        let value = if member.is_empty() {
            body
        } else {
            body[member].take()
        };
        serde_json::from_value(value).with_context(|| format!("reading GET {path}"))
    }

    async fn put(&self, path: &str, body: String) -> anyhow::Result<()> {
        let response = self
            .http
            .put(self.url(path))
            .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        if response.status() != 200 {
            bail!("PUT {path} answered {}", response.status());
        }
        Ok(())
    }

    /// `GET /transfers`: the network's log of transfers, in arrival order.
    ///
    /// Errors: transport errors, another status, an unreadable body.
    pub async fn transfers(&self) -> anyhow::Result<Vec<TransferRecord>> {
        self.get("/transfers", "transfers").await
    }

    /// `GET /queries`: the status queries it answered, in order.
    ///
    /// Errors: as [`NetClient::transfers`].
    pub async fn queries(&self) -> anyhow::Result<Vec<QueryRecord>> {
        self.get("/queries", "queries").await
    }

    /// `PUT /control`.
    ///
    /// Errors: transport errors, another status.
    pub async fn control(&self, request: &ControlRequest) -> anyhow::Result<()> {
        self.put("/control", serde_json::to_string(request)?).await
    }

    /// `PUT /control` with `release`: ends every answer a `delay` holds now.
    ///
    /// Errors: transport errors, another status.
    pub async fn release_held(&self) -> anyhow::Result<()> {
        self.control(&ControlRequest {
            action: Action::Release,
            delay_ms: 0,
            count: 1,
        })
        .await
    }

    /// `GET /control`.
    ///
    /// Errors: as [`NetClient::transfers`].
    pub async fn control_state(&self) -> anyhow::Result<ControlState> {
        self.get("/control", "").await
    }

    /// `PUT /deposits/{tx}`.
    ///
    /// Errors: transport errors, another status.
    pub async fn set_deposit(&self, deposit: &DepositState) -> anyhow::Result<()> {
        self.put(
            &format!("/deposits/{}", deposit.tx_id),
            serde_json::to_string(deposit)?,
        )
        .await
    }

    /// `GET /deposits`.
    ///
    /// Errors: as [`NetClient::transfers`].
    pub async fn deposits(&self) -> anyhow::Result<Vec<DepositState>> {
        self.get("/deposits", "deposits").await
    }
}
