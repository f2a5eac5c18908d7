//! The tables the store keeps in PostgreSQL and the statements it runs on them. This
//! file owns the SQL text; `shard.rs` runs it.
//!
//! ```text
//! agentloop_entries   (session text, key bytea, value bytea)   one row per table entry
//!                     (+ a partial index on the timers' due-time keys, S39, and
//!                     one on the records' heads, for pages of records, issue 52,
//!                     and one on the sessions that keep history or events, S26a)
//! agentloop_instances (instance text, beat_ms bigint)          one heartbeat per instance
//! agentloop_runs      (instance text, runs text)               what each instance can run
//!                                                               (S40: kinds and versions, JSON)
//! ```
//!
//! An entry's `key` is exactly the key the embedded engines use (`agentloop_core::table`
//! and `history`), so export/import and the conformance suite see one layout; `session`
//! repeats the key's id so one session's rows (record and history) are one index range.

/// Creates the tables when missing. Run under an advisory lock so two nodes starting
/// together do not race PostgreSQL's catalog.
pub(crate) const CREATE: &str = "
CREATE TABLE IF NOT EXISTS agentloop_entries (
    session text NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (session, key)
);
CREATE INDEX IF NOT EXISTS agentloop_due_timers ON agentloop_entries (key)
    WHERE get_byte(key, 0) = 3;
CREATE INDEX IF NOT EXISTS agentloop_heads ON agentloop_entries (key)
    WHERE get_byte(key, 0) > 4 AND length(key) = octet_length(session) + 2
        AND get_byte(key, length(key) - 1) = 104;
CREATE INDEX IF NOT EXISTS agentloop_kept ON agentloop_entries ((session COLLATE \"C\"))
    WHERE get_byte(key, 0) IN (1, 2);
CREATE TABLE IF NOT EXISTS agentloop_instances (
    instance text PRIMARY KEY,
    beat_ms bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS agentloop_runs (
    instance text PRIMARY KEY,
    runs text NOT NULL
);
";

/// The advisory lock key that serializes [`CREATE`] across nodes ("agentlp" in ASCII).
pub(crate) const CREATE_LOCK: i64 = 0x0061_6765_6e74_6c70;

/// Locks the sessions `$1` for the transaction, in one global order (the lock key's),
/// so two nodes locking overlapping batches cannot deadlock.
pub(crate) const LOCK_SESSIONS: &str = "
SELECT pg_advisory_xact_lock(k) FROM (
    SELECT DISTINCT hashtextextended(s, 0) AS k FROM unnest($1::text[]) AS s ORDER BY k
) AS ordered";

/// Every row of the sessions `$1`; history values only when `$2` (a write needs only
/// the history keys).
pub(crate) const READ_SESSIONS: &str = "
SELECT session, key, CASE WHEN $2 OR get_byte(key, 0) NOT IN (1, 2) THEN value END
FROM agentloop_entries WHERE session = ANY($1::text[])";

/// Stores rows `(session, key, value)` given as three arrays.
pub(crate) const PUT_ROWS: &str = "
INSERT INTO agentloop_entries (session, key, value)
SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])
ON CONFLICT (session, key) DO UPDATE SET value = EXCLUDED.value";

/// Removes rows `(session, key)` given as two arrays.
pub(crate) const REMOVE_ROWS: &str = "
DELETE FROM agentloop_entries AS e
USING unnest($1::text[], $2::bytea[]) AS gone(session, key)
WHERE e.session = gone.session AND e.key = gone.key";

/// Every live-record row (history, kept events and timers excluded), in key order:
/// what a list groups.
pub(crate) const LIST_ROWS: &str = "
SELECT key, value FROM agentloop_entries WHERE get_byte(key, 0) NOT IN (1, 2, 3, 4) ORDER BY key";

/// The sessions of one page of records, in id order: the heads (`<id> 0x00 'h'`: one
/// per record, the partial index [`CREATE`] makes) from key `$1` on, at most `$2`. A
/// head's key order is its id's order (bytes, whatever the database's collation).
pub(crate) const PAGE_HEADS: &str = "
SELECT session FROM agentloop_entries
WHERE get_byte(key, 0) > 4 AND length(key) = octet_length(session) + 2
    AND get_byte(key, length(key) - 1) = 104 AND key >= $1
ORDER BY key LIMIT $2";

/// The live-record rows of the sessions `$1` (history, kept events and timers, whose
/// keys start below any id, excluded): what a page reads of its records.
pub(crate) const PAGE_ROWS: &str = "
SELECT session, key, value FROM agentloop_entries
WHERE session = ANY($1::text[]) AND key >= '\\x20'::bytea";

/// One page of the sessions that keep checkpoint history or events (S26a; keys marked
/// 1 and 2), in id order (byte order: `COLLATE "C"`) after `$1`, at most `$2`: a loose
/// scan of the partial index [`CREATE`] makes, one seek per session listed however many
/// entries each keeps.
pub(crate) const KEPT_PAGE: &str = r#"
WITH RECURSIVE ids(s) AS (
    (SELECT session COLLATE "C" FROM agentloop_entries
        WHERE get_byte(key, 0) IN (1, 2) AND session COLLATE "C" > $1
        ORDER BY session COLLATE "C" LIMIT 1)
    UNION ALL
    SELECT (SELECT session COLLATE "C" FROM agentloop_entries
        WHERE get_byte(key, 0) IN (1, 2) AND session COLLATE "C" > ids.s
        ORDER BY session COLLATE "C" LIMIT 1)
    FROM ids WHERE ids.s IS NOT NULL
)
SELECT s FROM ids WHERE s IS NOT NULL LIMIT $2"#;

/// The due-time index of every session's timers (S39), earliest first (keys only; the
/// partial index [`CREATE`] makes keeps the scan to them).
pub(crate) const DUE_ROWS: &str = "
SELECT key FROM agentloop_entries WHERE get_byte(key, 0) = 3 ORDER BY key";

/// Renews an instance's heartbeat.
pub(crate) const BEAT: &str = "
INSERT INTO agentloop_instances (instance, beat_ms) VALUES ($1, $2)
ON CONFLICT (instance) DO UPDATE SET beat_ms = EXCLUDED.beat_ms";

/// Every instance's last heartbeat, by name.
pub(crate) const INSTANCES: &str =
    "SELECT instance, beat_ms FROM agentloop_instances ORDER BY instance";

/// Records what an instance can run (S40: agent kinds and versions, as JSON).
pub(crate) const ADVERTISE: &str = "
INSERT INTO agentloop_runs (instance, runs) VALUES ($1, $2)
ON CONFLICT (instance) DO UPDATE SET runs = EXCLUDED.runs";

/// What every instance advertised, by name.
pub(crate) const ADVERTISED: &str = "SELECT instance, runs FROM agentloop_runs ORDER BY instance";

/// An instance's last heartbeat.
pub(crate) const HEARTBEAT: &str = "SELECT beat_ms FROM agentloop_instances WHERE instance = $1";
