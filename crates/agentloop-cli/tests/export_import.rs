//! `agentloop sessions export` / `import` (issue 15, 4): records move from sled to fjall
//! and back, byte for byte, through the built binary; what the target holds is refused
//! and kept; a corrupt record stops an export.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use agentloop::store::history::HistoryMark;
use agentloop::store::{SessionRecord, SessionStatus, SledBackend, WriteCondition};
use agentloop_core::table::header_key;
use agentloop_sim::SimItem;
use serde_json::Value;

mod common;

use common::{fails_saying as fails, ok, sim_items as items, TempDir};

/// Sessions of every shape on sled: items in both places and a state, a failed one,
/// one with kept checkpoints, one whose record is gone but whose history stays.
fn populate(dir: &Path) {
    let mut alpha = SessionRecord::<SimItem>::new("alpha", "sim", 3);
    alpha.unhandled_items = items(&[10, 11]);
    alpha.stop_cause = Some("user left".into());

    let mut beta = SessionRecord::<SimItem>::new("beta", "sim", 7);
    beta.status = SessionStatus::Interrupted;
    beta.unhandled_items = items(&[20]);
    beta.interrupted_items = items(&[21, 22]);
    beta.state = Some(vec![7; 300]);
    // Its cut turn made durable steps after its state (S1b): they move with it.
    beta.journal = Some(agentloop_core::steps::TurnJournal {
        mark: agentloop_core::steps::JournalMark {
            turn: 7,
            covered: 1,
        },
        entries: vec![
            agentloop_core::steps::JournalEntry {
                occurrence: 1,
                name: "charge".into(),
                // MessagePack for "ok".
                result: Some(vec![0xa2, b'o', b'k']),
            },
            agentloop_core::steps::JournalEntry {
                occurrence: 2,
                name: "refund".into(),
                result: None,
            },
        ],
    });

    let mut gamma = SessionRecord::<SimItem>::new("gamma", "sim", 1);
    gamma.status = SessionStatus::Failed("model exploded".into());
    gamma.last_error = Some("model exploded".into());

    let mut kept = SessionRecord::<SimItem>::new("kept", "sim", 2);
    kept.unhandled_items = items(&[30]);

    let write = |r: &SessionRecord<SimItem>, turn: Option<u64>| {
        let mut w = r.to_write(WriteCondition::Always).unwrap();
        w.history = turn.map(|turn| HistoryMark { turn, keep: 5 });
        w
    };
    let ops = vec![
        write(&alpha, None),
        write(&alpha, None),
        write(&beta, None),
        write(&gamma, None),
        write(&kept, Some(1)),
        write(&kept, Some(2)),
        write(&kept, Some(3)),
        {
            // A session whose record is deleted while its checkpoint history stays.
            let mut gone = write(&kept, Some(4));
            gone.header.session_id = "gone".into();
            gone
        },
    ];
    let backend = SledBackend::open(dir).unwrap();
    backend.write_all(ops).unwrap();
    assert!(backend.delete("gone").unwrap());
    backend.flush().unwrap();
}

/// Opens sled again right after a close: its IO threads can hold the directory's lock
/// a moment after the database is dropped.
fn open_sled(dir: &str) -> SledBackend {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match SledBackend::open(dir) {
            Ok(b) => return b,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("sled did not reopen {dir}: {e}"),
        }
    }
}

fn agentloop(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run the agentloop binary");
    let mut pipe = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        // A command that refuses its input early closes its end: what it printed is
        // what the test checks.
        if let Err(e) = pipe.write_all(text.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        }
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}):\n{s}"))
}

#[test]
fn export_import_round_trip_between_sled_and_fjall() {
    let tmp = TempDir::new("transfer");
    let sled_dir = tmp.sub("sled");
    let fjall_dir = tmp.sub("fjall");
    let back_dir = tmp.sub("back");
    populate(Path::new(&sled_dir));

    let exported = ok(&agentloop(
        &["sessions", "export", "--data-dir", &sled_dir],
        None,
    ));
    let lines: Vec<Value> = exported.lines().map(json).collect();
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta", "gamma", "gone", "kept"]);
    let kept = &lines[4];
    assert_eq!(kept["history"].as_array().unwrap().len(), 3);
    assert!(lines[3]["header"].is_null(), "history only: {}", lines[3]);
    assert_eq!(lines[3]["history"].as_array().unwrap().len(), 1);
    assert_eq!(lines[0]["header"]["version"], 2);
    assert!(lines[1]["state"].is_string());
    assert_eq!(
        lines[1]["journal"].as_array().map(Vec::len),
        Some(2),
        "the cut turn's journal is exported: {}",
        lines[1]
    );

    // Into a new fjall directory: everything reads back the same.
    let out = ok(&agentloop(
        &[
            "sessions",
            "import",
            "--data-dir",
            &fjall_dir,
            "--engine",
            "fjall",
        ],
        Some(&exported),
    ));
    assert!(
        out.contains("imported 5 sessions") && out.contains("(fjall)"),
        "{out}"
    );
    assert_eq!(
        ok(&agentloop(
            &["sessions", "export", "--data-dir", &fjall_dir],
            None
        )),
        exported
    );
    for args in [
        vec!["sessions", "list", "--json"],
        vec!["sessions", "show", "beta", "--json"],
        vec!["sessions", "history", "kept", "--json"],
    ] {
        let on = |dir: &str| {
            let mut a = args.clone();
            a.extend(["--data-dir", dir]);
            json(&ok(&agentloop(&a, None)))
        };
        assert_eq!(on(&sled_dir), on(&fjall_dir), "{args:?}");
    }
    // S1b: `sessions show` lists the cut turn's durable steps with their keys.
    let beta = json(&ok(&agentloop(
        &[
            "sessions",
            "show",
            "beta",
            "--json",
            "--data-dir",
            &fjall_dir,
        ],
        None,
    )));
    assert_eq!(beta["steps"]["turn"], 7, "{beta}");
    assert_eq!(beta["steps"]["covered"], 1);
    assert_eq!(beta["steps"]["journaled"][0]["key"], "beta/7/1/charge");
    assert_eq!(beta["steps"]["journaled"][0]["finished"], true);
    assert_eq!(beta["steps"]["journaled"][0]["result"], "ok");
    assert_eq!(beta["steps"]["journaled"][1]["finished"], false);
    let text = ok(&agentloop(
        &["sessions", "show", "beta", "--data-dir", &fjall_dir],
        None,
    ));
    assert!(
        text.contains("turn 7: 1 covered by the state, 2 journaled")
            && text.contains("beta/7/2/refund began, no result (unknown outcome)"),
        "{text}"
    );

    // A second import is refused session by session; the records stay as they were.
    let again = agentloop(
        &["sessions", "import", "--data-dir", &fjall_dir],
        Some(&exported),
    );
    fails(&again, 1, "imported 0 sessions");
    fails(&again, 1, "5 refused");
    fails(&again, 1, "session `alpha` already has a record");
    assert_eq!(
        ok(&agentloop(
            &["sessions", "export", "--data-dir", &fjall_dir],
            None
        )),
        exported
    );

    // And back to sled (a new directory: the default engine).
    let fjall_export = ok(&agentloop(
        &["sessions", "export", "--data-dir", &fjall_dir],
        None,
    ));
    ok(&agentloop(
        &["sessions", "import", "--data-dir", &back_dir],
        Some(&fjall_export),
    ));
    assert!(Path::new(&back_dir).join("db").is_file(), "sled's files");
    assert_eq!(
        ok(&agentloop(
            &["sessions", "export", "--data-dir", &back_dir],
            None
        )),
        exported
    );

    // The wrong engine for a directory is refused with the way out.
    fails(
        &agentloop(
            &[
                "sessions",
                "import",
                "--data-dir",
                &sled_dir,
                "--engine",
                "fjall",
            ],
            Some(&exported),
        ),
        1,
        "holds a sled database, but the store is configured for fjall",
    );
}

#[test]
fn export_stops_at_a_corrupt_record_and_import_checks_every_line_first() {
    let tmp = TempDir::new("transfer-bad");
    let dir = tmp.sub("sled");
    populate(Path::new(&dir));
    {
        let b = open_sled(&dir);
        b.put_raw(&header_key("bad"), b"garbage, not a record")
            .unwrap();
        b.flush().unwrap();
    }
    let out = agentloop(&["sessions", "export", "--data-dir", &dir], None);
    fails(&out, 1, "1 session cannot be exported");
    fails(&out, 1, "bad:");
    assert!(out.stdout.is_empty(), "nothing is printed");

    // A line that is not an export line: nothing is imported.
    let target = tmp.sub("target");
    let good = r#"{"agentloop_export":1,"session_id":"x","header":null,"items":[],"state":null,"history":[{"turn":1,"snapshot":"AA=="}],"other":[]}"#;
    let out = agentloop(
        &["sessions", "import", "--data-dir", &target],
        Some(&format!("{good}\nnot json\n")),
    );
    fails(
        &out,
        1,
        "line 2 of the input is not an agentloop export line",
    );
    assert!(
        !Path::new(&target).exists(),
        "no directory was created for a refused import"
    );
    // An unknown level is a usage error naming the levels (S15b).
    fails(
        &agentloop(
            &[
                "sessions",
                "import",
                "--data-dir",
                &target,
                "--durability",
                "fsync",
            ],
            Some(good),
        ),
        2,
        "invalid value 'fsync' for '--durability",
    );
    assert!(
        !Path::new(&target).exists(),
        "no directory was created for a refused import"
    );
}
