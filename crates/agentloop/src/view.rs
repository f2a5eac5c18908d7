//! What clients read of a session (DESIGN S24; issue 13, 5): the client view of a
//! stored record, and the redaction every client-facing read goes through.
//!
//! A [`Redaction`] is set on the runtime ([`crate::runtime::RuntimeBuilder::redact`], or the
//! `[redact] fields` list of agentloop.toml, which the `agentloop sessions show` command
//! applies too). It sees items, the agent state, an interrupt's question and agent
//! events as JSON values (payloads are self-describing, so no item type is needed) and
//! returns what a client may see: mask secrets, drop personal data. It shapes views
//! only: the stored record is never altered, and the session itself always reads its
//! own data in full.
//!
//! This module builds views; it never writes a record and decides nothing about
//! sessions.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::store::codec::payload;
use crate::store::{StoreError, StoredRecord};

/// Which part of a session a value is, for the redaction function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// An item (unhandled or interrupted), or an answer.
    Item,
    /// The cut turn's agent state.
    State,
    /// An interrupt's question.
    Question,
    /// An agent event sent to a client (the HTTP front's SSE).
    Event,
}

type RedactFn = dyn Fn(Part, Value) -> Value + Send + Sync;

/// The redaction every client-facing read goes through. Cheap to clone.
#[derive(Clone, Default)]
pub struct Redaction {
    f: Option<Arc<RedactFn>>,
}

impl fmt::Debug for Redaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.f.is_some() {
            "Redaction(custom)"
        } else {
            "Redaction(none)"
        })
    }
}

/// What a masked value reads as.
pub const REDACTED: &str = "[redacted]";

impl Redaction {
    /// Shows everything.
    pub fn none() -> Self {
        Redaction { f: None }
    }

    /// Redacts with `f`, which gets each value and its part and returns what clients
    /// see.
    pub fn new(f: impl Fn(Part, Value) -> Value + Send + Sync + 'static) -> Self {
        Redaction {
            f: Some(Arc::new(f)),
        }
    }

    /// Masks the value of every object field named one of `names` (exact, at any
    /// depth, in every part) with `"[redacted]"`: the `[redact] fields` of
    /// agentloop.toml.
    pub fn fields<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        let names: BTreeSet<String> = names.into_iter().map(Into::into).collect();
        if names.is_empty() {
            return Redaction::none();
        }
        Redaction::new(move |_, v| mask_fields(v, &names))
    }

    /// Whether anything is redacted.
    pub fn is_active(&self) -> bool {
        self.f.is_some()
    }

    /// What a client may see of `value`.
    pub fn apply(&self, part: Part, value: Value) -> Value {
        match &self.f {
            Some(f) => f(part, value),
            None => value,
        }
    }
}

fn mask_fields(v: Value, names: &BTreeSet<String>) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = if names.contains(&k) {
                        Value::String(REDACTED.into())
                    } else {
                        mask_fields(v, names)
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| mask_fields(v, names)).collect())
        }
        other => other,
    }
}

/// A business interrupt as a client sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InterruptView {
    /// Why the turn stopped.
    pub reason: String,
    /// The question, redacted.
    pub question: Value,
    /// Whether the session waits for an answer.
    pub awaiting_answer: bool,
}

/// The cut turn's durable steps (S1b) as a client sees them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepsView {
    /// The turn they belong to.
    pub turn: u64,
    /// How many of its steps the stored state covers (they are not listed).
    pub covered: u32,
    /// The journaled steps after them, in order.
    pub journaled: Vec<StepView>,
}

/// One journaled step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepView {
    /// Its position in the turn.
    pub occurrence: u32,
    /// Its name.
    pub name: String,
    /// Its key (the idempotency key it handed out).
    pub key: String,
    /// Its result is journaled (it is replayed when the turn runs again); `false`: only
    /// its beginning is (a `NoRetry` step whose outcome is unknown).
    pub finished: bool,
    /// Its result as JSON, through the redaction as the state is.
    pub result: Option<Value>,
}

/// The durable steps of a stored record's cut turn, through `redaction` (results as
/// [`Part::State`]); `None` when it has none.
pub fn steps_view(
    record: &StoredRecord,
    redaction: &Redaction,
) -> Result<Option<StepsView>, StoreError> {
    let h = &record.header;
    let Some(j) = crate::store::codec::decode_journal(h, &record.journal)? else {
        return Ok(None);
    };
    let journaled = j
        .entries
        .iter()
        .map(|e| {
            let key = agentloop_core::steps::StepKey {
                session: h.session_id.clone(),
                turn: j.mark.turn,
                occurrence: e.occurrence,
                name: e.name.clone(),
            };
            // A result that does not read as JSON is named, not fatal: the session
            // replays its bytes as its own type.
            let result = e.result.as_ref().map(|b| match payload::to_json(b) {
                Ok(v) => redaction.apply(Part::State, v),
                Err(err) => serde_json::json!({ "not_shown": err.to_string() }),
            });
            Ok(StepView {
                occurrence: e.occurrence,
                name: e.name.clone(),
                key: key.to_string(),
                finished: e.result.is_some(),
                result,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Some(StepsView {
        turn: j.mark.turn,
        covered: j.mark.covered,
        journaled,
    }))
}

/// A stored session as a client sees it: every payload as JSON, through the runtime's
/// redaction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionView {
    /// The session's id.
    pub session_id: String,
    /// Its agent kind.
    pub agent_kind: String,
    /// The version of its kind that wrote the record (S40).
    pub agent_version: u32,
    /// Its status (S19), e.g. `Stopped`.
    pub status: String,
    /// The failure, for a `Failed` record.
    pub last_error: Option<String>,
    /// The business stop cause.
    pub stop_cause: Option<String>,
    /// The next turn's index (or the cut turn's).
    pub turn_index: u64,
    /// Items accepted and not consumed, in offer order.
    pub unhandled_items: Vec<Value>,
    /// The cut turn's items.
    pub interrupted_items: Vec<Value>,
    /// The cut turn's state at its last safe point, or (with `state_carried`) the
    /// state the session carries between turns.
    pub state: Option<Value>,
    /// `state` is the state the session's last completed turn left to the next
    /// (`TurnOutcome::CompletedWith`), not a cut turn's.
    pub state_carried: bool,
    /// The interrupt, if the session stopped on one.
    pub interrupt: Option<InterruptView>,
    /// Last update, ms since the Unix epoch.
    pub updated_at_ms: u64,
    /// The record's version.
    pub version: u64,
    /// The session's own settings (issue 28), restored when it resumes; `None` for a
    /// record written before they were kept.
    pub settings: Option<agentloop_core::settings::SessionSettings>,
    /// The cut turn's durable steps (S1b), replayed when it runs again; `None` when it
    /// journaled none.
    pub steps: Option<StepsView>,
    /// The session's durable timers and schedules (S39), by number; items through the
    /// redaction.
    pub timers: Vec<TimerView>,
    /// The record says the session sleeps (S39). It may have been woken since without
    /// writing (a session live here is live whatever its record says).
    pub asleep: bool,
}

/// Where a session stands and what is kept of it (S26a): what every door shows of a
/// session, judged once ([`agentloop_core::lifecycle::judge`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SessionLife {
    /// Its lifecycle: `running`, `sleeping`, `stopped`, `interrupted`, `completed`,
    /// `canceled` or `failed`.
    pub lifecycle: agentloop_core::lifecycle::Lifecycle,
    /// What the store keeps of it.
    pub kept: Kept,
}

/// What the store keeps of a session (S26a).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// Its record (S15).
    pub record: bool,
    /// How many turn-end checkpoints its history keeps (S16b).
    pub history: usize,
    /// The highest number of its kept events (S20a); 0 when none are kept.
    pub events: u64,
}

/// A durable timer as a client sees it (S39).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimerView {
    /// Its number within the session (what cancels it).
    pub id: u64,
    /// When it is due next, ms since the Unix epoch.
    pub due_ms: u64,
    /// The item it pushes, through the redaction (`Part::Item`).
    pub item: Value,
    /// How it recurs: `every <n>ms` or a cron expression; `None` for a one-off timer.
    pub schedule: Option<String>,
    /// How many times it fired.
    pub fired: u64,
}

/// The client view of `id`'s stored timers, through `redaction`.
pub fn timers_view(
    id: &str,
    timers: Vec<(u64, crate::store::StoredTimer)>,
    redaction: &Redaction,
) -> Result<Vec<TimerView>, StoreError> {
    timers
        .into_iter()
        .map(|(n, t)| {
            let item = payload::to_json(&t.item).map_err(|e| StoreError::Corrupt {
                session: id.to_string(),
                reason: format!("timer {n}'s item: {e}"),
            })?;
            Ok(TimerView {
                id: n,
                due_ms: t.due_ms,
                item: redaction.apply(Part::Item, item),
                schedule: t.repeat.map(|r| match r {
                    crate::store::Repeat::Every { ms } => format!("every {ms}ms"),
                    crate::store::Repeat::Cron { expr } => expr,
                }),
                fired: t.fired,
            })
        })
        .collect()
}

/// Builds the client view of a stored (format-2) record through `redaction`.
pub fn session_view(
    record: &StoredRecord,
    redaction: &Redaction,
) -> Result<SessionView, StoreError> {
    let h = &record.header;
    let corrupt = |what: String| StoreError::Corrupt {
        session: h.session_id.clone(),
        reason: what,
    };
    let placement = record.placement()?;
    let item = |seq: &u64| -> Result<Value, StoreError> {
        let bytes = record
            .items
            .iter()
            .find(|(s, _)| s == seq)
            .map(|(_, b)| b)
            .ok_or_else(|| corrupt(format!("item entry {seq} is missing")))?;
        let v = payload::to_json(bytes).map_err(|e| corrupt(format!("item entry {seq}: {e}")))?;
        Ok(redaction.apply(Part::Item, v))
    };
    let state = match &record.state {
        None => None,
        Some(b) => {
            let v = payload::to_json(b).map_err(|e| corrupt(format!("agent state: {e}")))?;
            Some(redaction.apply(Part::State, v))
        }
    };
    Ok(SessionView {
        session_id: h.session_id.clone(),
        agent_kind: h.agent_kind.clone(),
        agent_version: h.agent_version,
        status: h.status.to_string(),
        last_error: h.last_error.clone(),
        stop_cause: h.stop_cause.clone(),
        turn_index: h.turn_index,
        unhandled_items: placement
            .unhandled
            .iter()
            .map(item)
            .collect::<Result<_, _>>()?,
        interrupted_items: placement
            .interrupted
            .iter()
            .map(item)
            .collect::<Result<_, _>>()?,
        state,
        state_carried: h.state_carried,
        interrupt: h.interrupt.as_ref().map(|i| InterruptView {
            reason: i.reason.clone(),
            question: redaction.apply(Part::Question, i.question.clone()),
            awaiting_answer: h.awaiting_answer,
        }),
        updated_at_ms: h.updated_at_ms,
        version: h.version,
        settings: h.settings,
        steps: steps_view(record, redaction)?,
        timers: Vec::new(),
        asleep: h.asleep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_masked_at_any_depth_and_nothing_else_changes() {
        let r = Redaction::fields(["api_key", "ssn"]);
        let v = json!({"user": {"name": "ann", "ssn": "123"}, "calls": [{"api_key": "k", "n": 1}]});
        assert_eq!(
            r.apply(Part::Item, v),
            json!({"user": {"name": "ann", "ssn": REDACTED}, "calls": [{"api_key": REDACTED, "n": 1}]})
        );
        assert!(!Redaction::fields(Vec::<String>::new()).is_active());
        assert_eq!(Redaction::none().apply(Part::State, json!(1)), json!(1));
    }
}
