//! A session's lifecycle as every door shows it (DESIGN S26a): one judgement of what a
//! session is now, from what runs and what is kept, used by the library's view, the
//! HTTP list and get, the CLI, the live page and `/metrics`. Pure: it reads facts the
//! caller gathered and touches no store and no runtime.
//!
//! The judgement, in one table (first row that matches):
//!
//! | facts | lifecycle |
//! |---|---|
//! | it runs in this process | `running` |
//! | its record is `Running` and says it sleeps (S39) | `sleeping` |
//! | its record is `Running` (another node runs it, or a crashed process held it and the next start resumes it) | `running` |
//! | its record is `Stopped` / `Interrupted` / `Completed` / `Canceled` / `Failed` | the same |
//! | no record, but checkpoint history or kept events remain | `completed` (a clean end's record was deleted by a build before S26a) |
//! | nothing kept | unknown (`None`: a door answers 404) |
//!
//! Since S26a a session that keeps history or events and ends cleanly keeps a final
//! record (`Stopped` after a stop, else `Completed`) instead of having it deleted
//! (S16), so its status is its record's; the last-but-one row reads what older builds
//! left.

use serde::{Deserialize, Serialize};

use crate::status::SessionStatus;

/// Where a session stands, as every door names it (S26a).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// It runs (here, or on another node that owns its record).
    Running,
    /// It sleeps (S39): its record holds everything; a push or a timer wakes it.
    Sleeping,
    /// It was stopped; spawning it again resumes what it kept.
    Stopped,
    /// A shutdown ended it; the next start of the runtime resumes it.
    Interrupted,
    /// It finished.
    Completed,
    /// It was canceled; it does not run again.
    Canceled,
    /// It failed and is not restarted.
    Failed,
}

impl Lifecycle {
    /// Every lifecycle, in the order of a session's life.
    pub const ALL: [Lifecycle; 7] = [
        Lifecycle::Running,
        Lifecycle::Sleeping,
        Lifecycle::Stopped,
        Lifecycle::Interrupted,
        Lifecycle::Completed,
        Lifecycle::Canceled,
        Lifecycle::Failed,
    ];

    /// Its name at every door: `running`, `sleeping`, `stopped`, `interrupted`,
    /// `completed`, `canceled`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Running => "running",
            Lifecycle::Sleeping => "sleeping",
            Lifecycle::Stopped => "stopped",
            Lifecycle::Interrupted => "interrupted",
            Lifecycle::Completed => "completed",
            Lifecycle::Canceled => "canceled",
            Lifecycle::Failed => "failed",
        }
    }

    /// The lifecycle named `name` (as [`as_str`](Self::as_str) names it).
    pub fn parse(name: &str) -> Option<Lifecycle> {
        Lifecycle::ALL.into_iter().find(|l| l.as_str() == name)
    }

    /// Whether something of it runs or will run without being spawned again
    /// (`running`, `sleeping`): pushes reach it.
    pub fn is_active(self) -> bool {
        matches!(self, Lifecycle::Running | Lifecycle::Sleeping)
    }
}

impl std::fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a door knows of a session when it judges it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts<'a> {
    /// An incarnation of it runs in this process (not asleep).
    pub live: bool,
    /// Its record's status, if a record is stored.
    pub record: Option<&'a SessionStatus>,
    /// Its record says it sleeps (S39).
    pub asleep: bool,
    /// Checkpoint history (S16b) or kept events (S20a) of it remain in the store.
    pub kept_beyond_record: bool,
}

/// The one judgement (see the module's table); `None` when nothing of the session is
/// kept or runs.
pub fn judge(facts: Facts<'_>) -> Option<Lifecycle> {
    if facts.live {
        return Some(Lifecycle::Running);
    }
    match facts.record {
        Some(SessionStatus::Running) if facts.asleep => Some(Lifecycle::Sleeping),
        Some(SessionStatus::Running) => Some(Lifecycle::Running),
        Some(SessionStatus::Stopped) => Some(Lifecycle::Stopped),
        Some(SessionStatus::Interrupted) => Some(Lifecycle::Interrupted),
        Some(SessionStatus::Completed) => Some(Lifecycle::Completed),
        Some(SessionStatus::Canceled) => Some(Lifecycle::Canceled),
        Some(SessionStatus::Failed(_)) => Some(Lifecycle::Failed),
        None if facts.kept_beyond_record => Some(Lifecycle::Completed),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_judges_every_row() {
        let failed = SessionStatus::Failed("boom".into());
        let rows: Vec<(Facts<'_>, Option<Lifecycle>)> = vec![
            (
                Facts {
                    live: true,
                    record: Some(&SessionStatus::Completed),
                    ..Facts::default()
                },
                Some(Lifecycle::Running),
            ),
            (
                Facts {
                    record: Some(&SessionStatus::Running),
                    asleep: true,
                    ..Facts::default()
                },
                Some(Lifecycle::Sleeping),
            ),
            (
                Facts {
                    record: Some(&SessionStatus::Running),
                    ..Facts::default()
                },
                Some(Lifecycle::Running),
            ),
            (
                Facts {
                    record: Some(&SessionStatus::Stopped),
                    asleep: true,
                    ..Facts::default()
                },
                Some(Lifecycle::Stopped),
            ),
            (
                Facts {
                    record: Some(&SessionStatus::Interrupted),
                    ..Facts::default()
                },
                Some(Lifecycle::Interrupted),
            ),
            (
                Facts {
                    record: Some(&SessionStatus::Completed),
                    kept_beyond_record: true,
                    ..Facts::default()
                },
                Some(Lifecycle::Completed),
            ),
            (
                Facts {
                    record: Some(&SessionStatus::Canceled),
                    ..Facts::default()
                },
                Some(Lifecycle::Canceled),
            ),
            (
                Facts {
                    record: Some(&failed),
                    ..Facts::default()
                },
                Some(Lifecycle::Failed),
            ),
            (
                Facts {
                    kept_beyond_record: true,
                    ..Facts::default()
                },
                Some(Lifecycle::Completed),
            ),
            (Facts::default(), None),
        ];
        for (facts, want) in rows {
            assert_eq!(judge(facts), want, "{facts:?}");
        }
    }

    #[test]
    fn names_round_trip_and_match_serde() {
        for l in Lifecycle::ALL {
            assert_eq!(Lifecycle::parse(l.as_str()), Some(l));
            assert_eq!(
                serde_json::to_value(l).ok(),
                Some(serde_json::Value::String(l.as_str().into()))
            );
        }
        assert_eq!(Lifecycle::parse("Running"), None);
        assert!(Lifecycle::Sleeping.is_active());
        assert!(!Lifecycle::Stopped.is_active());
    }
}
