//! A PostgreSQL [`CheckpointStore`] for agentloop (issue 18, DESIGN S36, S37): the
//! records, checkpoint history and instance heartbeats of sessions that several nodes
//! share. It owns its connections and its tables; it knows nothing of sessions beyond
//! the store trait, and decides nothing about records itself: every write, status
//! change and delete runs the same table code as the memory, sled and fjall stores
//! (`agentloop_core::table`), over a session's rows read inside a transaction that
//! holds the session's advisory lock. So fencing (S37: a write whose lease epoch is
//! below the stored one is refused; a cancel by id moves the epoch on) holds across
//! every node that writes through this store.
//!
//! Requests go to one of [`PostgresOptions::connections`] shards by the session's id
//! (`shard.rs`): a shard owns one connection and runs its requests in the order they
//! were made (the trait's ordering contract), many to a transaction. A write is
//! answered after its transaction commits, so it is as durable as the server makes a
//! commit. The store's level (S15b, [`PostgresOptions::durability`]) is applied to every
//! connection it opens (`level.rs`): at `power` (the default) a server running with
//! `fsync = off` (which cannot make a commit survive a power loss) is refused and
//! `synchronous_commit` is kept from being `off`; `crash` sets it `off`
//! (docs/operations.md, "Durability levels").
//!
//! ```no_run
//! # async fn demo() -> Result<(), agentloop::StoreError> {
//! use std::sync::Arc;
//! use agentloop_postgres::{PostgresOptions, PostgresStore};
//! let store = PostgresStore::<String>::connect(
//!     PostgresOptions::new("postgresql://agentloop@db.internal/agentloop"),
//! )
//! .await?;
//! let store: Arc<dyn agentloop::CheckpointStore<String>> = Arc::new(store);
//! # Ok(()) }
//! ```

mod error;
mod level;
mod rows;
mod schema;
mod shard;
mod tls;

#[cfg(feature = "local-server")]
pub mod local_server;

use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::Arc;

use agentloop::store::StoreDurability;
use agentloop::CheckpointStore;
use agentloop_core::history::{HistoryAnswer, HistoryQuery};
use agentloop_core::record::{Stored, StoredEntry};
use agentloop_core::status::{CasOutcome, SessionStatus, StatusKind};
use agentloop_core::store_error::StoreError;
use agentloop_core::write::RecordWrite;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use crate::shard::{Answer, Connection, Op, Request};

/// How to reach PostgreSQL and how many connections to hold.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// A libpq-style URL or key=value string
    /// (`postgresql://user:password@host:port/db`, `host=… port=… user=…`).
    pub url: String,
    /// Connections, one per shard (default 4). Requests of one session always use the
    /// same one.
    pub connections: usize,
    /// What an acknowledged write survives (S15b), applied to every connection: `power`
    /// (the default: the server must run with `fsync = on`, and `synchronous_commit` is
    /// kept from being `off`) or `crash` (`synchronous_commit = off`: a crash of this
    /// process loses nothing; a crash of the server or a power cut loses up to 3 × the
    /// server's `wal_writer_delay`).
    pub durability: StoreDurability,
}

impl PostgresOptions {
    /// The defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            connections: 4,
            durability: StoreDurability::default(),
        }
    }

    /// The store's level (S15b).
    pub fn durability(mut self, level: StoreDurability) -> Self {
        self.durability = level;
        self
    }
}

/// A checkpoint store in PostgreSQL. Cheap to clone: clones share the connections.
pub struct PostgresStore<I> {
    shards: Arc<[mpsc::UnboundedSender<Op>]>,
    target: Arc<str>,
    _items: PhantomData<fn() -> I>,
}

impl<I> Clone for PostgresStore<I> {
    fn clone(&self) -> Self {
        PostgresStore {
            shards: self.shards.clone(),
            target: self.target.clone(),
            _items: PhantomData,
        }
    }
}

impl<I> std::fmt::Debug for PostgresStore<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("server", &self.target)
            .field("connections", &self.shards.len())
            .finish()
    }
}

fn refused_url(url: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Database {
        operation: "connect",
        session: String::new(),
        message: format!(
            "the PostgreSQL URL {:?} is not usable ({why}); write it as \
             postgresql://user:password@host:port/database or host=… port=… user=… dbname=…",
            redact(url)
        ),
    }
}

/// The URL without its password, for messages and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => match url.find("password=") {
            Some(p) => {
                let rest = &url[p + 9..];
                let end = rest.find(' ').map_or(url.len(), |e| p + 9 + e);
                format!("{}password=***{}", &url[..p], &url[end..])
            }
            None => url.to_string(),
        },
    }
}

/// How long the server lets a connection sit idle inside a transaction before it ends
/// it: far longer than any of the store's transactions (milliseconds), shorter than a
/// cluster node's lease (3 s) plus a sweep.
pub const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(2);

impl<I> PostgresStore<I> {
    /// Connects (every connection now, so a wrong URL or a server that is down is
    /// reported here, naming the server) and creates the store's tables when missing.
    pub async fn connect(options: PostgresOptions) -> Result<Self, StoreError> {
        // S43: `sslmode` and `sslrootcert` as libpq reads them (crate::tls).
        let (url, tls_params) = tls::split(&options.url)?;
        let mut config =
            tokio_postgres::Config::from_str(&url).map_err(|e| refused_url(&url, e))?;
        // Reads sslrootcert: off the tokio worker (S43; never block one).
        let tls = {
            let params = tls_params.clone();
            tokio::task::spawn_blocking(move || tls::client_config(&params))
                .await
                .map_err(|e| StoreError::Backend {
                    operation: "connect",
                    session: String::new(),
                    message: format!("reading the TLS files failed: {e}"),
                })??
                .map(tokio_postgres_rustls::MakeRustlsConnect::new)
        };
        config.ssl_mode(match tls_params.mode {
            tls::SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            tls::SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        // A process frozen inside a transaction (SIGSTOP, a VM pause) would hold its
        // sessions' locks for as long as it is frozen, and no other node could claim
        // them (S37, S38): the server ends such a connection after IDLE_IN_TRANSACTION,
        // which rolls its write back (the frozen writer is fenced anyway).
        let guard = format!(
            "-c idle_in_transaction_session_timeout={}",
            IDLE_IN_TRANSACTION.as_millis()
        );
        let opts = match config.get_options() {
            Some(o) if !o.trim().is_empty() => format!("{o} {guard}"),
            _ => guard,
        };
        config.options(&opts);
        let host = config
            .get_hosts()
            .first()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .unwrap_or_else(|| "localhost".into());
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let target = format!("{host}:{port}");
        let level = options.durability;
        let mut first =
            Connection::open(config.clone(), target.clone(), tls.clone(), level).await?;
        create_tables(&mut first).await?;
        let n = options.connections.max(1);
        let mut shards = Vec::with_capacity(n);
        let mut conns = vec![first];
        for _ in 1..n {
            conns.push(Connection::open(config.clone(), target.clone(), tls.clone(), level).await?);
        }
        for conn in conns {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(shard::run(conn, rx));
            shards.push(tx);
        }
        tracing::info!(server = %target, connections = n, tls = ?tls_params.mode, durability = %options.durability, "PostgreSQL store connected");
        Ok(PostgresStore {
            shards: shards.into(),
            target: target.into(),
            _items: PhantomData,
        })
    }

    /// The server, as `host:port`.
    pub fn server(&self) -> &str {
        &self.target
    }

    /// The shard of a session (or an instance): FNV-1a of the id, so it is the same in
    /// every process and build.
    fn shard(&self, key: &str) -> &mpsc::UnboundedSender<Op> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        &self.shards[(h % self.shards.len() as u64) as usize]
    }

    /// Queues `request` on its shard now (the ordering contract: order of calls), and
    /// resolves to its answer.
    fn call(&self, key: &str, request: Request) -> BoxFuture<'static, Result<Answer, StoreError>> {
        // An id PostgreSQL cannot hold (S32: a control character, say) is refused here,
        // as the table code would refuse it, without a round trip.
        if let Some(id) = request.session() {
            if let Err(reason) = agentloop_core::ids::validate_session_id(id) {
                let id = id.to_string();
                return Box::pin(std::future::ready(Err(StoreError::InvalidId {
                    id,
                    reason,
                })));
            }
        }
        let (reply, answer) = oneshot::channel();
        let sent = self.shard(key).send(Op { request, reply });
        Box::pin(async move {
            sent.map_err(|_| StoreError::Closed)?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }
}

async fn create_tables(conn: &mut Connection) -> Result<(), StoreError> {
    let target = conn.target().to_string();
    let db = |e: tokio_postgres::Error| {
        crate::error::database_error(&target, "create its tables", "", &e)
    };
    let client = conn.client().await?;
    let tx = client.transaction().await.map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&schema::CREATE_LOCK])
        .await
        .map_err(db)?;
    tx.batch_execute(schema::CREATE).await.map_err(db)?;
    tx.commit().await.map_err(db)
}

/// An answer of the wrong kind: a bug in this crate, said as one.
fn unexpected(answer: Answer) -> StoreError {
    StoreError::Database {
        operation: "answer",
        session: String::new(),
        message: format!(
            "unexpected answer {answer:?} (a bug in the PostgreSQL store: please report it)"
        ),
    }
}

macro_rules! expect {
    ($fut:expr, $pat:pat => $out:expr) => {
        Box::pin(async move {
            match $fut.await? {
                $pat => Ok($out),
                other => Err(unexpected(other)),
            }
        })
    };
}

impl<I> PostgresStore<I> {
    /// Stores raw bytes under a raw key of session `session`'s rows, bypassing every
    /// check: for tests that damage records (a head that does not decode), as
    /// `SledBackend::put_raw` does for sled.
    pub fn put_raw(
        &self,
        session: &str,
        key: &[u8],
        value: &[u8],
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let request = Request::PutRaw(session.to_string(), key.to_vec(), value.to_vec());
        let f = self.call(session, request);
        expect!(f, Answer::Done => ())
    }
}

impl<I: 'static> CheckpointStore<I> for PostgresStore<I> {
    fn load_stored<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        let f = self.call(session_id, Request::Load(session_id.to_string()));
        expect!(f, Answer::Loaded(s) => s.map(|s| *s))
    }

    fn write(&self, write: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        let id = write.session_id().to_string();
        let f = self.call(&id, Request::Write(Box::new(write)));
        expect!(f, Answer::Done => ())
    }

    fn delete(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let f = self.call(session_id, Request::Delete(session_id.to_string()));
        expect!(f, Answer::Existed(b) => b)
    }

    fn purge(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let f = self.call(session_id, Request::Purge(session_id.to_string()));
        expect!(f, Answer::Existed(b) => b)
    }

    fn list_stored(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        let f = self.call("", Request::List(statuses));
        expect!(f, Answer::Listed(l) => l)
    }

    fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        // One shard asks: every shard's connection reaches the same table, and the
        // heads' index pages it in id order (`shard::page`).
        let f = self.call("", Request::Page(after.map(str::to_string), limit));
        expect!(f, Answer::Listed(l) => l)
    }

    fn list_kept_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<String>, StoreError>> {
        let f = self.call("", Request::Kept(after.map(str::to_string), limit));
        expect!(f, Answer::Ids(l) => l)
    }

    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        let request = Request::Cas {
            id: session_id.to_string(),
            from,
            to,
            now_ms: agentloop_core::store_error::now_ms(),
        };
        let f = self.call(session_id, request);
        expect!(f, Answer::Swapped(c) => c)
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        // Every shard answers a flush once the requests queued before it are done.
        let waits: Vec<_> = self
            .shards
            .iter()
            .map(|tx| {
                let (reply, answer) = oneshot::channel();
                let sent = tx.send(Op {
                    request: Request::Flush,
                    reply,
                });
                (sent, answer)
            })
            .collect();
        Box::pin(async move {
            for (sent, answer) in waits {
                sent.map_err(|_| StoreError::Closed)?;
                answer.await.map_err(|_| StoreError::Closed)??;
            }
            Ok(())
        })
    }

    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        let f = self.call(instance, Request::Beat(instance.to_string(), now_ms));
        expect!(f, Answer::Done => ())
    }

    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let f = self.call(instance, Request::Heartbeat(instance.to_string()));
        expect!(f, Answer::Beat(b) => b)
    }

    fn instances(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let f = self.call("", Request::Instances);
        expect!(f, Answer::Instances(all) => all)
    }

    fn advertise(
        &self,
        instance: &str,
        runs: &agentloop_core::adopt::Runs,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let json = match serde_json::to_string(runs) {
            Ok(j) => j,
            Err(e) => {
                return Box::pin(std::future::ready(Err(StoreError::Encode {
                    session: String::new(),
                    reason: format!("the agent versions of instance `{instance}`: {e}"),
                })))
            }
        };
        let f = self.call(instance, Request::Advertise(instance.to_string(), json));
        expect!(f, Answer::Done => ())
    }

    fn advertised(
        &self,
    ) -> BoxFuture<
        'static,
        Result<std::collections::BTreeMap<String, agentloop_core::adopt::Runs>, StoreError>,
    > {
        let f = self.call("", Request::Advertised);
        Box::pin(async move {
            match f.await? {
                Answer::Advertised(rows) => Ok(rows
                    .into_iter()
                    .filter_map(|(instance, json)| match serde_json::from_str(&json) {
                        Ok(runs) => Some((instance, runs)),
                        Err(e) => {
                            // Read as an instance that advertised nothing (runs all).
                            tracing::warn!(%instance, error = %e, "an instance's advertised agent versions do not read; it is assumed to run every version");
                            None
                        }
                    })
                    .collect()),
                other => Err(unexpected(other)),
            }
        })
    }

    fn history(
        &self,
        session_id: &str,
        query: HistoryQuery,
    ) -> BoxFuture<'static, Result<HistoryAnswer, StoreError>> {
        let f = self.call(session_id, Request::History(session_id.to_string(), query));
        expect!(f, Answer::History(h) => h)
    }

    fn keeps_events(&self) -> bool {
        true
    }

    fn keeps_history(&self) -> bool {
        true
    }

    fn append_events_then(
        &self,
        session: &str,
        epoch: u64,
        append: agentloop::store::EventAppend,
        _flush: bool,
        done: agentloop::store::committer::Answer<()>,
    ) {
        // A transaction is durable when it commits: every append waits for its own.
        let f = self.call(
            session,
            Request::AppendEvents {
                id: session.to_string(),
                epoch,
                append,
            },
        );
        tokio::spawn(async move {
            done.send(match f.await {
                Ok(Answer::Done) => Ok(()),
                Ok(other) => Err(unexpected(other)),
                Err(e) => Err(e),
            })
        });
    }

    fn read_events(
        &self,
        session: &str,
        after: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<agentloop::store::KeptEvents, StoreError>> {
        let f = self.call(
            session,
            Request::ReadEvents(session.to_string(), after, max),
        );
        expect!(f, Answer::Events(e) => e)
    }

    fn keeps_timers(&self) -> bool {
        true
    }

    fn arm_timer(
        &self,
        session: &str,
        timer: agentloop::store::StoredTimer,
        max: usize,
    ) -> BoxFuture<'static, Result<u64, StoreError>> {
        let f = self.call(session, Request::ArmTimer(session.to_string(), timer, max));
        expect!(f, Answer::Armed(n) => n)
    }

    fn cancel_timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        let f = self.call(session, Request::CancelTimer(session.to_string(), timer));
        expect!(f, Answer::Existed(e) => e)
    }

    fn change_timer(
        &self,
        session: &str,
        change: agentloop::store::TimerChange,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let f = self.call(session, Request::ChangeTimer(session.to_string(), change));
        expect!(f, Answer::Done => ())
    }

    fn timers(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Vec<(u64, agentloop::store::StoredTimer)>, StoreError>> {
        let f = self.call(session, Request::Timers(session.to_string()));
        expect!(f, Answer::Timers(t) => t)
    }

    fn due_timers(
        &self,
    ) -> BoxFuture<'static, Result<Vec<agentloop::store::TimerRef>, StoreError>> {
        let f = self.call("", Request::DueTimers);
        expect!(f, Answer::Due(d) => d)
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgresql://al:secret@db:5432/x"),
            "postgresql://al:***@db:5432/x"
        );
        assert_eq!(redact("postgresql://al@db/x"), "postgresql://al@db/x");
        assert_eq!(
            redact("host=db password=secret user=al"),
            "host=db password=*** user=al"
        );
    }
}
