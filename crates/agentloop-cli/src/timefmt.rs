//! Human-readable times for the CLI: milliseconds since the Unix epoch as a UTC calendar
//! time (humantime's RFC 3339), and coarse ages.

/// The last second humantime writes (9999-12-31 23:59:59Z), in ms since the epoch.
const LAST_MS: u64 = 253_402_300_799_000;

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SSZ` (UTC, seconds truncated). A time
/// past year 9999 (only a damaged record holds one) shows as that year's last second.
pub(crate) fn utc(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.min(LAST_MS));
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replacen('T', " ", 1)
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
        assert_eq!(utc(u64::MAX), "9999-12-31 23:59:59Z");
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
