//! The verb reference in `docs/specs.md` is the verb tables themselves: the text
//! between `<!-- verbs: begin -->` and `<!-- verbs: end -->` must be what
//! `harness::verb_reference` makes from every family's declared verb sets, so a verb
//! added, removed or changed in a table fails here until the doc says so too. Run with
//! `LEDGER_WRITE_VERBS=1` to write the reference into the doc.

use std::path::PathBuf;

const BEGIN: &str = "<!-- verbs: begin -->\n";
const END: &str = "<!-- verbs: end -->";

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/specs.md")
}

#[test]
fn the_docs_verb_reference_is_the_verb_tables() {
    let path = doc_path();
    let text = std::fs::read_to_string(&path).expect("docs/specs.md");
    let start = text
        .find(BEGIN)
        .expect("docs/specs.md has a verbs: begin marker")
        + BEGIN.len();
    let end = start + text[start..].find(END).expect("and a verbs: end marker");
    let made = harness::verb_reference();
    if std::env::var_os("LEDGER_WRITE_VERBS").is_some() {
        let written = format!("{}{made}{}", &text[..start], &text[end..]);
        std::fs::write(&path, written).expect("write docs/specs.md");
        return;
    }
    let shown = &text[start..end];
    if shown != made {
        let diff = similar::TextDiff::from_lines(shown, made.as_str())
            .unified_diff()
            .header("docs/specs.md", "the verb tables")
            .to_string();
        panic!(
            "docs/specs.md's verb reference differs from the tables; \
             LEDGER_WRITE_VERBS=1 cargo test -p harness --test verbs writes it:\n{diff}"
        );
    }
    assert!(
        made.contains("| `debit account=X amount=N key=X [client=X]` | L"),
        "{made}"
    );
}

#[test]
fn every_declared_verb_is_listed_and_a_name_that_is_no_family_is_refused() {
    let families = harness::families();
    let listed = harness::verb_listing(&families, &["L".to_string()]).expect("L");
    for set in cases_ledger::verbs::ALL {
        for verb in set.verbs {
            assert!(
                listed.contains(&format!("  {}\n", verb.usage())),
                "{}",
                verb.name
            );
        }
    }
    let refused = harness::verb_listing(&families, &["Q".to_string()]).expect_err("Q");
    assert!(refused.contains("\"Q\""), "{refused}");
}
