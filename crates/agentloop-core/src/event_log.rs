//! Events that outlive the process (DESIGN S20a, issue 33): how long a session keeps
//! its events in the store ([`Retention`], one of the settings its record keeps). How
//! the events are laid out, appended, trimmed and read is `table::events`; how a
//! session numbers them and rides the store's group commits is the runtime's keeper
//! (`agentloop` `events/keeper/mod.rs`).

use serde::{Deserialize, Serialize};

/// How long stored events are kept (S20a: a count and an age).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep the events among the newest `count` numbers (whole pages: a page goes
    /// when all of its events are older).
    pub count: u64,
    /// Keep none older than this, in ms (`None`: no age limit).
    pub max_age_ms: Option<u64>,
}

impl Default for Retention {
    /// 10 000 events, a day.
    fn default() -> Self {
        Retention {
            count: 10_000,
            max_age_ms: Some(24 * 3600 * 1000),
        }
    }
}
