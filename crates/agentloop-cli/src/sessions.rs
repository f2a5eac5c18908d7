//! `agentloop sessions list|show`: reads the stored session records of a data directory
//! offline (DESIGN §9) and prints them as a table or as JSON.
//!
//! Everything here is blocking and runs without a tokio runtime. The data directory is a
//! sled database that one process at a time may open, so the command fails with a clear
//! message while an `agentloop` process holds it. Corrupt records are shown with their
//! error, never hidden and never modified; `show --raw` shows their stored entries.
//! Items and agent state are shown as JSON whatever type wrote them (format 2 is
//! self-describing); format-1 records are read as the main job's `SimItem`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use agentloop::store::codec::{self, payload};
use agentloop::store::lease::{is_fresh, DEFAULT_LEASE_TIMEOUT};
use agentloop::store::{
    now_ms, Backend, Engine, SessionStatus, StatusKind, StoreDurability, StoreError, Stored,
};
use agentloop_sim::SimItem;
use serde_json::{json, Value};

use crate::cli::{DurabilityArg, EngineArg, SessionsCmd, StatusWord};
use crate::text_table::{cell, clean, table};
use crate::timefmt::{age, utc};
use crate::Failure;

/// The status shown for a record that does not decode.
const CORRUPT: &str = "CORRUPT";

#[derive(Debug, PartialEq)]
pub(crate) enum Command {
    List {
        dir: PathBuf,
        statuses: Option<Vec<StatusKind>>,
        json: bool,
        /// Read this PostgreSQL store instead of `dir`.
        postgres: Option<String>,
    },
    Show {
        dir: PathBuf,
        id: String,
        json: bool,
        raw: bool,
        config: Option<PathBuf>,
    },
    /// `list --server`.
    RemoteList {
        server: crate::remote::Server,
        statuses: Vec<String>,
        json: bool,
    },
    /// `show <id> --server`.
    RemoteShow {
        server: crate::remote::Server,
        id: String,
    },
    /// `history <id>`.
    History {
        dir: PathBuf,
        id: String,
        json: bool,
    },
    /// `events <id>`.
    Events {
        dir: PathBuf,
        id: String,
        after: u64,
        json: bool,
    },
    /// `timers <id>`.
    Timers {
        dir: PathBuf,
        id: String,
        json: bool,
    },
    /// `delete <id>`.
    Delete { dir: PathBuf, id: String },
    /// `migrate --dry-run` (S40).
    Migrate {
        dir: PathBuf,
        postgres: Option<String>,
        versions: crate::cli::SimVersions,
        json: bool,
    },
    /// `export`.
    Export { dir: PathBuf },
    /// `import`.
    Import {
        dir: PathBuf,
        /// `None`: the directory's own engine, or sled for a new one.
        engine: Option<EngineArg>,
        /// The level the import writes at (`power` unless `--durability crash`).
        level: StoreDurability,
    },
}

/// The parsed command line, checked.
pub(crate) fn command(cmd: SessionsCmd) -> Result<Command, Failure> {
    Ok(match cmd {
        SessionsCmd::List {
            status,
            json,
            remote:
                crate::cli::Remote {
                    server: Some(url),
                    token,
                },
            ..
        } => Command::RemoteList {
            server: crate::remote::Server::new(&url, token)?,
            statuses: status
                .iter()
                .map(|w| match w {
                    StatusWord::Status(k) => format!("{k:?}").to_lowercase(),
                    StatusWord::Corrupt => "unreadable".to_string(),
                })
                .collect(),
            json,
        },
        SessionsCmd::Show {
            id,
            remote:
                crate::cli::Remote {
                    server: Some(url),
                    token,
                },
            ..
        } => Command::RemoteShow {
            server: crate::remote::Server::new(&url, token)?,
            id,
        },
        SessionsCmd::List {
            dir,
            status,
            json,
            postgres,
            ..
        } => Command::List {
            dir: dir.data_dir,
            postgres,
            // `corrupt` alone narrows the listing to corrupt records (always listed).
            statuses: (!status.is_empty()).then(|| {
                let mut kinds = Vec::new();
                for w in &status {
                    if let StatusWord::Status(k) = w {
                        if !kinds.contains(k) {
                            kinds.push(*k);
                        }
                    }
                }
                kinds
            }),
            json,
        },
        SessionsCmd::Show {
            id,
            dir,
            config,
            json,
            raw,
            ..
        } => Command::Show {
            dir: dir.data_dir,
            id,
            json,
            raw,
            config,
        },
        SessionsCmd::History { id, dir, json } => Command::History {
            dir: dir.data_dir,
            id,
            json,
        },
        SessionsCmd::Events {
            id,
            dir,
            after,
            json,
        } => Command::Events {
            dir: dir.data_dir,
            id,
            after,
            json,
        },
        SessionsCmd::Timers { id, dir, json } => Command::Timers {
            dir: dir.data_dir,
            id,
            json,
        },
        SessionsCmd::Migrate { dry_run: false, .. } => {
            return Err(Failure::Usage {
                message: "`sessions migrate` only reports: add --dry-run. Sessions are migrated \
                          by the start that resumes them (`agentloop serve` or `run` with the \
                          same --sim-versions and --sim-migrations), never by this command"
                    .into(),
            })
        }
        SessionsCmd::Migrate {
            dir,
            postgres,
            versions,
            json,
            ..
        } => Command::Migrate {
            dir: dir.data_dir,
            postgres,
            versions,
            json,
        },
        SessionsCmd::Delete { id, dir } => Command::Delete {
            dir: dir.data_dir,
            id,
        },
        SessionsCmd::Export { dir } => Command::Export { dir: dir.data_dir },
        SessionsCmd::Import {
            dir,
            engine,
            durability,
        } => Command::Import {
            dir: dir.data_dir,
            engine,
            level: durability.map(DurabilityArg::level).unwrap_or_default(),
        },
    })
}

/// Runs a `sessions` command and returns what to print on stdout.
pub(crate) fn run(cmd: Command) -> Result<String, Failure> {
    match cmd {
        Command::List {
            dir,
            statuses,
            json,
            postgres,
        } => match postgres {
            Some(url) => {
                let entries = postgres_entries(&url, statuses.clone())?;
                render_list(entries, statuses.as_deref(), json, &postgres_name(&url))
            }
            None => list(&dir, statuses.as_deref(), json),
        },
        Command::Show {
            dir,
            id,
            json,
            raw,
            config,
        } => {
            let redaction = agentloop::RuntimeConfig::load(config.as_deref())
                .map_err(|e| Failure::Error(e.to_string()))?
                .redact
                .redaction();
            show(&dir, &id, json, raw, &redaction)
        }
        Command::RemoteList {
            server,
            statuses,
            json,
        } => crate::remote::list(&server, &statuses, json),
        Command::RemoteShow { server, id } => crate::remote::show(&server, &id),
        Command::History { dir, id, json } => history(&dir, &id, json),
        Command::Events {
            dir,
            id,
            after,
            json,
        } => events(&dir, &id, after, json),
        Command::Timers { dir, id, json } => timers(&dir, &id, json),
        Command::Delete { dir, id } => delete(&dir, &id),
        Command::Migrate {
            dir,
            postgres,
            versions,
            json,
        } => migrate_dry_run(&dir, postgres.as_deref(), &versions, json),
        Command::Export { dir } => export(&dir),
        Command::Import { dir, engine, level } => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| Failure::Error(format!("cannot read the export from stdin: {e}")))?;
            import(&dir, engine, level, &text)
        }
    }
}

/// Opens the data directory for reading, refusing to create a database where none is.
fn open(dir: &Path) -> Result<Backend, Failure> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Failure::Error(format!(
                "no data directory at {}; run `agentloop run` first or pass --data-dir",
                dir.display()
            )))
        }
        Err(e) => {
            return Err(Failure::Error(format!(
                "cannot read the data directory {}: {e}",
                dir.display()
            )))
        }
        Ok(m) if !m.is_dir() => {
            return Err(Failure::Error(format!(
                "{} is not a directory; pass the agentloop data directory with --data-dir",
                dir.display()
            )))
        }
        Ok(_) => {}
    }
    // Opening a directory that holds no database would create a new, empty one there,
    // which an inspection command must not do.
    let Some(engine) = Backend::detect(dir) else {
        return Err(Failure::Error(format!(
            "{} holds no agentloop data (no sled or fjall database in it); run `agentloop run` first or pass --data-dir",
            dir.display()
        )));
    };
    Backend::open(dir, engine).map_err(|e| match e {
        StoreError::Backend { message, .. } => Failure::Error(message),
        other => Failure::Error(other.to_string()),
    })
}

/// What `list` and `show` print of one record, whatever its format and item type.
struct View {
    session_id: String,
    agent_kind: String,
    /// The version of the kind that wrote the record (S40).
    agent_version: u32,
    status: SessionStatus,
    turn_index: u64,
    /// Items as JSON, in their logical places.
    unhandled: Vec<Value>,
    interrupted: Vec<Value>,
    /// The state's size and its JSON, or why it cannot be shown, if there is one.
    state: Option<(usize, Result<Value, String>)>,
    stop_cause: Option<String>,
    last_error: Option<String>,
    /// The business interrupt (reason and question) and whether it awaits an answer.
    interrupt: Option<agentloop::InterruptInfo>,
    awaiting_answer: bool,
    owner: Option<String>,
    heartbeat_ms: u64,
    created_at_ms: u64,
    updated_at_ms: u64,
    version: u64,
    lease_epoch: u64,
    /// "2", or "1 (converted on the next write)".
    format: &'static str,
    /// The cut turn's durable steps (S1b).
    steps: Option<agentloop::view::StepsView>,
    /// The record says the session sleeps (S39).
    asleep: bool,
    /// `state` is what the session carries between turns, not a cut turn's.
    state_carried: bool,
}

impl View {
    /// The status as listings show it: a sleeping session's is `Running (asleep)`.
    fn status_text(&self) -> String {
        match (&self.status, self.asleep) {
            (SessionStatus::Running, true) => "Running (asleep)".to_string(),
            (s, _) => s.to_string(),
        }
    }
}

/// Builds the view of a stored record. Format 2 is read without its item type (items
/// and state are self-describing); format 1 (bincode) only as the main job's `SimItem`.
fn view(stored: &Stored) -> Result<View, StoreError> {
    match stored {
        Stored::Current(r) => {
            let placement = r.placement()?;
            let by_seq: std::collections::HashMap<u64, &[u8]> =
                r.items.iter().map(|(s, b)| (*s, b.as_ref())).collect();
            let id = &r.header.session_id;
            let json = |seqs: &[u64]| -> Result<Vec<Value>, StoreError> {
                seqs.iter()
                    .map(|seq| {
                        let bytes = by_seq.get(seq).ok_or_else(|| StoreError::Corrupt {
                            session: id.clone(),
                            reason: format!("item entry {seq} is missing"),
                        })?;
                        payload::to_json(bytes).map_err(|e| StoreError::Corrupt {
                            session: id.clone(),
                            reason: format!("item entry {seq}: {e}"),
                        })
                    })
                    .collect()
            };
            let h = &r.header;
            Ok(View {
                session_id: h.session_id.clone(),
                agent_kind: h.agent_kind.clone(),
                agent_version: h.agent_version,
                status: h.status.clone(),
                turn_index: h.turn_index,
                unhandled: json(&placement.unhandled)?,
                interrupted: json(&placement.interrupted)?,
                state: r
                    .state
                    .as_ref()
                    .map(|s| (s.len(), payload::to_json(s).map_err(|e| e.to_string()))),
                stop_cause: h.stop_cause.clone(),
                last_error: h.last_error.clone(),
                interrupt: h.interrupt.clone(),
                awaiting_answer: h.awaiting_answer,
                owner: h.owner.clone(),
                heartbeat_ms: h.heartbeat_ms,
                created_at_ms: h.created_at_ms,
                updated_at_ms: h.updated_at_ms,
                version: h.version,
                lease_epoch: h.lease_epoch,
                format: "2",
                steps: agentloop::view::steps_view(r, &agentloop::view::Redaction::default())?,
                asleep: h.asleep,
                state_carried: h.state_carried,
            })
        }
        Stored::Format1(_) => {
            let rec = stored.decode::<SimItem>()?.into_record();
            Ok(View {
                session_id: rec.session_id,
                agent_kind: rec.agent_kind,
                agent_version: rec.agent_version,
                status: rec.status,
                turn_index: rec.turn_index,
                unhandled: rec.unhandled_items.iter().map(|i| json!(i)).collect(),
                interrupted: rec.interrupted_items.iter().map(|i| json!(i)).collect(),
                // A format-1 state is bincode, which only its type can read.
                state: rec.state.as_ref().map(|s| {
                    let why = "format 1 (bincode): readable once the record is converted";
                    (s.len().saturating_sub(4), Err(why.to_string()))
                }),
                stop_cause: rec.stop_cause,
                last_error: rec.last_error,
                interrupt: rec.interrupt,
                awaiting_answer: rec.awaiting_answer,
                owner: rec.owner,
                heartbeat_ms: rec.heartbeat_ms,
                created_at_ms: rec.created_at_ms,
                updated_at_ms: rec.updated_at_ms,
                version: rec.version,
                lease_epoch: rec.lease_epoch,
                format: "1 (converted to 2 on its next write)",
                steps: None,
                asleep: false,
                state_carried: false,
            })
        }
    }
}

fn list(dir: &Path, statuses: Option<&[StatusKind]>, json: bool) -> Result<String, Failure> {
    let backend = open(dir)?;
    let entries = backend
        .list(statuses)
        .map_err(|e| Failure::Error(e.to_string()))?;
    drop(backend);
    render_list(entries, statuses, json, &dir.display().to_string())
}

/// The records of a PostgreSQL store (issue 18), read on a runtime of this command's
/// own (this module is otherwise blocking).
fn postgres_entries(
    url: &str,
    statuses: Option<Vec<StatusKind>>,
) -> Result<Vec<agentloop::store::StoredEntry>, Failure> {
    use agentloop::CheckpointStore as _;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Error(format!("cannot start a runtime: {e}")))?;
    rt.block_on(async {
        let store = agentloop_postgres::PostgresStore::<SimItem>::connect(
            agentloop_postgres::PostgresOptions {
                url: url.to_string(),
                connections: 1,
                // A listing writes nothing: any server will do, whatever its fsync.
                durability: StoreDurability::Crash,
            },
        )
        .await?;
        store.list_stored(statuses).await
    })
    .map_err(|e| Failure::Error(e.to_string()))
}

/// How a listing names a PostgreSQL store: its server, never its password.
pub(crate) fn postgres_name(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, host)) => format!("PostgreSQL at {host}"),
        None => "PostgreSQL".to_string(),
    }
}

/// Prints listed records as a table (or JSON); `place` says where they were read.
fn render_list(
    entries: Vec<agentloop::store::StoredEntry>,
    statuses: Option<&[StatusKind]>,
    json: bool,
    place: &str,
) -> Result<String, Failure> {
    let views: Vec<(String, Result<View, StoreError>)> = entries
        .into_iter()
        .map(|e| (e.session_id, e.record.and_then(|r| view(&r))))
        .collect();
    if json {
        let rows: Vec<Value> = views
            .iter()
            .map(|(id, v)| match v {
                Ok(v) => view_json(v, false),
                Err(err) => corrupt_json(id, err),
            })
            .collect();
        return Ok(pretty(&Value::Array(rows)));
    }
    if views.is_empty() {
        let which = if statuses.is_some() { "matching " } else { "" };
        return Ok(format!("no {which}records in {place}\n"));
    }
    let header = [
        "ID",
        "STATUS",
        "TURN",
        "UNHANDLED",
        "INTERRUPTED",
        "MID-TURN STATE",
        "STOP CAUSE",
        "UPDATED",
        "OWNER",
        "KIND",
    ];
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (id, v) in &views {
        match v {
            Ok(r) => rows.push(vec![
                cell(&r.session_id),
                cell(&r.status_text()),
                r.turn_index.to_string(),
                r.unhandled.len().to_string(),
                r.interrupted.len().to_string(),
                match &r.state {
                    Some((n, _)) => format!("yes ({n} B)"),
                    None => "no".to_string(),
                },
                cell(r.stop_cause.as_deref().unwrap_or("-")),
                utc(r.updated_at_ms),
                cell(r.owner.as_deref().unwrap_or("-")),
                format!("{} v{}", cell(&r.agent_kind), r.agent_version),
            ]),
            Err(err) => {
                let mut row = vec![cell(id), CORRUPT.to_string()];
                row.resize(header.len(), "-".to_string());
                rows.push(row);
                notes.push(format!(
                    "{CORRUPT} {}: {}",
                    clean(id),
                    clean(&err.to_string())
                ));
            }
        }
    }
    let mut out = table(&header, &rows);
    let corrupt = notes.len();
    let _ = write!(out, "\n{} record{}", views.len(), plural(views.len()));
    if corrupt > 0 {
        let _ = write!(out, " ({corrupt} corrupt)");
    }
    let _ = writeln!(out, " in {place}");
    for n in notes {
        let _ = writeln!(out, "{n}");
    }
    Ok(out)
}

fn show(
    dir: &Path,
    id: &str,
    json: bool,
    raw: bool,
    redaction: &agentloop::view::Redaction,
) -> Result<String, Failure> {
    let backend = open(dir)?;
    if raw {
        let entries = backend
            .raw_entries(id)
            .map_err(|e| Failure::Error(e.to_string()))?;
        drop(backend);
        return raw_view(dir, id, &entries, json);
    }
    let loaded = backend.load(id);
    // Bytes stored for the session, to report with a record that does not decode.
    let raw_bytes: usize = match &loaded {
        Err(_) => backend
            .raw_entries(id)
            .map(|e| e.iter().map(|(_, b)| b.len()).sum())
            .unwrap_or(0),
        Ok(_) => 0,
    };
    let missing = || {
        Failure::Error(format!(
            "no record for session `{}` in {}; `agentloop sessions list --data-dir {}` shows the stored ids",
            clean(id),
            dir.display(),
            dir.display()
        ))
    };
    let record = match loaded {
        Ok(None) => return Err(missing()),
        Ok(Some(stored)) => view(&stored).map(|v| redact(v, redaction)),
        Err(e) => Err(e),
    };
    // The owner's own heartbeat (one per runtime instance, S19), for a Running record.
    let owner_beat = match &record {
        Ok(View {
            status: SessionStatus::Running,
            owner: Some(owner),
            ..
        }) => backend
            .heartbeat(owner)
            .map_err(|e| Failure::Error(e.to_string()))?,
        _ => None,
    };
    drop(backend);
    if json {
        return Ok(pretty(&match &record {
            Ok(v) => view_json(v, true),
            Err(err) => {
                let mut v = corrupt_json(id, err);
                v["raw_bytes"] = json!(raw_bytes);
                v
            }
        }));
    }
    let mut out = String::new();
    let mut line = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<12} {v}");
    };
    let rec = match record {
        Ok(rec) => rec,
        Err(err) => {
            line("session", clean(id));
            line("status", CORRUPT.to_string());
            line("error", clean(&err.to_string()));
            line(
                "inspect",
                format!(
                    "agentloop sessions show {} --raw --data-dir {}",
                    clean(id),
                    dir.display()
                ),
            );
            return Ok(out);
        }
    };
    let now = now_ms();
    let opt = |v: &Option<String>| v.as_deref().map(clean).unwrap_or_else(|| "-".into());
    line("session", clean(&rec.session_id));
    line(
        "agent kind",
        format!("{} (version {})", clean(&rec.agent_kind), rec.agent_version),
    );
    line(
        "status",
        format!(
            "{} ({})",
            clean(&rec.status.to_string()),
            lifecycle(&rec.status)
        ),
    );
    line("turn index", rec.turn_index.to_string());
    line(
        "mid-turn",
        match &rec.state {
            Some((n, _)) => format!("yes: {n} bytes of agent state"),
            None if !rec.interrupted.is_empty() => {
                "yes: interrupted items, no agent state".to_string()
            }
            None => "no".to_string(),
        },
    );
    if let Some(steps) = &rec.steps {
        line(
            "steps",
            format!(
                "turn {}: {} covered by the state, {} journaled (replayed when it runs again)",
                steps.turn,
                steps.covered,
                steps.journaled.len()
            ),
        );
        for s in &steps.journaled {
            line(
                "",
                format!(
                    "{} {}",
                    clean(&s.key),
                    if s.finished {
                        "finished"
                    } else {
                        "began, no result (unknown outcome)"
                    }
                ),
            );
        }
    }
    line("stop cause", opt(&rec.stop_cause));
    line("last error", opt(&rec.last_error));
    if let Some(i) = &rec.interrupt {
        line("interrupt", clean(&i.reason));
        line("question", clean(&i.question.to_string()));
        line(
            "awaiting",
            if rec.awaiting_answer {
                "yes: resumes only with an answer (resume_with_answer)".to_string()
            } else {
                "no: answered".to_string()
            },
        );
    }
    line("owner", opt(&rec.owner));
    line(
        "heartbeat",
        format!("{} ({})", utc(rec.heartbeat_ms), age(rec.heartbeat_ms, now)),
    );
    if let (SessionStatus::Running, Some(_)) = (&rec.status, &rec.owner) {
        // Judged as a resume does: the instance's heartbeat, else the record's.
        let (beat, whose) = match owner_beat {
            Some(ms) => (ms, "instance heartbeat"),
            None => (
                rec.heartbeat_ms,
                "no instance heartbeat stored, record heartbeat",
            ),
        };
        let verdict = if is_fresh(beat, now, DEFAULT_LEASE_TIMEOUT) {
            "fresh: a resume elsewhere is refused"
        } else {
            "stale: recoverable by another instance"
        };
        line(
            "lease",
            format!(
                "{whose} {} ({}); {verdict} under the default {}s lease timeout",
                utc(beat),
                age(beat, now),
                DEFAULT_LEASE_TIMEOUT.as_secs()
            ),
        );
    }
    line(
        "created",
        format!("{} ({} ms)", utc(rec.created_at_ms), rec.created_at_ms),
    );
    line(
        "updated",
        format!("{} ({} ms)", utc(rec.updated_at_ms), rec.updated_at_ms),
    );
    line("version", rec.version.to_string());
    line("lease epoch", rec.lease_epoch.to_string());
    line("format", rec.format.to_string());
    items(&mut out, "unhandled items", &rec.unhandled);
    items(&mut out, "interrupted items", &rec.interrupted);
    match &rec.state {
        Some((_, Ok(state))) => {
            let _ = writeln!(out, "agent state:\n  {}", clean(&state.to_string()));
        }
        Some((_, Err(why))) => {
            let _ = writeln!(out, "agent state: not shown: {}", clean(why));
        }
        None => {}
    }
    Ok(out)
}

fn items(out: &mut String, title: &str, items: &[Value]) {
    if items.is_empty() {
        let _ = writeln!(out, "{title} (0): none");
        return;
    }
    let _ = writeln!(out, "{title} ({}):", items.len());
    for (i, item) in items.iter().enumerate() {
        let _ = writeln!(out, "  [{i}] {}", clean(&item.to_string()));
    }
}

/// `show --raw`: every stored entry of the session, undecoded, with what each part
/// says when it does decode, so a corrupt record can be looked at.
fn raw_view(
    dir: &Path,
    id: &str,
    entries: &[(String, Vec<u8>)],
    json: bool,
) -> Result<String, Failure> {
    if entries.is_empty() {
        return Err(Failure::Error(format!(
            "no stored entries for session `{}` in {}",
            clean(id),
            dir.display()
        )));
    }
    let described: Vec<(String, usize, String, Value)> = entries
        .iter()
        .map(|(name, bytes)| {
            let head: String = bytes.iter().take(32).map(|b| format!("{b:02x}")).collect();
            let reading = if name == "header" {
                match codec::head::decode(id, bytes) {
                    Ok(head) => {
                        let h = &head.header;
                        let mut v = json!({
                            "status": h.status.to_string(),
                            "turn_index": h.turn_index,
                            "cut": h.cut,
                            "front": h.front,
                            "next_seq": h.next_seq,
                            "version": h.version,
                            "lease_epoch": h.lease_epoch,
                        });
                        // Format 3: what the head holds itself, and what it names beside it.
                        if let Some(l) = head.layout {
                            v["inline_items"] =
                                json!(head.items.iter().map(|(s, _)| *s).collect::<Vec<_>>());
                            v["inline_state"] = json!(head.state.is_some());
                            v["loose_items"] = json!(l.loose_items);
                            v["loose_state"] = json!(l.loose_state);
                        }
                        v
                    }
                    Err(e) => json!({ "error": e.to_string() }),
                }
            } else if name == "format-1 record" {
                match codec::legacy::prefix(id, bytes) {
                    Ok((p, _)) => {
                        json!({"status": p.status.to_string(), "agent_kind": p.agent_kind})
                    }
                    Err(e) => json!({ "error": e.to_string() }),
                }
            } else {
                match payload::to_json(bytes) {
                    Ok(v) => v,
                    Err(e) => json!({ "error": e.to_string() }),
                }
            };
            (name.clone(), bytes.len(), head, reading)
        })
        .collect();
    if json {
        let rows: Vec<Value> = described
            .iter()
            .map(|(name, len, head, reading)| {
                json!({"entry": name, "bytes": len, "head_hex": head, "reads_as": reading})
            })
            .collect();
        return Ok(pretty(&json!({ "session_id": id, "entries": rows })));
    }
    let mut out = format!(
        "session `{}`: {} stored entries\n",
        clean(id),
        described.len()
    );
    for (name, len, head, reading) in described {
        let _ = writeln!(out, "{name}: {len} bytes, first {}: {head}", head.len() / 2);
        let _ = writeln!(out, "  reads as: {}", clean(&reading.to_string()));
    }
    Ok(out)
}

/// What the status means for a resume (S19).
fn lifecycle(status: &SessionStatus) -> &'static str {
    match status {
        SessionStatus::Running => {
            "owned by a runtime instance; recoverable once its heartbeat is stale"
        }
        SessionStatus::Stopped | SessionStatus::Interrupted => "resumable",
        SessionStatus::Completed | SessionStatus::Canceled | SessionStatus::Failed(_) => "terminal",
    }
}

/// `sessions events <id>`: the kept events (S20a), as stored (JSON whatever the event
/// type), oldest first; a line per gap says how many numbers are missing there.
fn events(dir: &Path, id: &str, after: u64, json: bool) -> Result<String, Failure> {
    let backend = open(dir)?;
    let kept = backend
        .read_events(id, after, usize::MAX)
        .map_err(|e| Failure::Error(e.to_string()))?;
    drop(backend);
    let mut out = String::new();
    if kept.events.is_empty() {
        if json {
            return Ok(String::new());
        }
        return Ok(format!(
            "session `{}` keeps no events after {after} (a session keeps them when spawned with keep_events, as every persistent session spawned over HTTP does)\n",
            clean(id)
        ));
    }
    let mut next = after + 1;
    for e in &kept.events {
        let body: Value = serde_json::from_slice(&e.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&e.body).into_owned()));
        let kind = body
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .or_else(|| body.as_str().map(str::to_string))
            .unwrap_or_else(|| "event".into());
        if json {
            let _ = writeln!(
                out,
                "{}",
                json!({"seq": e.seq, "at_ms": e.at_ms, "at": utc(e.at_ms), "event": body})
            );
            continue;
        }
        if e.seq > next {
            let _ = writeln!(
                out,
                "   ({} missing: {}..={})",
                e.seq - next,
                next,
                e.seq - 1
            );
        }
        next = e.seq + 1;
        let _ = writeln!(out, "#{} {} {} {}", e.seq, utc(e.at_ms), kind, body);
    }
    Ok(out)
}

/// `timers <id>`: the session's durable timers and schedules (S39), by number.
fn timers(dir: &Path, id: &str, json: bool) -> Result<String, Failure> {
    let backend = open(dir)?;
    let timers = backend
        .timers(id)
        .map_err(|e| Failure::Error(e.to_string()))?;
    drop(backend);
    let views = agentloop::view::timers_view(id, timers, &agentloop::view::Redaction::none())
        .map_err(|e| Failure::Error(e.to_string()))?;
    let mut out = String::new();
    if views.is_empty() && !json {
        return Ok(format!(
            "session `{}` has no timers (arm them with POST /sessions/{{id}}/timers, or RuntimeHandle::wake_at / schedule)\n",
            clean(id)
        ));
    }
    for t in views {
        if json {
            let _ = writeln!(
                out,
                "{}",
                json!({"id": t.id, "due_ms": t.due_ms, "due": utc(t.due_ms), "schedule": t.schedule, "fired": t.fired, "item": t.item})
            );
            continue;
        }
        let _ = writeln!(
            out,
            "#{} due {} {} fired {} item {}",
            t.id,
            utc(t.due_ms),
            t.schedule.as_deref().unwrap_or("once"),
            t.fired,
            t.item
        );
    }
    Ok(out)
}

/// `history <id>`: the kept turn-end checkpoints, oldest first (issue 13, 4).
fn history(dir: &Path, id: &str, json: bool) -> Result<String, Failure> {
    use agentloop::store::history::{HistoryAnswer, HistoryQuery};
    let backend = open(dir)?;
    let answer = backend
        .history(id, HistoryQuery::List)
        .map_err(|e| Failure::Error(e.to_string()))?;
    drop(backend);
    let entries = match answer {
        HistoryAnswer::List(l) => l,
        HistoryAnswer::Load(_) => Vec::new(),
    };
    if json {
        return Ok(pretty(&json!({
            "session_id": id,
            "checkpoints": entries.iter().map(|e| json!({
                "turn": e.turn,
                "at_ms": e.at_ms,
                "at": utc(e.at_ms),
                "size": e.size,
            })).collect::<Vec<_>>(),
        })));
    }
    if entries.is_empty() {
        return Ok(format!(
            "session `{}` keeps no checkpoints (spawn it with a history to keep its last turn ends)\n",
            clean(id)
        ));
    }
    let mut out = "| turn | written (UTC) | bytes |\n|---:|---|---:|\n".to_string();
    for e in &entries {
        out.push_str(&format!("| {} | {} | {} |\n", e.turn, utc(e.at_ms), e.size));
    }
    out.push_str(&format!(
        "{} checkpoint{} of session `{}`\n",
        entries.len(),
        plural(entries.len()),
        clean(id)
    ));
    Ok(out)
}

/// `delete <id>`: removes the record and its checkpoint history, durably.
fn delete(dir: &Path, id: &str) -> Result<String, Failure> {
    let backend = open(dir)?;
    let r = backend.purge(id);
    drop(backend);
    match r {
        Ok(true) => Ok(format!(
            "deleted session `{}`: its record, its checkpoint history and its kept events\n",
            clean(id)
        )),
        Ok(false) => Err(Failure::Error(format!(
            "nothing is stored for session `{}` in {}; `agentloop sessions list --data-dir {}` shows the stored ids",
            clean(id),
            dir.display(),
            dir.display()
        ))),
        Err(e) => Err(Failure::Error(e.to_string())),
    }
}

/// `export`: every session as a JSON line (`store::transfer`), in id order. Fails,
/// printing nothing, when any session cannot be exported, naming each and why.
fn export(dir: &Path) -> Result<String, Failure> {
    use agentloop::store::transfer;
    let backend = open(dir)?;
    let found = transfer::export(&backend).map_err(|e| Failure::Error(e.to_string()))?;
    drop(backend);
    if !found.not_exported.is_empty() {
        let mut msg = format!(
            "{} session{} cannot be exported from {} (nothing was written):",
            found.not_exported.len(),
            plural(found.not_exported.len()),
            dir.display()
        );
        for n in &found.not_exported {
            msg.push_str(&format!("\n  {}: {}", clean(&n.session_id), n.error));
        }
        return Err(Failure::Error(msg));
    }
    let mut out = String::new();
    for line in &found.lines {
        let text = serde_json::to_string(line)
            .map_err(|e| Failure::Error(format!("cannot write the export: {e}")))?;
        out.push_str(&text);
        out.push('\n');
    }
    Ok(out)
}

/// `import`: the sessions of an export into `dir` (created with `engine`, sled by
/// default, when it holds no database; without `--engine` an existing one is opened
/// with its own engine). Every line is checked before
/// anything is written; a session the directory holds is refused and kept.
fn import(
    dir: &Path,
    engine: Option<EngineArg>,
    level: StoreDurability,
    text: &str,
) -> Result<String, Failure> {
    use agentloop::store::transfer::{self, ExportLine};
    let mut lines = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line: ExportLine = serde_json::from_str(raw).map_err(|e| {
            Failure::Error(format!(
                "line {} of the input is not an agentloop export line: {e}; nothing was imported",
                n + 1
            ))
        })?;
        lines.push(line);
    }
    if dir.is_file() {
        return Err(Failure::Error(format!(
            "{} is a file, not a directory; pass a data directory with --data-dir",
            dir.display()
        )));
    }
    // An explicit engine the directory was not written by is refused by `open`.
    let engine = match engine {
        Some(EngineArg::Sled) => Engine::Sled(level),
        Some(EngineArg::Fjall) => Engine::Fjall(level),
        None => Backend::detect(dir).unwrap_or_default().at(level),
    };
    let backend = Backend::open(dir, engine).map_err(|e| Failure::Error(e.to_string()))?;
    let results = transfer::import(&backend, lines);
    drop(backend);
    let imported = results.iter().filter(|r| r.is_ok()).count();
    let refused: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| format!("  {e}")))
        .collect();
    if refused.is_empty() {
        return Ok(format!(
            "imported {imported} session{} into {} ({})\n",
            plural(imported),
            dir.display(),
            engine.name()
        ));
    }
    Err(Failure::Error(format!(
        "imported {imported} session{} into {} ({}); {} refused, left as they were:\n{}",
        plural(imported),
        dir.display(),
        engine.name(),
        refused.len(),
        refused.join("\n")
    )))
}

/// The view as a client may see it (issue 13, 5): items, state and question through
/// the configured redaction.
fn redact(mut v: View, redaction: &agentloop::view::Redaction) -> View {
    use agentloop::view::Part;
    if !redaction.is_active() {
        return v;
    }
    let each = |items: Vec<Value>| -> Vec<Value> {
        items
            .into_iter()
            .map(|i| redaction.apply(Part::Item, i))
            .collect()
    };
    v.unhandled = each(v.unhandled);
    v.interrupted = each(v.interrupted);
    v.state = v
        .state
        .map(|(n, s)| (n, s.map(|s| redaction.apply(Part::State, s))));
    if let Some(i) = v.interrupt.as_mut() {
        i.question = redaction.apply(Part::Question, std::mem::take(&mut i.question));
    }
    for step in v.steps.iter_mut().flat_map(|s| s.journaled.iter_mut()) {
        step.result = step.result.take().map(|r| redaction.apply(Part::State, r));
    }
    v
}

fn view_json(rec: &View, with_items: bool) -> Value {
    let mut v = json!({
        "session_id": rec.session_id,
        "agent_kind": rec.agent_kind,
        "agent_version": rec.agent_version,
        "status": format!("{:?}", rec.status.kind()),
        "asleep": rec.asleep,
        "failure": match &rec.status {
            SessionStatus::Failed(e) => Some(e.as_str()),
            _ => None,
        },
        "turn_index": rec.turn_index,
        "unhandled_count": rec.unhandled.len(),
        "interrupted_count": rec.interrupted.len(),
        "mid_turn": (rec.state.is_some() && !rec.state_carried) || !rec.interrupted.is_empty(),
        "state_carried": rec.state_carried,
        "state_bytes": rec.state.as_ref().map(|(n, _)| *n),
        "stop_cause": rec.stop_cause,
        "last_error": rec.last_error,
        "interrupt": rec.interrupt,
        "awaiting_answer": rec.awaiting_answer,
        "owner": rec.owner,
        "heartbeat_ms": rec.heartbeat_ms,
        "created_at_ms": rec.created_at_ms,
        "updated_at_ms": rec.updated_at_ms,
        "updated_at": utc(rec.updated_at_ms),
        "version": rec.version,
        "lease_epoch": rec.lease_epoch,
        "format": rec.format,
    });
    if with_items {
        v["unhandled_items"] = Value::Array(rec.unhandled.clone());
        v["interrupted_items"] = Value::Array(rec.interrupted.clone());
        v["state"] = match &rec.state {
            Some((_, Ok(j))) => j.clone(),
            Some((_, Err(why))) => json!({ "not_shown": why }),
            None => Value::Null,
        };
        v["steps"] = serde_json::to_value(&rec.steps).unwrap_or(Value::Null);
    }
    v
}

fn corrupt_json(id: &str, err: &StoreError) -> Value {
    json!({
        "session_id": id,
        "status": CORRUPT,
        "error": err.to_string(),
    })
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("\"{e}\""));
    s.push('\n');
    s
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `agentloop sessions migrate --dry-run` (S40): what a start of this build with
/// `versions` of kind `sim` would do to every stored session, as the runtime's own dry
/// run reports it ([`agentloop::RuntimeBuilder::plan_deploy`]). Reads only.
fn migrate_dry_run(
    dir: &Path,
    postgres: Option<&str>,
    versions: &crate::cli::SimVersions,
    json: bool,
) -> Result<String, Failure> {
    let (entries, place) = match postgres {
        Some(url) => (postgres_entries(url, None)?, postgres_name(url)),
        None => {
            let backend = open(dir)?;
            let entries = backend
                .list(None)
                .map_err(|e| Failure::Error(e.to_string()))?;
            drop(backend);
            (entries, dir.display().to_string())
        }
    };
    // The factory never runs here: the dry run reads the versions, the migrations and
    // the types the agents read.
    let builder = versions.register(
        agentloop::Runtime::<SimItem, agentloop_sim::SimEvent>::builder(),
        |_: &[u8]| -> Result<agentloop_sim::SimAgent, String> {
            Err("not started by a dry run".into())
        },
    );
    let plan = builder.plan_deploy(entries);
    if json {
        return Ok(pretty(&json!(plan)));
    }
    if plan.sessions.is_empty() {
        return Ok(format!("no records in {place}\n"));
    }
    use agentloop::versions::SessionFate;
    let mut notes = Vec::new();
    let rows: Vec<Vec<String>> = plan
        .sessions
        .iter()
        .map(|s| {
            let (fate, why) = match &s.fate {
                SessionFate::Pinned { version } => (format!("pinned on v{version}"), None),
                SessionFate::Migrated { from, to } => (format!("migrated v{from} -> v{to}"), None),
                SessionFate::Refused { reason } => ("REFUSED".to_string(), Some(reason.clone())),
                SessionFate::UnknownKind => (
                    "REFUSED".to_string(),
                    Some(format!(
                        "its agent kind `{}` is not registered here",
                        s.kind
                    )),
                ),
                SessionFate::Finished => ("finished".to_string(), None),
                SessionFate::Unreadable { reason } => (CORRUPT.to_string(), Some(reason.clone())),
            };
            if let Some(why) = why {
                notes.push(format!("{fate} {}: {}", clean(&s.id), clean(&why)));
            }
            vec![
                cell(&s.id),
                format!("{} v{}", cell(&s.kind), s.version),
                cell(&s.status),
                fate,
            ]
        })
        .collect();
    let mut out = table(&["ID", "KIND", "STATUS", "ON START"], &rows);
    let (pinned, migrated, refused, finished) = plan.counts();
    let _ = writeln!(
        out,
        "\n{} session{} in {place}: {pinned} pinned, {migrated} migrated, {refused} refused, {finished} finished (sim versions {}{}); nothing was written",
        plan.sessions.len(),
        plural(plan.sessions.len()),
        versions.sim_versions.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        if versions.sim_migrations { ", with migrations" } else { "" },
    );
    for n in notes {
        let _ = writeln!(out, "{n}");
    }
    Ok(out)
}
