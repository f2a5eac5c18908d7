//! Durations as people read them in messages and in the configuration file (`"30s"`,
//! `"250ms"`): one way to write a duration, shared by every error and log line that
//! names one, so none of them imports the configuration to do it. Text only; it decides
//! nothing.

use std::time::Duration;

/// Formats a duration the way the configuration file writes it: whole seconds as
/// `"30s"`, anything else in milliseconds (`"250ms"`).
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_read_as_seconds_and_the_rest_as_milliseconds() {
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
    }
}
