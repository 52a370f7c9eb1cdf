//! The four tables of SPEC §8 in InnoDB, the same names and columns as the PostgreSQL
//! system's (`frozen_balances::schema`), without its withdrawal tables.
//!
//! Differences a reader should know: ids are `VARCHAR(255)` in `utf8mb4` with the binary
//! collation `utf8mb4_bin` (the server's default collation compares case-insensitively,
//! so `Order-1` and `order-1` would be one business id); assets are ASCII so that the
//! movement key `(tenant, business, account, asset)` stays under InnoDB's 3072-byte
//! index limit; `result` is `LONGTEXT` holding JSON; CHECK constraints are enforced
//! (MariaDB ≥ 10.2).

use mysql_async::prelude::Queryable;

use crate::InnoError;

/// DDL of the four tables, one statement per entry.
pub const SCHEMA_SQL: [&str; 4] = [
    "CREATE TABLE balance (
        tenant_id      VARCHAR(255) NOT NULL,
        account_id     VARCHAR(255) NOT NULL,
        asset          VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        available      BIGINT  NOT NULL DEFAULT 0,
        frozen         BIGINT  NOT NULL DEFAULT 0,
        allow_negative BOOLEAN NOT NULL DEFAULT FALSE,
        version        BIGINT  NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant_id, account_id, asset),
        CONSTRAINT balance_asset_check CHECK (asset IN ('USDT', 'BTC', 'ETH')),
        CONSTRAINT balance_frozen_non_negative CHECK (frozen >= 0),
        CONSTRAINT balance_available_non_negative CHECK (allow_negative OR available >= 0)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE balance_operation (
        operation_id BIGINT AUTO_INCREMENT PRIMARY KEY,
        tenant_id    VARCHAR(255) NOT NULL,
        business_id  VARCHAR(255) NOT NULL,
        kind         VARCHAR(16) NOT NULL,
        payload      TEXT NOT NULL,
        payload_hash CHAR(32) NOT NULL,
        outcome      VARCHAR(16) NOT NULL,
        result       LONGTEXT NULL,
        created_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        UNIQUE KEY balance_operation_tenant_business_key (tenant_id, business_id),
        CONSTRAINT balance_operation_outcome_check
            CHECK (outcome IN ('PENDING', 'OK', 'INSUFFICIENT', 'ORDER_CLOSED'))
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE balance_movement (
        movement_id     BIGINT AUTO_INCREMENT PRIMARY KEY,
        tenant_id       VARCHAR(255) NOT NULL,
        business_id     VARCHAR(255) NOT NULL,
        account_id      VARCHAR(255) NOT NULL,
        asset           VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        available_delta BIGINT NOT NULL,
        frozen_delta    BIGINT NOT NULL,
        CONSTRAINT balance_movement_non_zero CHECK (available_delta <> 0 OR frozen_delta <> 0),
        UNIQUE KEY balance_movement_event_row_key (tenant_id, business_id, account_id, asset),
        KEY balance_movement_row_idx (tenant_id, account_id, asset),
        CONSTRAINT balance_movement_balance_fkey FOREIGN KEY (tenant_id, account_id, asset)
            REFERENCES balance (tenant_id, account_id, asset)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE spot_order (
        order_id          BIGINT AUTO_INCREMENT PRIMARY KEY,
        tenant_id         VARCHAR(255) NOT NULL,
        account_id        VARCHAR(255) NOT NULL,
        place_business_id VARCHAR(255) NOT NULL,
        market            VARCHAR(16) NOT NULL,
        side              VARCHAR(4) NOT NULL,
        quantity          BIGINT NOT NULL,
        limit_price       BIGINT NOT NULL,
        frozen_asset      VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        frozen_amount     BIGINT NOT NULL,
        fee_reserve       BIGINT NOT NULL,
        filled_quantity   BIGINT NOT NULL DEFAULT 0,
        consumed          BIGINT NOT NULL DEFAULT 0,
        released          BIGINT NOT NULL DEFAULT 0,
        status            VARCHAR(16) NOT NULL DEFAULT 'OPEN',
        created_at        TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY spot_order_account_idx (tenant_id, account_id),
        CONSTRAINT spot_order_market_check CHECK (market IN ('BTC-USDT', 'ETH-USDT')),
        CONSTRAINT spot_order_side_check CHECK (side IN ('BUY', 'SELL')),
        CONSTRAINT spot_order_status_check CHECK (status IN ('OPEN', 'FILLED', 'CANCELLED')),
        CONSTRAINT spot_order_filled_check CHECK (filled_quantity BETWEEN 0 AND quantity),
        CONSTRAINT spot_order_settled_check CHECK (consumed >= 0 AND released >= 0),
        CONSTRAINT spot_order_frozen_balance_fkey FOREIGN KEY (tenant_id, account_id, frozen_asset)
            REFERENCES balance (tenant_id, account_id, asset)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
];

/// Creates the tables in the connection's database and seeds the default tenant's
/// system accounts at 0 (`sys-deposit` with `allow_negative`, `sys-fee`) for every
/// asset.
///
/// Errors: [`InnoError::Server`] (1050 if installed twice).
pub async fn install(conn: &mut mysql_async::Conn) -> Result<(), InnoError> {
    for ddl in SCHEMA_SQL {
        conn.query_drop(ddl).await?;
    }
    conn.query_drop(
        "INSERT INTO balance (tenant_id, account_id, asset, allow_negative) VALUES
         ('default', 'sys-deposit', 'USDT', TRUE), ('default', 'sys-deposit', 'BTC', TRUE),
         ('default', 'sys-deposit', 'ETH', TRUE), ('default', 'sys-fee', 'USDT', FALSE),
         ('default', 'sys-fee', 'BTC', FALSE), ('default', 'sys-fee', 'ETH', FALSE)",
    )
    .await?;
    Ok(())
}
