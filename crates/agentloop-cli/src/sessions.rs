//! `agentloop sessions list|show`: reads the stored session records of a data directory
//! offline (DESIGN §9) and prints them as a table or as JSON.
//!
//! Everything here is blocking and runs without a tokio runtime. The data directory is a
//! sled database that one process at a time may open, so the command fails with a clear
//! message while an `agentloop` process holds it. Corrupt records are shown with their
//! error, never hidden and never modified.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use agentloop::store::lease::{is_fresh, DEFAULT_LEASE_TIMEOUT};
use agentloop::store::{
    codec, now_ms, SessionRecord, SessionStatus, SledBackend, StatusKind, StoreError,
};
use agentloop_sim::SimItem;
use serde_json::{json, Value};

use crate::timefmt::{age, utc};
use crate::Failure;

/// The usage text of `agentloop sessions`.
pub(crate) const SESSIONS_USAGE: &str = "\
usage: agentloop sessions list [--data-dir DIR] [--status STATUS[,STATUS...]] [--json]
       agentloop sessions show <id> [--data-dir DIR] [--json]
  --data-dir DIR  the data directory (default ./agentloop-data)
  --status        running, stopped, interrupted, completed, canceled, failed or corrupt;
                  corrupt records are always listed, since their status cannot be read
  --json          print JSON instead of a table
The directory is read offline: stop the agentloop process that uses it first.";

/// The data directory used when `--data-dir` is not given.
pub(crate) const DEFAULT_DATA_DIR: &str = "./agentloop-data";

/// The status shown for a record that does not decode.
const CORRUPT: &str = "CORRUPT";
/// The widest table cell, in characters (longer text is cut with `…`).
const CELL_MAX: usize = 40;

#[derive(Debug, PartialEq)]
enum Command {
    List {
        dir: PathBuf,
        statuses: Option<Vec<StatusKind>>,
        json: bool,
    },
    Show {
        dir: PathBuf,
        id: String,
        json: bool,
    },
    Help,
}

/// Runs `agentloop sessions <args>` and returns what to print on stdout.
pub(crate) fn main(args: &[String]) -> Result<String, Failure> {
    match parse(args)? {
        Command::Help => Ok(format!("{SESSIONS_USAGE}\n")),
        Command::List {
            dir,
            statuses,
            json,
        } => list(&dir, statuses.as_deref(), json),
        Command::Show { dir, id, json } => show(&dir, &id, json),
    }
}

fn usage(msg: impl Into<String>) -> Failure {
    Failure::Usage {
        message: msg.into(),
        usage: SESSIONS_USAGE,
    }
}

fn parse(args: &[String]) -> Result<Command, Failure> {
    let (sub, rest) = match args.split_first() {
        Some((sub, rest)) => (sub.as_str(), rest),
        None => return Err(usage("`sessions` needs a subcommand: list or show")),
    };
    if matches!(sub, "-h" | "--help" | "help") {
        return Ok(Command::Help);
    }
    if sub != "list" && sub != "show" {
        return Err(usage(format!(
            "unknown sessions subcommand `{sub}`; use list or show"
        )));
    }
    let mut dir: Option<PathBuf> = None;
    let mut statuses: Option<Vec<StatusKind>> = None;
    let mut json = false;
    let mut id: Option<String> = None;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, Failure> {
            match inline.clone().or_else(|| it.next().cloned()) {
                Some(v) if !v.is_empty() => Ok(v),
                _ => Err(usage(format!("{name} needs a value"))),
            }
        };
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--json" if inline.is_none() => json = true,
            "--data-dir" if dir.is_some() => return Err(usage("--data-dir given twice")),
            "--data-dir" => dir = Some(PathBuf::from(value("--data-dir")?)),
            "--status" if sub == "list" => {
                let v = value("--status")?;
                let mut kinds = statuses.take().unwrap_or_default();
                for word in v.split(',') {
                    if let Some(kind) = parse_status(word)? {
                        if !kinds.contains(&kind) {
                            kinds.push(kind);
                        }
                    }
                }
                statuses = Some(kinds);
            }
            f if f.starts_with('-') && f.len() > 1 => {
                return Err(usage(format!("unknown option {arg} for `sessions {sub}`")))
            }
            _ if sub == "show" && id.is_none() => id = Some(arg.clone()),
            _ => {
                return Err(usage(format!(
                    "unexpected argument `{arg}` for `sessions {sub}`"
                )))
            }
        }
    }
    let dir = dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    if sub == "list" {
        Ok(Command::List {
            dir,
            statuses,
            json,
        })
    } else {
        let id = id.ok_or_else(|| usage("`sessions show` needs a session id"))?;
        Ok(Command::Show { dir, id, json })
    }
}

/// One `--status` word: a status kind, or `None` for `corrupt` (corrupt records are
/// always listed, so it only narrows the listing when given alone).
fn parse_status(word: &str) -> Result<Option<StatusKind>, Failure> {
    Ok(Some(match word.trim().to_ascii_lowercase().as_str() {
        "running" => StatusKind::Running,
        "stopped" => StatusKind::Stopped,
        "interrupted" => StatusKind::Interrupted,
        "completed" => StatusKind::Completed,
        "canceled" | "cancelled" => StatusKind::Canceled,
        "failed" => StatusKind::Failed,
        "corrupt" => return Ok(None),
        _ => {
            return Err(usage(format!(
                "unknown status `{word}`; use running, stopped, interrupted, completed, canceled, failed or corrupt"
            )))
        }
    }))
}

/// Opens the data directory for reading, refusing to create a database where none is.
fn open(dir: &Path) -> Result<SledBackend, Failure> {
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
    // sled keeps its data in the file `db`; opening a directory without it would create
    // a new, empty database there, which an inspection command must not do.
    if !dir.join("db").is_file() {
        return Err(Failure::Error(format!(
            "{} holds no agentloop data (no sled database in it); run `agentloop run` first or pass --data-dir",
            dir.display()
        )));
    }
    SledBackend::open(dir).map_err(|e| match e {
        StoreError::Backend { message, .. } if message.contains("lock") => Failure::Error(format!(
            "{message}\nthe data directory is in use: stop the agentloop process that holds it, then retry"
        )),
        StoreError::Backend { message, .. } => Failure::Error(message),
        other => Failure::Error(other.to_string()),
    })
}

fn list(dir: &Path, statuses: Option<&[StatusKind]>, json: bool) -> Result<String, Failure> {
    let backend = open(dir)?;
    let entries = backend
        .list::<SimItem>(statuses)
        .map_err(|e| Failure::Error(e.to_string()))?;
    drop(backend);
    if json {
        let rows: Vec<Value> = entries
            .iter()
            .map(|e| match &e.record {
                Ok(rec) => record_json(rec, false),
                Err(err) => corrupt_json(&e.session_id, err, None),
            })
            .collect();
        return Ok(pretty(&Value::Array(rows)));
    }
    if entries.is_empty() {
        let which = if statuses.is_some() { "matching " } else { "" };
        return Ok(format!("no {which}records in {}\n", dir.display()));
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
    ];
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for e in &entries {
        match &e.record {
            Ok(r) => rows.push(vec![
                cell(&r.session_id),
                cell(&r.status.to_string()),
                r.turn_index.to_string(),
                r.unhandled_items.len().to_string(),
                r.interrupted_items.len().to_string(),
                match &r.state {
                    Some(s) => format!("yes ({} B)", s.len()),
                    None => "no".to_string(),
                },
                cell(r.stop_cause.as_deref().unwrap_or("-")),
                utc(r.updated_at_ms),
                cell(r.owner.as_deref().unwrap_or("-")),
            ]),
            Err(err) => {
                let mut row = vec![cell(&e.session_id), CORRUPT.to_string()];
                row.resize(header.len(), "-".to_string());
                rows.push(row);
                notes.push(format!(
                    "{CORRUPT} {}: {}",
                    clean(&e.session_id),
                    clean(&err.to_string())
                ));
            }
        }
    }
    let mut out = table(&header, &rows);
    let corrupt = notes.len();
    let _ = write!(out, "\n{} record{}", entries.len(), plural(entries.len()));
    if corrupt > 0 {
        let _ = write!(out, " ({corrupt} corrupt)");
    }
    let _ = writeln!(out, " in {}", dir.display());
    for n in notes {
        let _ = writeln!(out, "{n}");
    }
    Ok(out)
}

fn show(dir: &Path, id: &str, json: bool) -> Result<String, Failure> {
    let backend = open(dir)?;
    let raw = backend
        .get_raw(id)
        .map_err(|e| Failure::Error(e.to_string()))?;
    let Some(bytes) = raw else {
        return Err(Failure::Error(format!(
            "no record for session `{}` in {}; `agentloop sessions list --data-dir {}` shows the stored ids",
            clean(id),
            dir.display(),
            dir.display()
        )));
    };
    let record = codec::decode_record::<SimItem>(id, &bytes);
    // The owner's own heartbeat (one per runtime instance, S19), for a Running record.
    let owner_beat = match &record {
        Ok(SessionRecord {
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
            Ok(rec) => record_json(rec, true),
            Err(err) => corrupt_json(id, err, Some(bytes.len())),
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
            let head: Vec<String> = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
            line(
                "raw bytes",
                format!("{} (first {}: {})", bytes.len(), head.len(), head.join(" ")),
            );
            return Ok(out);
        }
    };
    let now = now_ms();
    let opt = |v: &Option<String>| v.as_deref().map(clean).unwrap_or_else(|| "-".into());
    line("session", clean(&rec.session_id));
    line("agent kind", clean(&rec.agent_kind));
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
            Some(s) => format!("yes: {} bytes of agent state", s.len()),
            None if !rec.interrupted_items.is_empty() => {
                "yes: interrupted items, no agent state".to_string()
            }
            None => "no".to_string(),
        },
    );
    line("stop cause", opt(&rec.stop_cause));
    line("last error", opt(&rec.last_error));
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
    items(&mut out, "unhandled items", &rec.unhandled_items);
    items(&mut out, "interrupted items", &rec.interrupted_items);
    Ok(out)
}

fn items(out: &mut String, title: &str, items: &[SimItem]) {
    if items.is_empty() {
        let _ = writeln!(out, "{title} (0): none");
        return;
    }
    let _ = writeln!(out, "{title} ({}):", items.len());
    for (i, item) in items.iter().enumerate() {
        let _ = writeln!(out, "  [{i}] id={} {:?}", item.id, item.text);
    }
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

fn record_json(rec: &SessionRecord<SimItem>, with_items: bool) -> Value {
    let mut v = json!({
        "session_id": rec.session_id,
        "agent_kind": rec.agent_kind,
        "status": format!("{:?}", rec.status.kind()),
        "failure": match &rec.status {
            SessionStatus::Failed(e) => Some(e.as_str()),
            _ => None,
        },
        "turn_index": rec.turn_index,
        "unhandled_count": rec.unhandled_items.len(),
        "interrupted_count": rec.interrupted_items.len(),
        "mid_turn": rec.is_mid_turn(),
        "state_bytes": rec.state.as_ref().map(Vec::len),
        "stop_cause": rec.stop_cause,
        "last_error": rec.last_error,
        "owner": rec.owner,
        "heartbeat_ms": rec.heartbeat_ms,
        "created_at_ms": rec.created_at_ms,
        "updated_at_ms": rec.updated_at_ms,
        "updated_at": utc(rec.updated_at_ms),
        "version": rec.version,
    });
    if with_items {
        v["unhandled_items"] = json!(rec.unhandled_items);
        v["interrupted_items"] = json!(rec.interrupted_items);
    }
    v
}

fn corrupt_json(id: &str, err: &StoreError, raw_bytes: Option<usize>) -> Value {
    let mut v = json!({
        "session_id": id,
        "status": CORRUPT,
        "error": err.to_string(),
    });
    if let Some(n) = raw_bytes {
        v["raw_bytes"] = json!(n);
    }
    v
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

/// Text with control characters escaped, so a stored string cannot break the output.
fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A table cell: cleaned and cut to [`CELL_MAX`] characters.
fn cell(s: &str) -> String {
    let s = clean(s);
    if s.chars().count() <= CELL_MAX {
        return s;
    }
    let mut cut: String = s.chars().take(CELL_MAX - 1).collect();
    cut.push('…');
    cut
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut put = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(c);
            let pad = widths[i].saturating_sub(c.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    put(&mut header.iter().copied());
    for row in rows {
        put(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_list_and_show() {
        assert_eq!(
            parse(&args("list")).ok(),
            Some(Command::List {
                dir: PathBuf::from(DEFAULT_DATA_DIR),
                statuses: None,
                json: false
            })
        );
        assert_eq!(
            parse(&args("list --data-dir /d --status stopped,Failed --json")).ok(),
            Some(Command::List {
                dir: PathBuf::from("/d"),
                statuses: Some(vec![StatusKind::Stopped, StatusKind::Failed]),
                json: true
            })
        );
        assert_eq!(
            parse(&args("list --status=corrupt")).ok(),
            Some(Command::List {
                dir: PathBuf::from(DEFAULT_DATA_DIR),
                statuses: Some(vec![]),
                json: false
            })
        );
        assert_eq!(
            parse(&args("show s-1 --data-dir=/d --json")).ok(),
            Some(Command::Show {
                dir: PathBuf::from("/d"),
                id: "s-1".into(),
                json: true
            })
        );
        assert_eq!(parse(&args("show --help")).ok(), Some(Command::Help));
    }

    #[test]
    fn rejects_bad_arguments() {
        for bad in [
            "",
            "frobnicate",
            "list --status nope",
            "list --status",
            "list --data-dir",
            "list --bogus",
            "list extra",
            "list --json=yes",
            "show",
            "show a b",
            "show a --status stopped",
            "list --data-dir a --data-dir b",
        ] {
            assert!(
                matches!(parse(&args(bad)), Err(Failure::Usage { .. })),
                "`{bad}` should be a usage error"
            );
        }
    }

    #[test]
    fn cells_are_clean_and_bounded() {
        assert_eq!(clean("a\nb\tc"), "a\\nb\\tc");
        let long = "x".repeat(100);
        assert_eq!(cell(&long).chars().count(), CELL_MAX);
        assert!(cell(&long).ends_with('…'));
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
    }
}
