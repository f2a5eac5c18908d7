//! How one value of the configuration is read and range-checked: durations in
//! `humantime`'s grammar, timeouts, positive counts, the store's engine and durability,
//! `idle_after`. Each refusal is a [`ConfigError`] naming the key and what is allowed;
//! the tables themselves are read in the module above.

use std::time::Duration;

use super::ConfigError;
use crate::store::{Engine, StoreDurability};

/// A timeout of the `[http]` table: above 0, at most 300 s.
pub(super) fn io_timeout(
    key: &'static str,
    v: Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let allowed = "a duration above 0 and at most 300s";
    let d = duration(key, &v, allowed)?;
    check_range(key, d, Duration::from_secs(300), allowed)?;
    Ok(Some(d))
}

/// A positive whole number of the `[http]` table.
pub(super) fn positive(key: &'static str, n: Option<i64>) -> Result<Option<usize>, ConfigError> {
    match n {
        None => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(n) => Err(ConfigError::OutOfRange {
            key,
            value: n.to_string(),
            allowed: "a whole number above 0",
        }),
    }
}

/// Checks an `idle_after` (S39) as the configuration file does, wherever it comes from
/// (`[supervisor] idle_after`, `serve --idle-after`): at least 1 s, at most 30 days.
pub fn check_idle_after(d: Duration) -> Result<Duration, ConfigError> {
    if d < Duration::from_secs(1) || d > MAX_IDLE_AFTER {
        return Err(ConfigError::OutOfRange {
            key: "supervisor.idle_after",
            value: format_duration(d),
            allowed: IDLE,
        });
    }
    Ok(d)
}
/// The longest `idle_after` a configuration takes.
const MAX_IDLE_AFTER: Duration = Duration::from_secs(30 * 86_400);
pub(super) const LEASE: &str = "longer than supervisor.heartbeat and at most 600s";
pub(super) const BEAT: &str = "more than 0s and at most 60s";
pub(super) const IDLE: &str = "at least 1s and at most 30 days";

/// `[store] engine` and `durability`: sled (the default) or fjall, each at `power`
/// (the default) or `crash` (S15b).
pub(super) fn engine(
    engine: Option<String>,
    durability: Option<String>,
) -> Result<Engine, ConfigError> {
    let level = match durability {
        None => StoreDurability::default(),
        Some(d) => StoreDurability::parse(&d).ok_or(ConfigError::OutOfRange {
            key: "store.durability",
            value: d,
            allowed: "\"power\" (the default: an acknowledged write survives a power loss) or \"crash\" (it survives a process crash only; faster)",
        })?,
    };
    let name = engine.as_deref().unwrap_or("sled");
    Engine::named(name, level).ok_or_else(|| ConfigError::OutOfRange {
        key: "store.engine",
        value: name.to_string(),
        allowed: "\"sled\" (the default) or \"fjall\"",
    })
}

/// Checks a heartbeat interval and lease timeout (the file's checks, also applied to
/// values given to the runtime builder in code): a zero interval is refused here, not
/// left to panic in the lease's renewal task.
pub(crate) fn check_lease(heartbeat: Duration, lease: Duration) -> Result<(), ConfigError> {
    check_range(
        "supervisor.heartbeat",
        heartbeat,
        Duration::from_secs(60),
        BEAT,
    )?;
    if lease <= heartbeat || lease > Duration::from_secs(600) {
        return Err(ConfigError::OutOfRange {
            key: "supervisor.lease_timeout",
            value: format_duration(lease),
            allowed: LEASE,
        });
    }
    Ok(())
}

pub(super) fn check_range(
    key: &'static str,
    d: Duration,
    max: Duration,
    allowed: &'static str,
) -> Result<(), ConfigError> {
    if d.is_zero() || d > max {
        return Err(ConfigError::OutOfRange {
            key,
            value: format_duration(d),
            allowed,
        });
    }
    Ok(())
}

/// Parses a human-readable duration for `key` (humantime); zero and negative values
/// are refused as out of range, anything that is not a duration as
/// [`ConfigError::NotADuration`].
pub(super) fn duration(
    key: &'static str,
    text: &str,
    allowed: &'static str,
) -> Result<Duration, ConfigError> {
    if text.trim_start().starts_with('-') {
        // A negative duration is a duration, below the range.
        return Err(ConfigError::OutOfRange {
            key,
            value: text.to_string(),
            allowed,
        });
    }
    let d = humantime::parse_duration(text.trim()).map_err(|e| ConfigError::NotADuration {
        key,
        value: text.to_string(),
        reason: e.to_string(),
    })?;
    if d.is_zero() {
        return Err(ConfigError::OutOfRange {
            key,
            value: text.to_string(),
            allowed,
        });
    }
    Ok(d)
}

/// Parses `"30s"`, `"500ms"`, `"2m"`, `"1h"`, `"1m30s"`, `"1m 30s"` (humantime's
/// grammar). `None` for anything else, including negative values and a number without
/// a unit.
pub fn parse_duration(text: &str) -> Option<Duration> {
    humantime::parse_duration(text.trim()).ok()
}

/// Formats a duration the way the file writes it (`"30s"`, `"250ms"`).
pub use agentloop_core::duration_text::format_duration;
