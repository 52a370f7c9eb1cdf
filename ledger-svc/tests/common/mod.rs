//! Shared scaffolding of the service's contract tests: the scratch cluster and test
//! databases of the points ledger's own tests (one definition, included from there), a
//! running `ledger-svc` ([`service`]) and its callers' tokens ([`tokens`]).
#![allow(dead_code)]

#[path = "../../../systems/points-ledger/tests/common/mod.rs"]
mod db;
pub mod service;
pub mod tokens;

pub use db::*;
