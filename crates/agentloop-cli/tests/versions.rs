//! S40 across real restarts of `agentloop serve` (sled): a session written by version 1
//! of kind `sim` and the process SIGKILLed; a restart that runs version 2 alone refuses
//! it (says why, keeps the record byte for byte); one that runs 1 and 2 resumes it
//! pinned on 1 while new sessions run 2; `sessions migrate --dry-run` says what the
//! next start does, and a start with the migrations does exactly that.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{agent, base, delivered, spawn_sim, stop, wait_for, Job, TempDir};
use serde_json::{json, Value};

/// `agentloop sessions ARGS... --data-dir DIR/data`: (exit code, stdout, stderr).
fn sessions(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("sessions")
        .args(args)
        .args(["--data-dir", dir.join("data").to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .expect("the agentloop binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn serve(dir: &Path, log: &Path, versions: &[&str]) -> (Job, String) {
    let args = [&["--item-log", log.to_str().unwrap()], versions].concat();
    let mut job = Job::serve(dir, &args);
    let url = base(&mut job);
    (job, url)
}

/// The row `GET /sessions` lists for `id`.
fn row(url: &str, id: &str) -> Value {
    let mut r = agent()
        .get(&format!("{url}/sessions"))
        .call()
        .expect("listed");
    let rows: Value = r.body_mut().read_json().expect("json");
    rows.as_array()
        .and_then(|rows| rows.iter().find(|r| r["id"] == id).cloned())
        .unwrap_or(Value::Null)
}

/// Spawns the persistent `sim` session `id` of one quick round.
fn spawn(url: &str, id: &str) {
    spawn_sim(url, id, json!({"rounds": 1, "model_ms": 1, "tool_ms": 1}));
}

fn push(url: &str, id: &str, item: u64) {
    let mut r = agent()
        .post(&format!("{url}/sessions/{id}/items"))
        .send_json(json!({"item": {"id": item, "text": "v"}}))
        .expect("push");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
}

/// The stored record's raw entries (what `sessions export` prints for it).
fn export(dir: &Path) -> String {
    let (code, out, err) = sessions(dir, &["export"]);
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn a_deploy_pins_refuses_and_migrates_across_real_restarts() {
    let dir = TempDir::new("versions");
    let log: PathBuf = dir.0.join("items.log");

    // Version 1 (the default) writes the record; the process dies.
    let (v1, url) = serve(&dir.0, &log, &[]);
    spawn(&url, "s");
    push(&url, "s", 1);
    wait_for("item 1 delivered", 30, || delivered(&log).contains(&1));
    assert_eq!(row(&url, "s")["version"], 1);
    let _ = v1.kill();

    // The dry run for a build with version 2 alone: refused, and why.
    let (code, out, err) = sessions(&dir.0, &["migrate", "--dry-run", "--sim-versions", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("sim v1"), "{out}");
    assert!(out.contains("REFUSED s: session `s` was written by version 1 of agent kind `sim`, and this runtime runs version(s) 2 of it"), "{out}");
    assert!(out.contains("0 pinned, 0 migrated, 1 refused"), "{out}");
    let (code, _, err) = sessions(&dir.0, &["migrate", "--sim-versions", "2"]);
    assert_eq!(code, 2, "without --dry-run: a usage error");
    assert!(err.contains("add --dry-run"), "{err}");

    // A start with version 2 alone refuses it and leaves the record as it was.
    let before = export(&dir.0);
    let (v2, url) = serve(&dir.0, &log, &["--sim-versions", "2"]);
    let s = row(&url, "s");
    assert_eq!(
        (s["live"].clone(), s["version"].clone()),
        (json!(false), json!(1)),
        "{s}"
    );
    let out = stop(v2);
    assert!(
        out.contains("not resumed: s: session `s` was written by version 1 of agent kind `sim`"),
        "{out}"
    );
    assert_eq!(
        export(&dir.0),
        before,
        "the refused record is kept as it was"
    );

    // Versions 1 and 2: pinned on 1; a new session runs 2.
    let (both, url) = serve(&dir.0, &log, &["--sim-versions", "1,2"]);
    wait_for("s live again", 30, || row(&url, "s")["live"] == true);
    assert_eq!(row(&url, "s")["version"], 1);
    push(&url, "s", 2);
    wait_for("item 2 delivered", 30, || delivered(&log).contains(&2));
    spawn(&url, "n");
    assert_eq!(row(&url, "n")["version"], 2);
    stop(both);

    // The dry run of a deploy with version 2 and the migrations, then the start.
    let args = [
        "migrate",
        "--dry-run",
        "--json",
        "--sim-versions",
        "2",
        "--sim-migrations",
    ];
    let (code, out, err) = sessions(&dir.0, &args);
    assert_eq!(code, 0, "{err}");
    let plan: Value = serde_json::from_str(&out).expect("json");
    let fates: Vec<(String, String)> = plan["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["fate"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        fates,
        vec![
            ("n".to_string(), "pinned".to_string()),
            ("s".to_string(), "migrated".to_string())
        ],
        "{out}"
    );
    let (v2, url) = serve(&dir.0, &log, &["--sim-versions", "2", "--sim-migrations"]);
    wait_for("s live, migrated", 30, || {
        let s = row(&url, "s");
        s["live"] == true && s["version"] == 2
    });
    assert_eq!(row(&url, "n")["version"], 2);
    push(&url, "s", 3);
    wait_for("item 3 delivered", 30, || delivered(&log).contains(&3));
    let mut r = agent()
        .get(&format!("{url}/sessions/s"))
        .call()
        .expect("view");
    let view: Value = r.body_mut().read_json().expect("json");
    assert_eq!(view["agent_version"], 2, "{view}");
    let mut r = agent()
        .get(&format!("{url}/metrics"))
        .call()
        .expect("metrics");
    let metrics = r.body_mut().read_to_string().expect("text");
    assert!(
        metrics.contains("agentloop_sessions_by_version{kind=\"sim\",version=\"2\"} 2"),
        "{metrics}"
    );
    stop(v2);
    let (code, out, _) = sessions(&dir.0, &["show", "s"]);
    assert_eq!(code, 0);
    assert!(out.contains("sim (version 2)"), "{out}");
    let delivered = delivered(&log);
    for item in [1, 2, 3] {
        assert_eq!(
            delivered.iter().filter(|i| **i == item).count(),
            1,
            "{delivered:?}"
        );
    }
}
