//! Human-readable times for the CLI, without a date library: milliseconds since the Unix
//! epoch to a UTC calendar time (proleptic Gregorian calendar).

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SSZ` (UTC, seconds truncated).
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// How long before `now_ms` the time `then_ms` was, coarsely (`5s`, `3m 12s`, `2h 5m`,
/// `4d 1h`); `in the future` if it is after `now_ms`.
pub(crate) fn age(then_ms: u64, now_ms: u64) -> String {
    let Some(ms) = now_ms.checked_sub(then_ms) else {
        return "in the future".to_string();
    };
    let s = ms / 1000;
    let ago = match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    };
    format!("{ago} ago")
}

/// The civil date of day `days` after 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01 so leap days fall at the end of a year.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097; // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1st
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(999), "1970-01-01 00:00:00Z");
        assert_eq!(utc(1_795_317_338_000), "2026-11-22 03:15:38Z");
        assert_eq!(utc(951_868_799_000), "2000-02-29 23:59:59Z");
        assert_eq!(utc(4_107_542_400_000), "2100-03-01 00:00:00Z");
        assert_eq!(utc(4_107_542_399_000), "2100-02-28 23:59:59Z");
    }

    #[test]
    fn extreme_values_do_not_panic() {
        let s = utc(u64::MAX);
        assert!(s.ends_with('Z'), "{s}");
    }

    #[test]
    fn ages() {
        assert_eq!(age(1_000, 6_500), "5s ago");
        assert_eq!(age(0, 192_000), "3m 12s ago");
        assert_eq!(age(0, 7_500_000), "2h 5m ago");
        assert_eq!(age(0, 90_000_000), "1d 1h ago");
        assert_eq!(age(10, 5), "in the future");
    }
}
