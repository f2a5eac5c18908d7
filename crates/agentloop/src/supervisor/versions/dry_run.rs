//! What a deploy would do to the stored sessions (S40, `agentloop sessions migrate
//! --dry-run`): for every record, the version it would resume on, the migration it
//! would get (run on a copy, checked as a start checks it) or why it would be refused.
//! Nothing is written.

use serde::Serialize;

use super::choose::prepare;
use crate::store::{Stored, StoredEntry};
use crate::supervisor::AgentKind;

/// What the next resume of one stored session would do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "fate", rename_all = "snake_case")]
pub enum SessionFate {
    /// It resumes on its own version, registered here.
    Pinned {
        /// Its version.
        version: u32,
    },
    /// It is migrated along the chain (the migration ran on a copy and the new version
    /// reads the result), then resumes on `to`.
    Migrated {
        /// Its version.
        from: u32,
        /// The version it would run.
        to: u32,
    },
    /// It would be refused, its record kept: no version runs it, or its migration fails.
    Refused {
        /// The error the start would give.
        reason: String,
    },
    /// Its kind is not registered here.
    UnknownKind,
    /// It is finished (`Completed`, `Canceled`, `Failed`): nothing resumes it.
    Finished,
    /// Its record does not read.
    Unreadable {
        /// The store's error.
        reason: String,
    },
}

/// One stored session in a [`DeployPlan`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedSession {
    /// The session id.
    pub id: String,
    /// Its agent kind (empty when unreadable).
    pub kind: String,
    /// The version that wrote its record.
    pub version: u32,
    /// Its status.
    pub status: String,
    /// What its next resume would do.
    #[serde(flatten)]
    pub fate: SessionFate,
}

/// What a deploy of this runtime's versions would do to every stored session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeployPlan {
    /// Every stored session, by id.
    pub sessions: Vec<PlannedSession>,
}

impl DeployPlan {
    /// How many sessions would be pinned, migrated, refused (including unknown kinds
    /// and unreadable records), and are finished.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for s in &self.sessions {
            match s.fate {
                SessionFate::Pinned { .. } => c.0 += 1,
                SessionFate::Migrated { .. } => c.1 += 1,
                SessionFate::Finished => c.3 += 1,
                _ => c.2 += 1,
            }
        }
        c
    }
}

/// Reports what the next resume of every listed session (`entries`, as a store's
/// `list_stored` returns them) would do under the kinds `kind_of` names (S40), running
/// each migration on a copy; writes nothing.
pub fn dry_run<'k, I, E, K>(entries: Vec<StoredEntry>, kind_of: K) -> DeployPlan
where
    I: 'static,
    E: 'static,
    K: Fn(&str) -> Option<&'k dyn AgentKind<I, E>>,
{
    let mut plan = DeployPlan::default();
    for entry in entries {
        let stored = match entry.record {
            Ok(s) => s,
            Err(e) => {
                plan.sessions.push(PlannedSession {
                    id: entry.session_id,
                    kind: String::new(),
                    version: 0,
                    status: String::new(),
                    fate: SessionFate::Unreadable {
                        reason: e.to_string(),
                    },
                });
                continue;
            }
        };
        let (kind_name, status) = match &stored {
            Stored::Current(r) => (r.header.agent_kind.clone(), r.header.status.clone()),
            Stored::Format1(f) => (f.agent_kind.clone(), f.status.clone()),
        };
        let version = super::choose::version_of(&stored);
        let fate = if status.is_terminal() {
            SessionFate::Finished
        } else {
            match kind_of(&kind_name) {
                None => SessionFate::UnknownKind,
                Some(kind) => match prepare(kind, &kind_name, &stored) {
                    Ok((s, _)) => match s.migrated_from {
                        None => SessionFate::Pinned { version: s.version },
                        Some(from) => SessionFate::Migrated {
                            from,
                            to: s.version,
                        },
                    },
                    Err(e) => SessionFate::Refused {
                        reason: e.to_string(),
                    },
                },
            }
        };
        plan.sessions.push(PlannedSession {
            id: entry.session_id,
            kind: kind_name,
            version,
            status: status.to_string(),
            fate,
        });
    }
    plan.sessions.sort_by(|a, b| a.id.cmp(&b.id));
    plan
}
