//! The store's error for a failed PostgreSQL call: which server, what it was doing and
//! PostgreSQL's own message. This file only words errors; it runs no statement.

use agentloop_core::store_error::StoreError;

/// The error for a failed database call, naming the server and PostgreSQL's own
/// message (its `DbError` when there is one: the useful part).
pub(crate) fn database_error(
    target: &str,
    operation: &'static str,
    session: &str,
    e: &tokio_postgres::Error,
) -> StoreError {
    let said = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                source = inner.source();
            }
            s
        }
    };
    StoreError::Database {
        operation,
        session: session.to_string(),
        message: format!("PostgreSQL at {target}: {said}"),
    }
}
