//! The values a `check:` (or an `exposes:` query) compared, for the run record and its
//! page: a check prints its first column (`?column?=t`), which says that the comparison
//! held but not what was compared. From a query `SELECT L1 = R1 AND L2 >= R2 … FROM …`
//! this makes `SELECT L1 AS compared_1, R1 AS compared_2, … FROM …` (the first column's
//! top-level comparisons, joined by `AND` or `OR`, each maybe after `NOT`: both sides,
//! a literal side left out since its value is its text), run after the check on the same connection; each value is then named by its
//! expression (`available=5095100000`). A query whose first column has no top-level
//! comparison (`NOT EXISTS (…)`, `bool_and(…)`), or that holds several statements,
//! gets none: its page shows what it printed.

/// The comparison operators looked for, longest first.
const OPERATORS: [&str; 7] = ["<=", ">=", "<>", "!=", "=", "<", ">"];

/// The query reading the compared expressions of `sql`, and those expressions in its
/// column order; `None` when `sql` has nothing to compare (see the module's doc).
pub fn value_query(sql: &str) -> Option<(String, Vec<String>)> {
    let sql = sql.trim().trim_end_matches(';').trim();
    if top_level(sql, ";").is_some() {
        return None;
    }
    let body = strip_keyword(sql, "SELECT")?;
    let (list, rest) = match top_level_keyword(body, "FROM") {
        Some(at) => (&body[..at], &body[at..]),
        None => (body, ""),
    };
    let first = match top_level(list, ",") {
        Some(at) => &list[..at],
        None => list,
    };
    let first = match top_level_keyword(first, "AS") {
        Some(at) => &first[..at],
        None => first,
    };
    let mut expressions = Vec::new();
    let terms = split_keyword(first, "AND")
        .into_iter()
        .flat_map(|term| split_keyword(term, "OR"));
    for term in terms {
        let term = strip_keyword(term.trim_start(), "NOT").unwrap_or(term);
        let Some((at, operator)) = OPERATORS
            .iter()
            .filter_map(|op| top_level(term, op).map(|at| (at, *op)))
            .min_by_key(|(at, op)| (*at, usize::MAX - op.len()))
        else {
            continue;
        };
        for side in [&term[..at], &term[at + operator.len()..]] {
            let side = one_line(side);
            if !side.is_empty() && !is_literal(&side) && !expressions.contains(&side) {
                expressions.push(side);
            }
        }
    }
    if expressions.is_empty() {
        return None;
    }
    let columns: Vec<String> = expressions
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{e} AS compared_{}", i + 1))
        .collect();
    let query = format!("SELECT {} {}", columns.join(", "), rest.trim());
    Some((query.trim().to_string(), expressions))
}

/// Each of `expressions` with its value in `rows` (as the engine printed the value
/// query's rows: `compared_1=… compared_2=…`), `expression=value`; a row per line when
/// there were several; empty when the query failed or returned nothing.
pub fn values(expressions: &[String], rows: &[String]) -> Vec<String> {
    let mut named = Vec::new();
    for row in rows {
        if row.starts_with("ERROR") || row.starts_with('(') {
            return Vec::new();
        }
        for (i, expression) in expressions.iter().enumerate() {
            let marker = format!("compared_{}=", i + 1);
            let next = format!(" compared_{}=", i + 2);
            let Some(start) = row.find(&marker).map(|at| at + marker.len()) else {
                return Vec::new();
            };
            let end = row[start..].find(&next).map_or(row.len(), |at| start + at);
            named.push(format!("{expression}={}", &row[start..end]));
        }
    }
    named
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A number or a quoted string.
fn is_literal(text: &str) -> bool {
    text.parse::<f64>().is_ok()
        || (text.len() >= 2 && text.starts_with('\'') && text.ends_with('\''))
        || ["true", "false", "null"].contains(&text.to_ascii_lowercase().as_str())
}

/// `text` without its leading `keyword` (any case) and the space after it.
fn strip_keyword<'a>(text: &'a str, keyword: &str) -> Option<&'a str> {
    let head = text.get(..keyword.len())?;
    let rest = &text[keyword.len()..];
    (head.eq_ignore_ascii_case(keyword) && rest.starts_with(char::is_whitespace)).then_some(rest)
}

/// `text` cut at each top-level `keyword` standing as a word.
fn split_keyword<'a>(mut text: &'a str, keyword: &str) -> Vec<&'a str> {
    let mut parts = Vec::new();
    while let Some(at) = top_level_keyword(text, keyword) {
        parts.push(&text[..at]);
        text = &text[at + keyword.len()..];
    }
    parts.push(text);
    parts
}

/// Where `keyword` (any case) first stands as a word at the top level of `text`.
fn top_level_keyword(text: &str, keyword: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let word =
        |at: usize| at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_');
    top_level_positions(text).find(|&at| {
        text.get(at..at + keyword.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(keyword))
            && (at == 0 || !word(at - 1))
            && !word(at + keyword.len())
    })
}

/// Where `needle` first occurs at the top level of `text`.
fn top_level(text: &str, needle: &str) -> Option<usize> {
    top_level_positions(text).find(|&at| text[at..].starts_with(needle))
}

/// The byte offsets of `text` outside parentheses and quotes (`'…'`, `"…"`, `` `…` ``).
fn top_level_positions(text: &str) -> impl Iterator<Item = usize> + '_ {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    text.char_indices().filter_map(move |(at, c)| {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"' | '`') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => depth = depth.saturating_sub(1),
            (None, _) if depth == 0 => return Some(at),
            (None, _) => {}
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_of_each_comparison_of_the_first_column() {
        let (query, names) = value_query(
            "SELECT available = 5095100000 AND frozen = 0 FROM balance\n  WHERE account_id = 'alice'",
        )
        .unwrap();
        assert_eq!(
            query,
            "SELECT available AS compared_1, frozen AS compared_2 FROM balance\n  WHERE account_id = 'alice'"
        );
        assert_eq!(names, ["available", "frozen"]);
        let rows = ["compared_1=5095100000 compared_2=0".to_string()];
        assert_eq!(values(&names, &rows), ["available=5095100000", "frozen=0"]);

        let (query, names) =
            value_query("SELECT units = 12 AS exposed, units FROM stock WHERE item_id = 1")
                .unwrap();
        assert_eq!(
            query,
            "SELECT units AS compared_1 FROM stock WHERE item_id = 1"
        );
        assert_eq!(names, ["units"]);

        let (query, names) =
            value_query("SELECT balance = 10000 - (SELECT sum(a) FROM t WHERE x = 1) FROM account")
                .unwrap();
        assert_eq!(
            names,
            ["balance", "10000 - (SELECT sum(a) FROM t WHERE x = 1)"]
        );
        assert!(query.ends_with(" AS compared_2 FROM account"), "{query}");

        let (query, _) =
            value_query("SELECT @@GLOBAL.tx_isolation = 'REPEATABLE-READ' AS repeatable_read")
                .unwrap();
        assert_eq!(query, "SELECT @@GLOBAL.tx_isolation AS compared_1");
        let (_, names) = value_query("SELECT count(*) >= 2 FROM t").unwrap();
        assert_eq!(names, ["count(*)"]);
        let (_, names) = value_query(
            "SELECT count(*) < 10 OR (SELECT c FROM p) <> 'ok' AS exposed, count(*) FROM t",
        )
        .unwrap();
        assert_eq!(names, ["count(*)", "(SELECT c FROM p)"]);
        let (_, names) = value_query("SELECT NOT a = 1 FROM t").unwrap();
        assert_eq!(names, ["a"]);
    }

    #[test]
    fn nothing_to_compare_gives_no_query() {
        assert_eq!(
            value_query("SELECT NOT EXISTS (SELECT FROM t WHERE a = 1)"),
            None
        );
        assert_eq!(value_query("SELECT bool_and(a = b) FROM t"), None);
        assert_eq!(value_query("SELECT 1; SELECT a = 1 FROM t"), None);
        assert_eq!(value_query("UPDATE t SET a = 1"), None);
        assert_eq!(
            values(&["a".into()], &["ERROR 42P01: no table".into()]),
            Vec::<String>::new()
        );
        assert_eq!(
            values(&["a".into()], &["(0 rows)".into()]),
            Vec::<String>::new()
        );
    }
}
