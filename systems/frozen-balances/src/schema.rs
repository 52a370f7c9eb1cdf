//! The tables of SPEC §8 (withdrawals and network deposits included) and the seeded rows
//! of a template database.
//!
//! Names are a contract: cases query them and tamper with them by name. The tables live
//! beside the points ledger's and share no name with them.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::asset::Asset;
use crate::error::FrozenError;

/// The tenant seeded in the template and used when a case names none.
pub const DEFAULT_TENANT: &str = "default";
/// Source of every deposit; `allow_negative`, so per asset its available is minus the
/// total deposited.
pub const SYS_DEPOSIT: &str = "sys-deposit";
/// Receives the fees of both sides of every fill.
pub const SYS_FEE: &str = "sys-fee";
/// Account ids starting with this are system accounts; the public routes refuse them.
pub const SYSTEM_ACCOUNT_PREFIX: &str = "sys-";
/// The two traders seeded in [`DEFAULT_TENANT`].
pub const SEEDED_TRADERS: [&str; 2] = ["alice", "bob"];

/// Whether `account_id` names a system account.
pub fn is_system_account(account_id: &str) -> bool {
    account_id.starts_with(SYSTEM_ACCOUNT_PREFIX)
}

/// DDL of the four tables and the rounding rule.
///
/// - `balance`: one row per `(tenant_id, account_id, asset)`, minor units; a derived
///   value, equal to the sum of its movements. CHECKs `balance_frozen_non_negative` and
///   `balance_available_non_negative` (unless `allow_negative`).
/// - `balance_operation`: one row per business event, `UNIQUE (tenant_id, business_id)`,
///   with the canonical payload, its fingerprint, the outcome (`PENDING` only inside the
///   registering transaction) and the recorded result (JSON) that a replay returns.
/// - `rounding_rule`: one row, the version of the rule that turns a fill into amounts
///   now in force (1 at install; [`crate::rules`]); `current_rule_version()` reads it.
/// - `balance_movement`: one row per (event, account, asset), linked to its operation by
///   `(tenant_id, business_id)` (no foreign key on purpose: reconciliation must be able
///   to find a movement without an operation), with the rule version in force when it
///   was written (`rule_version`, F24).
/// - `spot_order`: the freeze record — what was frozen (fee reserve included), the filled
///   quantity, the amount consumed by fills, the amount released (price improvement and
///   cancel) and the status. Its remainder is `frozen_amount - consumed - released`.
pub const SCHEMA_SQL: &str = r#"
CREATE TABLE rounding_rule (
    one     boolean PRIMARY KEY DEFAULT true CONSTRAINT rounding_rule_one_row CHECK (one),
    version integer NOT NULL CONSTRAINT rounding_rule_version_check CHECK (version IN (1, 2))
);

INSERT INTO rounding_rule (version) VALUES (1);

CREATE FUNCTION current_rule_version() RETURNS integer LANGUAGE sql STABLE
    AS 'SELECT version FROM rounding_rule';

CREATE TABLE balance (
    tenant_id      text    NOT NULL,
    account_id     text    NOT NULL,
    asset          text    NOT NULL CONSTRAINT balance_asset_check CHECK (asset IN ('USDT', 'BTC', 'ETH')),
    available      bigint  NOT NULL DEFAULT 0,
    frozen         bigint  NOT NULL DEFAULT 0,
    allow_negative boolean NOT NULL DEFAULT false,
    version        bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, account_id, asset),
    CONSTRAINT balance_frozen_non_negative CHECK (frozen >= 0),
    CONSTRAINT balance_available_non_negative CHECK (allow_negative OR available >= 0)
);

CREATE TABLE balance_operation (
    operation_id bigserial   PRIMARY KEY,
    tenant_id    text        NOT NULL,
    business_id  text        NOT NULL,
    kind         text        NOT NULL
        CONSTRAINT balance_operation_kind_check CHECK (kind IN ('PLACE', 'FILL', 'CANCEL', 'DEPOSIT', 'DEPOSIT_REVERSAL', 'WITHDRAW', 'WITHDRAW_SETTLE')),
    payload      text        NOT NULL,
    payload_hash text        NOT NULL,
    outcome      text        NOT NULL
        CONSTRAINT balance_operation_outcome_check
        CHECK (outcome IN ('PENDING', 'OK', 'INSUFFICIENT', 'ORDER_CLOSED')),
    result       jsonb       NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT balance_operation_tenant_business_key UNIQUE (tenant_id, business_id)
);

CREATE TABLE balance_movement (
    movement_id     bigserial PRIMARY KEY,
    tenant_id       text      NOT NULL,
    business_id     text      NOT NULL,
    account_id      text      NOT NULL,
    asset           text      NOT NULL,
    available_delta bigint    NOT NULL,
    frozen_delta    bigint    NOT NULL,
    rule_version    integer   NOT NULL DEFAULT current_rule_version(),
    CONSTRAINT balance_movement_non_zero CHECK (available_delta <> 0 OR frozen_delta <> 0),
    CONSTRAINT balance_movement_event_row_key UNIQUE (tenant_id, business_id, account_id, asset),
    CONSTRAINT balance_movement_balance_fkey FOREIGN KEY (tenant_id, account_id, asset)
        REFERENCES balance (tenant_id, account_id, asset)
);

CREATE INDEX balance_movement_row_idx ON balance_movement (tenant_id, account_id, asset);

CREATE TABLE spot_order (
    order_id          bigserial   PRIMARY KEY,
    tenant_id         text        NOT NULL,
    account_id        text        NOT NULL,
    place_business_id text        NOT NULL,
    market            text        NOT NULL CONSTRAINT spot_order_market_check CHECK (market IN ('BTC-USDT', 'ETH-USDT')),
    side              text        NOT NULL CONSTRAINT spot_order_side_check CHECK (side IN ('BUY', 'SELL')),
    quantity          bigint      NOT NULL CONSTRAINT spot_order_quantity_check CHECK (quantity > 0),
    limit_price       bigint      NOT NULL CONSTRAINT spot_order_limit_price_check CHECK (limit_price > 0),
    frozen_asset      text        NOT NULL,
    frozen_amount     bigint      NOT NULL CONSTRAINT spot_order_frozen_amount_check CHECK (frozen_amount > 0),
    fee_reserve       bigint      NOT NULL CONSTRAINT spot_order_fee_reserve_check CHECK (fee_reserve >= 0),
    filled_quantity   bigint      NOT NULL DEFAULT 0,
    consumed          bigint      NOT NULL DEFAULT 0,
    released          bigint      NOT NULL DEFAULT 0,
    status            text        NOT NULL DEFAULT 'OPEN'
        CONSTRAINT spot_order_status_check CHECK (status IN ('OPEN', 'FILLED', 'CANCELLED')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT spot_order_filled_check CHECK (filled_quantity BETWEEN 0 AND quantity),
    CONSTRAINT spot_order_settled_check CHECK (consumed >= 0 AND released >= 0),
    CONSTRAINT spot_order_frozen_balance_fkey FOREIGN KEY (tenant_id, account_id, frozen_asset)
        REFERENCES balance (tenant_id, account_id, asset)
);

CREATE INDEX spot_order_open_idx ON spot_order (tenant_id, account_id) WHERE status = 'OPEN';
"#;

/// The tables of withdrawals and network deposits ([`crate::withdraw`]), installed with
/// the others by [`install`].
///
/// - `withdrawal`: one row per withdrawal id (its business id), with its status.
/// - `withdrawal_history`: every status the withdrawal took, in order, with a detail.
/// - `withdrawal_outbox`: the pending event the request writes; `processed_at` is set by
///   the settlement.
/// - `chain_deposit`: one row per network transaction reported, its highest
///   confirmations seen and `SEEN | CREDITED | DROPPED | REVERSED` (dropped after its
///   credit, [`crate::reorg`]), with the shortfall of a reversal (what the account had
///   already spent, fronted by `sys-reorg`).
pub const WITHDRAWAL_SCHEMA_SQL: &str = r#"
CREATE TABLE withdrawal (
    tenant_id     text        NOT NULL,
    withdrawal_id text        NOT NULL,
    account_id    text        NOT NULL,
    asset         text        NOT NULL,
    amount        bigint      NOT NULL CONSTRAINT withdrawal_amount_check CHECK (amount > 0),
    destination   text        NOT NULL,
    status        text        NOT NULL
        CONSTRAINT withdrawal_status_check
        CHECK (status IN ('REQUESTED', 'BROADCAST', 'UNKNOWN', 'CONFIRMED', 'FAILED', 'REJECTED')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, withdrawal_id),
    CONSTRAINT withdrawal_balance_fkey FOREIGN KEY (tenant_id, account_id, asset)
        REFERENCES balance (tenant_id, account_id, asset)
);

CREATE TABLE withdrawal_history (
    seq           bigserial   PRIMARY KEY,
    tenant_id     text        NOT NULL,
    withdrawal_id text        NOT NULL,
    status        text        NOT NULL,
    detail        text        NOT NULL,
    at            timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT withdrawal_history_withdrawal_fkey FOREIGN KEY (tenant_id, withdrawal_id)
        REFERENCES withdrawal (tenant_id, withdrawal_id)
);

CREATE TABLE withdrawal_outbox (
    event_id      bigserial   PRIMARY KEY,
    tenant_id     text        NOT NULL,
    withdrawal_id text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    processed_at  timestamptz NULL,
    CONSTRAINT withdrawal_outbox_withdrawal_fkey FOREIGN KEY (tenant_id, withdrawal_id)
        REFERENCES withdrawal (tenant_id, withdrawal_id)
);

CREATE INDEX withdrawal_outbox_pending_idx ON withdrawal_outbox (event_id) WHERE processed_at IS NULL;

CREATE TABLE chain_deposit (
    tenant_id     text    NOT NULL,
    tx_id         text    NOT NULL,
    account_id    text    NOT NULL,
    asset         text    NOT NULL,
    amount        bigint  NOT NULL CONSTRAINT chain_deposit_amount_check CHECK (amount > 0),
    confirmations integer NOT NULL CONSTRAINT chain_deposit_confirmations_check CHECK (confirmations >= 0),
    status        text    NOT NULL
        CONSTRAINT chain_deposit_status_check CHECK (status IN ('SEEN', 'CREDITED', 'DROPPED', 'REVERSED')),
    shortfall     bigint  NOT NULL DEFAULT 0 CONSTRAINT chain_deposit_shortfall_check CHECK (shortfall >= 0),
    PRIMARY KEY (tenant_id, tx_id)
);
"#;

/// Creates the tables of [`SCHEMA_SQL`] (one implicit transaction: all or none), then
/// those of [`WITHDRAWAL_SCHEMA_SQL`] (another).
///
/// Errors: [`FrozenError::Db`] (42P07 if a table exists).
pub async fn install(client: &Client) -> Result<(), FrozenError> {
    client.batch_execute(SCHEMA_SQL).await?;
    client.batch_execute(WITHDRAWAL_SCHEMA_SQL).await?;
    Ok(())
}

/// Seeds [`DEFAULT_TENANT`]: [`SYS_DEPOSIT`] (`allow_negative`), [`SYS_FEE`] and the
/// [`SEEDED_TRADERS`] alice and bob, each with a row per asset of [`Asset::SEEDED`] at 0 available, 0 frozen.
/// Other tenants and accounts are created on demand by the events (see
/// [`crate::events`]). One INSERT.
///
/// Errors: [`FrozenError::Db`] (23505 if seeded twice).
pub async fn seed(client: &Client) -> Result<(), FrozenError> {
    let mut accounts = vec![(SYS_DEPOSIT, true), (SYS_FEE, false)];
    accounts.extend(SEEDED_TRADERS.iter().map(|name| (*name, false)));
    let mut ids = Vec::new();
    let mut assets = Vec::new();
    let mut negative = Vec::new();
    for (account, allow_negative) in accounts {
        for asset in Asset::SEEDED {
            ids.push(account.to_owned());
            assets.push(asset.as_str().to_owned());
            negative.push(allow_negative);
        }
    }
    client
        .execute_typed(
            "INSERT INTO balance (tenant_id, account_id, asset, allow_negative) \
             SELECT $1, a, s, n FROM unnest($2::text[], $3::text[], $4::boolean[]) AS t(a, s, n)",
            &[
                (&DEFAULT_TENANT, Type::TEXT),
                (&ids, Type::TEXT_ARRAY),
                (&assets, Type::TEXT_ARRAY),
                (&negative, Type::BOOL_ARRAY),
            ],
        )
        .await?;
    Ok(())
}

/// [`install`] then [`seed`]: what a template database needs.
///
/// Errors: as those two.
pub async fn install_and_seed(client: &Client) -> Result<(), FrozenError> {
    install(client).await?;
    seed(client).await
}
