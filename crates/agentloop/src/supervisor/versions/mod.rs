//! Agent versions (DESIGN S40): a kind registered at several versions side by side
//! ([`AgentVersions`]), migrations between consecutive versions ([`Migration`]), and
//! how a start chooses the version a session runs ([`choose`](self)): the record's own
//! when it is registered (pinned), else the newest after migrating the record along the
//! chain, else refused with a [`VersionError`] that names the kind, the record's
//! version and the versions available, the record kept (S18).
//!
//! The judgements (the plan, what a migration writes) are plain code in
//! `agentloop_core::versions`; this module is the shell that reads the record, writes
//! the migrated one and checks the new code can read it. It never runs a turn and
//! never touches the supervisor's registry. [`dry_run`] reports what a deploy would do
//! to the stored sessions without writing anything.

mod choose;
mod dry_run;
mod error;
mod kinds;

pub use agentloop_core::header::FIRST_VERSION;
pub use agentloop_core::versions::{
    plan, JournalPolicy, Migration, MigrationError, PayloadFn, VersionPlan,
};
pub use choose::version_of;
pub(crate) use choose::{choose, plan_for};
pub use dry_run::{dry_run, DeployPlan, PlannedSession, SessionFate};
pub use error::VersionError;
pub use kinds::AgentVersions;
pub(crate) use kinds::Kinds;

/// The versions of a kind, written for people: `1, 2`.
pub(crate) fn list(versions: &std::collections::BTreeSet<u32>) -> String {
    versions
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a runtime with `kinds` can run (S40), as it advertises it to the other nodes:
/// for each kind, its registered versions and every older version a chain of
/// migrations leads from to the newest.
pub(crate) fn runs_of<I: 'static, E: 'static>(kinds: &Kinds<I, E>) -> agentloop_core::adopt::Runs {
    kinds
        .iter()
        .map(|(name, kind)| {
            let mut runs = kind.versions();
            let migrations = kind.migrations_from();
            if let Some(&newest) = runs.last() {
                let mut v = newest;
                while let Some(before) = v.checked_sub(1).filter(|p| migrations.contains(p)) {
                    runs.insert(before);
                    v = before;
                }
            }
            (name.clone(), runs)
        })
        .collect()
}
