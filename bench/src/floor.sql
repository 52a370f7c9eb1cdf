-- The schema's floor (docs/batch.md, "Counted figures"): the rows a batch of debits
-- writes and the locks it takes, with no decision and no check of its own. Per request:
-- its registration as PENDING, its debited account locked (FOR NO KEY UPDATE, as the
-- batch function) and updated once per account, one ledger_txn row with an id drawn from
-- the sequence, two ledger_entry rows, the outcome written into the registration; then
-- each credited account updated once. The schema's own constraints (keys, CHECKs, the
-- entries' references) still act: they are the schema's, not the function's. Only the
-- bench creates it, in its counted databases; it takes the arrays the batch call takes.
CREATE OR REPLACE FUNCTION bench_floor_batch(
    p_client_ids text[], p_idem_keys text[], p_request_hashes text[], p_kinds text[],
    p_froms text[], p_tos text[], p_amounts bigint[], p_order_ids text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
-- Planned as ledger_transfer_batch is: index lookups only, one generic plan per session,
-- no JIT (points_ledger::schema::BATCH_FUNCTION_SQL says why).
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
AS $fn$
DECLARE
    v_n integer := cardinality(p_client_ids);
    v_txn bigint[];
BEGIN
    INSERT INTO idem_request (client_id, idem_key, request_hash, outcome)
    SELECT u.c, u.k, u.h, 'PENDING'
    FROM unnest(p_client_ids, p_idem_keys, p_request_hashes) u(c, k, h);

    PERFORM 1 FROM account a WHERE a.account_id = ANY (p_froms)
    ORDER BY a.account_id FOR NO KEY UPDATE;

    UPDATE account a SET balance = a.balance - d.amount
    FROM (SELECT u.f, sum(u.m)::bigint AS amount FROM unnest(p_froms, p_amounts) u(f, m)
          GROUP BY u.f) d
    WHERE a.account_id = d.f;

    v_txn := ARRAY(SELECT nextval('ledger_txn_txn_id_seq') FROM generate_series(1, v_n));
    INSERT INTO ledger_txn (txn_id, client_id, idem_key, kind, order_id)
    SELECT v_txn[g], p_client_ids[g], p_idem_keys[g], p_kinds[g], p_order_ids[g]
    FROM generate_series(1, v_n) g;
    INSERT INTO ledger_entry (txn_id, account_id, amount)
    SELECT v_txn[g], e.acct, e.amt
    FROM generate_series(1, v_n) g CROSS JOIN LATERAL (VALUES (1, p_froms[g], -p_amounts[g]),
                                                        (2, p_tos[g], p_amounts[g])) e(pos, acct, amt)
    ORDER BY g, e.pos;

    UPDATE idem_request r SET outcome = 'OK', txn_id = u.t, balance_after = 0
    FROM unnest(p_client_ids, p_idem_keys, v_txn) u(c, k, t)
    WHERE r.client_id = u.c AND r.idem_key = u.k;

    UPDATE account a SET balance = a.balance + d.amount
    FROM (SELECT u.t, sum(u.m)::bigint AS amount FROM unnest(p_tos, p_amounts) u(t, m)
          GROUP BY u.t) d
    WHERE a.account_id = d.t;
    RETURN v_n;
END
$fn$;
