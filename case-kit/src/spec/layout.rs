//! PostgreSQL's expected-output layout for a spec's transcript, and the comparison of
//! two transcripts in meaning.
//!
//! The layout is the one PostgreSQL's isolation tester prints (its result sets through
//! libpq's `PQprint` with `align` and `fieldSep = "|"`, `src/interfaces/libpq/fe-print.c`):
//! a header of column names, a border of `-` joined by `+`, each row with numbers
//! right-aligned and other values left-aligned to the column's width, then
//! `(N rows)` and a blank line.
//!
//! Two transcripts mean the same when, line by line, they show the same steps with
//! the same SQL and the same `<waiting ...>` / `<... completed>` markers, the same
//! errors, notices and permutation headers, and the same rows: what is compared is
//! each line with table borders and blank lines dropped, table cells trimmed, and runs
//! of whitespace collapsed. Alignment and padding do not count.

/// A result set laid out as PostgreSQL's isolation tester prints it: header, border,
/// rows, `(N rows)` (`(1 row)` for one), and a blank line. A NULL prints as empty.
pub fn table(columns: &[String], rows: &[Vec<Option<String>>]) -> Vec<String> {
    let cell = |row: &Vec<Option<String>>, i: usize| row[i].clone().unwrap_or_default();
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            rows.iter()
                .map(|row| cell(row, i).chars().count())
                .chain([columns[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = Vec::new();
    let header: Vec<String> = columns
        .iter()
        .zip(&widths)
        .map(|(name, &width)| format!("{name:<width$}"))
        .collect();
    out.push(header.join("|"));
    let border: Vec<String> = widths.iter().map(|&width| "-".repeat(width)).collect();
    out.push(border.join("+"));
    for row in rows {
        let cells: Vec<String> = (0..columns.len())
            .map(|i| {
                let value = cell(row, i);
                let width = widths[i];
                if looks_numeric(&value) {
                    format!("{value:>width$}")
                } else {
                    format!("{value:<width$}")
                }
            })
            .collect();
        out.push(cells.join("|"));
    }
    let count = rows.len();
    out.push(format!(
        "({count} row{})",
        if count == 1 { "" } else { "s" }
    ));
    out.push(String::new());
    out
}

/// Whether libpq's `PQprint` right-aligns `value`: not empty, and only digits, signs,
/// dots, exponents and blanks.
fn looks_numeric(value: &str) -> bool {
    !value.is_empty() && value.chars().all(|c| "0123456789 +-.eE".contains(c))
}

/// The lines of `text` that carry meaning, normalized (see the module documentation).
pub fn meaningful(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .filter(|line| !line.chars().all(|c| c == '-' || c == '+'))
        .map(|line| {
            line.split('|')
                .map(|cell| cell.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

/// Compares `ours` with `expected` in meaning ([`meaningful`]).
///
/// Errors: the first line where they differ, with both lines (or which one ended first)
/// and its number among the meaningful lines.
pub fn same_meaning(ours: &str, expected: &str) -> Result<(), String> {
    let (ours, expected) = (meaningful(ours), meaningful(expected));
    for (index, (a, b)) in ours.iter().zip(&expected).enumerate() {
        if a != b {
            return Err(format!(
                "meaningful line {}: ours {a:?}, expected {b:?}",
                index + 1
            ));
        }
    }
    match ours.len().cmp(&expected.len()) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(format!(
            "ours ends after {} meaningful lines; expected goes on with {:?}",
            ours.len(),
            expected[ours.len()]
        )),
        std::cmp::Ordering::Greater => Err(format!(
            "expected ends after {} meaningful lines; ours goes on with {:?}",
            expected.len(),
            ours[expected.len()]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lays_out_a_result_set_as_the_isolation_tester_does() {
        let columns = vec!["id".to_string(), "balance".to_string()];
        let rows = vec![
            vec![Some("X".to_string()), Some("-11".to_string())],
            vec![Some("Y".to_string()), Some("20".to_string())],
        ];
        assert_eq!(
            table(&columns, &rows),
            [
                "id|balance",
                "--+-------",
                "X |    -11",
                "Y |     20",
                "(2 rows)",
                ""
            ]
        );
        assert_eq!(
            table(&["t".to_string()], &[vec![Some("t".to_string())]])[3],
            "(1 row)"
        );
    }

    #[test]
    fn compares_in_meaning_not_in_padding() {
        let expected = "step s3r: <... completed>\nid|balance\n--+-------\nX |    -11\n(1 row)\n\n";
        let padded = "step  s3r: <... completed>\nid | balance\n---+--------\nX  | -11\n(1 row)\n";
        assert_eq!(same_meaning(padded, expected), Ok(()));
        let other = padded.replace("-11", "-10");
        assert!(same_meaning(&other, expected).unwrap_err().contains("-10"));
        let short = "step s3r: <... completed>\n";
        assert!(
            same_meaning(short, expected)
                .unwrap_err()
                .contains("ours ends")
        );
        let waiting = padded.replace("<... completed>", "<waiting ...>");
        assert!(same_meaning(&waiting, expected).is_err());
    }
}
