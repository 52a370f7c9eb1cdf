//! PostgreSQL's own spec format, read natively, so a spec copied from PostgreSQL's
//! `src/test/isolation/specs/` runs unchanged. The grammar is the one PostgreSQL's
//! isolation tester reads (`specparse.y` and `specscanner.l` there); the reader is ours:
//!
//! ```text
//! spec        := setup* [teardown] session+ permutation*
//! setup       := "setup" SQL            teardown := "teardown" SQL
//! session     := "session" NAME ["setup" SQL] step+ ["teardown" SQL]
//! step        := "step" NAME SQL
//! permutation := "permutation" entry+
//! entry       := NAME ["(" blocker ("," blocker)* ")"]
//! blocker     := "*" | NAME ["notices" INTEGER]
//! SQL         := "{" any text up to the first "}" "}"   (outer whitespace trimmed)
//! NAME        := [A-Za-z_][A-Za-z0-9_]* | "double-quoted, "" for a quote"
//! ```
//!
//! A `#` outside braces starts a comment to the end of the line. The title, claim and
//! the rest of a case's description are not part of this format: they come from the
//! file beside it (see [`super::cases_in`]).

use super::model::{Action, Blocker, Entry, Layout, ParseError, Session, Spec, Step, error};

/// Longest spec file in PostgreSQL's format: generous for upstream's specs (the longest,
/// `eval-plan-qual.spec`, has about 400 lines).
pub const MAX_UPSTREAM_SPEC_LINES: usize = 2000;

/// One token, with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// An unquoted word (a keyword or a name).
    Word(String),
    /// A double-quoted name.
    Quoted(String),
    /// The text between `{` and `}`, outer whitespace trimmed.
    Sql(String),
    /// `(`, `)`, `,` or `*`.
    Punct(char),
    /// Digits.
    Number(usize),
}

/// Whether `text` looks like PostgreSQL's format rather than ours: its first word (after
/// blank lines and `#` comments) is `setup`, `teardown`, `session` or `permutation` not
/// followed by a colon.
pub fn is_upstream(text: &str) -> bool {
    let Some(first) = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
    else {
        return false;
    };
    let word: String = first
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let rest = first[word.len()..].trim_start();
    ["setup", "teardown", "session", "permutation"].contains(&word.as_str())
        && !rest.starts_with(':')
        && !rest.starts_with("call")
}

fn tokens(text: &str) -> Result<Vec<(usize, Token)>, ParseError> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let (mut at, mut line) = (0, 1);
    while at < chars.len() {
        let c = chars[at];
        let start = line;
        if c == '\n' {
            line += 1;
            at += 1;
        } else if c.is_whitespace() {
            at += 1;
        } else if c == '#' {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if c == '{' {
            let end = (at + 1..chars.len())
                .find(|&i| chars[i] == '}')
                .ok_or_else(|| error(start, "a `{` without its `}`"))?;
            let body: String = chars[at + 1..end].iter().collect();
            line += body.matches('\n').count();
            out.push((start, Token::Sql(body.trim().to_string())));
            at = end + 1;
        } else if c == '"' {
            let mut name = String::new();
            at += 1;
            loop {
                match chars.get(at) {
                    None | Some('\n') => return Err(error(start, "a name without its closing \"")),
                    Some('"') if chars.get(at + 1) == Some(&'"') => {
                        name.push('"');
                        at += 2;
                    }
                    Some('"') => break,
                    Some(&other) => {
                        name.push(other);
                        at += 1;
                    }
                }
            }
            at += 1;
            out.push((start, Token::Quoted(name)));
        } else if "(),*".contains(c) {
            out.push((start, Token::Punct(c)));
            at += 1;
        } else if c.is_ascii_digit() {
            let digits: String = chars[at..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            at += digits.len();
            let number = digits
                .parse()
                .map_err(|_| error(start, "a number too large"))?;
            out.push((start, Token::Number(number)));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let word: String = chars[at..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                .collect();
            at += word.len();
            out.push((start, Token::Word(word)));
        } else {
            return Err(error(start, format!("unexpected character {c:?}")));
        }
    }
    Ok(out)
}

/// A cursor over the tokens.
struct Reader {
    tokens: Vec<(usize, Token)>,
    at: usize,
}

impl Reader {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).map(|(_, token)| token)
    }

    fn line(&self) -> usize {
        self.tokens
            .get(self.at)
            .or(self.tokens.last())
            .map_or(0, |(line, _)| *line)
    }

    fn keyword(&mut self, word: &str) -> bool {
        if self.peek() == Some(&Token::Word(word.to_string())) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn sql(&mut self, what: &str) -> Result<String, ParseError> {
        match self.peek() {
            Some(Token::Sql(sql)) => {
                let sql = sql.clone();
                self.at += 1;
                Ok(sql)
            }
            _ => Err(error(
                self.line(),
                format!("{what} takes a {{ SQL }} block"),
            )),
        }
    }

    fn name(&mut self, what: &str) -> Result<String, ParseError> {
        match self.peek() {
            Some(Token::Word(name) | Token::Quoted(name)) => {
                let name = name.clone();
                self.at += 1;
                Ok(name)
            }
            _ => Err(error(self.line(), format!("{what} takes a name"))),
        }
    }

    fn punct(&mut self, c: char) -> bool {
        if self.peek() == Some(&Token::Punct(c)) {
            self.at += 1;
            true
        } else {
            false
        }
    }
}

/// Parses a spec in PostgreSQL's format into its setup, teardown, sessions and
/// permutations (with their markers), laid out as [`Layout::Postgres`]. The title,
/// claim, failure, system and cleanliness are left empty for the caller to fill.
///
/// Errors: the first token that does not fit the grammar, with its line; more than
/// [`MAX_UPSTREAM_SPEC_LINES`] lines; a step name used twice; a permutation or a marker
/// naming an unknown step.
pub fn parse_upstream(text: &str) -> Result<Spec, ParseError> {
    let lines = text.lines().count();
    if lines > MAX_UPSTREAM_SPEC_LINES {
        return Err(error(
            0,
            format!("{lines} lines; a spec has at most {MAX_UPSTREAM_SPEC_LINES}"),
        ));
    }
    let mut reader = Reader {
        tokens: tokens(text)?,
        at: 0,
    };
    let mut spec = Spec {
        layout: Layout::Postgres,
        ..Spec::default()
    };
    while reader.keyword("setup") {
        spec.setup.push(Action::Sql(reader.sql("setup")?));
    }
    if reader.keyword("teardown") {
        spec.teardown.push(reader.sql("teardown")?);
    }
    while reader.keyword("session") {
        spec.sessions.push(session(&mut reader)?);
    }
    while reader.keyword("permutation") {
        let mut entries = Vec::new();
        while matches!(reader.peek(), Some(Token::Quoted(_)))
            || matches!(reader.peek(), Some(Token::Word(w)) if w != "permutation")
        {
            entries.push(entry(&mut reader)?);
        }
        if entries.is_empty() {
            return Err(error(
                reader.line(),
                "a permutation names at least one step",
            ));
        }
        spec.permutations.push(entries);
    }
    if reader.peek().is_some() {
        return Err(error(reader.line(), "expected `session` or `permutation`"));
    }
    check(&spec)?;
    Ok(spec)
}

fn session(reader: &mut Reader) -> Result<Session, ParseError> {
    let mut session = Session {
        name: reader.name("session")?,
        ..Session::default()
    };
    if reader.keyword("setup") {
        session.setup.push(reader.sql("setup")?);
    }
    while reader.keyword("step") {
        let name = reader.name("step")?;
        let sql = reader.sql("a step")?;
        session.steps.push(Step {
            name,
            action: Action::Sql(sql),
        });
    }
    if reader.keyword("teardown") {
        session.teardown.push(reader.sql("teardown")?);
    }
    if session.steps.is_empty() {
        return Err(error(
            reader.line(),
            format!("session {} has no step", session.name),
        ));
    }
    Ok(session)
}

fn entry(reader: &mut Reader) -> Result<Entry, ParseError> {
    let mut entry = Entry::plain(reader.name("a permutation")?);
    if !reader.punct('(') {
        return Ok(entry);
    }
    loop {
        if reader.punct('*') {
            entry.blockers.push(Blocker::Once);
        } else {
            let other = reader.name("a marker")?;
            if reader.keyword("notices") {
                let line = reader.line();
                match reader.peek() {
                    Some(Token::Number(n)) => {
                        let n = *n;
                        reader.at += 1;
                        entry.blockers.push(Blocker::Notices(other, n));
                    }
                    _ => return Err(error(line, "`notices` takes a number")),
                }
            } else {
                entry.blockers.push(Blocker::Step(other));
            }
        }
        if reader.punct(')') {
            return Ok(entry);
        }
        if !reader.punct(',') {
            return Err(error(
                reader.line(),
                "markers are separated by `,` and end with `)`",
            ));
        }
    }
}

/// Step names unique, and every step a permutation or a marker names defined.
fn check(spec: &Spec) -> Result<(), ParseError> {
    let mut seen = std::collections::BTreeSet::new();
    for step in spec.sessions.iter().flat_map(|s| &s.steps) {
        if !seen.insert(step.name.as_str()) {
            return Err(error(0, format!("step {:?} is defined twice", step.name)));
        }
    }
    if spec.sessions.is_empty() {
        return Err(error(0, "a spec has at least one session"));
    }
    for entry in spec.permutations.iter().flatten() {
        let mut named = vec![entry.name.as_str()];
        for blocker in &entry.blockers {
            if let Blocker::Step(other) | Blocker::Notices(other, _) = blocker {
                named.push(other);
            }
        }
        if let Some(unknown) = named.into_iter().find(|name| !seen.contains(name)) {
            return Err(error(
                0,
                format!("permutation names unknown step {unknown:?}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "# comment\nsetup\n{\n  CREATE TABLE a1 ();\n}\nsetup { SELECT 1; }\n\
        teardown { DROP TABLE a1; }\n\nsession s1\nsetup\t\t{ BEGIN; }\n\
        step s1a\t{ LOCK TABLE a1; }\nstep \"s1 \"\"b\"\"\" { COMMIT; }\n\
        session \"s2\"\nstep s2a { SELECT 2; }\nteardown { ROLLBACK; }\n\
        permutation s1a(*) s2a(s1a, s1a notices 2) \"s1 \"\"b\"\"\"\npermutation s2a s1a\n";

    #[test]
    fn reads_postgres_format_with_markers_and_quoted_names() {
        assert!(is_upstream(SPEC));
        assert!(!is_upstream("# x\ntitle: t\nsetup: SELECT 1"));
        let spec = parse_upstream(SPEC).expect("parses");
        assert_eq!(spec.layout, Layout::Postgres);
        assert_eq!(
            spec.setup,
            vec![
                Action::Sql("CREATE TABLE a1 ();".into()),
                Action::Sql("SELECT 1;".into())
            ]
        );
        assert_eq!(spec.teardown, vec!["DROP TABLE a1;".to_string()]);
        assert_eq!(spec.sessions[0].steps[1].name, "s1 \"b\"");
        assert_eq!(spec.sessions[1].teardown, vec!["ROLLBACK;".to_string()]);
        assert_eq!(spec.permutations.len(), 2);
        assert_eq!(spec.permutations[0][0].blockers, vec![Blocker::Once]);
        assert_eq!(
            spec.permutations[0][1].blockers,
            vec![
                Blocker::Step("s1a".into()),
                Blocker::Notices("s1a".into(), 2)
            ]
        );
    }

    #[test]
    fn refuses_what_does_not_fit_the_grammar() {
        for (text, expected) in [
            (SPEC.replace("s2a(s1a,", "s2a(zz,"), "unknown step"),
            (SPEC.replace("step s2a", "step s1a"), "defined twice"),
            (SPEC.replace("{ ROLLBACK; }", "{ ROLLBACK;"), "without its"),
            (SPEC.replace("notices 2", "notices x"), "takes a number"),
            (SPEC.replace("step s2a { SELECT 2; }", ""), "has no step"),
        ] {
            let error = parse_upstream(&text).expect_err(expected);
            assert!(
                error.message.contains(expected),
                "{error} lacks {expected:?}"
            );
        }
    }
}
