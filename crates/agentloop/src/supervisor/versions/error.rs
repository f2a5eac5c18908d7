//! Why a session's record could not run on this runtime's versions of its kind (S40).
//! Every message names the session, the kind, the record's version and what to do; the
//! record is always left as it was.

use crate::store::StoreError;
use agentloop_core::versions::MigrationError;

/// A record this runtime cannot run, or could not migrate; the record is kept as it was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// No registered version runs the record, and no chain of migrations leads from its
    /// version to one that does.
    #[error(
        "session `{session}` was written by version {version} of agent kind `{kind}`, and \
         this runtime runs version(s) {available} of it: {why}; its record is kept as it is"
    )]
    Unavailable {
        /// The session.
        session: String,
        /// The agent kind.
        kind: String,
        /// The record's version.
        version: u32,
        /// The versions registered here.
        available: String,
        /// Why no migration applies, with what to do.
        why: String,
    },
    /// A migration function failed, its result did not read as the new version's, or
    /// journaled steps keep the record on its version.
    #[error(
        "session `{session}` (agent kind `{kind}`) could not be migrated from version \
         {version} to {to}: {reason}; its record is kept as it is (fix the migration, or \
         register version {version} again)"
    )]
    Migration {
        /// The session.
        session: String,
        /// The agent kind.
        kind: String,
        /// The record's version.
        version: u32,
        /// The version it was migrated to.
        to: u32,
        /// What failed.
        reason: String,
    },
    /// Reading or writing the record failed.
    #[error("session `{session}`: the store refused its version's migration: {error}")]
    Store {
        /// The session.
        session: String,
        /// The store's error.
        error: StoreError,
    },
}

impl VersionError {
    pub(crate) fn migration(
        session: &str,
        kind: &str,
        version: u32,
        to: u32,
        error: &MigrationError,
    ) -> Self {
        VersionError::Migration {
            session: session.to_string(),
            kind: kind.to_string(),
            version,
            to,
            reason: error.to_string(),
        }
    }
}
