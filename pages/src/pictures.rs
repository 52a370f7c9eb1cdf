//! Inline SVG pictures of a case: a race's sessions as bars over time with their
//! results (`details["races"]`, written by `case_kit::Ctx::race`), and a spec case's
//! permutations as swimlanes, one lane per session, with its `<waiting ...>` spans
//! (read from the transcript; `details["spec_sessions"]` names each step's session).

use maud::{Markup, html};
use serde_json::Value;

use crate::kinds::{self, Kind};
use crate::text;

/// Pixels per lane (a race's session or a spec's session).
const LANE_PX: u32 = 22;
/// Pixels left of the bars, for the lane names.
const LABEL_PX: u32 = 110;
/// Width of the drawing area right of the labels.
const PLOT_PX: u32 = 720;
/// Width of one slot of a spec permutation.
const SLOT_PX: u32 = 92;

/// The pictures of `case` (none when it raced nothing and is no spec case).
pub fn for_case(case: &Value, transcript: &str) -> Markup {
    let details = &case["details"];
    html! {
        @if let Some(races) = details["races"].as_array() {
            @for (number, race) in races.iter().enumerate() {
                (race_bars(number + 1, race))
            }
        }
        @if let Some(sessions) = details["spec_sessions"].as_object() {
            @let lanes: Vec<(String, Vec<String>)> = sessions.iter().map(|(name, steps)| {
                (name.clone(), steps.as_array().map(|s| s.iter().map(text).collect()).unwrap_or_default())
            }).collect();
            @for permutation in permutations(transcript) {
                (swimlanes(&lanes, &permutation))
            }
        }
    }
}

/// A race's sessions as horizontal bars from start to end (the clock read only to draw),
/// each coloured by its result's kind ([`Kind`], the same colours on every page) and
/// labelled with its result's own words (cut to `LABEL_CHARS` with the whole text on
/// hover); a legend with each kind's count, and every session's result in full below.
fn race_bars(number: usize, race: &Value) -> Markup {
    let empty = Vec::new();
    let sessions = race["sessions"].as_array().unwrap_or(&empty);
    let results: Vec<(String, Kind)> = sessions
        .iter()
        .map(|s| {
            let (words, failed) = kinds::words(&text(&s["outcome"]));
            let kind = kinds::classify(&words, failed);
            (words, kind)
        })
        .collect();
    let first = sessions
        .iter()
        .filter_map(|s| s["start_us"].as_u64())
        .min()
        .unwrap_or(0);
    let end = sessions
        .iter()
        .filter_map(|s| s["end_us"].as_u64())
        .max()
        .unwrap_or(1)
        .saturating_sub(first)
        .max(1);
    let height = LANE_PX * sessions.len() as u32 + 24;
    let scale =
        |us: u64| LABEL_PX as f64 + (us.saturating_sub(first) as f64 / end as f64) * PLOT_PX as f64;
    let counts: Vec<(Kind, usize)> = results.iter().map(|(_, k)| (*k, 1)).collect();
    html! {
        figure.race {
            figcaption { "Race " (number) ": " (sessions.len()) " sessions released by a barrier; each bar runs from its start to its result, coloured by the result's kind (clock read only to draw; " (end / 1000) " ms from the first start to the last result)" }
            svg xmlns="http://www.w3.org/2000/svg" width=(LABEL_PX + PLOT_PX + LABEL_CHARS as u32 * 6 + 12) height=(height) role="img" {
                @for (i, (session, (words, kind))) in sessions.iter().zip(&results).enumerate() {
                    @let y = 4 + LANE_PX * i as u32;
                    @let x0 = scale(session["start_us"].as_u64().unwrap_or(0));
                    @let x1 = scale(session["end_us"].as_u64().unwrap_or(0)).max(x0 + 2.0);
                    text x="4" y=(y + 14) { "session " (i) }
                    rect.bar data-kind=(kind.name()) x=(format!("{x0:.1}")) y=(y) width=(format!("{:.1}", x1 - x0)) height=(LANE_PX - 6) fill=(kind.colour()) {
                        title { (kind.name()) ": " (words) }
                    }
                    text x=(format!("{:.1}", x1 + 4.0)) y=(y + 14) {
                        title { (words) }
                        (short(words, LABEL_CHARS))
                    }
                }
            }
            (kinds::legend(Some(&counts), html! {}))
            (results_in_full(&results))
        }
    }
}

/// Characters of a result shown beside its bar or under its box (the whole text is
/// on hover and in the table below the picture).
const LABEL_CHARS: usize = 60;

/// Each distinct result of a race in full, with its kind and the sessions that had it.
fn results_in_full(results: &[(String, Kind)]) -> Markup {
    let mut distinct: Vec<(&str, Kind, Vec<usize>)> = Vec::new();
    for (i, (words, kind)) in results.iter().enumerate() {
        match distinct.iter_mut().find(|(w, _, _)| w == words) {
            Some((_, _, sessions)) => sessions.push(i),
            None => distinct.push((words, *kind, vec![i])),
        }
    }
    html! {
        details.results {
            summary { "each result in full (" (distinct.len()) " distinct)" }
            table.results {
                tr { th { "kind" } th { "result" } th { "sessions" } }
                @for (words, kind, sessions) in &distinct {
                    tr data-kind=(kind.name()) {
                        td { span.swatch style={ "background:" (kind.colour()) } {} (kind.name()) }
                        td { code { (words) } }
                        td { (sessions.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")) }
                    }
                }
            }
        }
    }
}

fn short(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_string()
    } else {
        let cut: String = text.chars().take(chars).collect();
        format!("{cut}…")
    }
}

/// One step as a spec transcript shows it.
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    /// The step's name.
    step: String,
    /// The slot it was sent in.
    sent: usize,
    /// The slot it completed in (equal to `sent` unless it waited).
    done: usize,
    /// The lines printed below its completion.
    outcome: Vec<String>,
}

/// One permutation: its label and its steps.
#[derive(Debug, Clone, PartialEq)]
struct Permutation {
    label: String,
    slots: Vec<Slot>,
}

/// The permutations of a spec case's transcript, in either format the runner prints:
/// ours (`note permutation …`, or `note then: …` for the steps after a race; `note
/// step X: … <waiting ...>`, `note   step X: <... completed>`, results indented below)
/// and an upstream isolation spec's (`note starting permutation: …`, `note step X: …`,
/// results on the `note` lines that follow, unindented).
fn permutations(transcript: &str) -> Vec<Permutation> {
    let mut found: Vec<Permutation> = Vec::new();
    let mut upstream = false;
    let mut clock = 0;
    let mut last: Option<usize> = None;
    for line in transcript.lines() {
        let Some(note) = line.trim_start().strip_prefix("note ") else {
            last = None;
            continue;
        };
        let label = if let Some(label) = note.strip_prefix("permutation ") {
            Some((format!("permutation {label}"), false))
        } else if let Some(order) = note.strip_prefix("then: ") {
            Some((format!("after the race: {order}"), false))
        } else {
            note.strip_prefix("starting permutation: ")
                .map(|order| (format!("permutation: {order}"), true))
        };
        if let Some((label, format)) = label {
            found.push(Permutation {
                label,
                slots: Vec::new(),
            });
            (upstream, clock, last) = (format, 0, None);
            continue;
        }
        let Some(permutation) = found.last_mut() else {
            continue;
        };
        let step = if upstream {
            note.strip_prefix("step ")
        } else {
            note.strip_prefix("  step ")
        };
        if let Some(rest) = step {
            last = permutation.step(rest, clock);
            clock += 1;
        } else if let Some(index) = last
            && (upstream || note.starts_with("    "))
        {
            permutation.slots[index]
                .outcome
                .push(note.trim().to_string());
        } else {
            last = None;
        }
    }
    found
}

impl Permutation {
    /// Reads a step line (`X: …`, `X: … <waiting ...>` or `X: <... completed>`) at
    /// `clock`; returns the slot that prints the lines below it, if any.
    fn step(&mut self, rest: &str, clock: usize) -> Option<usize> {
        let (step, what) = rest
            .split_once(": ")
            .unwrap_or((rest.trim_end_matches(':'), ""));
        if what.starts_with("<... completed>") {
            let index = self.slots.iter().rposition(|s| s.step == step);
            if let Some(index) = index {
                self.slots[index].done = clock;
            }
            return index;
        }
        let waits = what.ends_with("<waiting ...>");
        self.slots.push(Slot {
            step: step.to_string(),
            sent: clock,
            done: if waits { usize::MAX } else { clock },
            outcome: Vec::new(),
        });
        (!waits).then(|| self.slots.len() - 1)
    }
}

/// A permutation as swimlanes: a box per step in its session's lane at the slot it was
/// sent, coloured by its result's kind ([`Kind`]), a hatched span while it waited, its
/// result under the box (cut, whole on hover); a legend, and every step's result in
/// full below.
fn swimlanes(lanes: &[(String, Vec<String>)], permutation: &Permutation) -> Markup {
    let slots = permutation
        .slots
        .iter()
        .map(|s| s.done.min(s.sent + 64).max(s.sent))
        .max()
        .unwrap_or(0)
        + 1;
    let lane_of = |step: &str| {
        lanes
            .iter()
            .position(|(_, steps)| steps.iter().any(|s| s == step))
            .unwrap_or(0)
    };
    let height = (LANE_PX + 14) * lanes.len() as u32 + 8;
    let x = |slot: usize| LABEL_PX + SLOT_PX * slot as u32;
    let results: Vec<(String, Kind)> = permutation
        .slots
        .iter()
        .map(|slot| {
            let outcome = slot.outcome.join("; ");
            let kind = kinds::classify(&outcome, false);
            (outcome, kind)
        })
        .collect();
    let counts: Vec<(Kind, usize)> = results.iter().map(|(_, k)| (*k, 1)).collect();
    html! {
        figure.spec {
            figcaption { (permutation.label) }
            svg xmlns="http://www.w3.org/2000/svg" width=(x(slots) + 8) height=(height) role="img" {
                defs {
                    pattern id="waiting-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)" {
                        rect width="6" height="6" fill="#eaecee" {}
                        line x1="0" y1="0" x2="0" y2="6" stroke="#85929e" stroke-width="2" {}
                    }
                }
                @for (i, (name, _)) in lanes.iter().enumerate() {
                    text x="4" y=(6 + (LANE_PX + 14) * i as u32 + 15) { "session " (name) }
                }
                @for (slot, (outcome, kind)) in permutation.slots.iter().zip(&results) {
                    @let y = 6 + (LANE_PX + 14) * lane_of(&slot.step) as u32;
                    @let below = if slot.done == slot.sent { Some(slot.sent) } else if slot.done == usize::MAX { None } else { Some(slot.done) };
                    @if slot.done != slot.sent {
                        @let until = if slot.done == usize::MAX { slots } else { slot.done };
                        rect.waiting x=(x(slot.sent) + SLOT_PX / 2) y=(y + 4) width=(SLOT_PX * (until - slot.sent) as u32) height=(LANE_PX - 8) fill="url(#waiting-hatch)" stroke="#85929e" stroke-dasharray="4 2" {
                            title { (slot.step) " <waiting ...>" }
                        }
                    }
                    rect.step data-kind=(kind.name()) x=(x(slot.sent) + 2) y=(y) width=(SLOT_PX - 4) height=(LANE_PX) rx="3" fill=(kind.tint()) stroke=(kind.colour()) stroke-width="2" {
                        title { (slot.step) " (" (kind.name()) "): " (outcome) }
                    }
                    text x=(x(slot.sent) + 6) y=(y + 15) { title { (slot.step) } (short(&slot.step, 13)) }
                    @if let Some(at) = below {
                        text x=(x(at) + 4) y=(y + LANE_PX + 10) { title { (outcome) } (short(outcome, 13)) }
                    }
                }
            }
            (kinds::legend(Some(&counts), html! {
                span.key { span.swatch.waiting {} b { "waiting" } " — sent, blocked until its " code { "<... completed>" } }
            }))
            (steps_in_full(permutation, &results))
        }
    }
}

/// Each step of a permutation with its result in full and its kind.
fn steps_in_full(permutation: &Permutation, results: &[(String, Kind)]) -> Markup {
    html! {
        details.results {
            summary { "each step's result in full" }
            table.results {
                tr { th { "step" } th { "kind" } th { "result" } }
                @for (slot, (outcome, kind)) in permutation.slots.iter().zip(results) {
                    tr data-kind=(kind.name()) {
                        td { code { (slot.step) } @if slot.done != slot.sent { " (waited)" } }
                        td { span.swatch style={ "background:" (kind.colour()) } {} (kind.name()) }
                        td { code { (outcome) } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_step_spans_until_its_completion() {
        let transcript = "\
  note permutation 1 of 1: a_debit b_debit a_commit b_commit
  note   step a_debit: UPDATE x
  note     balance=20
  note   step b_debit: UPDATE y <waiting ...>
  note   step a_commit: COMMIT
  note   step b_debit: <... completed>
  note     (0 rows)
  note   step b_commit: COMMIT
  note   teardown: SELECT 1
  note     x=1
";
        let found = permutations(transcript);
        assert_eq!(found.len(), 1);
        let slots = &found[0].slots;
        assert_eq!(slots.len(), 4);
        assert_eq!(
            (slots[1].step.as_str(), slots[1].sent, slots[1].done),
            ("b_debit", 1, 3)
        );
        assert_eq!(slots[1].outcome, vec!["(0 rows)".to_string()]);
        assert_eq!(slots[0].outcome, vec!["balance=20".to_string()]);
        assert!(slots[3].outcome.is_empty());
    }

    #[test]
    fn an_upstream_transcript_and_the_steps_after_a_race_are_read_too() {
        let transcript = "\
  note Parsed test spec with 2 sessions
  note starting permutation: s1as s2ae s1c
  note step s1as: LOCK TABLE a1; <waiting ...>
  note step s2ae: LOCK TABLE a1 IN ACCESS EXCLUSIVE MODE;
  note ERROR:  deadlock detected
  note step s1as: <... completed>
  note step s1c: COMMIT;
  ok   permutation 1 of 1 ran every step, none left waiting
  note then: rest
  note   step rest: post-debit account=acct-0001
  note     status=201 outcome=OK balance=0
";
        let found = permutations(transcript);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].label, "permutation: s1as s2ae s1c");
        let slots = &found[0].slots;
        assert_eq!((slots[0].sent, slots[0].done), (0, 2));
        assert_eq!(
            slots[1].outcome,
            vec!["ERROR:  deadlock detected".to_string()]
        );
        assert!(slots[2].outcome.is_empty());
        assert_eq!(found[1].label, "after the race: rest");
        assert_eq!(
            found[1].slots[0].outcome,
            vec!["status=201 outcome=OK balance=0".to_string()]
        );
    }

    /// One colour per kind whatever the order: a race whose first result is refused
    /// colours it as refused, and every picture carries the legend.
    #[test]
    fn a_result_is_coloured_by_its_kind_not_its_order() {
        let race = serde_json::json!({ "sessions": [
            { "start_us": 0, "end_us": 10, "outcome": "Ok(\"outcome=INSUFFICIENT balance=2\")" },
            { "start_us": 0, "end_us": 20, "outcome": "Ok(\"outcome=OK balance=9\")" },
            { "start_us": 0, "end_us": 30, "outcome": "Ok(\"503 UNKNOWN\")" },
            { "start_us": 0, "end_us": 40, "outcome": "Err(\"the racer panicked\")" },
        ]});
        let page = race_bars(1, &race).into_string();
        for kind in kinds::ALL {
            let bar = format!(r#"data-kind="{}" "#, kind.name());
            let at = page
                .find(&format!(r#"<rect class="bar" {bar}"#))
                .unwrap_or_else(|| panic!("no {} bar", kind.name()));
            assert!(
                page[at..].contains(&format!(r#"fill="{}""#, kind.colour())),
                "{page}"
            );
        }
        assert!(page.contains(r#"<div class="legend">"#), "{page}");
        assert!(page.contains(">outcome=INSUFFICIENT balance=2<"), "{page}");
        assert!(!page.contains("Ok("), "debug text on the page: {page}");
    }
}
