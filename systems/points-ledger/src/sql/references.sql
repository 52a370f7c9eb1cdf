-- The entries' references (SPEC §2.2), enforced set-based: one check per statement that
-- writes ledger_entry rows, over all the rows it wrote, instead of a declared foreign
-- key's check per row and key (two per entry, four per debit). It refuses what the
-- declared keys refused, with the same SQLSTATE (23503), constraint name, message and
-- detail; it takes the same row locks (FOR KEY SHARE of every referenced row); and the
-- referenced tables are append-only (no DELETE, no TRUNCATE, no UPDATE writing their key
-- column), which is what a declared key's NO ACTION guarded for the rows it referenced.
-- No SET clauses (unlike the transfer functions): each costs a save and a restore of the
-- setting on every call, 12,000 instructions a debit in the statement mode, and both
-- queries reach the referenced rows by their keys as planned anyway.
CREATE FUNCTION ledger_entry_references() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_txn     bigint;
    v_account text;
BEGIN
    -- Each key the statement wrote, once and in key order: its row locked as a foreign
    -- key's check locks it, or, when there is none, the first such key reported (the
    -- statement refused).
    SELECT d.txn_id INTO v_txn
    FROM (SELECT DISTINCT n.txn_id FROM new_entries n ORDER BY n.txn_id) d
    LEFT JOIN LATERAL (SELECT t.txn_id FROM ledger_txn t WHERE t.txn_id = d.txn_id
                       FOR KEY SHARE OF t) l ON true
    WHERE l.txn_id IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'insert or update on table "ledger_entry" violates foreign key constraint "ledger_entry_txn_id_fkey"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'ledger_entry_txn_id_fkey',
                  TABLE = 'ledger_entry',
                  DETAIL = format('Key (txn_id)=(%s) is not present in table "ledger_txn".', v_txn);
    END IF;
    SELECT d.account_id INTO v_account
    FROM (SELECT DISTINCT n.account_id FROM new_entries n ORDER BY n.account_id) d
    LEFT JOIN LATERAL (SELECT a.account_id FROM account a WHERE a.account_id = d.account_id
                       FOR KEY SHARE OF a) l ON true
    WHERE l.account_id IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'insert or update on table "ledger_entry" violates foreign key constraint "ledger_entry_account_id_fkey"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'ledger_entry_account_id_fkey',
                  TABLE = 'ledger_entry',
                  DETAIL = format('Key (account_id)=(%s) is not present in table "account".', v_account);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER ledger_entry_references_insert AFTER INSERT ON ledger_entry
    REFERENCING NEW TABLE AS new_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entry_references();
CREATE TRIGGER ledger_entry_references_update AFTER UPDATE ON ledger_entry
    REFERENCING NEW TABLE AS new_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entry_references();

-- The guard of a referenced table: TG_ARGV[0] names the reference, TG_ARGV[1] the key.
CREATE FUNCTION ledger_referenced_append_only() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    RAISE EXCEPTION 'update or delete on table "%" violates foreign key constraint "%" on table "ledger_entry"',
            TG_TABLE_NAME, TG_ARGV[0]
        USING ERRCODE = 'foreign_key_violation', CONSTRAINT = TG_ARGV[0], TABLE = TG_TABLE_NAME,
              DETAIL = format('Table "%s" is append-only (%s of it refused): ledger_entry references its %s.',
                              TG_TABLE_NAME, TG_OP, TG_ARGV[1]);
END
$fn$;

CREATE TRIGGER account_append_only BEFORE DELETE OR TRUNCATE OR UPDATE OF account_id ON account
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_referenced_append_only('ledger_entry_account_id_fkey', 'account_id');
CREATE TRIGGER ledger_txn_append_only BEFORE DELETE OR TRUNCATE OR UPDATE OF txn_id ON ledger_txn
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_referenced_append_only('ledger_entry_txn_id_fkey', 'txn_id');
