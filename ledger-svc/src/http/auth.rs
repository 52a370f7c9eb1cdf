//! Bearer-token authentication of callers (`--auth-tokens FILE`).
//!
//! # The token file
//!
//! One caller per line, three fields separated by spaces or tabs:
//!
//! ```text
//! # sha256-of-token                                                  client-id  admin
//! 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08   app-a      no
//! bd354d4cc72b147ca4ae0414b198edd7d1ebb546d575034d4c53d1686110ebd7   ops        yes
//! ```
//!
//! (the hashes of the example tokens `test` and `admin-token-ops`; real tokens are long
//! and random, e.g. `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'`).
//!
//! - the SHA-256 of the token's bytes as 64 hex digits (the token itself is never stored:
//!   `printf '%s' "$TOKEN" | sha256sum` prints it);
//! - the caller's client id, with the grammar of `X-Client-Id` (1 to
//!   [`super::grammar::MAX_CLIENT_ID_CHARS`] visible ASCII characters);
//! - `yes` when the caller may use the admin listener, else `no`.
//!
//! Blank lines and lines starting with `#` are ignored. A hash listed twice, a malformed
//! line, or a file with no caller at all refuses the start (the error names the line).
//! Several tokens may name one client id (e.g. one per deployment).
//!
//! # What a request must carry
//!
//! With the file given, every route except `GET /healthz`, `GET /readyz` (the probes)
//! and `GET /openapi.json` (the public contract) needs `Authorization: Bearer <token>`
//! (RFC 6750 §2.1): missing, or another scheme →
//! 401 `UNAUTHENTICATED` with `WWW-Authenticate: Bearer realm="ledger-svc"`; a token not
//! in the file → 401 with `error="invalid_token"`; a malformed header (repeated, empty,
//! characters outside RFC 6750's b64token) → 400 with `error="invalid_request"`. On the
//! admin listener the caller must be an admin (else 403 `FORBIDDEN`). The caller's id
//! then scopes the idempotency keys: `X-Client-Id` may be left out, and when present must
//! equal it (else 403 `FORBIDDEN`). On the spot routes the caller's id is also the tenant
//! ([`tenant_id`]): `X-Tenant-Id` may be left out, and when present must name it (else
//! 403). None of these records anything.
//!
//! The presented token is hashed with SHA-256 and the hash compared with every listed
//! hash by `subtle`'s constant-time equality, all entries each time, so neither how much
//! of a hash matched nor which entry did shows in the answer's timing.

use std::path::Path;

use hyper::StatusCode;
use hyper::header::{AUTHORIZATION, HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::grammar;
use super::listener::Listener;
use super::problem::{ApiOutcome, HttpResponse, Problem};

/// Largest token file read, bytes; a larger one refuses the start.
pub const MAX_TOKEN_FILE_BYTES: u64 = 1024 * 1024;
/// Most callers (lines) in a token file; more refuse the start. Each request compares
/// its token's hash with every entry, so this also bounds that work.
pub const MAX_CALLERS: usize = 10_000;
/// Longest token accepted in `Authorization`, bytes; a longer one is 400 (hyper's header
/// buffer, `MAX_HEADER_BUFFER_BYTES`, bounds the whole head anyway).
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Hex digits of a token hash in the file (SHA-256: 32 bytes).
pub const TOKEN_HASH_HEX_CHARS: usize = 64;
/// The realm named in `WWW-Authenticate`.
pub const REALM: &str = "ledger-svc";
/// Hex digits of a token hash shown in the start-up lines (enough to tell entries apart
/// when comparing with the file, never the token).
pub const HASH_PREFIX_HEX_CHARS: usize = 12;

/// An authenticated caller: who the token says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The client id that scopes this caller's idempotency keys.
    pub client_id: String,
    /// Whether the caller may use the admin listener.
    pub admin: bool,
}

/// One line of the token file.
#[derive(Debug, Clone)]
struct Entry {
    hash: [u8; 32],
    caller: Caller,
}

/// The callers of a token file, looked up by token.
#[derive(Debug, Clone)]
pub struct TokenTable {
    entries: Vec<Entry>,
}

/// SHA-256 of a token's bytes.
pub fn token_hash(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != TOKEN_HASH_HEX_CHARS || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(hash)
}

impl TokenTable {
    /// Reads and parses the token file at `path` (format: the module docs).
    ///
    /// Errors: the file cannot be read, is larger than [`MAX_TOKEN_FILE_BYTES`], or does
    /// not parse ([`TokenTable::parse`]); the message names the path.
    pub fn load(path: &Path) -> Result<TokenTable, String> {
        let shown = path.display();
        let size = std::fs::metadata(path)
            .map_err(|error| format!("cannot read the token file {shown}: {error}"))?
            .len();
        if size > MAX_TOKEN_FILE_BYTES {
            return Err(format!(
                "the token file {shown} is larger than {MAX_TOKEN_FILE_BYTES} bytes"
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read the token file {shown}: {error}"))?;
        TokenTable::parse(&text).map_err(|error| format!("token file {shown}: {error}"))
    }

    /// Parses the text of a token file.
    ///
    /// Errors: a line without exactly three fields, a hash that is not 64 hex digits, a
    /// client id outside the `X-Client-Id` grammar, an admin field other than `yes`/`no`,
    /// a hash listed twice, more than [`MAX_CALLERS`] callers, or none (`line N: ...`).
    pub fn parse(text: &str) -> Result<TokenTable, String> {
        let mut entries: Vec<Entry> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [hash, client_id, admin] = fields.as_slice() else {
                return Err(format!(
                    "line {number}: expected 3 fields (sha256-hex client-id yes|no), found {}",
                    fields.len()
                ));
            };
            let hash = parse_hash(hash).ok_or_else(|| {
                format!(
                    "line {number}: the token hash must be {TOKEN_HASH_HEX_CHARS} hex digits \
                     (SHA-256 of the token)"
                )
            })?;
            let client_id = grammar::parse_client_id(std::iter::once(client_id.as_bytes()))
                .map_err(|bad| format!("line {number}: {}", bad.0))?;
            let admin = match *admin {
                "yes" => true,
                "no" => false,
                other => {
                    return Err(format!(
                        "line {number}: the admin field must be yes or no, not {other:?}"
                    ));
                }
            };
            if entries.iter().any(|entry| entry.hash == hash) {
                return Err(format!("line {number}: this token hash is listed twice"));
            }
            if entries.len() == MAX_CALLERS {
                return Err(format!("more than {MAX_CALLERS} callers"));
            }
            entries.push(Entry {
                hash,
                caller: Caller { client_id, admin },
            });
        }
        if entries.is_empty() {
            return Err("no caller listed (every request would be refused)".into());
        }
        Ok(TokenTable { entries })
    }

    /// The caller whose token this is, if any: the token's SHA-256 compared in constant
    /// time with every entry (no early exit).
    pub fn lookup(&self, token: &[u8]) -> Option<&Caller> {
        let presented = token_hash(token);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(&entry.caller);
            }
        }
        found
    }

    /// Callers listed (at least 1).
    pub fn callers(&self) -> usize {
        self.entries.len()
    }

    /// Callers that may use the admin listener.
    pub fn admins(&self) -> usize {
        self.entries
            .iter()
            .filter(|entry| entry.caller.admin)
            .count()
    }

    /// One line per caller for the start-up log: client id, admin flag and the first
    /// [`HASH_PREFIX_HEX_CHARS`] hex digits of the token hash (never the token).
    pub fn describe(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|entry| {
                format!(
                    "caller client_id={} admin={} token_sha256={}…",
                    entry.caller.client_id,
                    if entry.caller.admin { "yes" } else { "no" },
                    &hex(&entry.hash)[..HASH_PREFIX_HEX_CHARS]
                )
            })
            .collect()
    }
}

/// Whether `token` is an RFC 6750 b64token: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" /
/// "+" / "/" ) *"="`.
fn is_b64token(token: &[u8]) -> bool {
    let body = token.iter().rposition(|b| *b != b'=').map_or(0, |i| i + 1);
    body > 0
        && token[..body]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(b))
}

/// A 401 or 400 with its `WWW-Authenticate` challenge (RFC 6750 §3).
fn challenge(status: StatusCode, error: Option<&str>, detail: &str) -> Box<HttpResponse> {
    let problem = if status == StatusCode::UNAUTHORIZED {
        Problem::new(
            status,
            "unauthenticated",
            "Authentication required",
            detail,
            ApiOutcome::Unauthenticated,
        )
    } else {
        Problem::bad_request(detail)
    };
    let mut response = problem.into_response();
    let value = match error {
        Some(error) => format!("Bearer realm=\"{REALM}\", error=\"{error}\""),
        None => format!("Bearer realm=\"{REALM}\""),
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(WWW_AUTHENTICATE, value);
    }
    Box::new(response)
}

/// 403 `FORBIDDEN` with `detail`.
fn forbidden(kind: &'static str, detail: String) -> Box<HttpResponse> {
    Box::new(
        Problem::new(
            StatusCode::FORBIDDEN,
            kind,
            "Forbidden",
            detail,
            ApiOutcome::Forbidden,
        )
        .into_response(),
    )
}

/// The caller of a request on `listener`, from its `Authorization: Bearer` header.
///
/// Errors: the response to send instead (401, 400 or 403, see the module docs; boxed, it
/// is large); nothing has been read from the body or the database.
pub fn authenticate(
    table: &TokenTable,
    listener: Listener,
    headers: &HeaderMap,
) -> Result<Caller, Box<HttpResponse>> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(if headers.contains_key(AUTHORIZATION) {
            challenge(
                StatusCode::BAD_REQUEST,
                Some("invalid_request"),
                "the Authorization header must appear once",
            )
        } else {
            challenge(
                StatusCode::UNAUTHORIZED,
                None,
                "this service requires Authorization: Bearer <token>",
            )
        });
    };
    let raw = value.as_bytes();
    let (scheme, rest) = match raw.iter().position(|b| *b == b' ') {
        Some(space) => (&raw[..space], &raw[space + 1..]),
        None => (raw, &raw[raw.len()..]),
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(challenge(
            StatusCode::UNAUTHORIZED,
            None,
            "this service accepts only the Bearer scheme: Authorization: Bearer <token>",
        ));
    }
    let token = rest.trim_ascii();
    if token.len() > MAX_TOKEN_BYTES || !is_b64token(token) {
        return Err(challenge(
            StatusCode::BAD_REQUEST,
            Some("invalid_request"),
            &format!(
                "the bearer token must be 1 to {MAX_TOKEN_BYTES} characters of A-Z a-z 0-9 \
                 - . _ ~ + / (then = padding)"
            ),
        ));
    }
    let Some(caller) = table.lookup(token) else {
        return Err(challenge(
            StatusCode::UNAUTHORIZED,
            Some("invalid_token"),
            "the bearer token is not known to this service",
        ));
    };
    if listener == Listener::Admin && !caller.admin {
        return Err(forbidden(
            "not-admin",
            format!("caller {} may not use the admin listener", caller.client_id),
        ));
    }
    Ok(caller.clone())
}

/// The client id that scopes a request's keys. Without authentication (`caller` is
/// `None`): the `X-Client-Id` header, required. With it: the caller's id; an
/// `X-Client-Id` header is optional and must name the same id.
///
/// Errors: 400 for a missing (without authentication) or malformed header, 403
/// `FORBIDDEN` for a header naming another client than the token's.
pub fn client_id(
    caller: Option<&Caller>,
    headers: &HeaderMap,
) -> Result<String, Box<HttpResponse>> {
    let values = || {
        headers
            .get_all("x-client-id")
            .iter()
            .map(|value| value.as_bytes())
    };
    let Some(caller) = caller else {
        return grammar::parse_client_id(values())
            .map_err(|bad| Box::new(Problem::bad_request(bad.0).into_response()));
    };
    if values().next().is_none() {
        return Ok(caller.client_id.clone());
    }
    let declared = grammar::parse_client_id(values())
        .map_err(|bad| Box::new(Problem::bad_request(bad.0).into_response()))?;
    if declared != caller.client_id {
        return Err(forbidden(
            "client-id-mismatch",
            format!(
                "X-Client-Id {declared} is not the client this token authenticates ({}); \
                 leave the header out or name the token's own client",
                caller.client_id
            ),
        ));
    }
    Ok(declared)
}

/// Header naming the tenant of a spot request (SPEC §8): it scopes business ids and owns
/// accounts.
pub const TENANT_HEADER: &str = "x-tenant-id";

/// The tenant a spot request acts for, and the check of its `X-Client-Id`.
///
/// Without authentication (`caller` is `None`): `X-Tenant-Id`, required, trusted as
/// declared (`X-Client-Id` is not read). With it, the tenant is who the caller is: the
/// caller's client id. `X-Tenant-Id` may then be left out, and when present must name
/// that id; `X-Client-Id`, when present, must name the caller (as on the ledger routes,
/// [`client_id`]). Several tokens may name one client id, so a tenant may have several
/// callers (one per deployment, and an admin one for deposits and fills).
///
/// Errors: 400 for a missing (without authentication) or malformed header; 403
/// `FORBIDDEN` (`client-id-mismatch`, `tenant-mismatch`) for a header naming another
/// client or tenant than the token's. Nothing has been read from the body or the database.
pub fn tenant_id(
    caller: Option<&Caller>,
    headers: &HeaderMap,
) -> Result<String, Box<HttpResponse>> {
    let declared = || {
        headers
            .get_all(TENANT_HEADER)
            .iter()
            .map(|value| value.as_bytes())
    };
    let parse = || {
        grammar::parse_header_id("X-Tenant-Id", declared())
            .map_err(|bad| Box::new(Problem::bad_request(bad.0).into_response()))
    };
    let Some(caller) = caller else {
        return parse();
    };
    let tenant = client_id(Some(caller), headers)?;
    if declared().next().is_none() {
        return Ok(tenant);
    }
    let declared = parse()?;
    if declared != tenant {
        return Err(forbidden(
            "tenant-mismatch",
            format!(
                "X-Tenant-Id {declared} is not the tenant of this token's caller ({tenant}); \
                 leave the header out or name the caller's own tenant"
            ),
        ));
    }
    Ok(tenant)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `printf '%s' test | sha256sum`.
    const TEST_HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn table() -> TokenTable {
        TokenTable::parse(&format!(
            "# comment\n\n{TEST_HASH} app-a no\n{}\tops\tyes\n",
            hex(&token_hash(b"admin-token"))
        ))
        .unwrap()
    }

    fn headers(authorization: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in authorization {
            map.append(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn hash_matches_sha256sum() {
        assert_eq!(hex(&token_hash(b"test")), TEST_HASH);
    }

    #[test]
    fn parses_and_looks_up() {
        let table = table();
        assert_eq!((table.callers(), table.admins()), (2, 1));
        assert_eq!(table.lookup(b"test").unwrap().client_id, "app-a");
        assert!(table.lookup(b"admin-token").unwrap().admin);
        assert!(table.lookup(b"tesT").is_none());
        assert!(table.describe()[0].contains("token_sha256=9f86d081884c…"));
        assert!(!table.describe().concat().contains("admin-token"));
    }

    #[test]
    fn refuses_bad_files() {
        for (text, wanted) in [
            ("", "no caller"),
            ("# only a comment\n", "no caller"),
            (&format!("{TEST_HASH} app-a\n"), "line 1: expected 3 fields"),
            (&format!("{TEST_HASH} app-a maybe\n"), "yes or no"),
            ("abc app-a no\n", "64 hex digits"),
            (
                &format!("{TEST_HASH} app-a no\n{TEST_HASH} app-b no\n"),
                "line 2: this token hash is listed twice",
            ),
        ] {
            let error = TokenTable::parse(text).unwrap_err();
            assert!(error.contains(wanted), "{text:?}: {error}");
        }
    }

    #[test]
    fn bearer_header() {
        let table = table();
        let status =
            |values: &[&str], listener| match authenticate(&table, listener, &headers(values)) {
                Ok(caller) => caller.client_id,
                Err(response) => response.status().as_u16().to_string(),
            };
        assert_eq!(status(&["Bearer test"], Listener::Public), "app-a");
        assert_eq!(status(&["bearer  test "], Listener::Public), "app-a");
        assert_eq!(status(&[], Listener::Public), "401");
        assert_eq!(status(&["Basic dGVzdA=="], Listener::Public), "401");
        assert_eq!(status(&["Bearer other"], Listener::Public), "401");
        assert_eq!(status(&["Bearer"], Listener::Public), "400");
        assert_eq!(status(&["Bearer a b"], Listener::Public), "400");
        assert_eq!(
            status(&["Bearer test", "Bearer test"], Listener::Public),
            "400"
        );
        assert_eq!(status(&["Bearer test"], Listener::Admin), "403");
        assert_eq!(status(&["Bearer admin-token"], Listener::Admin), "ops");
        let missing = authenticate(&table, Listener::Public, &headers(&[])).unwrap_err();
        assert_eq!(
            missing.headers()[WWW_AUTHENTICATE],
            "Bearer realm=\"ledger-svc\""
        );
    }

    #[test]
    fn tenant_is_the_caller() {
        let caller = Caller {
            client_id: "tenant-a".into(),
            admin: false,
        };
        let with = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, HeaderValue::from_str(value).unwrap());
            }
            map
        };
        let status = |result: Result<String, Box<HttpResponse>>| match result {
            Ok(tenant) => tenant,
            Err(response) => response.status().as_u16().to_string(),
        };
        assert_eq!(status(tenant_id(Some(&caller), &with(&[]))), "tenant-a");
        assert_eq!(
            status(tenant_id(
                Some(&caller),
                &with(&[(TENANT_HEADER, "tenant-a")])
            )),
            "tenant-a"
        );
        assert_eq!(
            status(tenant_id(
                Some(&caller),
                &with(&[(TENANT_HEADER, "tenant-b")])
            )),
            "403"
        );
        assert_eq!(
            status(tenant_id(
                Some(&caller),
                &with(&[("x-client-id", "tenant-b")])
            )),
            "403"
        );
        assert_eq!(
            status(tenant_id(Some(&caller), &with(&[(TENANT_HEADER, "a b")]))),
            "400"
        );
        // Without authentication the header is trusted as declared, and required.
        assert_eq!(
            status(tenant_id(None, &with(&[(TENANT_HEADER, "tenant-b")]))),
            "tenant-b"
        );
        assert_eq!(status(tenant_id(None, &with(&[]))), "400");
    }

    #[test]
    fn client_id_must_match() {
        let caller = Caller {
            client_id: "app-b".into(),
            admin: false,
        };
        let with = |value: Option<&str>| {
            let mut map = HeaderMap::new();
            if let Some(value) = value {
                map.insert("x-client-id", HeaderValue::from_str(value).unwrap());
            }
            map
        };
        assert_eq!(client_id(Some(&caller), &with(None)).unwrap(), "app-b");
        assert_eq!(
            client_id(Some(&caller), &with(Some("app-b"))).unwrap(),
            "app-b"
        );
        let mismatch = client_id(Some(&caller), &with(Some("app-a"))).unwrap_err();
        assert_eq!(mismatch.status(), StatusCode::FORBIDDEN);
        assert_eq!(client_id(None, &with(Some("app-a"))).unwrap(), "app-a");
        assert_eq!(
            client_id(None, &with(None)).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }
}
