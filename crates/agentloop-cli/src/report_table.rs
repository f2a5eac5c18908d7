//! Prints a [`ShutdownReport`] as a table (the library returns it; printing it is the
//! CLI's job, DESIGN S27).

use std::fmt::Write as _;
use std::time::Duration;

use agentloop::shutdown::{HookOutcome, ShutdownReport};

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The report as a two-column table, one line per figure.
pub(crate) fn report_table(r: &ShutdownReport) -> String {
    let mut rows: Vec<(String, String)> = vec![
        ("strategy".into(), r.strategy.clone()),
        (
            "force requested".into(),
            if r.force_requested {
                "yes (second signal)"
            } else {
                "no"
            }
            .into(),
        ),
        ("phase: drain gate".into(), ms(r.phases.gate)),
        ("phase: grace".into(), ms(r.phases.grace)),
        ("phase: force".into(), ms(r.phases.force)),
        ("phase: cleanup".into(), ms(r.phases.cleanup)),
        ("phase: total".into(), ms(r.phases.total)),
        ("sessions".into(), r.sessions.total.to_string()),
        (
            "  exited in grace".into(),
            r.sessions.exited_in_grace.to_string(),
        ),
        ("  forced".into(), r.sessions.forced.to_string()),
        ("  killed".into(), r.sessions.killed.to_string()),
        ("checkpoints saved".into(), r.checkpoints.saved.to_string()),
        (
            "checkpoints failed".into(),
            r.checkpoints.failed.to_string(),
        ),
        ("items saved".into(), r.checkpoints.items_saved.to_string()),
        (
            "items not saved".into(),
            r.checkpoints.items_unsaved.to_string(),
        ),
        ("late items".into(), r.late_items.to_string()),
        (
            "store flush".into(),
            r.store_flush_error.clone().unwrap_or_else(|| "ok".into()),
        ),
        (
            "cleanup hooks".into(),
            format!(
                "ok {} | failed {} | timed out {}",
                r.hooks_ok(),
                r.hooks_failed(),
                r.hooks_timed_out()
            ),
        ),
    ];
    for h in &r.hooks {
        let outcome = match &h.outcome {
            HookOutcome::Ok => "ok".to_string(),
            HookOutcome::Failed(e) => format!("failed: {e}"),
            HookOutcome::TimedOut => "timed out".to_string(),
        };
        rows.push((
            format!("  hook {}", h.name),
            format!("{outcome} ({})", ms(h.took)),
        ));
    }
    let left = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let right = rows.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let rule = format!("+-{}-+-{}-+\n", "-".repeat(left), "-".repeat(right));
    let mut out = String::new();
    out.push_str("shutdown report\n");
    out.push_str(&rule);
    for (k, v) in &rows {
        let _ = writeln!(out, "| {k:<left$} | {v:<right$} |");
    }
    out.push_str(&rule);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_is_a_row() {
        let mut r = ShutdownReport {
            strategy: "cooperative".into(),
            ..ShutdownReport::default()
        };
        r.sessions.total = 3;
        r.sessions.forced = 2;
        r.late_items = 7;
        let t = report_table(&r);
        assert!(t.contains("| strategy "), "{t}");
        assert!(t.contains("cooperative"));
        let row = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("| {name} ")))
                .unwrap_or_else(|| panic!("no row {name}: {t}"))
                .to_string()
        };
        assert!(row("sessions").contains(" 3 "));
        assert!(row("  forced").contains(" 2 "));
        assert!(row("late items").contains(" 7 "));
        // Every line of the table has the same width.
        let widths: Vec<usize> = t.lines().skip(1).map(str::len).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{t}");
    }
}
