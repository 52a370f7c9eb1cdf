//! Finding citations in a Markdown text: block markers (a line `<!-- cite: … -->` right
//! before a fenced block or a blockquote), inline markers (`<!-- cite: … -->14<!-- /cite
//! -->`), the illustrative marker, and fenced blocks of harness output that carry none.

use std::ops::Range;

/// How a marker's text starts.
const MARKER_OPEN: &str = "<!-- cite:";
/// How every marker ends.
const MARKER_CLOSE: &str = "-->";
/// The end of an inline citation's quoted text.
const INLINE_END: &str = "<!-- /cite -->";
/// The marker of a quote that is made up on purpose and cites nothing.
pub const ILLUSTRATIVE: &str = "none, illustrative";
/// The indentation, in spaces, that makes lines after a blank line an indented code
/// block (CommonMark).
const INDENTED_CODE: usize = 4;
/// How lines of harness output start: a case, a check passed or failed, the summary.
const OUTPUT_STARTS: [&str; 4] = ["CASE ", "  ok   ", "  FAIL ", "SUMMARY passed="];

/// Where a citation's quoted text sits in its text, in lines counted from 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quote {
    /// The content lines of a fenced block (fences excluded); `indent` is the fence's
    /// indentation, removed from each content line.
    Fenced { lines: Range<usize>, indent: usize },
    /// The lines of a blockquote (`> …`), compared with whitespace collapsed.
    Blockquote { lines: Range<usize> },
    /// The bytes between an inline marker and `<!-- /cite -->` on one line.
    Inline { line: usize, bytes: Range<usize> },
}

/// One thing found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A marker with a selector and the text it quotes.
    Citation {
        line: usize,
        selector: String,
        quote: Quote,
    },
    /// A block marker followed by neither a fenced block nor a blockquote.
    Unquoted { line: usize, selector: String },
    /// A quote marked `none, illustrative`.
    Illustrative { line: usize },
    /// A fenced block of harness output with no marker, at its opening fence.
    Uncited { line: usize },
}

/// The lines of `text` as [`Found`] and [`Quote`] count them.
pub fn lines(text: &str) -> Vec<&str> {
    text.split('\n').collect()
}

/// Everything `text` cites, marks illustrative, or quotes without a marker, in order.
pub fn scan(text: &str) -> Vec<Found> {
    let lines = lines(text);
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if let Some((fence, _)) = fence_open(line) {
            let end = fence_close(&lines, at, &fence);
            let content = at + 1..end;
            if !is_syntax_example(&lines[content.clone()]) && looks_like_output(&lines[content]) {
                found.push(Found::Uncited { line: at });
            }
            at = end + 1;
            continue;
        }
        if let Some(selector) = block_marker(line) {
            at = quoted_after(&lines, at, selector, &mut found);
            continue;
        }
        if let Some(end) = indented_block(&lines, at) {
            // Only output is skipped: an indented line that is not output may be a list
            // item's paragraph, whose inline markers count.
            let content: Vec<&str> = lines[at..end]
                .iter()
                .map(|l| strip_indent(l, INDENTED_CODE))
                .collect();
            if looks_like_output(&content) {
                found.push(Found::Uncited { line: at });
                at = end;
                continue;
            }
        }
        inline_markers(line, at, &mut found);
        at += 1;
    }
    found
}

/// After the block marker on line `at`: records what it quotes and returns the line to
/// go on from.
fn quoted_after(lines: &[&str], at: usize, selector: &str, found: &mut Vec<Found>) -> usize {
    let next = at + 1;
    let quote = if let Some((fence, indent)) = lines.get(next).and_then(|l| fence_open(l)) {
        let end = fence_close(lines, next, &fence);
        Some((
            Quote::Fenced {
                lines: next + 1..end,
                indent,
            },
            end + 1,
        ))
    } else if let Some(end) = indented_block(lines, next) {
        Some((
            Quote::Fenced {
                lines: next..end,
                indent: INDENTED_CODE,
            },
            end,
        ))
    } else if lines
        .get(next)
        .is_some_and(|l| l.trim_start().starts_with('>'))
    {
        let end = (next..lines.len())
            .find(|&i| !lines[i].trim_start().starts_with('>'))
            .unwrap_or(lines.len());
        Some((Quote::Blockquote { lines: next..end }, end))
    } else {
        None
    };
    let selector = selector.to_string();
    match quote {
        Some(_) if selector == ILLUSTRATIVE => {
            found.push(Found::Illustrative { line: at });
            quote.map_or(next, |(_, resume)| resume)
        }
        Some((quote, resume)) => {
            found.push(Found::Citation {
                line: at,
                selector,
                quote,
            });
            resume
        }
        None => {
            found.push(Found::Unquoted { line: at, selector });
            next
        }
    }
}

/// The inline markers on `line` outside code spans.
fn inline_markers(line: &str, at: usize, found: &mut Vec<Found>) {
    let mut from = 0;
    while let Some(start) = line[from..].find(MARKER_OPEN).map(|i| i + from) {
        let Some(close) = line[start..].find(MARKER_CLOSE).map(|i| i + start) else {
            return;
        };
        let selector = line[start + MARKER_OPEN.len()..close].trim().to_string();
        let quoted_from = close + MARKER_CLOSE.len();
        let Some(end) = line[quoted_from..]
            .find(INLINE_END)
            .map(|i| i + quoted_from)
        else {
            return;
        };
        // An odd number of backticks before the marker: it is inside a code span.
        let in_code = line[..start].matches('`').count() % 2 == 1;
        if !in_code {
            found.push(if selector == ILLUSTRATIVE {
                Found::Illustrative { line: at }
            } else {
                Found::Citation {
                    line: at,
                    selector,
                    quote: Quote::Inline {
                        line: at,
                        bytes: quoted_from..end,
                    },
                }
            });
        }
        from = end + INLINE_END.len();
    }
}

/// The selector of a block marker: a line holding `<!-- cite: … -->` and nothing else.
fn block_marker(line: &str) -> Option<&str> {
    let inner = line
        .trim()
        .strip_prefix(MARKER_OPEN)?
        .strip_suffix(MARKER_CLOSE)?;
    (!inner.contains(MARKER_CLOSE)).then(|| inner.trim())
}

/// An opening fence (three or more backticks or tildes, indented at most three spaces):
/// the fence and its indentation.
fn fence_open(line: &str) -> Option<(String, usize)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let mark = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let fence: String = rest.chars().take_while(|c| *c == mark).collect();
    (indent <= 3 && fence.len() >= 3).then_some((fence, indent))
}

/// An indented code block starting on line `at` (a line indented by
/// [`INDENTED_CODE`] spaces or more after a blank line, a marker or the text's start):
/// the line after its last non-blank line.
fn indented_block(lines: &[&str], at: usize) -> Option<usize> {
    let indented = |line: &str| {
        line.trim().is_empty() || line.len() - line.trim_start_matches(' ').len() >= INDENTED_CODE
    };
    let opens = lines
        .get(at)
        .is_some_and(|l| !l.trim().is_empty() && indented(l));
    let after_break =
        at == 0 || lines[at - 1].trim().is_empty() || block_marker(lines[at - 1]).is_some();
    if !opens || !after_break {
        return None;
    }
    let run_end = (at..lines.len())
        .find(|&i| !indented(lines[i]))
        .unwrap_or(lines.len());
    (at..run_end)
        .rev()
        .find(|&i| !lines[i].trim().is_empty())
        .map(|last| last + 1)
}

/// The line closing the fence opened on line `open` (the text's end if none does).
fn fence_close(lines: &[&str], open: usize, fence: &str) -> usize {
    let mark = fence.chars().next().unwrap_or('`');
    (open + 1..lines.len())
        .find(|&i| {
            let trimmed = lines[i].trim();
            trimmed.len() >= fence.len() && trimmed.chars().all(|c| c == mark)
        })
        .unwrap_or(lines.len())
}

/// Whether the lines read like harness output (a case, a check, the summary).
fn looks_like_output(content: &[&str]) -> bool {
    content.iter().any(|line| {
        let line = line.trim_start_matches(' ');
        let indented = format!("  {line}");
        OUTPUT_STARTS
            .iter()
            .any(|start| line.starts_with(start) || indented.starts_with(start))
    })
}

/// Whether a fenced block shows the marker syntax itself (an example of a citation, as
/// in docs/citing.md): such a block is not inspected.
fn is_syntax_example(content: &[&str]) -> bool {
    content.iter().any(|line| line.contains(MARKER_OPEN))
}

/// The text a quote holds as it is compared: a fenced block's lines without the fence's
/// indentation and trailing whitespace; a blockquote's without `>`; an inline quote
/// trimmed.
pub fn quoted_text(lines: &[&str], quote: &Quote) -> String {
    match quote {
        Quote::Fenced {
            lines: range,
            indent,
        } => lines[range.clone()]
            .iter()
            .map(|line| strip_indent(line, *indent).trim_end())
            .collect::<Vec<_>>()
            .join("\n"),
        Quote::Blockquote { lines: range } => lines[range.clone()]
            .iter()
            .map(|line| {
                let rest = line.trim_start().trim_start_matches('>');
                rest.strip_prefix(' ').unwrap_or(rest).trim_end()
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Quote::Inline { line, bytes } => lines[*line][bytes.clone()].trim().to_string(),
    }
}

/// `line` without up to `indent` leading spaces.
fn strip_indent(line: &str, indent: usize) -> &str {
    let spaces = line.len() - line.trim_start_matches(' ').len();
    &line[spaces.min(indent)..]
}

/// The lines that replace `quote` so that it holds `current`.
pub fn replacement(lines: &[&str], quote: &Quote, current: &str) -> Vec<String> {
    match quote {
        Quote::Fenced { indent, .. } => current
            .lines()
            .map(|line| {
                if line.is_empty() {
                    String::new()
                } else {
                    format!("{}{line}", " ".repeat(*indent))
                }
            })
            .collect(),
        Quote::Blockquote { lines: range } => {
            let first = lines.get(range.start).copied().unwrap_or_default();
            let lead = &first[..first.len() - first.trim_start().len()];
            current
                .lines()
                .map(|line| format!("{lead}> {line}").trim_end().to_string())
                .collect()
        }
        Quote::Inline { line, bytes } => {
            let text = lines[*line];
            vec![format!(
                "{}{current}{}",
                &text[..bytes.start],
                &text[bytes.end..]
            )]
        }
    }
}

/// The lines of `quote` that [`replacement`]'s lines replace.
pub fn replaced_lines(quote: &Quote) -> Range<usize> {
    match quote {
        Quote::Fenced { lines, .. } | Quote::Blockquote { lines } => lines.clone(),
        Quote::Inline { line, .. } => *line..*line + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_block_inline_illustrative_and_uncited() {
        let text = "intro\n\
            <!-- cite: snapshot L/L3 from \"CASE L3\" -->\n\
            ```text\n\
            CASE L3 :: x\n\
            ```\n\
            ok=<!-- cite: figure L/L3 /ok=(\\d+)/ -->14<!-- /cite --> and `<!-- cite: x -->1<!-- /cite -->`\n\
            <!-- cite: none, illustrative -->\n\
            ```\n\
            \x20 FAIL made up\n\
            ```\n\
            ```\n\
            SUMMARY passed=1 failed=0\n\
            ```\n\
            > not cited\n\
            <!-- cite: limit \"Probing\" -->\n\
            > **Probing.** text\n";
        let found = scan(text);
        assert_eq!(found.len(), 5, "{found:#?}");
        assert_eq!(
            found[0],
            Found::Citation {
                line: 1,
                selector: "snapshot L/L3 from \"CASE L3\"".into(),
                quote: Quote::Fenced {
                    lines: 3..4,
                    indent: 0
                },
            }
        );
        let Found::Citation { quote, .. } = &found[1] else {
            panic!("{found:?}")
        };
        assert_eq!(quoted_text(&lines(text), quote), "14");
        assert_eq!(found[2], Found::Illustrative { line: 6 });
        assert_eq!(found[3], Found::Uncited { line: 10 });
        let Found::Citation { quote, .. } = &found[4] else {
            panic!("{found:?}")
        };
        assert_eq!(quoted_text(&lines(text), quote), "**Probing.** text");
    }

    #[test]
    fn indented_code_blocks_are_inspected_and_can_be_cited() {
        let text = "ends with\n\n    SUMMARY passed=1 failed=0\n\nmore\n\n\
            <!-- cite: none, illustrative -->\n    CASE L3 :: made up\n\n\
            <!-- cite: snapshot L/L3 from \"CASE L3\" -->\n    CASE L3 :: x\n\n    \x20 ok   y\n\n\
            - a list item\n\n    its paragraph, <!-- cite: figure L/L3 /(1)/ -->1<!-- /cite -->\n";
        let found = scan(text);
        assert_eq!(found.len(), 4, "{found:#?}");
        assert_eq!(found[0], Found::Uncited { line: 2 });
        assert_eq!(found[1], Found::Illustrative { line: 6 });
        let Found::Citation { quote, .. } = &found[2] else {
            panic!("{found:?}")
        };
        assert_eq!(
            *quote,
            Quote::Fenced {
                lines: 10..13,
                indent: 4
            }
        );
        assert_eq!(quoted_text(&lines(text), quote), "CASE L3 :: x\n\n  ok   y");
        assert!(
            matches!(&found[3], Found::Citation { selector, .. } if selector == "figure L/L3 /(1)/")
        );
    }

    #[test]
    fn an_example_of_the_syntax_is_not_uncited() {
        let text = "````markdown\n<!-- cite: snapshot L/L3 -->\n```\nCASE L3 :: x\n```\n````\n";
        assert!(scan(text).is_empty());
    }

    #[test]
    fn a_marker_without_a_block_is_unquoted() {
        let found = scan("<!-- cite: snapshot L/L3 -->\n\nno block\n");
        assert_eq!(
            found,
            vec![Found::Unquoted {
                line: 0,
                selector: "snapshot L/L3".into()
            }]
        );
    }

    #[test]
    fn replacement_keeps_indent_and_surroundings() {
        let text = "- a list item:\n  ```\n  old\n  ```\nx <!-- cite: figure L/L3 /(1)/ -->9<!-- /cite --> y";
        let found = scan(text);
        let lines = lines(text);
        let Found::Citation { quote, .. } = &found[0] else {
            panic!("{found:?}")
        };
        assert_eq!(replaced_lines(quote), 4..5);
        assert_eq!(
            replacement(&lines, quote, "1"),
            vec!["x <!-- cite: figure L/L3 /(1)/ -->1<!-- /cite --> y"]
        );
        let fenced = Quote::Fenced {
            lines: 2..3,
            indent: 2,
        };
        assert_eq!(quoted_text(&lines, &fenced), "old");
        assert_eq!(
            replacement(&lines, &fenced, "new\n\nlines"),
            vec!["  new", "", "  lines"]
        );
    }
}
