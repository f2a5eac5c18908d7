//! `agentloop sessions list|show` against a real sled data directory (DESIGN §9, issue 3
//! item 7): runs the built binary on records written through `SledBackend`.

use std::path::Path;
use std::process::Output;

use agentloop::store::{SessionRecord, SessionStatus, SledBackend, WriteCondition};
use agentloop_core::table::header_key;
use agentloop_sim::SimItem;
use serde_json::Value;

/// 2026-11-22 03:15:38 UTC.
const UPDATED_MS: u64 = 1_795_317_338_000;

mod common;

use common::{agentloop, fails_saying, ok, sim_items as items, text, TempDir};

/// Writes four good records and one corrupt one, then closes the database.
fn populate(dir: &Path) {
    let mut alpha = SessionRecord::<SimItem>::new("alpha", "sim", 3);
    alpha.unhandled_items = items(&[10, 11]);
    alpha.stop_cause = Some("user left".into());
    alpha.updated_at_ms = UPDATED_MS;
    alpha.version = 4;

    let mut beta = SessionRecord::<SimItem>::new("beta", "sim", 7);
    beta.status = SessionStatus::Interrupted;
    beta.unhandled_items = items(&[20]);
    beta.interrupted_items = items(&[21, 22]);
    beta.state = Some(vec![7; 42]);
    beta.agent_version = 3;
    beta.owner = Some("instance-1".into());

    let mut gamma = SessionRecord::<SimItem>::new("gamma", "sim", 1);
    gamma.status = SessionStatus::Failed("model exploded".into());
    gamma.last_error = Some("model exploded".into());

    let mut delta = SessionRecord::<SimItem>::new("delta", "sim", 2);
    delta.status = SessionStatus::Running;
    delta.owner = Some("instance-9".into());

    let write = |r: &SessionRecord<SimItem>| r.to_write(WriteCondition::Always).unwrap();
    // The store counts versions itself: alpha is written four times.
    let writes = [&alpha, &alpha, &alpha, &alpha, &beta, &gamma, &delta]
        .into_iter()
        .map(write)
        .collect();
    let backend = SledBackend::open(dir).unwrap();
    backend.write_all(writes).unwrap();
    backend
        .beat("instance-9", agentloop::store::now_ms())
        .unwrap();
    // A damaged record: its header is not an envelope.
    backend
        .put_raw(&header_key("bad"), b"garbage, not a record")
        .unwrap();
    backend.flush().unwrap();
    drop(backend); // releases sled's lock on the directory
}

/// [`fails_saying`], and nothing on stdout.
fn fails(out: &Output, code: i32, needle: &str) {
    fails_saying(out, code, needle);
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
}

/// The table row of session `id` (its first column), split on whitespace.
fn row<'a>(table: &'a str, id: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no row for {id} in:\n{table}"))
        .split_whitespace()
        .collect()
}

#[test]
fn sessions_list_and_show() {
    let tmp = TempDir::new("sessions");
    let dir = tmp.0.join("data");
    let d = dir.to_str().unwrap();
    populate(&dir);

    // The table: id, status, turn, unhandled, interrupted, mid-turn state, ...
    let list = ok(&agentloop(&["sessions", "list", "--data-dir", d]));
    assert!(list.lines().next().unwrap().starts_with("ID"), "{list}");
    assert_eq!(
        row(&list, "alpha")[..6],
        ["alpha", "Stopped", "3", "2", "0", "no"]
    );
    assert!(
        list.contains("user left") && list.contains("2026-11-22 03:15:38Z"),
        "{list}"
    );
    assert_eq!(
        row(&list, "beta")[..8],
        ["beta", "Interrupted", "7", "1", "2", "yes", "(42", "B)"]
    );
    // The owner, then the kind with the version that wrote the record (S40).
    let beta = row(&list, "beta");
    assert_eq!(beta[beta.len() - 3..], ["instance-1", "sim", "v3"]);
    assert_eq!(row(&list, "alpha").last(), Some(&"v1"));
    assert_eq!(
        row(&list, "gamma")[..3],
        ["gamma", "Failed(model", "exploded)"]
    );
    assert_eq!(row(&list, "bad")[..2], ["bad", "CORRUPT"]);
    assert!(list.contains("5 records (1 corrupt)"), "{list}");
    assert!(
        list.contains("CORRUPT bad: record of session `bad` is corrupt"),
        "{list}"
    );

    // A status filter; corrupt records are always listed.
    let stopped = ok(&agentloop(&[
        "sessions",
        "list",
        "--data-dir",
        d,
        "--status",
        "stopped",
    ]));
    assert!(
        stopped.contains("alpha") && stopped.contains("CORRUPT"),
        "{stopped}"
    );
    for other in ["beta", "gamma", "delta"] {
        assert!(!stopped.contains(other), "{stopped}");
    }

    // JSON.
    let json: Value = serde_json::from_str(&ok(&agentloop(&[
        "sessions",
        "list",
        "--data-dir",
        d,
        "--json",
    ])))
    .expect("list --json is JSON");
    let rows = json.as_array().expect("an array");
    assert_eq!(rows.len(), 5);
    let by_id = |id: &str| {
        rows.iter()
            .find(|r| r["session_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {json}"))
            .clone()
    };
    let alpha = by_id("alpha");
    assert_eq!(alpha["status"], "Stopped");
    assert_eq!(alpha["turn_index"], 3);
    assert_eq!(alpha["unhandled_count"], 2);
    assert_eq!(alpha["interrupted_count"], 0);
    assert_eq!(alpha["state_bytes"], Value::Null);
    assert_eq!(alpha["stop_cause"], "user left");
    assert_eq!(alpha["updated_at_ms"], UPDATED_MS);
    assert_eq!(alpha["updated_at"], "2026-11-22 03:15:38Z");
    assert_eq!(alpha["version"], 4);
    let beta = by_id("beta");
    assert_eq!(beta["status"], "Interrupted");
    assert_eq!(beta["mid_turn"], true);
    assert_eq!(beta["state_bytes"], 42);
    assert_eq!(beta["owner"], "instance-1");
    let gamma = by_id("gamma");
    assert_eq!(gamma["status"], "Failed");
    assert_eq!(gamma["failure"], "model exploded");
    let bad = by_id("bad");
    assert_eq!(bad["status"], "CORRUPT");
    assert!(
        bad["error"].as_str().unwrap().contains("bad magic"),
        "{bad}"
    );

    // show: every field and the item lists.
    let show = ok(&agentloop(&["sessions", "show", "beta", "--data-dir", d]));
    for needle in [
        "status       Interrupted (resumable)",
        "turn index   7",
        "yes: 42 bytes of agent state",
        "owner        instance-1",
        "agent kind   sim (version 3)",
        "unhandled items (1):",
        "[0] {\"id\":20,\"text\":\"message 20\"}",
        "interrupted items (2):",
        "[1] {\"id\":22,\"text\":\"message 22\"}",
    ] {
        assert!(
            show.contains(needle),
            "show should contain {needle:?}:\n{show}"
        );
    }
    let show = ok(&agentloop(&["sessions", "show", "alpha", "--data-dir", d]));
    assert!(show.contains("interrupted items (0): none"), "{show}");
    assert!(show.contains("updated      2026-11-22 03:15:38Z"), "{show}");
    let shown: Value = serde_json::from_str(&ok(&agentloop(&[
        "sessions",
        "show",
        "beta",
        "--data-dir",
        d,
        "--json",
    ])))
    .expect("show --json is JSON");
    assert_eq!(shown["agent_version"], 3);
    assert_eq!(shown["interrupted_items"][0]["id"], 21);
    assert_eq!(shown["interrupted_items"][1]["text"], "message 22");
    assert_eq!(shown["unhandled_items"][0]["id"], 20);
    // A Running record: its owner's instance heartbeat is judged (S19).
    let show = ok(&agentloop(&["sessions", "show", "delta", "--data-dir", d]));
    assert!(show.contains("lease        instance heartbeat"), "{show}");
    assert!(
        show.contains("fresh: a resume elsewhere is refused"),
        "{show}"
    );
    let corrupt = ok(&agentloop(&["sessions", "show", "bad", "--data-dir", d]));
    assert!(
        corrupt.contains("CORRUPT") && corrupt.contains("bad magic"),
        "{corrupt}"
    );
    // The error says how to look at it, and that way works on it.
    assert!(corrupt.contains("sessions show bad --raw"), "{corrupt}");
    let raw = ok(&agentloop(&[
        "sessions",
        "show",
        "bad",
        "--raw",
        "--data-dir",
        d,
    ]));
    assert!(raw.contains("header: 21 bytes"), "{raw}");
    assert!(raw.contains("bad magic"), "{raw}");
    let raw = ok(&agentloop(&[
        "sessions",
        "show",
        "beta",
        "--raw",
        "--data-dir",
        d,
    ]));
    for needle in [
        "header:",
        "item 0:",
        "item 2:",
        "state: 42 bytes",
        "message 21",
    ] {
        assert!(
            raw.contains(needle),
            "--raw should contain {needle:?}:\n{raw}"
        );
    }
    let corrupt: Value = serde_json::from_str(&ok(&agentloop(&[
        "sessions",
        "show",
        "bad",
        "--data-dir",
        d,
        "--json",
    ])))
    .unwrap();
    assert_eq!(corrupt["status"], "CORRUPT");
    assert_eq!(corrupt["raw_bytes"], 21);

    // Failures: unknown id, missing or foreign directory, bad arguments.
    fails(
        &agentloop(&["sessions", "show", "missing", "--data-dir", d]),
        1,
        "no record for session `missing`",
    );
    let nowhere = tmp.0.join("nowhere");
    fails(
        &agentloop(&["sessions", "list", "--data-dir", nowhere.to_str().unwrap()]),
        1,
        "no data directory at",
    );
    assert!(!nowhere.exists(), "listing must not create the directory");
    let empty = tmp.0.join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails(
        &agentloop(&["sessions", "list", "--data-dir", empty.to_str().unwrap()]),
        1,
        "holds no agentloop data",
    );
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "nothing created"
    );
    // `sessions` alone prints its commands (exit 2).
    fails(
        &agentloop(&["sessions"]),
        2,
        "Usage: agentloop sessions <COMMAND>",
    );
    for bad in [
        &["sessions", "lsit"][..],
        &["sessions", "list", "--status", "sleepy"],
        &["sessions", "list", "--data-dir"],
        &["sessions", "show"],
        &["sessions", "show", "a", "b"],
        &["sessions", "list", "--frobnicate"],
    ] {
        fails(&agentloop(bad), 2, "For more information, try '--help'.");
        let err = text(&agentloop(bad).stderr);
        assert!(
            err.starts_with("error: "),
            "one line says what was wrong: {err}"
        );
    }

    // The records are untouched by reading them, and the lock was released each time.
    let backend = SledBackend::open(&dir).unwrap();
    assert_eq!(backend.list(None).unwrap().len(), 5);
    assert_eq!(
        backend.raw_entries("bad").unwrap().len(),
        1,
        "corrupt record kept"
    );

    // While a process holds the directory, the command says so.
    fails(
        &agentloop(&["sessions", "list", "--data-dir", d]),
        1,
        "in use",
    );
    drop(backend);
}

/// Items and state of a type the CLI does not know are shown as JSON (format 2 is
/// self-describing, issue 12 item 4).
#[test]
fn sessions_show_renders_any_item_type_as_json() {
    #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
    #[serde(tag = "role", rename_all = "snake_case")]
    enum Chat {
        User { content: String },
        Tool { call: String, result: Value },
    }
    let tmp = TempDir::new("sessions-json");
    let dir = tmp.0.join("data");
    let mut r = SessionRecord::<Chat>::new("chat", "llm", 4);
    r.status = SessionStatus::Interrupted;
    r.interrupted_items = vec![Chat::User {
        content: "weather?".into(),
    }];
    r.unhandled_items = vec![Chat::Tool {
        call: "get_weather".into(),
        result: serde_json::json!({"t": 14.5, "city": "Paris"}),
    }];
    r.state = Some(
        agentloop::store::codec::encode_state("chat", &serde_json::json!({"step": 2})).unwrap(),
    );
    let backend = SledBackend::open(&dir).unwrap();
    backend
        .write(r.to_write(WriteCondition::Always).unwrap())
        .unwrap();
    drop(backend);
    let d = dir.to_str().unwrap();
    let show = ok(&agentloop(&["sessions", "show", "chat", "--data-dir", d]));
    for needle in [
        r#"[0] {"content":"weather?","role":"user"}"#,
        r#""result":{"city":"Paris","t":14.5}"#,
        "agent state:",
        r#"{"step":2}"#,
    ] {
        assert!(
            show.contains(needle),
            "show should contain {needle:?}:\n{show}"
        );
    }
    let json: Value = serde_json::from_str(&ok(&agentloop(&[
        "sessions",
        "show",
        "chat",
        "--data-dir",
        d,
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["unhandled_items"][0]["result"]["city"], "Paris");
    assert_eq!(json["interrupted_items"][0]["role"], "user");
    assert_eq!(json["state"]["step"], 2);
}

/// Issue 13 (1): `show` prints a session's interrupt, its question and that it awaits
/// an answer, in text and JSON.
#[test]
fn sessions_show_prints_the_question_awaiting_an_answer() {
    let dir = TempDir::new("question");
    let mut rec = SessionRecord::<SimItem>::new("asks", "sim", 0);
    rec.interrupted_items = items(&[1]);
    rec.interrupt = Some(agentloop::InterruptInfo::asking(
        "approval required",
        serde_json::json!({"tool": "delete_file", "path": "/tmp/x"}),
    ));
    rec.awaiting_answer = true;
    let backend = SledBackend::open(dir.0.as_path()).unwrap();
    backend
        .write(rec.to_write(WriteCondition::Always).unwrap())
        .unwrap();
    backend.flush().unwrap();
    drop(backend);
    let d = dir.0.to_str().unwrap();
    let out = ok(&agentloop(&["sessions", "show", "asks", "--data-dir", d]));
    assert!(out.contains("interrupt    approval required"), "{out}");
    assert!(
        out.contains(r#"question     {"path":"/tmp/x","tool":"delete_file"}"#),
        "{out}"
    );
    assert!(out.contains("awaiting     yes"), "{out}");
    let json: Value = serde_json::from_str(&ok(&agentloop(&[
        "sessions",
        "show",
        "asks",
        "--json",
        "--data-dir",
        d,
    ])))
    .unwrap();
    assert_eq!(json["awaiting_answer"], Value::Bool(true));
    assert_eq!(json["interrupt"]["question"]["tool"], "delete_file");
    // Issue 13 (5): the config file's [redact] fields are masked in every payload.
    let cfg = dir.0.join("agentloop.toml");
    std::fs::write(&cfg, "[redact]\nfields = [\"path\", \"text\"]\n").unwrap();
    let c = cfg.to_str().unwrap();
    let out = ok(&agentloop(&[
        "sessions",
        "show",
        "asks",
        "--json",
        "--config",
        c,
        "--data-dir",
        d,
    ]));
    assert!(
        !out.contains("/tmp/x") && !out.contains("message 1"),
        "{out}"
    );
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["interrupt"]["question"]["path"], "[redacted]");
    assert_eq!(json["interrupted_items"][0]["text"], "[redacted]");
    assert_eq!(json["interrupted_items"][0]["id"], 1);
}

/// Issue 13 (4): `history` lists the kept turn-end checkpoints; `delete` removes the
/// record and its history; both on unknown ids say so.
#[test]
fn sessions_history_and_delete() {
    use agentloop::store::history::HistoryMark;
    let dir = TempDir::new("history");
    let backend = SledBackend::open(dir.0.as_path()).unwrap();
    for turn in 0..3u64 {
        let mut rec = SessionRecord::<SimItem>::new("kept", "sim", turn + 1);
        rec.status = SessionStatus::Running;
        rec.unhandled_items = items(&[turn + 10]);
        let mut w = rec.to_write(WriteCondition::Always).unwrap();
        w.history = Some(HistoryMark { turn, keep: 2 });
        backend.write(w).unwrap();
    }
    drop(backend);
    let d = dir.0.to_str().unwrap();
    let out = ok(&agentloop(&[
        "sessions",
        "history",
        "kept",
        "--data-dir",
        d,
    ]));
    assert!(out.contains("2 checkpoints of session `kept`"), "{out}");
    let turns: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| turn"))
        .map(|l| l.split('|').nth(1).unwrap().trim())
        .collect();
    assert_eq!(turns, vec!["1", "2"], "{out}");
    let json: Value = serde_json::from_str(&ok(&agentloop(&[
        "sessions",
        "history",
        "kept",
        "--json",
        "--data-dir",
        d,
    ])))
    .unwrap();
    assert_eq!(json["checkpoints"].as_array().unwrap().len(), 2);
    let out = ok(&agentloop(&["sessions", "delete", "kept", "--data-dir", d]));
    assert!(out.contains("deleted session `kept`"), "{out}");
    let out = ok(&agentloop(&[
        "sessions",
        "history",
        "kept",
        "--data-dir",
        d,
    ]));
    assert!(out.contains("keeps no checkpoints"), "{out}");
    fails(
        &agentloop(&["sessions", "delete", "kept", "--data-dir", d]),
        1,
        "nothing is stored for session `kept`",
    );
    fails(
        &agentloop(&["sessions", "delete", "--data-dir", d]),
        2,
        "the following required arguments were not provided",
    );
}
