//! Loading a session's record at start (DESIGN S17, S18, S19): read it (or take the
//! one the spawner already read), judge whether it may be resumed (its owner's lease),
//! settle a finished record (delete it, or reopen a `Completed` one that still lists
//! items), decode the cut turn's state, and seed the core.
//!
//! It owns only this I/O; the judgements are the core's (`core::load`). Any error is
//! kept in the core, which then ends the session without touching the record (S18).
//! It never writes a record, except the delete or reopen of a finished one.

use crate::session::core::load::{check_resumable, finished, Finished};
use crate::session::core::Core;
use crate::session::SessionSpec;
use crate::store::transition::hand_over;
use crate::store::transition::StatusChange;
use crate::store::{
    codec, now_ms, CasOutcome, CheckpointStore, LoadedRecord, Payload, SessionStatus, StoreError,
};
use crate::turn::agent::Agent;

/// Reads the record (or takes the one the spawner read) and seeds the core (S17).
/// `config` is what is left of the session's configuration once the core took its
/// part (owner and lease timeout are read here).
/// Errors are kept in the core, which ends the session without touching the record
/// (S18).
pub(super) async fn load<A: Agent>(
    core: &mut Core<A>,
    store: &dyn CheckpointStore<A::Item>,
    config: &SessionSpec<A::Item>,
    preloaded: Option<LoadedRecord<A::Item>>,
) {
    // (The id moved into the core's configuration.)
    let id = core.config.id.clone();
    let loaded = match preloaded.filter(|r| r.header.session_id == id) {
        Some(r) => Ok(Some(r)),
        None => match store.load_stored(&id).await {
            Ok(Some(s)) => s.decode::<A::Item>().map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        },
    };
    let loaded = match loaded {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            core.load_error = Some(Box::new(e));
            return;
        }
    };
    if let Err(e) = judge_owner(
        store,
        &loaded.header,
        config.owner.as_deref(),
        config.effective_lease_timeout(),
    )
    .await
    {
        core.load_error = Some(Box::new(e));
        return;
    }
    // S40: a record resumes only on the version that wrote it (the start chose it, or
    // migrated the record first); checked before the claim, so a record this version
    // cannot run is never taken from the node that can. A finished record the start
    // replaces is any version's.
    let replaced = loaded.header.status == SessionStatus::Completed
        && loaded.item_count() == 0
        && loaded.state.is_none();
    if !replaced && loaded.header.agent_version != core.config.agent_version {
        core.load_error = Some(Box::new(StoreError::Refused {
            session: id.clone(),
            status: loaded.header.status.to_string(),
            why: format!(
                "it was written by version {} of agent kind `{}`, and this runtime runs version \
                 {} of it: register version {} too (RuntimeBuilder::register_agent_version), \
                 or a migration from it (register_migration); the record is kept as it is",
                loaded.header.agent_version,
                loaded.header.agent_kind,
                core.config.agent_version,
                loaded.header.agent_version,
            ),
        }));
        return;
    }
    let mut loaded = loaded;
    if config.claim && loaded.header.owner != config.owner && !loaded.header.status.is_terminal() {
        if let Err(e) = claim(store, &mut loaded.header, config.owner.clone()).await {
            core.load_error = Some(Box::new(e));
            return;
        }
    }
    match finished(&loaded) {
        Some(Finished::Delete) => {
            // A finished session: this run starts afresh under the id.
            if let Err(e) = store.delete(&id).await {
                // Every `sync` write would be refused: refuse the start instead.
                core.load_error = Some(Box::new(e));
            }
            return;
        }
        Some(Finished::Reopen) => match StatusChange::Reopened.apply(store, &id).await {
            Ok(CasOutcome::Swapped(_)) => {}
            Ok(other) => {
                core.load_error = Some(Box::new(StoreError::Refused {
                    session: id.clone(),
                    status: format!("{other:?}"),
                    why: "its Completed record changed while it was loaded; spawn it again".into(),
                }));
                return;
            }
            Err(e) => {
                core.load_error = Some(Box::new(e));
                return;
            }
        },
        None => {}
    }
    // The cut turn's state, decoded for the resume turn; its bytes kept for writes
    // (re-encoded in format 2 when it was read in format 1).
    let (state, bytes) = match &loaded.state {
        None => (None, None),
        Some(b) => match codec::decode_state::<A::State>(&id, b) {
            Err(e) => {
                core.load_error = Some(Box::new(e));
                return;
            }
            Ok(v) if b.starts_with(&codec::FORMAT1_STATE_MARK) => {
                match codec::encode_state(&id, &v) {
                    Ok(enc) => (Some(v), Some(Payload::from(enc))),
                    Err(e) => {
                        core.load_error = Some(Box::new(e));
                        return;
                    }
                }
            }
            Ok(v) => (Some(v), Some(b.clone())),
        },
    };
    // The answer a caller gave to the record's interrupt (written with its claim).
    let answer = match &loaded.header.answer {
        None => None,
        Some(b) => match codec::decode_item::<A::Item>(&id, b) {
            Ok(item) => Some((item, Payload::from(b.as_ref()))),
            Err(e) => {
                core.load_error = Some(Box::new(e));
                return;
            }
        },
    };
    core.seed(loaded, state, bytes, answer);
}

/// Judges whether an instance (`me`) may resume `header`'s record (S19): a `Running`
/// record under another owner only once that owner's heartbeat is stale (or, on an
/// exclusive store, its process is proven gone). The refusal says why.
pub(crate) async fn judge_owner<I: 'static>(
    store: &dyn CheckpointStore<I>,
    header: &crate::store::RecordHeader,
    me: Option<&str>,
    lease_timeout: std::time::Duration,
) -> Result<(), StoreError> {
    // S19: the owner's heartbeat decides a `Running` record under another owner.
    let owner_beat = match (&header.status, header.owner.as_deref()) {
        (SessionStatus::Running, Some(owner)) if me != Some(owner) => {
            store.heartbeat(owner).await?
        }
        _ => None,
    };
    // An exclusive store proves a previous process's owner gone (issue 28).
    let orphaned = match (&header.status, header.owner.as_deref()) {
        (SessionStatus::Running, Some(owner)) if me != Some(owner) => {
            let beat = owner_beat.unwrap_or(header.heartbeat_ms);
            store.orphaned(owner, crate::store::lease::last_seen(header, beat))
        }
        _ => false,
    };
    check_resumable(header, me, owner_beat, orphaned, now_ms(), lease_timeout)
}

/// Claims a record another instance owned (issue 18, S37): one write, conditioned on the
/// version read, that names this instance the owner of a `Running` record at the next
/// lease epoch. Of several instances resuming the same record, exactly one succeeds;
/// the others are refused here and never write it. On success `header` is the record
/// as claimed (its epoch and version), so the session's own writes carry a later epoch
/// still and a paused former owner is fenced.
async fn claim<I: 'static>(
    store: &dyn CheckpointStore<I>,
    header: &mut crate::store::RecordHeader,
    owner: Option<String>,
) -> Result<(), StoreError> {
    let write = hand_over(header, owner, SessionStatus::Running, now_ms());
    let mut claimed = write.header.clone();
    match store.write(write).await {
        Ok(()) => {
            claimed.version = header.version + 1;
            *header = claimed;
            Ok(())
        }
        Err(StoreError::Changed { session, .. }) => Err(StoreError::Refused {
            session,
            status: header.status.to_string(),
            why: "another instance claimed it first (its record changed since it was read); \
                    that instance runs it now"
                .into(),
        }),
        Err(e) => Err(e),
    }
}
