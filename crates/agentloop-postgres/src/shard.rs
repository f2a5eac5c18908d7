//! One connection to PostgreSQL and the task that owns it: the store's requests for
//! the sessions hashed to this shard, run in the order they were made, many per
//! transaction (group commit). This file owns the connection, its reconnection and
//! the transaction around a batch; what a request does to a session's rows is the
//! shared table code's (`agentloop_core::table`), run over [`SessionRows`].
//!
//! A batch is every session request waiting when the shard gets to it (up to
//! [`BATCH_MAX`]): one transaction locks their sessions (advisory locks in one global
//! order, so two nodes cannot deadlock), reads their rows, applies the requests in
//! order, writes what changed and commits; only then is anyone answered, so an answered
//! write is durable to the server's `synchronous_commit`. Requests that are not about
//! one session (list, heartbeats, flush) run alone, between batches, in order.

use std::collections::HashMap;

use agentloop_core::header::Payload;
use agentloop_core::history::{HistoryAnswer, HistoryQuery};
use agentloop_core::record::{Stored, StoredEntry};
use agentloop_core::status::{CasOutcome, SessionStatus, StatusKind};
use agentloop_core::store_error::StoreError;
use agentloop_core::table;
use agentloop_core::table::history;
use agentloop_core::write::RecordWrite;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{Client, Config, NoTls};

use crate::rows::SessionRows;
use crate::schema;

/// The most requests one transaction carries.
pub(crate) const BATCH_MAX: usize = 256;

/// What a request asks.
pub(crate) enum Request {
    Load(String),
    Write(Box<RecordWrite>),
    Delete(String),
    Purge(String),
    Cas {
        id: String,
        from: Vec<StatusKind>,
        to: SessionStatus,
        now_ms: u64,
    },
    History(String, HistoryQuery),
    AppendEvents {
        id: String,
        epoch: u64,
        append: table::events::EventAppend,
    },
    ReadEvents(String, u64, usize),
    ArmTimer(String, table::timers::StoredTimer, usize),
    CancelTimer(String, u64),
    ChangeTimer(String, table::timers::TimerChange),
    Timers(String),
    DueTimers,
    List(Option<Vec<StatusKind>>),
    /// One page of records in id order: after this id, at most this many (issue 52).
    Page(Option<String>, usize),
    /// One page of the sessions that keep history or events, in id order (S26a).
    Kept(Option<String>, usize),
    /// Store raw bytes under a raw key of a session, bypassing every check (tests).
    PutRaw(String, Vec<u8>, Vec<u8>),
    Beat(String, u64),
    Heartbeat(String),
    Instances,
    /// Record what an instance can run (S40), as JSON.
    Advertise(String, String),
    /// What every instance advertised.
    Advertised,
    Flush,
}

/// What a request is answered.
#[derive(Debug)]
pub(crate) enum Answer {
    Done,
    Loaded(Option<Box<Stored>>),
    Existed(bool),
    Swapped(CasOutcome),
    History(HistoryAnswer),
    Events(table::events::KeptEvents),
    Armed(u64),
    Timers(Vec<(u64, table::timers::StoredTimer)>),
    Due(Vec<agentloop_core::timers::TimerRef>),
    Listed(Vec<StoredEntry>),
    Ids(Vec<String>),
    Beat(Option<u64>),
    Instances(Vec<(String, u64)>),
    Advertised(Vec<(String, String)>),
}

/// A request and where its answer goes.
pub(crate) struct Op {
    pub(crate) request: Request,
    pub(crate) reply: oneshot::Sender<Result<Answer, StoreError>>,
}

impl Request {
    /// The session a request is about, if it is about one.
    pub(crate) fn session(&self) -> Option<&str> {
        match self {
            Request::Load(id)
            | Request::Delete(id)
            | Request::Purge(id)
            | Request::History(id, _)
            | Request::ReadEvents(id, ..)
            | Request::ArmTimer(id, ..)
            | Request::CancelTimer(id, _)
            | Request::ChangeTimer(id, _)
            | Request::Timers(id)
            | Request::AppendEvents { id, .. }
            | Request::Cas { id, .. } => Some(id),
            Request::Write(w) => Some(w.session_id()),
            Request::List(_)
            | Request::Page(..)
            | Request::Kept(..)
            | Request::PutRaw(..)
            | Request::DueTimers
            | Request::Beat(..)
            | Request::Heartbeat(_)
            | Request::Instances
            | Request::Advertise(..)
            | Request::Advertised
            | Request::Flush => None,
        }
    }

    fn operation(&self) -> &'static str {
        match self {
            Request::Load(_) => "load",
            Request::Write(_) => "save",
            Request::Delete(_) => "delete",
            Request::Purge(_) => "delete",
            Request::Cas { .. } => "change the status of",
            Request::History(..) => "read the history of",
            Request::AppendEvents { .. } => "keep the events of",
            Request::ReadEvents(..) => "read the events of",
            Request::ArmTimer(..) => "arm a timer of",
            Request::CancelTimer(..) => "cancel a timer of",
            Request::ChangeTimer(..) => "change a timer of",
            Request::Timers(_) => "read the timers of",
            Request::DueTimers => "read the due timers",
            Request::List(_) | Request::Page(..) | Request::Kept(..) => "list",
            Request::PutRaw(..) => "save",
            Request::Beat(..) => "renew the heartbeat",
            Request::Heartbeat(_) => "read the heartbeat",
            Request::Instances => "list the instances",
            Request::Advertise(..) => "advertise the agent versions of",
            Request::Advertised => "read the agent versions of the instances",
            Request::Flush => "flush",
        }
    }
}

/// A connection that reconnects when it was lost.
pub(crate) struct Connection {
    config: Config,
    target: String,
    client: Option<Client>,
    /// The store's level, applied to each connection made (S15b, `level.rs`).
    level: agentloop::store::StoreDurability,
    /// TLS to the server (S43, `crate::tls`); `None`: plain TCP.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl Connection {
    /// Connects now (so a wrong URL or a server that is down is reported at start).
    pub(crate) async fn open(
        config: Config,
        target: String,
        tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
        level: agentloop::store::StoreDurability,
    ) -> Result<Self, StoreError> {
        let mut c = Connection {
            config,
            target,
            client: None,
            level,
            tls,
        };
        c.client().await?;
        Ok(c)
    }

    /// The connected client, reconnecting when the last one closed.
    pub(crate) async fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let failed = |e: tokio_postgres::Error| {
                crate::error::database_error(&self.target, "connect", "", &e)
            };
            let lost = |target: String| {
                move |e: tokio_postgres::Error| {
                    tracing::warn!(server = %target, error = %e, "connection to PostgreSQL lost; the next request reconnects");
                }
            };
            let client = match &self.tls {
                None => {
                    let (client, connection) = self.config.connect(NoTls).await.map_err(failed)?;
                    let lost = lost(self.target.clone());
                    tokio::spawn(async move { connection.await.unwrap_or_else(lost) });
                    client
                }
                Some(tls) => {
                    let (client, connection) =
                        self.config.connect(tls.clone()).await.map_err(failed)?;
                    let lost = lost(self.target.clone());
                    tokio::spawn(async move { connection.await.unwrap_or_else(lost) });
                    client
                }
            };
            crate::level::apply(&client, &self.target, self.level).await?;
            self.client = Some(client);
        }
        self.client.as_mut().ok_or(StoreError::Closed)
    }

    /// The server, as `host:port`, for messages.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }
}

/// Runs a shard until every sender is gone and its queue is empty.
pub(crate) async fn run(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Op>) {
    let mut carried: Option<Op> = None;
    loop {
        let first = match carried.take() {
            Some(op) => op,
            None => match rx.recv().await {
                Some(op) => op,
                None => return,
            },
        };
        if first.request.session().is_none() {
            guarded(&mut conn, |conn| Box::pin(alone(conn, first))).await;
            continue;
        }
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(op) if op.request.session().is_some() => batch.push(op),
                Ok(op) => {
                    carried = Some(op);
                    break;
                }
                Err(_) => break,
            }
        }
        guarded(&mut conn, |conn| Box::pin(sessions(conn, batch))).await;
    }
}

/// Runs one step of the shard; a panic in it (a bug, in this crate or the driver) is
/// logged, its requests hear `Closed` (their answers were dropped), the connection is
/// replaced, and the shard goes on serving the sessions hashed to it.
async fn guarded<F>(conn: &mut Connection, step: F)
where
    F: for<'c> FnOnce(&'c mut Connection) -> futures::future::BoxFuture<'c, ()>,
{
    use futures::FutureExt;
    let outcome = std::panic::AssertUnwindSafe(step(conn))
        .catch_unwind()
        .await;
    if outcome.is_err() {
        tracing::error!(server = %conn.target(), "a PostgreSQL store request panicked; its callers were told the store closed, and the connection is replaced");
        conn.client = None;
    }
}

/// Runs a request that is not about one session.
async fn alone(conn: &mut Connection, op: Op) {
    let operation = op.request.operation();
    let target = conn.target().to_string();
    let answer = async {
        let client = conn.client().await?;
        let db =
            |e: tokio_postgres::Error| crate::error::database_error(&target, operation, "", &e);
        match op.request {
            Request::Flush => Ok(Answer::Done),
            Request::Beat(instance, now_ms) => {
                let ms = i64::try_from(now_ms).unwrap_or(i64::MAX);
                client
                    .execute(schema::BEAT, &[&instance, &ms])
                    .await
                    .map_err(db)?;
                Ok(Answer::Done)
            }
            Request::Heartbeat(instance) => {
                let row = client
                    .query_opt(schema::HEARTBEAT, &[&instance])
                    .await
                    .map_err(db)?;
                Ok(Answer::Beat(
                    row.map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)),
                ))
            }
            Request::Advertise(instance, runs) => {
                client
                    .execute(schema::ADVERTISE, &[&instance, &runs])
                    .await
                    .map_err(db)?;
                Ok(Answer::Done)
            }
            Request::Advertised => {
                let rows = client.query(schema::ADVERTISED, &[]).await.map_err(db)?;
                Ok(Answer::Advertised(
                    rows.into_iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                        .collect(),
                ))
            }
            Request::Instances => {
                let rows = client.query(schema::INSTANCES, &[]).await.map_err(db)?;
                Ok(Answer::Instances(
                    rows.into_iter()
                        .map(|r| {
                            (
                                r.get::<_, String>(0),
                                u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
                            )
                        })
                        .collect(),
                ))
            }
            Request::DueTimers => {
                let rows = client.query(schema::DUE_ROWS, &[]).await.map_err(db)?;
                Ok(Answer::Due(
                    rows.into_iter()
                        .filter_map(|r| table::timers::parse_due_key(&r.get::<_, Vec<u8>>(0)))
                        .collect(),
                ))
            }
            Request::List(statuses) => {
                let rows = client.query(schema::LIST_ROWS, &[]).await.map_err(db)?;
                let scan = rows.into_iter().map(|r| {
                    let key: Vec<u8> = r.get(0);
                    let value: Vec<u8> = r.get(1);
                    Ok((key, Payload::from(value)))
                });
                table::list(scan, std::iter::empty(), statuses.as_deref()).map(Answer::Listed)
            }
            Request::PutRaw(session, key, value) => {
                let (session, key, value) = (vec![session], vec![key], vec![value]);
                client
                    .execute(schema::PUT_ROWS, &[&session, &key, &value])
                    .await
                    .map_err(db)?;
                Ok(Answer::Done)
            }
            Request::Page(after, limit) => page(client, after.as_deref(), limit)
                .await
                .map_err(db)
                .map(Answer::Listed),
            Request::Kept(after, limit) => {
                // An `after` with a NUL (no id has one, and PostgreSQL's text holds
                // none) comes after the same ids as its part before the NUL.
                let after = after
                    .as_deref()
                    .map(|a| a.split('\0').next().unwrap_or_default())
                    .unwrap_or_default();
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                client
                    .query(schema::KEPT_PAGE, &[&after, &limit])
                    .await
                    .map_err(db)
                    .map(|rows| Answer::Ids(rows.into_iter().map(|r| r.get(0)).collect()))
            }
            _ => Err(StoreError::Closed),
        }
    }
    .await;
    let _ = op.reply.send(answer);
}

/// One page of records in id order after `after`, at most `limit` (issue 52): the
/// page's sessions from the heads' index (a seek and `limit` index entries, whatever
/// the table holds), then only their live-record rows, each record read by the shared
/// table code as a load reads it (a corrupt one listed with its error). Every shard's
/// connection reaches the same table, so one query is the whole store's page.
async fn page(
    client: &Client,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<StoredEntry>, tokio_postgres::Error> {
    // From the first key past every key of `after` (`<after> 0x01`), or from the
    // first id byte. An `after` with a NUL (no id has one) comes after the same ids as
    // its part before the NUL.
    let from: Vec<u8> = match after {
        Some(a) => {
            let a = a.split('\0').next().unwrap_or_default();
            let mut k = a.as_bytes().to_vec();
            k.push(1);
            k
        }
        None => vec![0x20],
    };
    let limit_rows = i64::try_from(limit).unwrap_or(i64::MAX);
    let ids: Vec<String> = client
        .query(schema::PAGE_HEADS, &[&from, &limit_rows])
        .await?
        .into_iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|id| after.is_none_or(|a| id.as_str() > a))
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut tables: HashMap<String, SessionRows> = HashMap::with_capacity(ids.len());
    for row in client.query(schema::PAGE_ROWS, &[&ids]).await? {
        let session: String = row.get(0);
        let key: Vec<u8> = row.get(1);
        let value: Vec<u8> = row.get(2);
        tables
            .entry(session)
            .or_default()
            .insert_read(key, Some(Payload::from(value)));
    }
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let rows = tables.remove(&id).unwrap_or_default();
        match table::read(&rows, &id) {
            Ok(Some(record)) => out.push(StoredEntry {
                session_id: id,
                record: Ok(record),
            }),
            Ok(None) => {}
            Err(e) => out.push(StoredEntry {
                session_id: id,
                record: Err(e),
            }),
        }
    }
    Ok(out)
}

/// Runs a batch of session requests in one transaction.
async fn sessions(conn: &mut Connection, batch: Vec<Op>) {
    let target = conn.target().to_string();
    let mut ids: Vec<String> = batch
        .iter()
        .filter_map(|op| op.request.session().map(str::to_string))
        .collect();
    ids.sort();
    ids.dedup();
    // History and kept-event values are read only when a request needs them.
    let with_history = batch
        .iter()
        .any(|op| matches!(op.request, Request::History(..) | Request::ReadEvents(..)));
    let mut replies = Vec::with_capacity(batch.len());
    let result: Result<(), StoreError> = async {
        let db = |e: tokio_postgres::Error| crate::error::database_error(&target, "save", "", &e);
        let client = conn.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        tx.execute(schema::LOCK_SESSIONS, &[&ids])
            .await
            .map_err(db)?;
        let mut tables: HashMap<String, SessionRows> = HashMap::with_capacity(ids.len());
        for row in tx
            .query(schema::READ_SESSIONS, &[&ids, &with_history])
            .await
            .map_err(db)?
        {
            let session: String = row.get(0);
            let key: Vec<u8> = row.get(1);
            let value: Option<Vec<u8>> = row.get(2);
            tables
                .entry(session)
                .or_default()
                .insert_read(key, value.map(Payload::from));
        }
        for op in batch {
            let id = op.request.session().unwrap_or_default().to_string();
            let rows = tables.entry(id).or_default();
            replies.push((op.reply, apply(rows, op.request)));
        }
        let (mut put_s, mut put_k, mut put_v) = (Vec::new(), Vec::new(), Vec::new());
        let (mut del_s, mut del_k) = (Vec::new(), Vec::new());
        for (session, rows) in tables.iter_mut() {
            for (key, value) in rows.take_changes() {
                match value {
                    Some(v) => {
                        put_s.push(session.as_str());
                        put_k.push(key);
                        put_v.push(v.to_vec());
                    }
                    None => {
                        del_s.push(session.as_str());
                        del_k.push(key);
                    }
                }
            }
        }
        if !del_s.is_empty() {
            tx.execute(schema::REMOVE_ROWS, &[&del_s, &del_k])
                .await
                .map_err(db)?;
        }
        if !put_s.is_empty() {
            tx.execute(schema::PUT_ROWS, &[&put_s, &put_k, &put_v])
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }
    .await;
    match result {
        Ok(()) => {
            for (reply, answer) in replies {
                let _ = reply.send(answer);
            }
        }
        Err(e) => {
            // Nothing of the batch is known to be written: every request hears why.
            tracing::warn!(error = %e, requests = replies.len(), "a PostgreSQL transaction failed; its writes were not acknowledged");
            for (reply, _) in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// What one session request does to its session's rows (the shared table code).
fn apply(rows: &mut SessionRows, request: Request) -> Result<Answer, StoreError> {
    match request {
        Request::Load(id) => table::read(rows, &id).map(|s| Answer::Loaded(s.map(Box::new))),
        Request::Write(w) => table::write(rows, *w).map(|()| Answer::Done),
        Request::Delete(id) => table::delete(rows, &id).map(Answer::Existed),
        Request::Purge(id) => table::purge(rows, &id).map(Answer::Existed),
        Request::Cas {
            id,
            from,
            to,
            now_ms,
        } => table::cas(rows, &id, &from, to, now_ms).map(Answer::Swapped),
        Request::History(id, query) => history::read(rows, &id, query).map(Answer::History),
        Request::AppendEvents { id, epoch, append } => {
            table::events::append_events(rows, &id, epoch, append).map(|()| Answer::Done)
        }
        Request::ReadEvents(id, after, max) => {
            table::events::read_events(rows, &id, after, max).map(Answer::Events)
        }
        Request::ArmTimer(id, timer, max) => {
            table::timers::arm(rows, &id, timer, max).map(Answer::Armed)
        }
        Request::CancelTimer(id, n) => table::timers::cancel(rows, &id, n).map(Answer::Existed),
        Request::ChangeTimer(id, c) => {
            table::timers::apply(rows, &id, vec![c]).map(|()| Answer::Done)
        }
        Request::Timers(id) => table::timers::list(rows, &id).map(Answer::Timers),
        Request::List(_)
        | Request::Page(..)
        | Request::Kept(..)
        | Request::PutRaw(..)
        | Request::DueTimers
        | Request::Beat(..)
        | Request::Heartbeat(_)
        | Request::Instances
        | Request::Advertise(..)
        | Request::Advertised
        | Request::Flush => Err(StoreError::Closed),
    }
}
