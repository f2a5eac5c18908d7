//! Shared helpers of the figures: summary statistics over rounds, the table and the
//! verdict line every figure ends with.

/// Summary of one side's per-round samples (each sample is a mean over one round).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Median over rounds.
    pub median: f64,
    /// Fastest round.
    pub min: f64,
    /// Slowest round.
    pub max: f64,
    /// How many rounds.
    pub rounds: usize,
}

/// The median of `samples` (mean of the two middle values for an even count).
///
/// Panics on an empty slice or a NaN sample: both are harness bugs.
pub fn median(samples: &[f64]) -> f64 {
    assert!(!samples.is_empty(), "median of no samples");
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("a NaN sample"));
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Median, min and max of `samples`.
pub fn summarize(samples: &[f64]) -> Summary {
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Summary {
        median: median(samples),
        min,
        max,
        rounds: samples.len(),
    }
}

/// Prints a table of sides: one row per `(side, summary)`, values in `unit`.
pub fn print_table(title: &str, unit: &str, rows: &[(&str, Summary)]) {
    let width = rows
        .iter()
        .map(|(side, _)| side.len())
        .chain(std::iter::once("side".len()))
        .max()
        .unwrap_or(4);
    let med = format!("median {unit}");
    println!("{title}");
    println!(
        "| {:<width$} | {:>14} | {:>10} | {:>10} | {:>6} |",
        "side", med, "min", "max", "rounds"
    );
    println!(
        "|{}|{}:|{}:|{}:|{}:|",
        "-".repeat(width + 2),
        "-".repeat(15),
        "-".repeat(11),
        "-".repeat(11),
        "-".repeat(7)
    );
    for (side, s) in rows {
        println!(
            "| {:<width$} | {:>14.3} | {:>10.3} | {:>10.3} | {:>6} |",
            side, s.median, s.min, s.max, s.rounds
        );
    }
}

/// The verdict line of a ratio figure whose target is an upper bound, e.g.
/// `B1 ratio=1.42 target<=2 ok`. It is the last line a figure prints.
pub fn ratio_line_max(id: &str, ratio: f64, target: f64) -> String {
    let verdict = if ratio <= target { "ok" } else { "FAIL" };
    format!("{id} ratio={ratio:.2} target<={target} {verdict}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn summary_bounds() {
        let s = summarize(&[5.0, 1.0, 3.0]);
        assert_eq!((s.median, s.min, s.max, s.rounds), (3.0, 1.0, 5.0, 3));
    }

    #[test]
    fn verdict_line() {
        assert_eq!(
            ratio_line_max("B1", 1.999, 2.0),
            "B1 ratio=2.00 target<=2 ok"
        );
        assert_eq!(ratio_line_max("B1", 2.0, 2.0), "B1 ratio=2.00 target<=2 ok");
        assert_eq!(
            ratio_line_max("B1", 2.5, 2.0),
            "B1 ratio=2.50 target<=2 FAIL"
        );
    }
}
