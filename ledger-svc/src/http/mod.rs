//! The HTTP side of `ledger-svc` (SPEC §4): request grammar, problem bodies, callers'
//! bearer tokens (`auth`), routes,
//! fault injection, and the accept loops with graceful shutdown; `spot` serves the
//! frozen balances of SPEC §8 on the same listeners.

pub mod auth;
pub mod batch;
pub mod bound;
pub mod faults;
pub mod grammar;
pub mod ledger;
pub mod listener;
pub mod log;
pub mod planted;
pub mod problem;
pub mod routes;
pub mod server;
pub mod spot;
pub mod state;
pub mod transfers;

/// A handler's way to close the connection without writing a response: hyper ends an
/// HTTP/1 connection whose service returned an error, and the client sees the
/// connection close before any response (a lost response, SPEC §6 L7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed without a response (fault injection)")
    }
}

impl std::error::Error for CloseConnection {}
