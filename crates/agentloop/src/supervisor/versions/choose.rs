//! Choosing the version a session's start runs (S40), the shell around
//! `agentloop_core::versions`: read the record's version, plan, and for a migration
//! apply the chain to a copy, check that the new version reads the result (its state
//! type, the runtime's item type), then write it conditioned on the version read. A
//! failure anywhere leaves the record as it was.

use std::sync::Arc;

use super::{list, VersionError, VersionPlan};
use crate::session::SessionSpec;
use crate::store::{
    CheckpointStore, ItemChange, RecordWrite, SessionStatus, StateChange, StoreError, Stored,
};
use crate::supervisor::{AgentKind, SupervisorError};

/// The plan for a record of `version` under `kind`.
pub(crate) fn plan_for<I: 'static, E: 'static>(
    kind: &dyn AgentKind<I, E>,
    version: u32,
) -> VersionPlan {
    // The common case, asked once per record at a start: nothing to allocate.
    if kind.single_version() == Some(version) {
        return VersionPlan::Pinned(version);
    }
    super::plan(version, &kind.versions(), &kind.migrations_from())
}

/// The version of its agent kind a stored record was written by (S40; a format-1
/// record, written before versions existed, by version 1).
pub fn version_of(stored: &Stored) -> u32 {
    match stored {
        Stored::Current(r) => r.header.agent_version,
        Stored::Format1(_) => super::FIRST_VERSION,
    }
}

/// What settling a record's version found (and, unless a dry run, did).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    /// The version the session runs.
    pub(crate) version: u32,
    /// Migrated from this version (`None`: pinned).
    pub(crate) migrated_from: Option<u32>,
    /// The agent's configuration as the version that runs reads it.
    pub(crate) config: Vec<u8>,
}

/// What a record needs to run on `kind`'s versions (S40): pinned (nothing to write), or
/// the migration's write, already checked (the new version reads its state, the item
/// type its items and answer). Plain code: the caller writes.
pub(crate) fn prepare<I: 'static, E: 'static>(
    kind: &dyn AgentKind<I, E>,
    kind_name: &str,
    stored: &Stored,
) -> Result<(Settled, Option<RecordWrite>), VersionError> {
    let from = version_of(stored);
    let session = stored.session_id().to_string();
    let unavailable = |why: String| VersionError::Unavailable {
        session: session.clone(),
        kind: kind_name.to_string(),
        version: from,
        available: list(&kind.versions()),
        why,
    };
    let to = match plan_for(kind, from) {
        VersionPlan::Pinned(v) => {
            let config = match stored {
                Stored::Current(r) => r.header.agent_config.clone(),
                Stored::Format1(f) => f.agent_config.clone(),
            };
            let settled = Settled {
                version: v,
                migrated_from: None,
                config,
            };
            return Ok((settled, None));
        }
        VersionPlan::Refused { why } => return Err(unavailable(why)),
        VersionPlan::Migrate { to, .. } => to,
    };
    let Stored::Current(record) = stored else {
        return Err(unavailable(
            "it is stored in format 1, which is not migrated: resume it once on version 1 \
             (that converts it), then deploy the new version"
                .into(),
        ));
    };
    let chain: Vec<_> = (from..to).filter_map(|v| kind.migration(v)).collect();
    let failed = |reason: String| VersionError::Migration {
        session: session.clone(),
        kind: kind_name.to_string(),
        version: from,
        to,
        reason,
    };
    let write = agentloop_core::versions::migrate(record, from, &chain)
        .map_err(|e| VersionError::migration(&session, kind_name, from, to, &e))?;
    // The new version must read what the migration left: its state type, the
    // runtime's item type.
    if let StateChange::Put(s) = &write.state {
        kind.check_state(to, &session, s)
            .map_err(|e| failed(format!("version {to} cannot read the migrated state: {e}")))?;
    }
    for change in &write.items {
        if let ItemChange::Put(seq, bytes) = change {
            kind.check_item(&session, bytes).map_err(|e| {
                failed(format!(
                    "the migrated item entry {seq} does not read as the item type: {e}"
                ))
            })?;
        }
    }
    if let Some(a) = &write.header.answer {
        kind.check_item(&session, a).map_err(|e| {
            failed(format!(
                "the migrated answer does not read as the item type: {e}"
            ))
        })?;
    }
    let settled = Settled {
        version: to,
        migrated_from: Some(from),
        config: write.header.agent_config.clone(),
    };
    Ok((settled, Some(write)))
}

/// Settles `stored`'s version for `kind` (named `kind_name`): pinned, or migrated along
/// the chain and written to `store` (conditioned on the version read), or refused.
pub(crate) async fn settle<I: 'static, E: 'static>(
    store: &dyn CheckpointStore<I>,
    kind: &dyn AgentKind<I, E>,
    kind_name: &str,
    stored: &Stored,
) -> Result<Settled, VersionError> {
    let (settled, write) = prepare(kind, kind_name, stored)?;
    let Some(write) = write else {
        return Ok(settled);
    };
    let session = stored.session_id().to_string();
    let (from, to) = (settled.migrated_from.unwrap_or_default(), settled.version);
    store.write(write).await.map_err(|error| match error {
        StoreError::Changed { .. } => VersionError::Migration {
            session: session.clone(),
            kind: kind_name.to_string(),
            version: from,
            to,
            reason: "the record changed while it was migrated (another instance resumed it); \
                     nothing was written"
                .into(),
        },
        error => VersionError::Store {
            session: session.clone(),
            error,
        },
    })?;
    tracing::info!(session = %session, kind = kind_name, from, to, "migrated a session's record to a new agent version");
    Ok(settled)
}

/// Chooses the version this start of `spec` runs (S40) and sets it on the spec. A kind
/// with one version and no migration runs that version without reading anything (the
/// session's load refuses a record of another version). Otherwise the record decides:
/// none (or a finished one the start replaces) runs the newest version; a record this
/// start may resume is pinned or migrated first (its configuration, as migrated, is
/// what the factory gets); a record held by a live owner is left for the session's load
/// to refuse.
pub(crate) async fn choose<I, E>(
    kind: &Arc<dyn AgentKind<I, E>>,
    spec: &mut SessionSpec<I>,
    store: Option<&Arc<dyn CheckpointStore<I>>>,
) -> Result<(), SupervisorError>
where
    I: Send + 'static,
    E: 'static,
{
    let versions = kind.versions();
    spec.run.agent_version = versions.last().copied().unwrap_or(super::FIRST_VERSION);
    if kind.single_version().is_some() {
        return Ok(());
    }
    let store = match store {
        Some(s) if spec.run.load_record => s,
        _ => {
            // A restart from the items its predecessor handed back (no record read)
            // runs the version that predecessor ran, while it is registered.
            if let Some(v) = spec.run.restart_version.filter(|v| versions.contains(v)) {
                spec.run.agent_version = v;
            }
            return Ok(());
        }
    };
    if let Some(rec) = &spec.preloaded {
        match plan_for(&**kind, rec.header.agent_version) {
            VersionPlan::Pinned(v) => {
                spec.run.agent_version = v;
                return Ok(());
            }
            // Read again below: a migration works on the record as stored.
            _ => spec.preloaded = None,
        }
    }
    let stored = match store.load_stored(&spec.id).await {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(()),
        Err(e) => {
            return Err(SupervisorError::Version(VersionError::Store {
                session: spec.id.clone(),
                error: e,
            }))
        }
    };
    let replaced = match &stored {
        Stored::Current(r) => {
            r.header.status == SessionStatus::Completed && r.items.is_empty() && r.state.is_none()
        }
        Stored::Format1(_) => false,
    };
    if replaced {
        return Ok(());
    }
    if let Stored::Current(r) = &stored {
        let judged = crate::session::judge_owner(
            &**store,
            &r.header,
            spec.owner.as_deref(),
            spec.effective_lease_timeout(),
        )
        .await;
        if judged.is_err() {
            // Not this start's to resume: the session's load refuses it with the reason.
            return Ok(());
        }
    }
    let settled = settle(&**store, &**kind, &spec.kind, &stored)
        .await
        .map_err(SupervisorError::Version)?;
    spec.run.agent_version = settled.version;
    spec.agent_config = settled.config;
    Ok(())
}
