//! Timed figures in pairs: the ceiling, `batch` and `onetrip+fix` at 32 clients measured
//! as alternating short slices, round after round, so that a change in the machine's
//! speed hits the three alike; each round gives one ratio of each kind, and the figures
//! are the medians of those ratios with a distribution-free 95% interval (order
//! statistics of the binomial, docs/batch.md, "Timed in pairs").

use std::time::Duration;

use serde::Serialize;

use crate::load::{BenchDb, Measurement, Variant};

/// Rounds of slices by default (`--pair-rounds`): nine is the fewest whose median has a
/// 95% interval narrower than the whole range (ranks 2 and 8: 96.1%).
pub const DEFAULT_PAIR_ROUNDS: usize = 9;
/// Measured seconds of one slice by default (`--pair-slice-s`).
pub const DEFAULT_PAIR_SLICE_S: u64 = 2;
/// Unmeasured warm-up before each slice, milliseconds.
const PAIR_WARMUP_MS: u64 = 300;
/// Concurrent clients of every slice.
pub const PAIR_CLIENTS: usize = 32;
/// Labels the slices' random draws apart from the passes' repetitions.
const PAIR_REPETITION_BASE: usize = 1000;
/// The confidence the interval asks for.
const CONFIDENCE: f64 = 0.95;

/// A median with its distribution-free interval.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Interval {
    /// The median of the values.
    pub median: f64,
    /// The interval's lower end (an order statistic).
    pub low: f64,
    /// Its upper end.
    pub high: f64,
    /// The probability that the interval holds the true median, 0..1 (at least
    /// [`CONFIDENCE`] when there are six values or more; with fewer, the whole range's).
    pub coverage: f64,
}

/// The paired slices' figures.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// Rounds measured.
    pub rounds: usize,
    /// Measured seconds of each slice.
    pub slice_s: u64,
    /// Commits per second of the ceiling's slices, by round.
    pub ceiling_per_s: Vec<f64>,
    /// Debits per second of `batch`'s slices, by round.
    pub batch_per_s: Vec<f64>,
    /// Debits per second of `onetrip+fix`'s slices, by round.
    pub onetripfix_per_s: Vec<f64>,
    /// `batch` over the ceiling of the same round, in percent.
    pub batch_ceiling_pct: Interval,
    /// `batch` over `onetrip+fix` of the same round.
    pub batch_onetripfix: Interval,
    /// Whether every slice reconciled clean without a failed debit.
    pub clean: bool,
}

/// Runs `rounds` rounds of the three slices (ceiling, batch, onetrip+fix; every other
/// round in the opposite order, batch always in the middle, so a steady drift of the
/// machine's speed cancels in the ratios) and returns the figures; each slice prints a
/// line.
///
/// Errors: a slice failed.
pub async fn measure(
    db: &BenchDb,
    rounds: usize,
    slice: Duration,
    seed: u64,
) -> anyhow::Result<Paired> {
    let warmup = Duration::from_millis(PAIR_WARMUP_MS);
    let (mut ceiling, mut batch, mut onetripfix) = (Vec::new(), Vec::new(), Vec::new());
    let mut clean = true;
    for round in 0..rounds {
        let mut order = [Variant::Ceiling, Variant::Batch, Variant::OneTripFix];
        if round % 2 == 1 {
            order.reverse();
        }
        for variant in order {
            let m: Measurement = db
                .measure(
                    variant,
                    PAIR_CLIENTS,
                    PAIR_REPETITION_BASE + round,
                    (warmup, slice),
                    seed,
                )
                .await?;
            println!(
                "paired round {}/{rounds}: {}",
                round + 1,
                crate::report::progress(&m)
            );
            clean &= m.reconciled_clean && m.errors == 0;
            match variant {
                Variant::Ceiling => ceiling.push(m.debits_per_s),
                Variant::Batch => batch.push(m.debits_per_s),
                _ => onetripfix.push(m.debits_per_s),
            }
        }
    }
    let ratios = |top: &[f64], bottom: &[f64], scale: f64| -> Vec<f64> {
        top.iter()
            .zip(bottom)
            .map(|(a, b)| if *b > 0.0 { a / b * scale } else { 0.0 })
            .collect()
    };
    Ok(Paired {
        rounds,
        slice_s: slice.as_secs(),
        batch_ceiling_pct: interval(&ratios(&batch, &ceiling, 100.0)),
        batch_onetripfix: interval(&ratios(&batch, &onetripfix, 1.0)),
        ceiling_per_s: ceiling,
        batch_per_s: batch,
        onetripfix_per_s: onetripfix,
        clean,
    })
}

/// The median of `values` and the widest-ranked pair of order statistics whose binomial
/// coverage of the median is at least [`CONFIDENCE`]: ranks `k` and `n + 1 - k` cover it
/// with probability `1 - 2 P(B <= k - 1)`, B binomial(n, 1/2).
pub fn interval(values: &[f64]) -> Interval {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return Interval {
            median: f64::NAN,
            low: f64::NAN,
            high: f64::NAN,
            coverage: 0.0,
        };
    }
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let coverage_of = |k: usize| 1.0 - 2.0 * binomial_cdf_half(n, k - 1);
    let mut k = 1;
    while k < n.div_ceil(2) && coverage_of(k + 1) >= CONFIDENCE {
        k += 1;
    }
    Interval {
        median,
        low: sorted[k - 1],
        high: sorted[n - k],
        coverage: coverage_of(k),
    }
}

/// P(B <= k) for B binomial(n, 1/2).
fn binomial_cdf_half(n: usize, k: usize) -> f64 {
    let mut term = 0.5f64.powi(n as i32);
    let mut sum = 0.0;
    for i in 0..=k.min(n) {
        if i > 0 {
            term *= (n - i + 1) as f64 / i as f64;
        }
        sum += term;
    }
    sum
}

/// `median [low, high]` with `digits` decimals.
pub fn show(interval: &Interval, digits: usize) -> String {
    format!(
        "{:.digits$} [{:.digits$}, {:.digits$}]",
        interval.median, interval.low, interval.high
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nine_values_take_ranks_two_and_eight() {
        let values: Vec<f64> = (1..=9).map(f64::from).collect();
        let i = interval(&values);
        assert_eq!((i.median, i.low, i.high), (5.0, 2.0, 8.0));
        assert!((i.coverage - 0.9609).abs() < 1e-3, "{}", i.coverage);
    }

    #[test]
    fn few_values_take_the_whole_range() {
        let i = interval(&[3.0, 1.0, 2.0]);
        assert_eq!((i.median, i.low, i.high), (2.0, 1.0, 3.0));
        assert!(i.coverage < CONFIDENCE);
    }
}
