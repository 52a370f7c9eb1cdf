//! Inline SVG pictures of a case: a race's sessions as bars over time with their
//! results (`details["races"]`, written by `case_kit::Ctx::race`), and a spec case's
//! permutations as swimlanes, one lane per session, with its `<waiting ...>` spans
//! (read from the transcript; `details["spec_sessions"]` names each step's session).

use std::collections::BTreeMap;

use maud::{Markup, html};
use serde_json::Value;

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
/// each labelled with its result.
fn race_bars(number: usize, race: &Value) -> Markup {
    let empty = Vec::new();
    let sessions = race["sessions"].as_array().unwrap_or(&empty);
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
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    html! {
        figure.race {
            figcaption { "Race " (number) ": " (sessions.len()) " sessions released by a barrier; each bar runs from its start to its result (clock read only to draw; " (end / 1000) " ms from the first start to the last result)" }
            svg xmlns="http://www.w3.org/2000/svg" width=(LABEL_PX + PLOT_PX + 260) height=(height) role="img" {
                @for (i, session) in sessions.iter().enumerate() {
                    @let y = 4 + LANE_PX * i as u32;
                    @let outcome = text(&session["outcome"]);
                    @let next = kinds.len();
                    @let colour = PALETTE[*kinds.entry(outcome_kind(&outcome)).or_insert(next) % PALETTE.len()];
                    @let x0 = scale(session["start_us"].as_u64().unwrap_or(0));
                    @let x1 = scale(session["end_us"].as_u64().unwrap_or(0)).max(x0 + 2.0);
                    text x="4" y=(y + 14) { "session " (i) }
                    rect x=(format!("{x0:.1}")) y=(y) width=(format!("{:.1}", x1 - x0)) height=(LANE_PX - 6) fill=(colour) {
                        title { (outcome) }
                    }
                    text x=(format!("{:.1}", x1 + 4.0)) y=(y + 14) { (short(&outcome, 40)) }
                }
            }
        }
    }
}

/// Colours of the outcome kinds, in order of appearance.
const PALETTE: [&str; 6] = [
    "#4c9a2a", "#c0392b", "#2e6fb7", "#d68910", "#7d3c98", "#5d6d7e",
];

/// The kind of a result, for its colour: its text with every run of digits as `#`
/// (`Ok(Ok)` and `Ok(Insufficient)` differ, two balances do not).
fn outcome_kind(outcome: &str) -> String {
    let mut kind = String::new();
    for c in outcome.chars() {
        if !c.is_ascii_digit() {
            kind.push(c);
        } else if !kind.ends_with('#') {
            kind.push('#');
        }
    }
    kind
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

/// The permutations of a spec case's transcript (`note permutation …`, `note   step X:
/// … <waiting ...>`, `note   step X: <... completed>`, results indented below).
fn permutations(transcript: &str) -> Vec<Permutation> {
    let mut found: Vec<Permutation> = Vec::new();
    let mut clock = 0;
    let mut last: Option<usize> = None;
    for line in transcript.lines() {
        let Some(note) = line.trim_start().strip_prefix("note ") else {
            continue;
        };
        if let Some(label) = note.strip_prefix("permutation ") {
            found.push(Permutation {
                label: format!("permutation {label}"),
                slots: Vec::new(),
            });
            clock = 0;
            last = None;
            continue;
        }
        let Some(permutation) = found.last_mut() else {
            continue;
        };
        if let Some(rest) = note.strip_prefix("  step ") {
            let (step, what) = rest.split_once(": ").unwrap_or((rest, ""));
            if what.starts_with("<... completed>") {
                let index = permutation.slots.iter().rposition(|s| s.step == step);
                if let Some(index) = index {
                    permutation.slots[index].done = clock;
                }
                last = index;
            } else {
                let waits = what.ends_with("<waiting ...>");
                permutation.slots.push(Slot {
                    step: step.to_string(),
                    sent: clock,
                    done: if waits { usize::MAX } else { clock },
                    outcome: Vec::new(),
                });
                last = (!waits).then(|| permutation.slots.len() - 1);
            }
            clock += 1;
        } else if let Some(result) = note.strip_prefix("    ")
            && let Some(index) = last
        {
            permutation.slots[index]
                .outcome
                .push(result.trim().to_string());
        } else {
            last = None;
        }
    }
    found
}

/// A permutation as swimlanes: a box per step in its session's lane at the slot it was
/// sent, a hatched span while it waited, its result as the box's tooltip and text.
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
    html! {
        figure.spec {
            figcaption { (permutation.label) }
            svg xmlns="http://www.w3.org/2000/svg" width=(x(slots) + 8) height=(height) role="img" {
                @for (i, (name, _)) in lanes.iter().enumerate() {
                    text x="4" y=(6 + (LANE_PX + 14) * i as u32 + 15) { "session " (name) }
                }
                @for slot in &permutation.slots {
                    @let y = 6 + (LANE_PX + 14) * lane_of(&slot.step) as u32;
                    @let outcome = slot.outcome.join("; ");
                    @if slot.done != slot.sent {
                        @let until = if slot.done == usize::MAX { slots } else { slot.done };
                        rect.waiting x=(x(slot.sent) + SLOT_PX / 2) y=(y + 4) width=(SLOT_PX * (until - slot.sent) as u32) height=(LANE_PX - 8) fill="#f5cba7" stroke="#d68910" stroke-dasharray="4 2" {
                            title { (slot.step) " <waiting ...>" }
                        }
                        @if slot.done != usize::MAX {
                            text x=(x(slot.done) + 4) y=(y + LANE_PX + 10) { (short(&outcome, 16)) }
                        }
                    }
                    rect.step x=(x(slot.sent) + 2) y=(y) width=(SLOT_PX - 4) height=(LANE_PX) rx="3" fill="#d6eaf8" stroke="#2e6fb7" {
                        title { (slot.step) ": " (outcome) }
                    }
                    text x=(x(slot.sent) + 6) y=(y + 15) { (short(&slot.step, 13)) }
                    @if slot.done == slot.sent {
                        text x=(x(slot.sent) + 4) y=(y + LANE_PX + 10) { (short(&outcome, 16)) }
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
}
