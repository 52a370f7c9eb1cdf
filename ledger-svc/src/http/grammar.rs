//! What a well-formed request looks like (SPEC §4): the amount, the idempotency key, the
//! client id, the account id in the path, and the two accepted body encodings.
//!
//! Everything here is a pure function of the request's text, so a malformed request is
//! rejected before the database is touched: a 4xx never registers a key and never
//! changes a balance.

use std::fmt;

/// Largest request body accepted, bytes; a larger one is answered 413.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
/// Longest idempotency key, characters (after removing RFC 8941 quoting).
pub const MAX_KEY_CHARS: usize = 255;
/// Longest `X-Client-Id`, characters.
pub const MAX_CLIENT_ID_CHARS: usize = 64;
/// Longest account id in a path, characters.
pub const MAX_ACCOUNT_ID_CHARS: usize = 64;
/// Longest redemption order id (`order_id` of a debit body), characters.
pub const MAX_ORDER_ID_CHARS: usize = 64;

/// Why a request is malformed. The text is meant for the client (it becomes the
/// `detail` of a 400 problem) and never contains driver text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn malformed(text: impl Into<String>) -> Malformed {
    Malformed(text.into())
}

/// An amount: a decimal positive integer that fits in `i64`, written with ASCII digits
/// only and without a leading zero, sign, blank, exponent, fraction or radix prefix.
/// `7` and `9223372036854775807` are amounts; `0 -5 +5 007 " 7" 1e3 5.0 0x10 ""` and
/// `9223372036854775808` are not.
///
/// Errors: [`Malformed`] naming the rule that was broken.
pub fn parse_amount(text: &str) -> Result<i64, Malformed> {
    if text.is_empty() {
        return Err(malformed("amount is empty"));
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(
            "amount must be written with the digits 0-9 only (no sign, blank, point, exponent or prefix)",
        ));
    }
    if text.starts_with('0') {
        return Err(malformed(
            "amount must be a positive integer without leading zeros",
        ));
    }
    text.parse::<i64>().map_err(|_| {
        malformed(format!(
            "amount must not exceed {} (a signed 64-bit integer)",
            i64::MAX
        ))
    })
}

/// The `Idempotency-Key` header (IETF draft draft-ietf-httpapi-idempotency-key-header,
/// section 2: an RFC 8941 sf-string). Accepted forms, both naming the same key:
///
/// - the quoted string the draft uses, `"k-0701"`, with `\"` and `\\` as the only escapes
///   and printable ASCII (0x20–0x7E) inside, no parameters after it;
/// - a bare token, `k-0701`: RFC 9110 token characters plus `:` and `/`.
///
/// The key (the text between the quotes) has 1 to [`MAX_KEY_CHARS`] characters. Exactly
/// one `Idempotency-Key` field must be present.
///
/// Errors: [`Malformed`] for a missing, repeated, empty, too long or ill-formed key.
pub fn parse_idempotency_key<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
) -> Result<String, Malformed> {
    let Some(raw) = values.next() else {
        return Err(malformed("the Idempotency-Key header is missing"));
    };
    if values.next().is_some() {
        return Err(malformed("the Idempotency-Key header must appear once"));
    }
    let raw = trim_ows(raw);
    let key = if raw.first() == Some(&b'"') {
        unquote_sf_string(raw)?
    } else {
        if raw.is_empty() || !raw.iter().all(|&b| is_token_char(b)) {
            return Err(malformed(
                "Idempotency-Key must be a quoted string (\"...\") or a token of visible ASCII characters without separators",
            ));
        }
        // All bytes are ASCII, so this cannot fail.
        String::from_utf8_lossy(raw).into_owned()
    };
    if key.is_empty() {
        return Err(malformed("Idempotency-Key is empty"));
    }
    if key.chars().count() > MAX_KEY_CHARS {
        return Err(malformed(format!(
            "Idempotency-Key is longer than {MAX_KEY_CHARS} characters"
        )));
    }
    Ok(key)
}

/// RFC 8941 section 3.3.3 sf-string, the whole field value: `"` chars `"`, where chars are
/// 0x20–0x7E except `"` and `\`, or the escapes `\"` and `\\`.
fn unquote_sf_string(raw: &[u8]) -> Result<String, Malformed> {
    let mut key = String::new();
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(malformed("Idempotency-Key has no closing quote")),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(char::from(escaped)),
                _ => {
                    return Err(malformed(
                        "Idempotency-Key: only \\\" and \\\\ may be escaped in a quoted string",
                    ));
                }
            },
            Some(&b) if (0x20..=0x7e).contains(&b) => key.push(char::from(b)),
            Some(_) => {
                return Err(malformed(
                    "Idempotency-Key may contain printable ASCII characters only",
                ));
            }
        }
    }
    if bytes.next().is_some() {
        return Err(malformed(
            "Idempotency-Key: nothing may follow the closing quote (no parameters)",
        ));
    }
    Ok(key)
}

/// RFC 9110 section 5.6.2 tchar, plus `:` and `/` which RFC 8941 tokens allow.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b)
}

fn trim_ows(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

/// The `X-Client-Id` header: exactly one, 1 to [`MAX_CLIENT_ID_CHARS`] visible ASCII
/// characters (0x21–0x7E). It scopes the idempotency key; it is self-declared, not an
/// authenticated identity.
///
/// Errors: [`Malformed`] for a missing, repeated, empty, too long or ill-formed id.
pub fn parse_client_id<'a>(values: impl Iterator<Item = &'a [u8]>) -> Result<String, Malformed> {
    parse_header_id("X-Client-Id", values)
}

/// A header that carries one id with the grammar of `X-Client-Id` (exactly one field,
/// 1 to [`MAX_CLIENT_ID_CHARS`] visible ASCII characters); `header` names it in messages.
/// The spot routes use it for `X-Tenant-Id`.
///
/// Errors: [`Malformed`] for a missing, repeated, empty, too long or ill-formed id.
pub fn parse_header_id<'a>(
    header: &str,
    mut values: impl Iterator<Item = &'a [u8]>,
) -> Result<String, Malformed> {
    let Some(raw) = values.next() else {
        return Err(malformed(format!("the {header} header is missing")));
    };
    if values.next().is_some() {
        return Err(malformed(format!("the {header} header must appear once")));
    }
    let raw = trim_ows(raw);
    if raw.is_empty() {
        return Err(malformed(format!("{header} is empty")));
    }
    if raw.len() > MAX_CLIENT_ID_CHARS {
        return Err(malformed(format!(
            "{header} is longer than {MAX_CLIENT_ID_CHARS} characters"
        )));
    }
    if !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(malformed(format!(
            "{header} may contain visible ASCII characters only"
        )));
    }
    Ok(String::from_utf8_lossy(raw).into_owned())
}

/// An account id as it appears in a path segment: 1 to [`MAX_ACCOUNT_ID_CHARS`]
/// characters from `A-Z a-z 0-9 - _ .` (no percent-encoding is decoded).
///
/// Errors: [`Malformed`] otherwise.
pub fn parse_account_id(segment: &str) -> Result<String, Malformed> {
    if segment.is_empty() || segment.len() > MAX_ACCOUNT_ID_CHARS {
        return Err(malformed(format!(
            "account id must have 1 to {MAX_ACCOUNT_ID_CHARS} characters"
        )));
    }
    if !segment
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(malformed(
            "account id may contain only A-Z, a-z, 0-9, '-', '_' and '.'",
        ));
    }
    Ok(segment.to_owned())
}

/// The accepted body encodings of a transfer (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyType {
    /// `application/x-www-form-urlencoded`: the field `amount=N`, and optionally
    /// `order_id=ID`, each once.
    Form,
    /// `application/json`: an object with the member `amount` (a JSON number token that
    /// is an amount) and optionally `order_id` (a JSON string), no other member.
    Json,
}

/// The body type named by a `Content-Type` value (media type compared case-insensitively,
/// parameters such as `charset` ignored); `None` for anything else.
pub fn body_type(content_type: &[u8]) -> Option<BodyType> {
    let text = std::str::from_utf8(content_type).ok()?;
    let media_type = text.split(';').next()?.trim();
    if media_type.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Some(BodyType::Form)
    } else if media_type.eq_ignore_ascii_case("application/json") {
        Some(BodyType::Json)
    } else {
        None
    }
}

/// What a transfer body carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferBody {
    /// Points to move ([`parse_amount`]).
    pub amount: i64,
    /// The redemption order the debit pays ([`parse_order_id`]), if the body names one.
    pub order_id: Option<String>,
}

/// A redemption order id: 1 to [`MAX_ORDER_ID_CHARS`] characters from
/// `A-Z a-z 0-9 - _ . :`, compared exactly (nothing is trimmed or case-folded).
///
/// Errors: [`Malformed`] otherwise.
pub fn parse_order_id(text: &str) -> Result<String, Malformed> {
    if text.is_empty() || text.len() > MAX_ORDER_ID_CHARS {
        return Err(malformed(format!(
            "order_id must have 1 to {MAX_ORDER_ID_CHARS} characters"
        )));
    }
    if !text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    {
        return Err(malformed(
            "order_id may contain only A-Z, a-z, 0-9, '-', '_', '.' and ':'",
        ));
    }
    Ok(text.to_owned())
}

/// The amount (and the order id, if any) carried by a transfer body of type `body_type`.
///
/// Form: fields separated by `&`, each `name=value` with `+` meaning a blank and `%XX`
/// escapes (WHATWG URL, application/x-www-form-urlencoded parsing); the field `amount`
/// exactly once, its decoded value an amount ([`parse_amount`]), and optionally the field
/// `order_id` once ([`parse_order_id`]); no other field.
/// JSON: an object with the member `amount` whose value is a JSON number written as an
/// amount (so `5.0`, `1e3`, `-5`, strings and `null` are refused), and optionally the
/// member `order_id`, a JSON string that is an order id; no other member.
///
/// Errors: [`Malformed`] for anything else, including invalid UTF-8.
pub fn parse_body(body_type: BodyType, body: &[u8]) -> Result<TransferBody, Malformed> {
    let text = std::str::from_utf8(body).map_err(|_| malformed("the request body is not UTF-8"))?;
    match body_type {
        BodyType::Form => parse_form(text),
        BodyType::Json => parse_json(text),
    }
}

fn parse_form(text: &str) -> Result<TransferBody, Malformed> {
    let mut amount = None;
    let mut order_id = None;
    for field in text.split('&') {
        let (name, value) = field
            .split_once('=')
            .ok_or_else(|| malformed("form body must be amount=N"))?;
        match form_decode(name)?.as_str() {
            "amount" => {
                if amount.is_some() {
                    return Err(malformed("form field amount appears more than once"));
                }
                amount = Some(parse_amount(&form_decode(value)?)?);
            }
            "order_id" => {
                if order_id.is_some() {
                    return Err(malformed("form field order_id appears more than once"));
                }
                order_id = Some(parse_order_id(&form_decode(value)?)?);
            }
            _ => {
                return Err(malformed(
                    "form body may have only the fields amount and order_id",
                ));
            }
        }
    }
    let amount = amount.ok_or_else(|| malformed("form body must be amount=N"))?;
    Ok(TransferBody { amount, order_id })
}

fn form_decode(text: &str) -> Result<String, Malformed> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| malformed("form body has an invalid %-escape"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| malformed("form body is not UTF-8 after decoding"))
}

fn parse_json(text: &str) -> Result<TransferBody, Malformed> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        amount: serde_json::Value,
        // Present (even as `null`) → Some; absent → None (plain `Option` would read
        // `null` as absent).
        #[serde(default, deserialize_with = "present")]
        order_id: Option<serde_json::Value>,
    }
    fn present<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<serde_json::Value>, D::Error> {
        serde::Deserialize::deserialize(deserializer).map(Some)
    }
    let not_an_object = || {
        malformed(
            "JSON body must be an object with the member \"amount\" and optionally \"order_id\"",
        )
    };
    // A derived struct also deserializes from a JSON array (`[5]`): only an object counts.
    if !text.trim_start().starts_with('{') {
        return Err(not_an_object());
    }
    // deny_unknown_fields refuses other members; the derive refuses a repeated member.
    let parsed: Body = serde_json::from_str(text).map_err(|_| not_an_object())?;
    // serde_json keeps integers that fit i64/u64 as integers and turns any token with a
    // fraction or exponent into a float, so only an integer token passes `as_i64`; the
    // JSON grammar itself already forbids leading zeros and a plus sign.
    let amount = match parsed.amount {
        serde_json::Value::Number(number) if number.is_i64() || number.is_u64() => {
            parse_amount(&number.to_string())?
        }
        serde_json::Value::Number(_) => {
            return Err(malformed(
                "amount must be an integer (no fraction or exponent)",
            ));
        }
        _ => return Err(malformed("amount must be a JSON number")),
    };
    // `"order_id": null` is refused like any other non-string: absent means no order.
    let order_id = match parsed.order_id {
        None => None,
        Some(serde_json::Value::String(text)) => Some(parse_order_id(&text)?),
        Some(_) => return Err(malformed("order_id must be a JSON string")),
    };
    Ok(TransferBody { amount, order_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts() {
        assert_eq!(parse_amount("7"), Ok(7));
        assert_eq!(parse_amount("9223372036854775807"), Ok(i64::MAX));
        for bad in [
            "0",
            "-5",
            "+5",
            "007",
            " 7",
            "7 ",
            "1e3",
            "5.0",
            "0x10",
            "",
            "9223372036854775808",
            "٣",
            "99999999999999999999999",
        ] {
            assert!(parse_amount(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn key(raw: &str) -> Result<String, Malformed> {
        parse_idempotency_key(std::iter::once(raw.as_bytes()))
    }

    #[test]
    fn keys() {
        assert_eq!(key("k-0701").unwrap(), "k-0701");
        assert_eq!(key("\"k-0701\"").unwrap(), "k-0701");
        assert_eq!(key("\"a b\\\"c\\\\\"").unwrap(), "a b\"c\\");
        assert_eq!(key("8e04e1a2-6f7f-4b5e").unwrap(), "8e04e1a2-6f7f-4b5e");
        assert_eq!(key(&"x".repeat(255)).unwrap().len(), 255);
        assert_eq!(key(&format!("\"{}\"", "x".repeat(255))).unwrap().len(), 255);
        for bad in [
            "",
            "\"\"",
            "\"open",
            "\"a\";p=1",
            "\"a\\n\"",
            "a b",
            "a\"b",
            "k,1",
            "é",
            "\"é\"",
        ] {
            assert!(key(bad).is_err(), "{bad:?} accepted");
        }
        assert!(key(&"x".repeat(256)).is_err());
        assert!(key(&format!("\"{}\"", "x".repeat(256))).is_err());
        assert!(parse_idempotency_key(std::iter::empty()).is_err());
        assert!(parse_idempotency_key([b"a".as_slice(), b"b".as_slice()].into_iter()).is_err());
    }

    #[test]
    fn client_ids() {
        let id = |raw: &str| parse_client_id(std::iter::once(raw.as_bytes()));
        assert_eq!(id("app-a").unwrap(), "app-a");
        assert!(id("").is_err());
        assert!(id("a b").is_err());
        assert!(id(&"c".repeat(65)).is_err());
        assert!(parse_client_id(std::iter::empty()).is_err());
    }

    #[test]
    fn account_ids() {
        assert_eq!(parse_account_id("acct-0001").unwrap(), "acct-0001");
        assert!(parse_account_id("").is_err());
        assert!(parse_account_id("acct%2D0001").is_err());
        assert!(parse_account_id(&"a".repeat(65)).is_err());
    }

    #[test]
    fn order_ids() {
        assert_eq!(parse_order_id("ord-0001").unwrap(), "ord-0001");
        assert_eq!(parse_order_id(&"o".repeat(64)).unwrap().len(), 64);
        for bad in ["", " ord", "ord/1", "é", "a|b"] {
            assert!(parse_order_id(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_order_id(&"o".repeat(65)).is_err());
    }

    #[test]
    fn bodies() {
        assert_eq!(
            body_type(b"application/json; charset=utf-8"),
            Some(BodyType::Json)
        );
        assert_eq!(
            body_type(b"Application/X-WWW-Form-Urlencoded"),
            Some(BodyType::Form)
        );
        assert_eq!(body_type(b"text/plain"), None);
        let plain = |amount| {
            Ok(TransferBody {
                amount,
                order_id: None,
            })
        };
        let ordered = |amount, order: &str| {
            Ok(TransferBody {
                amount,
                order_id: Some(order.to_owned()),
            })
        };
        assert_eq!(parse_body(BodyType::Form, b"amount=30"), plain(30));
        assert_eq!(parse_body(BodyType::Form, b"amount=%33%30"), plain(30));
        assert_eq!(parse_body(BodyType::Json, br#"{"amount": 30}"#), plain(30));
        assert_eq!(parse_body(BodyType::Json, b" {\"amount\":30} "), plain(30));
        assert_eq!(
            parse_body(BodyType::Form, b"order_id=ord-7&amount=30"),
            ordered(30, "ord-7")
        );
        assert_eq!(
            parse_body(
                BodyType::Json,
                br#"{"amount": 30, "order_id": "ord:7.a_B"}"#
            ),
            ordered(30, "ord:7.a_B")
        );
        for (kind, bad) in [
            (BodyType::Form, "amount=+5"),
            (BodyType::Form, "amount=%2B5"),
            (BodyType::Form, "amount=5&amount=5"),
            (BodyType::Form, "amount=5&note=x"),
            (BodyType::Form, "amount"),
            (BodyType::Form, ""),
            (BodyType::Form, "amount=%zz"),
            (BodyType::Json, r#"{"amount": 5.0}"#),
            (BodyType::Json, r#"{"amount": 1e3}"#),
            (BodyType::Json, r#"{"amount": -5}"#),
            (BodyType::Json, r#"{"amount": 0}"#),
            (BodyType::Json, r#"{"amount": "5"}"#),
            (BodyType::Json, r#"{"amount": null}"#),
            (BodyType::Json, r#"{"amount": 9223372036854775808}"#),
            (BodyType::Json, r#"{"amount": 5, "note": 1}"#),
            (BodyType::Json, r#"{"amount": 5, "amount": 5}"#),
            (BodyType::Json, r#"{"amount": 007}"#),
            (BodyType::Json, "[5]"),
            (BodyType::Form, "order_id=ord-1"),
            (BodyType::Form, "amount=5&order_id="),
            (BodyType::Form, "amount=5&order_id=a+b"),
            (BodyType::Form, "amount=5&order_id=a&order_id=a"),
            (BodyType::Json, r#"{"order_id": "ord-1"}"#),
            (BodyType::Json, r#"{"amount": 5, "order_id": ""}"#),
            (BodyType::Json, r#"{"amount": 5, "order_id": null}"#),
            (BodyType::Json, r#"{"amount": 5, "order_id": 7}"#),
            (BodyType::Json, r#"{"amount": 5, "order_id": "ord 1"}"#),
            (
                BodyType::Json,
                r#"{"amount": 5, "order_id": "a", "order_id": "a"}"#,
            ),
            (BodyType::Json, "{}"),
            (BodyType::Json, ""),
        ] {
            assert!(
                parse_body(kind, bad.as_bytes()).is_err(),
                "{bad:?} accepted"
            );
        }
    }
}
