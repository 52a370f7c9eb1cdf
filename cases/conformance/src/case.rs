//! What a case of family C works with ([`Run`]: the target, the client, the run's id and
//! seed) and how the catalogue describes it ([`CaseDef`], [`Needs`]).

use std::sync::Arc;

use launch::proxy::{Proxy, ProxyOptions};

use crate::target::Target;

/// What a case works with.
pub struct Run {
    /// The target.
    pub target: Arc<Target>,
    /// The suite's HTTP client.
    pub http: reqwest::Client,
    /// Unique per run: every key the cases send starts with `cf-<run_id>-`.
    pub run_id: String,
    /// The seed of C8's workload.
    pub seed: u64,
}

impl Run {
    /// A fresh proxy in front of the target (counters at zero, no retries of its own).
    ///
    /// Errors: the target's URL has no address; the proxy cannot listen.
    pub async fn proxy(&self) -> Result<Proxy, String> {
        let upstream = self.target.address()?;
        Proxy::start(ProxyOptions {
            upstream,
            upstream_retries: 0,
        })
        .await
        .map_err(|e| format!("starting the proxy: {e:#}"))
    }

    /// The key `cf-<run_id>-<name>`.
    pub fn key(&self, name: &str) -> String {
        format!("cf-{}-{name}", self.run_id)
    }

    /// The target's base URL.
    pub fn url(&self) -> &str {
        &self.target.spec.url
    }
}

/// What a case needs of the target beyond its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Nothing more.
    Url,
    /// A way to kill it and a start command to start it again.
    KillAndRestart,
}

/// One case of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct CaseDef {
    /// `C1` …
    pub id: &'static str,
    /// Title.
    pub title: &'static str,
    /// What it proves.
    pub claim: &'static str,
    /// What makes it fail.
    pub fails: &'static str,
    /// What the target must have been given.
    pub needs: Needs,
}
