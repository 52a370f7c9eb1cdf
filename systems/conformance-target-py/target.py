#!/usr/bin/env python3
"""A second, independent implementation of the debit contract (docs/http.md §6.2, §6.3)
for `./run.sh conformance` (docs/conformance.md): Python 3 standard library only
(http.server's ThreadingHTTPServer, sqlite3), its own store, no code shared with
ledger-svc.

    target.py serve --listen 127.0.0.1:PORT --db FILE [--defect NAME ...]
    target.py grant --db FILE ACCOUNT AMOUNT     (creates ACCOUNT if missing, adds AMOUNT)

Routes: GET /healthz, GET /accounts/{id}, POST /accounts/{id}/debits (X-Client-Id,
Idempotency-Key, amount=N or {"amount": N}). Every debit runs under one process-wide
lock, in one SQLite transaction that registers the key, moves the balance, writes the
transaction and records the answer; a replay returns the recorded status and body with
`Idempotent-Replayed: true`; the same key with another amount is 422 `key-reused`.

Known, named defects, each switched on by `--defect` (docs/conformance.md says which C
case is meant to catch each):

- `reexecute-on-retry`: a known key with the same payload is executed again instead of
  replayed;
- `check-then-write`: the balance is read before the lock and written as
  `read - amount` after it (a lost update; 50 ms of "other work" between);
- `key-in-memory`: keys and their answers live only in a dict (gone after a restart);
- `ack-before-commit`: the debit is answered 201 from a write-back cache and committed by
  only when the process is stopped cleanly (SIGTERM or SIGINT): a kill -9 loses every
  answered debit since the start, always, so C6 catches it whatever the timing;
- `ignores-payload`: a known key is replayed whatever amount the request names (no
  fingerprint: the same key with another amount gets the first answer, not 422);
- `key-race`: the key is looked up, then 50 ms later the debit runs without looking
  again (two requests with one key at once both execute);
- `lenient-input`: amounts are parsed leniently (`007`, `1e3`, `-5` taken as numbers, a
  missing amount as 1), a missing key or client id is made up instead of refused.
"""

import argparse
import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFECTS = ("reexecute-on-retry", "check-then-write", "key-in-memory", "ack-before-commit",
           "ignores-payload", "key-race", "lenient-input")
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
CLIENT_RE = re.compile(r"^[\x21-\x7e]{1,64}$")
TOKEN_KEY_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~:/-]{1,255}$")
QUOTED_KEY_RE = re.compile(r'^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\]){1,255})"$')
AMOUNT_RE = re.compile(r"^[1-9][0-9]{0,18}$")
MAX_AMOUNT = 2**63 - 1
MAX_BODY_BYTES = 4096
CHECK_THEN_WRITE_GAP_S = 0.05
KEY_RACE_GAP_S = 0.05

LOCK = threading.Lock()


def open_db(path):
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def create_schema(db):
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS account (
            account_id TEXT PRIMARY KEY,
            balance INTEGER NOT NULL CHECK (balance >= 0));
        CREATE TABLE IF NOT EXISTS txn (
            txn_id INTEGER PRIMARY KEY AUTOINCREMENT,
            account_id TEXT NOT NULL, amount INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS idem (
            client_id TEXT NOT NULL, idem_key TEXT NOT NULL, fingerprint TEXT NOT NULL,
            status INTEGER NOT NULL, body TEXT NOT NULL,
            PRIMARY KEY (client_id, idem_key));
        """
    )


class Store:
    """The SQLite file plus what the defects keep in memory."""

    def __init__(self, path, defects):
        self.path = path
        self.defects = set(defects)
        self.db = open_db(path)
        create_schema(self.db)
        self.memory_keys = {}  # key-in-memory: (client, key) -> (fingerprint, status, body)
        self.pending = []  # ack-before-commit: [(client, key, fp, account, amount, status, body)]
        self.next_pending_txn = None

    def balance(self, account):
        row = self.db.execute(
            "SELECT balance FROM account WHERE account_id = ?", (account,)
        ).fetchone()
        if row is None:
            return None
        return row[0] - sum(p[4] for p in self.pending if p[3] == account and p[5] == 201)

    def lookup(self, client, key):
        for p in self.pending:
            if (p[0], p[1]) == (client, key):
                return p[2], p[5], p[6]
        if "key-in-memory" in self.defects:
            return self.memory_keys.get((client, key))
        row = self.db.execute(
            "SELECT fingerprint, status, body FROM idem WHERE client_id = ? AND idem_key = ?",
            (client, key),
        ).fetchone()
        return tuple(row) if row else None

    def new_txn_id(self):
        row = self.db.execute("SELECT coalesce(max(txn_id), 0) FROM txn").fetchone()
        if self.next_pending_txn is None or self.next_pending_txn <= row[0]:
            self.next_pending_txn = row[0] + 1
        else:
            self.next_pending_txn += 1
        return self.next_pending_txn

    def debit(self, client, key, fingerprint, account, amount, stale, looked_up=False):
        """Runs under LOCK. Returns (status, body, replayed). `looked_up`: the key was
        already looked up (and not found) before the lock (`key-race`)."""
        known = None if looked_up else self.lookup(client, key)
        if known is not None:
            if known[0] != fingerprint and "ignores-payload" not in self.defects:
                return 422, problem(422, "key-reused", "KEY_REUSED",
                                    "the key was first used with another payload"), False
            if "reexecute-on-retry" not in self.defects:
                return known[1], known[2], True
        balance = self.balance(account) if stale is None else stale
        if balance is None:
            status, body = 404, problem(404, "no-account", "NO_ACCOUNT",
                                        f"account {account} does not exist",
                                        account_id=account, amount=amount, balance=0)
        elif balance < amount:
            status, body = 409, problem(409, "insufficient", "INSUFFICIENT",
                                        f"account {account} had {balance} points, fewer "
                                        f"than the {amount} requested",
                                        account_id=account, amount=amount, balance=balance)
        else:
            status, body = 201, None
        if "ack-before-commit" in self.defects:
            if status == 201:
                txn_id = self.new_txn_id()
                body = ok_body(account, amount, txn_id, balance - amount)
            self.pending = [p for p in self.pending if (p[0], p[1]) != (client, key)]
            self.pending.append((client, key, fingerprint, account, amount, status, body))
            return status, body, False
        return self.commit(client, key, fingerprint, account, amount, status, body, balance)

    def commit(self, client, key, fingerprint, account, amount, status, body, balance):
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            if status == 201:
                db.execute("UPDATE account SET balance = ? WHERE account_id = ?",
                           (balance - amount, account))
                cursor = db.execute("INSERT INTO txn (account_id, amount) VALUES (?, ?)",
                                    (account, amount))
                body = ok_body(account, amount, cursor.lastrowid, balance - amount)
            if "key-in-memory" in self.defects:
                self.memory_keys[(client, key)] = (fingerprint, status, body)
            else:
                db.execute("INSERT OR REPLACE INTO idem VALUES (?, ?, ?, ?, ?)",
                           (client, key, fingerprint, status, body))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return status, body, False

    def flush(self):
        """ack-before-commit: commits what was answered; called only at a clean stop."""
        with LOCK:
            pending, self.pending = self.pending, []
            db = self.db
            db.execute("BEGIN IMMEDIATE")
            for client, key, fp, account, amount, status, body in pending:
                if status == 201:
                    txn_id = json.loads(body)["txn_id"]
                    db.execute("UPDATE account SET balance = balance - ? "
                               "WHERE account_id = ?", (amount, account))
                    db.execute("INSERT INTO txn VALUES (?, ?, ?)", (txn_id, account, amount))
                db.execute("INSERT OR REPLACE INTO idem VALUES (?, ?, ?, ?, ?)",
                           (client, key, fp, status, body))
            db.execute("COMMIT")


def ok_body(account, amount, txn_id, balance):
    return json.dumps({"outcome": "OK", "kind": "DEBIT", "account_id": account,
                       "amount": amount, "txn_id": txn_id, "balance": balance})


def problem(status, slug, outcome, detail, **extra):
    body = {"type": f"urn:ledger:problem:{slug}", "title": slug.replace("-", " "),
            "status": status, "detail": detail, "outcome": outcome}
    body.update(extra)
    return json.dumps(body)


def parse_key(value):
    if value is None:
        return None
    value = value.strip()
    quoted = QUOTED_KEY_RE.match(value)
    if quoted:
        return re.sub(r"\\(.)", r"\1", quoted.group(1))
    return value if TOKEN_KEY_RE.match(value) else None


def parse_lenient(raw):
    """`lenient-input`: the first number-looking thing in the body, 1 when none."""
    match = re.search(r"amount\W*([-+0-9.eE]+)", raw.decode("latin-1"))
    try:
        return max(1, int(float(match.group(1)))) if match else 1
    except ValueError:
        return 1


def parse_amount(content_type, raw):
    """The amount of a debit body, or None when it is malformed."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "application/json":
        try:
            text = raw.decode("utf-8")
            value = json.loads(text, parse_float=lambda _: None, parse_constant=lambda _: None)
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(value, dict) or set(value) != {"amount"}:
            return None
        amount = value["amount"]
        if type(amount) is not int or not AMOUNT_RE.match(str(amount)):
            return None
    elif media == "application/x-www-form-urlencoded":
        try:
            fields = urllib.parse.parse_qsl(raw.decode("ascii"), keep_blank_values=True,
                                            strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return None
        if len(fields) != 1 or fields[0][0] != "amount" or not AMOUNT_RE.match(fields[0][1]):
            return None
        amount = int(fields[0][1])
    else:
        return None
    return amount if 0 < amount <= MAX_AMOUNT else None


class Handler(BaseHTTPRequestHandler):
    server_version = "conformance-target-py"
    store = None

    def log_message(self, format, *args):  # one line per request on stderr
        sys.stderr.write("%s %s\n" % (self.requestline, format % args))

    def send(self, status, body, replayed=False):
        data = body.encode("utf-8")
        self.send_response(status)
        kind = "application/json" if status < 400 else "application/problem+json"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def bad(self, detail, status=400, slug="bad-request"):
        self.send(status, problem(status, slug, "BAD_REQUEST", detail))

    def do_GET(self):
        if self.path == "/healthz":
            return self.send(200, json.dumps({"status": "ok"}))
        parts = self.path.split("/")
        if len(parts) != 3 or parts[1] != "accounts":
            return self.bad("nothing served here", 404, "no-route")
        account = parts[2]
        if not ACCOUNT_RE.match(account):
            return self.bad("malformed account id")
        with LOCK:
            balance = self.store.balance(account)
        if balance is None:
            return self.send(404, problem(404, "no-account", "NO_ACCOUNT",
                                          f"account {account} does not exist",
                                          account_id=account))
        self.send(200, json.dumps({"account_id": account, "balance": balance}))

    def do_POST(self):
        parts = self.path.split("/")
        if len(parts) != 4 or parts[1] != "accounts" or parts[3] != "debits":
            return self.bad("nothing served here", 404, "no-route")
        account = parts[2]
        if not ACCOUNT_RE.match(account):
            return self.bad("malformed account id")
        lenient = "lenient-input" in self.store.defects
        clients = self.headers.get_all("X-Client-Id") or []
        if lenient and not clients:
            clients = ["anonymous"]
        if len(clients) != 1 or not CLIENT_RE.match(clients[0].strip()):
            return self.bad("X-Client-Id missing or malformed")
        keys = self.headers.get_all("Idempotency-Key") or []
        if lenient:
            keys = [(keys or [os.urandom(8).hex()])[0].replace(" ", "-")]
        key = parse_key(keys[0]) if len(keys) == 1 else None
        if key is None:
            return self.bad("Idempotency-Key missing or malformed")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return self.bad("malformed Content-Length")
        if length > MAX_BODY_BYTES:
            return self.bad("body over 4096 bytes", 413, "body-too-large")
        raw = self.rfile.read(length)
        if lenient:
            amount = parse_lenient(raw)
        else:
            amount = parse_amount(self.headers.get("Content-Type"), raw)
        if amount is None:
            return self.bad("the body is not amount=N with N a positive integer")
        self.debit(clients[0].strip(), key, account, amount)

    def debit(self, client, key, account, amount):
        store = self.store
        stale = None
        looked_up = False
        if "check-then-write" in store.defects:
            with LOCK:
                stale = store.balance(account)
            time.sleep(CHECK_THEN_WRITE_GAP_S)
        if "key-race" in store.defects:
            with LOCK:
                looked_up = store.lookup(client, key) is None
            time.sleep(KEY_RACE_GAP_S)
        with LOCK:
            status, body, replayed = store.debit(client, key, f"{account}:{amount}",
                                                 account, amount, stale, looked_up)
        self.send(status, body, replayed)


def serve(args):
    Handler.store = Store(args.db, args.defect or [])
    if "ack-before-commit" in Handler.store.defects:
        def stop(_signum, _frame):
            Handler.store.flush()
            os._exit(0)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    host, port = args.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    print(f"listening on {host}:{server.server_address[1]} defects="
          f"{','.join(sorted(Handler.store.defects)) or 'none'}", flush=True)
    server.serve_forever()


def grant(args):
    if not ACCOUNT_RE.match(args.account) or not AMOUNT_RE.match(args.amount):
        sys.exit("grant: ACCOUNT must match [A-Za-z0-9._-]{1,64}, AMOUNT a positive integer")
    db = open_db(args.db)
    create_schema(db)
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT OR IGNORE INTO account VALUES (?, 0)", (args.account,))
    db.execute("UPDATE account SET balance = balance + ? WHERE account_id = ?",
               (int(args.amount), args.account))
    db.execute("COMMIT")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve")
    s.add_argument("--listen", default="127.0.0.1:0")
    s.add_argument("--db", required=True)
    s.add_argument("--defect", action="append", choices=DEFECTS)
    g = commands.add_parser("grant")
    g.add_argument("--db", required=True)
    g.add_argument("account")
    g.add_argument("amount")
    args = parser.parse_args()
    serve(args) if args.command == "serve" else grant(args)


if __name__ == "__main__":
    main()
