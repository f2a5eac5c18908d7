//! The store's durability level on a PostgreSQL connection (S15b). This file owns what
//! a new connection is checked and set for; it knows nothing of records or shards.
//!
//! The level is a floor, applied on every connection the store opens (at connect and
//! at each reconnect):
//! - `power`: the server must run with `fsync = on` (else a commit cannot survive a
//!   power loss, and the connection is refused, naming `crash`, the level the server
//!   can give); `synchronous_commit` must not be `off`: a connection where it is gets
//!   `SET synchronous_commit = on`, and is refused if that did not take (a pooler that
//!   drops session settings). `local`, `on`, `remote_write` and `remote_apply` all flush
//!   the commit's WAL locally before answering and are kept as the server has them.
//! - `crash`: `SET synchronous_commit = off` (an explicit choice for speed); never
//!   refused: whatever the server does is at least that.

use agentloop::store::StoreDurability;
use agentloop_core::store_error::StoreError;
use tokio_postgres::Client;

fn refused(target: &str, why: String) -> StoreError {
    StoreError::Database {
        operation: "connect",
        session: String::new(),
        message: format!("the PostgreSQL server at {target} {why}"),
    }
}

async fn show(client: &Client, target: &str, setting: &str) -> Result<String, StoreError> {
    let db = |e: tokio_postgres::Error| {
        crate::error::database_error(target, "read its settings", "", &e)
    };
    let row = client
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .map_err(db)?;
    row.try_get::<_, String>(0).map_err(db)
}

/// Checks and sets `level` on a connection just opened.
pub(crate) async fn apply(
    client: &Client,
    target: &str,
    level: StoreDurability,
) -> Result<(), StoreError> {
    let set = |value: &'static str| async move {
        client
            .batch_execute(&format!("SET synchronous_commit = {value}"))
            .await
            .map_err(|e| crate::error::database_error(target, "set synchronous_commit", "", &e))
    };
    match level {
        StoreDurability::Crash => set("off").await,
        StoreDurability::Power => {
            let fsync = show(client, target, "fsync").await?;
            if fsync != "on" {
                return Err(refused(
                    target,
                    format!(
                        "runs with fsync = {fsync}, so a commit cannot survive a power loss and \
                         durability power cannot be given: turn fsync on in its postgresql.conf, \
                         or choose durability crash (`--durability crash`, `[store] durability = \
                         \"crash\"`), the only level this server can give"
                    ),
                ));
            }
            if show(client, target, "synchronous_commit").await? != "off" {
                return Ok(());
            }
            set("on").await?;
            let now = show(client, target, "synchronous_commit").await?;
            if now == "off" {
                return Err(refused(
                    target,
                    "kept synchronous_commit = off on this store's connection after `SET \
                     synchronous_commit = on`, so durability power cannot be given: a pooler \
                     between the store and the server drops session settings (PgBouncer in \
                     transaction mode); connect to the server directly, or to a pool in session \
                     mode"
                        .to_string(),
                ));
            }
            Ok(())
        }
    }
}
