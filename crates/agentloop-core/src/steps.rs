//! Durable steps (DESIGN S1b, issue 32): the journal of one turn's steps and the
//! decision, for each step the agent asks to run, whether it runs, runs again, is
//! answered from the journal, or diverges. Plain data and plain functions: the turn
//! task asks, the session writes what the journal returns, nothing here waits or
//! touches a store.
//!
//! A turn's steps are numbered by their *occurrence*: the position of the step within
//! the turn, from 0. A safe point's state covers the steps before it: the session
//! records, with the state, how many steps the turn had begun before it, up to the
//! first one still running ([`Journal::covered`]),
//! and a turn resumed from that state starts numbering there. The journal holds the
//! steps after it. So a resumed turn, running its code again from the state, meets
//! each journaled step at the occurrence it had:
//!
//! | journal at `occurrence` | the step asked for has | decision |
//! |---|---|---|
//! | nothing | any name | [`StepDecision::Run`] (fresh) |
//! | finished, same name | | [`StepDecision::Replay`]: the journaled result, not run |
//! | begun (not finished), same name | policy `Retry` | [`StepDecision::Run`] with `unknown: true`, same key |
//! | begun (not finished), same name | policy `NoRetry` | [`StepDecision::Unknown`] |
//! | any, another name | | [`StepDecision::Refused`] with [`StepError::Diverged`]: the turn fails, the record is kept |
//!
//! A step's [`StepKey`] is made of the session, the turn, the occurrence and the name:
//! every run of the same step (after a crash, a restart, a move, a failover) gets the
//! same key, for an external API's idempotency key.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The default bound on the bytes of journaled results per turn (1 MiB).
pub const DEFAULT_JOURNAL_LIMIT: usize = 1 << 20;

/// The stable identity of one step of one turn (S1b): the same for every run of that
/// step, on any node. Printed as `<session>/<turn>/<occurrence>/<name>` (the session id
/// may itself contain `/`: the last three fields are read from the right).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StepKey {
    /// The session.
    pub session: String,
    /// The turn's index.
    pub turn: u64,
    /// The step's position within the turn, from 0.
    pub occurrence: u32,
    /// The step's name, as the agent gave it.
    pub name: String,
}

impl fmt::Display for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.session, self.turn, self.occurrence, self.name
        )
    }
}

/// A printed [`StepKey`] that does not read back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a step key: expected <session>/<turn>/<occurrence>/<name>, with a step name without `/`")]
pub struct StepKeyError(pub String);

impl FromStr for StepKey {
    type Err = StepKeyError;

    /// Reads what [`fmt::Display`] printed. The name is the text after the last `/`,
    /// so a step name must not contain `/` ([`Journal::begin`] refuses one).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || StepKeyError(s.to_string());
        let mut parts = s.rsplitn(4, '/');
        let name = parts.next().ok_or_else(bad)?;
        let occurrence = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let turn = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let session = parts.next().ok_or_else(bad)?;
        if session.is_empty() || name.is_empty() {
            return Err(bad());
        }
        Ok(StepKey {
            session: session.to_string(),
            turn,
            occurrence,
            name: name.to_string(),
        })
    }
}

/// What happens to a step that began and whose result was not journaled when the
/// process died (S1b).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepPolicy {
    /// Run it again, with the same key (the default: the external API deduplicates).
    #[default]
    Retry,
    /// Do not run it again: the agent gets an unknown outcome and reconciles. Its
    /// beginning is journaled, durably, before it runs.
    NoRetry,
}

/// One step in a turn's journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The step's position within the turn.
    pub occurrence: u32,
    /// The step's name.
    pub name: String,
    /// Its encoded result (`Ok` or `Err` of the agent's type) once finished; `None`
    /// while it only began (journaled for `NoRetry` steps).
    #[serde(with = "serde_bytes")]
    pub result: Option<Vec<u8>>,
}

/// Which turn a stored journal belongs to and how many of its steps the stored state
/// covers: kept in the record's header beside the journal's entries (S1b).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalMark {
    /// The turn.
    pub turn: u64,
    /// How many of its steps the stored state covers (see [`Journal::covered`]).
    pub covered: u32,
}

/// A turn's journal as a record keeps it: its mark and its entries, ascending.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnJournal {
    /// The turn and the steps its state covers.
    pub mark: JournalMark,
    /// The journaled steps after the covered ones, ascending by occurrence.
    pub entries: Vec<JournalEntry>,
}

/// What the session does with a step the agent asks to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepDecision {
    /// Run it with this key. `unknown`: it began before and its result was never
    /// journaled (it may have had its effect). `journal_begin`: journal its
    /// beginning durably before running it (a `NoRetry` step).
    Run {
        /// The step's key.
        key: StepKey,
        /// Whether an earlier run began and left no result.
        unknown: bool,
        /// Whether to journal the beginning (durably) before running.
        journal_begin: bool,
    },
    /// It finished before: answer with the journaled result, without running it.
    Replay {
        /// The step's key.
        key: StepKey,
        /// The journaled result.
        result: Vec<u8>,
    },
    /// It began before, left no result, and may not run again (`NoRetry`).
    Unknown {
        /// The step's key.
        key: StepKey,
    },
    /// The step cannot go on and the turn fails: the journal holds another step at this
    /// position ([`StepError::Diverged`]: the turn's code changed, or chooses its steps
    /// differently on a rerun), or its name cannot be part of a key.
    Refused(StepError),
}

/// Why a step cannot go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The journal holds another step at this position (S1b divergence).
    #[error("step {occurrence} of turn {turn} is `{asked}` but the journal holds `{journaled}` there: the turn's code changed since the step ran, or chooses its steps differently on a rerun; the turn fails and the record is kept: deploy the code that wrote it, or delete the session")]
    Diverged {
        /// The turn.
        turn: u64,
        /// The position.
        occurrence: u32,
        /// The name the agent asked for.
        asked: String,
        /// The name the journal holds.
        journaled: String,
    },
    /// A step name that cannot be part of a key.
    #[error("step name `{0}` is not usable: give a non-empty name without `/`")]
    BadName(String),
    /// A result over the turn's journal bound.
    #[error("the result of step `{name}` is {bytes} bytes, which takes the turn's journal to {total} bytes, over its bound of {limit}: return a smaller result (store the large value elsewhere and journal its reference)")]
    TooLarge {
        /// The step.
        name: String,
        /// The result's size.
        bytes: usize,
        /// The journal's size with it.
        total: usize,
        /// The bound.
        limit: usize,
    },
    /// A beginning or a result for a step that was not decided to run here, or that a
    /// safe point's state already covers.
    #[error("step {occurrence} was journaled without being started in this run of the turn; this is a bug in agentloop, please report it")]
    NotStarted {
        /// The position.
        occurrence: u32,
    },
}

/// The steps of one turn: what is journaled and which step comes next.
///
/// Invariants (checked by [`Journal::check`]): entries ascend by occurrence, each at
/// or after [`Journal::covered`]; the journaled bytes
/// never exceed the limit. (Steps of one turn may run concurrently, so an unfinished
/// step may come before a finished one.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Journal {
    session: String,
    turn: u64,
    covered: u32,
    next: u32,
    entries: Vec<JournalEntry>,
    bytes: usize,
    limit: usize,
    /// Steps decided to run whose result is not journaled yet (steps may overlap).
    running: Vec<u32>,
}

impl Journal {
    /// A new turn's journal: nothing journaled, numbering from 0.
    pub fn new(session: &str, turn: u64, limit: usize) -> Self {
        Journal {
            session: session.to_string(),
            turn,
            covered: 0,
            next: 0,
            entries: Vec::new(),
            bytes: 0,
            limit,
            running: Vec::new(),
        }
    }

    /// The journal of a turn run again: `covered` steps are covered by the state it
    /// resumes from (0 without one), `entries` are what the record holds after them.
    /// Entries before `covered` are dropped (the state covers them).
    pub fn resume(
        session: &str,
        turn: u64,
        covered: u32,
        mut entries: Vec<JournalEntry>,
        limit: usize,
    ) -> Self {
        entries.retain(|e| e.occurrence >= covered);
        entries.sort_by_key(|e| e.occurrence);
        let bytes = entries.iter().map(entry_bytes).sum();
        Journal {
            session: session.to_string(),
            turn,
            covered,
            next: covered,
            entries,
            bytes,
            limit,
            running: Vec::new(),
        }
    }

    /// The journal a turn resumes with from a record's (`None`: the record has none,
    /// or one of another turn, which is stale: nothing is replayed).
    pub fn from_record(
        session: &str,
        turn: u64,
        stored: Option<&TurnJournal>,
        limit: usize,
    ) -> Self {
        match stored {
            Some(j) if j.mark.turn == turn => {
                Journal::resume(session, turn, j.mark.covered, j.entries.clone(), limit)
            }
            _ => Journal::new(session, turn, limit),
        }
    }

    /// The turn.
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The mark a record keeps beside the entries.
    pub fn mark(&self) -> JournalMark {
        JournalMark {
            turn: self.turn,
            covered: self.covered,
        }
    }

    /// How many of the turn's steps a safe point's state covers.
    pub fn covered(&self) -> u32 {
        self.covered
    }

    /// The next step's occurrence.
    pub fn next_occurrence(&self) -> u32 {
        self.next
    }

    /// The journaled steps after the covered ones.
    pub fn entries(&self) -> &[JournalEntry] {
        &self.entries
    }

    /// The bytes of journaled results.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Decides the next step the agent asks for (see the module's table) and moves
    /// past it (a diverged step does not move: the turn ends).
    pub fn begin(&mut self, name: &str, policy: StepPolicy) -> StepDecision {
        if name.is_empty() || name.contains('/') {
            return StepDecision::Refused(StepError::BadName(name.to_string()));
        }
        let occurrence = self.next;
        let key = StepKey {
            session: self.session.clone(),
            turn: self.turn,
            occurrence,
            name: name.to_string(),
        };
        let decision = match self.entries.iter().find(|e| e.occurrence == occurrence) {
            Some(e) if e.name != name => {
                return StepDecision::Refused(StepError::Diverged {
                    turn: self.turn,
                    occurrence,
                    asked: name.to_string(),
                    journaled: e.name.clone(),
                })
            }
            Some(JournalEntry {
                result: Some(r), ..
            }) => StepDecision::Replay {
                key,
                result: r.clone(),
            },
            Some(_) => match policy {
                StepPolicy::Retry => StepDecision::Run {
                    key,
                    unknown: true,
                    journal_begin: false,
                },
                StepPolicy::NoRetry => StepDecision::Unknown { key },
            },
            None => StepDecision::Run {
                key,
                unknown: false,
                journal_begin: policy == StepPolicy::NoRetry,
            },
        };
        if matches!(decision, StepDecision::Run { .. }) {
            self.running.push(occurrence);
        }
        self.next += 1;
        decision
    }

    /// A step decided to run ends without a result (its future was dropped, or its
    /// result could not be journaled): it no longer holds back a safe point.
    pub fn abandon(&mut self, occurrence: u32) {
        self.running.retain(|o| *o != occurrence);
    }

    /// Whether any step decided to run has no journaled result yet.
    pub fn is_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// The entry that journals the beginning of the step at `occurrence` (a `NoRetry`
    /// step, before it runs); [`StepError::NotStarted`] for a step not decided in this
    /// run or covered by a safe point.
    pub fn began(&mut self, occurrence: u32, name: &str) -> Result<JournalEntry, StepError> {
        self.started(occurrence)?;
        let entry = JournalEntry {
            occurrence,
            name: name.to_string(),
            result: None,
        };
        self.put(entry.clone());
        Ok(entry)
    }

    /// Journals the result of the step at `occurrence`: the entry to write, or
    /// [`StepError::TooLarge`] (nothing journaled) when it takes the turn over its
    /// bound.
    pub fn finish(
        &mut self,
        occurrence: u32,
        name: &str,
        result: Vec<u8>,
    ) -> Result<JournalEntry, StepError> {
        self.started(occurrence)?;
        let replaced = self
            .entries
            .iter()
            .find(|e| e.occurrence == occurrence)
            .map_or(0, entry_bytes);
        let total = self.bytes - replaced + result.len();
        if total > self.limit {
            // The step is over either way: its result is refused (the turn fails).
            self.abandon(occurrence);
            return Err(StepError::TooLarge {
                name: name.to_string(),
                bytes: result.len(),
                total,
                limit: self.limit,
            });
        }
        let entry = JournalEntry {
            occurrence,
            name: name.to_string(),
            result: Some(result),
        };
        self.put(entry.clone());
        self.abandon(occurrence);
        Ok(entry)
    }

    /// A safe point: its state covers every step begun before it, except those still
    /// running (the state cannot hold their results) and any after them; the journal
    /// drops the covered entries. Answers the occurrences dropped, for the session to
    /// delete with the write of the state (which stores [`Journal::mark`]).
    pub fn safe_point(&mut self) -> Vec<u32> {
        let upto = self.running.iter().copied().min().unwrap_or(self.next);
        self.covered = self.covered.max(upto);
        let mut dropped = Vec::new();
        let covered = self.covered;
        self.entries.retain(|e| {
            let keep = e.occurrence >= covered;
            if !keep {
                dropped.push(e.occurrence);
            }
            keep
        });
        self.bytes = self.entries.iter().map(entry_bytes).sum();
        dropped
    }

    /// The journal as a record keeps it.
    pub fn to_record(&self) -> TurnJournal {
        TurnJournal {
            mark: self.mark(),
            entries: self.entries.clone(),
        }
    }

    /// Whether the record needs to keep anything of it (entries, or steps covered).
    pub fn is_empty(&self) -> bool {
        self.covered == 0 && self.entries.is_empty()
    }

    /// The invariants of the type's docs; `Err` says which broke.
    pub fn check(&self) -> Result<(), String> {
        let mut last = None;
        for e in &self.entries {
            if e.occurrence < self.covered {
                return Err(format!("entry {} is covered by the state", e.occurrence));
            }
            if last.is_some_and(|l| e.occurrence <= l) {
                return Err(format!("entry {} is out of order", e.occurrence));
            }
            last = Some(e.occurrence);
        }
        let bytes: usize = self.entries.iter().map(entry_bytes).sum();
        if bytes != self.bytes {
            return Err(format!("{} bytes counted, {} held", self.bytes, bytes));
        }
        if bytes > self.limit {
            return Err(format!("{bytes} bytes over the limit {}", self.limit));
        }
        Ok(())
    }

    /// Whether `occurrence` was decided in this run and is not covered by a state.
    fn started(&self, occurrence: u32) -> Result<(), StepError> {
        if occurrence < self.covered || occurrence >= self.next {
            return Err(StepError::NotStarted { occurrence });
        }
        Ok(())
    }

    fn put(&mut self, entry: JournalEntry) {
        match self
            .entries
            .iter_mut()
            .find(|e| e.occurrence == entry.occurrence)
        {
            Some(e) => {
                self.bytes -= entry_bytes(e);
                self.bytes += entry_bytes(&entry);
                *e = entry;
            }
            None => {
                self.bytes += entry_bytes(&entry);
                let at = self
                    .entries
                    .partition_point(|e| e.occurrence < entry.occurrence);
                self.entries.insert(at, entry);
            }
        }
    }
}

fn entry_bytes(e: &JournalEntry) -> usize {
    e.result.as_ref().map_or(0, Vec::len)
}

#[cfg(test)]
mod tests;
