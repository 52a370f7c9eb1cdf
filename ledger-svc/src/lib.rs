//! `ledger-svc`, the HTTP service of two systems under test: the points ledger
//! (`points-ledger`, SPEC §4) and the frozen balances' spot routes (`frozen-balances`,
//! SPEC §8). The binary (`src/main.rs`) serves them; this library holds what its
//! contract tests read too.
//!
//! - [`route_table`]: every HTTP route of the service, and its OpenAPI document.

pub mod route_table;
