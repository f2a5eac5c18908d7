//! Agent versions (DESIGN S40), as plain code: how a record written by one version of
//! an agent kind resumes on a runtime that registers some versions of that kind and
//! some migrations ([`plan`]: pinned, migrated along the chain, or refused), and what a
//! migration does to the stored record ([`Migration`], [`migrate`]): plain functions
//! over the encoded state, items and configuration, applied to a copy, so a migration
//! that fails leaves nothing changed.
//!
//! This file performs no I/O and knows no session: the runtime reads the record, asks
//! [`plan`], applies [`migrate`]'s write with the record's version as its condition,
//! and only then builds the agent.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::payload;
use crate::header::Payload;
use crate::record::StoredRecord;
use crate::write::{ItemChange, JournalChange, RecordWrite, StateChange, WriteCondition};

/// A function over one encoded payload (an item, a state or a configuration): the
/// bytes the old version stored in, the bytes the new version reads out, or why not.
pub type PayloadFn = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// What a migration does with durable steps (S1b) the old version journaled in a cut
/// turn: steps journaled by one version are replayed only by that version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JournalPolicy {
    /// A record whose cut turn has journaled steps is not migrated: it resumes only on
    /// the version that journaled them (keep that version registered until such
    /// sessions have drained). The default: nothing a step did is forgotten silently.
    #[default]
    Pinned,
    /// The journaled steps are dropped: the new version's turn runs its steps afresh,
    /// so a step that already had its effect may have it again.
    Discard,
}

/// How a record written by version `from` of a kind becomes a record of version
/// `from + 1` (registered with the runtime as the migration *from* `from`). Each part
/// left unset passes through unchanged. Built from typed functions (the old type kept
/// in the new code, the new one produced) or functions over JSON.
#[derive(Clone, Default)]
pub struct Migration {
    state: Option<PayloadFn>,
    items: Option<PayloadFn>,
    config: Option<PayloadFn>,
    journal: JournalPolicy,
}

impl fmt::Debug for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Migration")
            .field("state", &self.state.is_some())
            .field("items", &self.items.is_some())
            .field("config", &self.config.is_some())
            .field("journal", &self.journal)
            .finish()
    }
}

fn typed<Old, New, F>(f: F) -> PayloadFn
where
    Old: DeserializeOwned,
    New: Serialize + DeserializeOwned,
    F: Fn(Old) -> Result<New, String> + Send + Sync + 'static,
{
    Arc::new(move |bytes: &[u8]| {
        let old = payload::decode::<Old>(bytes).map_err(|e| format!("reading it: {e}"))?;
        let new = f(old)?;
        payload::encode_checked(&new).map_err(|e| format!("writing the result: {e}"))
    })
}

impl Migration {
    /// A migration that changes nothing but the version: the new version reads the old
    /// state, items and configuration as they are.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps the stored state (a cut turn's, or the state carried between turns) from
    /// the old version's state type to the new one's.
    pub fn state<Old, New, F>(mut self, f: F) -> Self
    where
        Old: DeserializeOwned,
        New: Serialize + DeserializeOwned,
        F: Fn(Old) -> Result<New, String> + Send + Sync + 'static,
    {
        self.state = Some(typed(f));
        self
    }

    /// Maps the stored state as JSON (byte strings read as arrays of numbers).
    pub fn state_json<F>(self, f: F) -> Self
    where
        F: Fn(serde_json::Value) -> Result<serde_json::Value, String> + Send + Sync + 'static,
    {
        self.state(f)
    }

    /// Maps every stored item (buffered, cut, and an interrupt's answer) from the type
    /// the old version stored to the runtime's item type.
    pub fn items<Old, New, F>(mut self, f: F) -> Self
    where
        Old: DeserializeOwned,
        New: Serialize + DeserializeOwned,
        F: Fn(Old) -> Result<New, String> + Send + Sync + 'static,
    {
        self.items = Some(typed(f));
        self
    }

    /// Maps every stored item as JSON.
    pub fn items_json<F>(self, f: F) -> Self
    where
        F: Fn(serde_json::Value) -> Result<serde_json::Value, String> + Send + Sync + 'static,
    {
        self.items(f)
    }

    /// Maps the agent's serialized configuration (what the kind's factory reads).
    pub fn config<F>(mut self, f: F) -> Self
    where
        F: Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    {
        self.config = Some(Arc::new(f));
        self
    }

    /// Drops the durable steps the old version journaled in a cut turn instead of
    /// refusing to migrate such a record ([`JournalPolicy::Discard`]).
    pub fn discard_journal(mut self) -> Self {
        self.journal = JournalPolicy::Discard;
        self
    }

    /// What this migration does with journaled steps.
    pub fn journal_policy(&self) -> JournalPolicy {
        self.journal
    }
}

/// How a record written by some version resumes on a runtime (S40).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionPlan {
    /// Its version is registered: it resumes on it.
    Pinned(u32),
    /// Migrated along the chain `from → from+1 → … → to` (`to` the newest registered
    /// version), then resumed on `to`.
    Migrate {
        /// The record's version.
        from: u32,
        /// The version it resumes on.
        to: u32,
    },
    /// Neither: it is refused, its record kept.
    Refused {
        /// Why, for the error (the versions available are named by the caller).
        why: String,
    },
}

/// How a record of `record_version` resumes when `registered` versions of its kind run
/// here and migrations exist from each version in `migrations_from` to the next: on its
/// own version when registered (pinned); else along an unbroken chain of migrations up
/// to the newest registered version; else refused.
pub fn plan(
    record_version: u32,
    registered: &BTreeSet<u32>,
    migrations_from: &BTreeSet<u32>,
) -> VersionPlan {
    if registered.contains(&record_version) {
        return VersionPlan::Pinned(record_version);
    }
    let Some(&newest) = registered.iter().next_back() else {
        return VersionPlan::Refused {
            why: "no version of its kind is registered".into(),
        };
    };
    if record_version > newest {
        return VersionPlan::Refused {
            why: format!(
                "it was written by a newer version than this runtime runs (a rollback?): deploy \
                 code that registers version {record_version}"
            ),
        };
    }
    if let Some(gap) = (record_version..newest).find(|v| !migrations_from.contains(v)) {
        return VersionPlan::Refused {
            why: format!(
                "no migration from version {gap} to {} is registered: register version \
                 {record_version} again, or the migrations from it up to version {newest}",
                gap + 1
            ),
        };
    }
    VersionPlan::Migrate {
        from: record_version,
        to: newest,
    }
}

/// Why a migration did not apply (the record was left as it was).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigrationError {
    /// A migration function refused or failed.
    #[error("the migration from version {from} failed on the {part}: {reason}")]
    Failed {
        /// The version it migrates from.
        from: u32,
        /// Which part: `state`, `item entry N`, `answer`, `configuration`.
        part: String,
        /// The function's reason.
        reason: String,
    },
    /// The cut turn holds durable steps the old version journaled, and the migration
    /// keeps them pinned ([`JournalPolicy::Pinned`]).
    #[error(
        "its cut turn holds {steps} durable step(s) journaled by version {from}, which only \
         that version replays: register version {from} until such sessions have drained, or \
         let the migration from it discard them (Migration::discard_journal)"
    )]
    JournalPinned {
        /// The record's version.
        from: u32,
        /// How many journal entries.
        steps: usize,
    },
}

/// The write that turns `record` (written by version `from`) into a record of version
/// `from + chain.len()`, applying each migration of `chain` in turn to a copy: the
/// configuration, the state, every item entry and the answer. Conditioned on the
/// record's stored version (a change since it was read refuses the write) and kept at
/// its lease epoch; the record's status, owner and places are unchanged. An error
/// leaves nothing to write.
pub fn migrate(
    record: &StoredRecord,
    from: u32,
    chain: &[&Migration],
) -> Result<RecordWrite, MigrationError> {
    let mut header = record.header.clone();
    let mut items: Vec<(u64, Payload)> = record.items.clone();
    let mut state = record.state.clone();
    let mut journal = record.journal.clone();
    for (step, m) in chain.iter().enumerate() {
        let at = from + step as u32;
        let failed = |part: String, reason: String| MigrationError::Failed {
            from: at,
            part,
            reason,
        };
        if !journal.is_empty() {
            match m.journal {
                JournalPolicy::Pinned => {
                    return Err(MigrationError::JournalPinned {
                        from: at,
                        steps: journal.len(),
                    })
                }
                JournalPolicy::Discard => journal.clear(),
            }
        }
        if let Some(f) = &m.config {
            header.agent_config =
                f(&header.agent_config).map_err(|r| failed("configuration".into(), r))?;
        }
        if let (Some(f), Some(s)) = (&m.state, &state) {
            state = Some(Payload::from(f(s).map_err(|r| failed("state".into(), r))?));
        }
        if let Some(f) = &m.items {
            for (seq, bytes) in &mut items {
                *bytes =
                    Payload::from(f(bytes).map_err(|r| failed(format!("item entry {seq}"), r))?);
            }
            if let Some(a) = &header.answer {
                let mapped = f(a).map_err(|r| failed("answer".into(), r))?;
                header.answer = Some(serde_bytes::ByteBuf::from(mapped));
            }
        }
        header.agent_version = at + 1;
    }
    let dropped: Vec<JournalChange> = record
        .journal
        .iter()
        .filter(|(occ, _)| !journal.iter().any(|(o, _)| o == occ))
        .map(|(occ, _)| JournalChange::Delete(*occ))
        .collect();
    let condition = WriteCondition::AtVersion(record.header.version);
    Ok(RecordWrite {
        header,
        items: items
            .into_iter()
            .map(|(seq, b)| ItemChange::Put(seq, b))
            .collect(),
        state: match state {
            Some(s) => StateChange::Put(s),
            None => StateChange::Keep,
        },
        journal: dropped,
        replace: false,
        condition,
        history: None,
        timers: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::RecordHeader;
    use serde::Deserialize;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn s40_a_registered_version_pins_the_record() {
        assert_eq!(plan(1, &set(&[1, 2]), &set(&[1])), VersionPlan::Pinned(1));
        assert_eq!(plan(2, &set(&[1, 2]), &set(&[])), VersionPlan::Pinned(2));
    }

    #[test]
    fn s40_an_unregistered_version_migrates_along_an_unbroken_chain_to_the_newest() {
        assert_eq!(
            plan(1, &set(&[3]), &set(&[1, 2])),
            VersionPlan::Migrate { from: 1, to: 3 }
        );
        assert_eq!(
            plan(2, &set(&[1, 3]), &set(&[2])),
            VersionPlan::Migrate { from: 2, to: 3 }
        );
        let VersionPlan::Refused { why } = plan(1, &set(&[3]), &set(&[2])) else {
            panic!("a broken chain must refuse");
        };
        assert!(why.contains("no migration from version 1 to 2"), "{why}");
    }

    #[test]
    fn s40_a_newer_record_than_the_runtime_runs_is_refused() {
        let VersionPlan::Refused { why } = plan(4, &set(&[1, 2, 3]), &set(&[1, 2, 3])) else {
            panic!("a newer record must refuse");
        };
        assert!(why.contains("registers version 4"), "{why}");
        assert!(matches!(
            plan(1, &set(&[]), &set(&[])),
            VersionPlan::Refused { .. }
        ));
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct V1 {
        count: u32,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct V2 {
        count: u64,
        label: String,
    }

    fn record() -> StoredRecord {
        StoredRecord {
            header: RecordHeader {
                session_id: "s".into(),
                agent_kind: "k".into(),
                version: 7,
                lease_epoch: 3,
                answer: Some(serde_bytes::ByteBuf::from(payload::encode(&"yes").unwrap())),
                ..RecordHeader::default()
            },
            items: vec![
                (0, Payload::from(payload::encode(&"a").unwrap())),
                (4, Payload::from(payload::encode(&"b").unwrap())),
            ],
            state: Some(Payload::from(payload::encode(&V1 { count: 2 }).unwrap())),
            journal: Vec::new(),
        }
    }

    #[test]
    fn s40_a_chain_maps_state_items_answer_and_config_in_order_under_the_read_version() {
        let one = Migration::new()
            .state(|s: V1| {
                Ok(V2 {
                    count: u64::from(s.count),
                    label: "one".into(),
                })
            })
            .items(|i: String| Ok(format!("{i}!")))
            .config(|c| Ok([c, b"+1"].concat()));
        let two = Migration::new()
            .state_json(|mut v| {
                v["label"] = serde_json::json!("two");
                Ok(v)
            })
            .items_json(|v| Ok(serde_json::json!(format!("{}?", v.as_str().unwrap_or("")))));
        let w = migrate(&record(), 1, &[&one, &two]).unwrap();
        assert_eq!(w.header.agent_version, 3);
        assert_eq!(w.header.agent_config, b"+1".to_vec());
        assert_eq!(w.condition, WriteCondition::AtVersion(7));
        assert_eq!(w.header.lease_epoch, 3);
        let StateChange::Put(s) = &w.state else {
            panic!("{:?}", w.state)
        };
        assert_eq!(
            payload::decode::<V2>(s).unwrap(),
            V2 {
                count: 2,
                label: "two".into()
            }
        );
        let items: Vec<(u64, String)> = w
            .items
            .iter()
            .map(|c| match c {
                ItemChange::Put(s, b) => (*s, payload::decode::<String>(b).unwrap()),
                ItemChange::Delete(s) => panic!("deleted {s}"),
            })
            .collect();
        assert_eq!(items, vec![(0, "a!?".to_string()), (4, "b!?".to_string())]);
        let answer = w.header.answer.as_ref().unwrap();
        assert_eq!(payload::decode::<String>(answer).unwrap(), "yes!?");
    }

    #[test]
    fn s40_a_failing_function_names_the_step_and_part_and_writes_nothing() {
        let ok = Migration::new();
        let bad = Migration::new().items(|i: String| {
            if i == "b" {
                Err("no b".to_string())
            } else {
                Ok(i)
            }
        });
        let e = migrate(&record(), 1, &[&ok, &bad]).unwrap_err();
        assert_eq!(
            e,
            MigrationError::Failed {
                from: 2,
                part: "item entry 4".into(),
                reason: "no b".into()
            }
        );
        let wrong_type = Migration::new().state(|s: String| Ok(s));
        let e = migrate(&record(), 1, &[&wrong_type]).unwrap_err();
        assert!(
            matches!(&e, MigrationError::Failed { part, .. } if part == "state"),
            "{e}"
        );
    }

    #[test]
    fn s40_journaled_steps_pin_the_record_unless_the_migration_discards_them() {
        let mut r = record();
        r.journal = vec![(0, Payload::from(vec![1u8])), (1, Payload::from(vec![2u8]))];
        let e = migrate(&r, 1, &[&Migration::new()]).unwrap_err();
        assert_eq!(e, MigrationError::JournalPinned { from: 1, steps: 2 });
        let w = migrate(&r, 1, &[&Migration::new().discard_journal()]).unwrap();
        assert_eq!(
            w.journal,
            vec![JournalChange::Delete(0), JournalChange::Delete(1)]
        );
    }
}
