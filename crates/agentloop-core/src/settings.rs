//! A session's own settings as its record keeps them (issue 28): what it was spawned
//! with beyond its agent kind and configuration (durability, history, replay buffer,
//! restart policy, poll interval), so a resume, an adoption, a move or a fork runs it
//! as it was spawned instead of with the runtime's defaults.
//!
//! This file only describes the settings and their stored form; the core writes them
//! in every record header, and the runtime reads them back when it rebuilds a session
//! from a record (`SessionSpec::resuming`). It decides nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::durability::Durability;

/// When a session that ended `Failed` is restarted (S26).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicy {
    /// Restart after any failure (an agent error, a panic, an internal error).
    #[default]
    Permanent,
    /// Restart only after a panic or an internal error, not after an error the agent
    /// returned on purpose.
    Transient,
    /// Never restart.
    Never,
}

/// The per-session settings a record keeps (issue 28), restored when the session is
/// rebuilt from its record.
///
/// Stored in the record's self-describing header with `#[serde(default)]`: a setting
/// added later reads as its default from older records, so adding one needs no format
/// change (S15). A record written before settings were kept has none, and the runtime's
/// defaults apply to it as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionSettings {
    /// When the record is written (S16a).
    pub durability: Durability,
    /// How many turn-end checkpoints are kept (S16b).
    pub history: usize,
    /// How many recent events are kept for subscribers that reconnect (S20).
    pub replay: usize,
    /// When the session is restarted after a failure (S26).
    pub restart: RestartPolicy,
    /// How often a detached session re-reads its record (S24), in milliseconds, when it
    /// was set for this session; `None` follows the runtime's heartbeat.
    pub poll_interval_ms: Option<u64>,
    /// Whether and how long the session keeps its events in the store (S20a).
    pub events: Option<crate::event_log::Retention>,
    /// How long the session stays idle before it goes to sleep (S39), in
    /// milliseconds, when it was set for this session; `None` follows the runtime's
    /// default (off unless set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_after_ms: Option<u64>,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            durability: Durability::Sync,
            history: 0,
            replay: 0,
            restart: RestartPolicy::Permanent,
            poll_interval_ms: None,
            events: None,
            idle_after_ms: None,
        }
    }
}

impl SessionSettings {
    /// The session's own poll interval, if it was set.
    pub fn poll_interval(&self) -> Option<Duration> {
        self.poll_interval_ms.map(Duration::from_millis)
    }

    /// How long the session stays idle before it sleeps, if it was set (S39).
    pub fn idle_after(&self) -> Option<Duration> {
        self.idle_after_ms.map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_missing_fields_read_as_defaults() {
        let s = SessionSettings {
            durability: Durability::Exit,
            history: 3,
            replay: 17,
            restart: RestartPolicy::Never,
            poll_interval_ms: Some(250),
            events: Some(crate::event_log::Retention {
                count: 9,
                max_age_ms: None,
            }),
            idle_after_ms: None,
        };
        let bytes = rmp_serde::to_vec_named(&s).unwrap();
        assert_eq!(rmp_serde::from_slice::<SessionSettings>(&bytes).unwrap(), s);
        // A header written by an older build names fewer settings.
        #[derive(Serialize)]
        struct Older {
            history: usize,
        }
        let bytes = rmp_serde::to_vec_named(&Older { history: 2 }).unwrap();
        let read: SessionSettings = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            read,
            SessionSettings {
                history: 2,
                ..SessionSettings::default()
            }
        );
    }
}
