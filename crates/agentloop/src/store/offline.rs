//! The typed writes a tool makes to a data directory with no runtime on it (imports,
//! repairs, `agentloop sessions delete`, tests): one change, several, a delete, a purge,
//! a heartbeat, each applied as one wave and made durable before it answers. Owns the
//! mapping of those calls onto the write-op language (`wave`), which stays inside the
//! crate; it does not touch an engine itself (the backend passes its `apply`).

use crate::store::wave::{OpResult, WriteOp};
use crate::store::write::RecordWrite;
use crate::store::StoreError;

/// How a backend applies one wave and makes it durable.
pub(crate) type Apply<'a> = &'a dyn Fn(Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>>;

/// Applies `writes` in order as one durable wave; the first failure, if any.
pub(crate) fn write_all(apply: Apply<'_>, writes: Vec<RecordWrite>) -> Result<(), StoreError> {
    let ops = writes
        .into_iter()
        .map(|w| WriteOp::Write(Box::new(w)))
        .collect();
    apply(ops).into_iter().try_for_each(|r| r.map(|_| ()))
}

/// Applies one operation that answers whether a record existed.
pub(crate) fn removal(
    apply: Apply<'_>,
    op: WriteOp,
    operation: &'static str,
    id: &str,
) -> Result<bool, StoreError> {
    match apply(vec![op]).pop() {
        Some(Ok(OpResult::Deleted(existed))) => Ok(existed),
        Some(Ok(other)) => Err(unexpected(operation, id, &format!("{other:?}"))),
        Some(Err(e)) => Err(e),
        None => Err(unexpected(operation, id, "nothing")),
    }
}

/// Renews an instance heartbeat durably.
pub(crate) fn beat(apply: Apply<'_>, instance: &str, now_ms: u64) -> Result<(), StoreError> {
    let op = WriteOp::Beat {
        instance: instance.to_string(),
        now_ms,
    };
    match apply(vec![op]).pop() {
        Some(r) => r.map(|_| ()),
        None => Err(unexpected("beat", "", "nothing")),
    }
}

fn unexpected(operation: &'static str, id: &str, what: &str) -> StoreError {
    StoreError::Backend {
        operation,
        session: id.to_string(),
        message: format!(
            "the engine answered {what} for the {operation}; this is a bug in agentloop, please report it"
        ),
    }
}
