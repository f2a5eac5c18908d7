//! The main job end to end (DESIGN §9, S27, S28): the real `agentloop` binary on a
//! temporary data directory, shut down by real signals, then started again on the same
//! directory to resume what the first run left `Interrupted`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{number, row, write_config, Job, TempDir};

#[test]
fn sigterm_shuts_down_gracefully_and_the_next_run_resumes() {
    sigterm_then_resume(&[], "sled, durability power: survives a power loss");
}

/// Issue 15: the main job on fjall (at the default level, `power`), the same end to end.
#[test]
fn the_main_job_runs_and_resumes_on_fjall() {
    sigterm_then_resume(
        &["--engine", "fjall"],
        "fjall, durability power: survives a power loss",
    );
}

/// S15b: `crash` is an explicit choice, and the start line says it.
#[test]
fn the_main_job_runs_and_resumes_on_sled_at_crash() {
    sigterm_then_resume(
        &["--durability", "crash"],
        "sled, durability crash: survives a process crash, not a power loss",
    );
}

/// A run on `engine` (extra `run` arguments) shut down by SIGTERM, then a second run
/// on the same directory that resumes every session and delivers every item once; the
/// start line names the store and its level as `store` (S15b: with no configuration,
/// sled at `power`).
fn sigterm_then_resume(engine: &[&str], store: &str) {
    let dir = TempDir::new("sigterm");
    // Busy sessions: items keep arriving, every turn has safe points every 20 ms.
    let mut job = Job::start(
        &dir.0,
        &[
            engine,
            &[
                "--sessions",
                "3",
                "--items-per-session",
                "100000",
                "--push-ms",
                "2",
                "--model-ms",
                "20",
                "--tool-ms",
                "20",
            ],
        ]
        .concat(),
    );
    job.wait_for("agentloop: resumed 0 sessions");
    let ready = job.wait_for("ready:");
    assert!(
        ready.contains(store),
        "the start line should say {store:?}: {ready}"
    );
    // Let some turns complete first (progress is printed every second: stderr is not a
    // terminal, so plain lines with the total, the rate and the time left, issue 16).
    let line = job.wait_for("progress:");
    assert!(
        line.starts_with("progress: items delivered ")
            && line.contains(" of 300000 (")
            && line.contains("%) | ")
            && line.contains(" items/s | ETA ")
            && line.contains(" | sessions live 3 | turns "),
        "{line}"
    );
    job.signal(libc::SIGTERM);
    job.wait_for("SIGTERM received");
    let (status, out) = job.finish();
    assert_eq!(status.code(), Some(0), "clean shutdown exits 0:\n{out}");
    assert!(out.contains("shutdown report"), "{out}");
    assert_eq!(row(&out, "strategy"), "cooperative");
    assert_eq!(row(&out, "force requested"), "no");
    assert_eq!(number(&row(&out, "sessions")), 3);
    assert_eq!(number(&row(&out, "  exited in grace")), 3, "{out}");
    assert_eq!(number(&row(&out, "  killed")), 0);
    assert_eq!(number(&row(&out, "checkpoints saved")), 3);
    assert_eq!(number(&row(&out, "checkpoints failed")), 0);
    let late = number(&row(&out, "late items"));
    if late > 0 {
        assert!(
            out.contains(&format!("agentloop: {late} late item"))
                && out.contains("after the drain gate closed")
                && out.contains("in no record"),
            "late items are explained:\n{out}"
        );
    }
    let saved = number(&row(&out, "items saved"));
    assert!(saved > 0, "busy sessions leave items:\n{out}");

    if engine.contains(&"fjall") {
        // The directory keeps its engine: a run configured for the other is refused,
        // saying how to proceed, and changes nothing.
        let wrong = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["run", "--sessions", "0", "--data-dir"])
            .arg(dir.0.join("data"))
            .current_dir(&dir.0)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&wrong.stderr);
        assert_eq!(wrong.status.code(), Some(1), "{err}");
        assert!(
            err.contains("holds a fjall database, but the store is configured for sled")
                && err.contains("--engine fjall"),
            "{err}"
        );
    }
    // The next run on the same data directory resumes them, with their items.
    let mut job = Job::start(
        &dir.0,
        &[
            engine,
            &["--sessions", "0", "--model-ms", "1", "--tool-ms", "1"],
        ]
        .concat(),
    );
    let line = job.wait_for("agentloop: resumed");
    assert_eq!(
        line,
        format!(
            "agentloop: resumed 3 sessions carrying {saved} items (3 interrupted by a shutdown, 0 recovered after their process died)"
        ),
    );
    // They finish their items and the job ends by itself.
    let (status, out) = job.finish();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("every session delivered its items"), "{out}");
    // S1b: the simulated agent's tool calls are durable steps; the report counts the
    // ones the resumed turns replayed from the journal instead of running them again.
    let steps = out
        .lines()
        .find(|l| l.contains(" tool calls run as durable steps, "))
        .unwrap_or_else(|| panic!("the steps line:\n{out}"));
    let numbers: Vec<u64> = steps
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{steps}");
    assert!(
        numbers[0] > 0,
        "the resumed sessions' turns ran tool calls: {steps}"
    );
    let done = out
        .lines()
        .find(|l| l.contains(" items delivered in "))
        .expect("summary line");
    let delivered: u64 = number(done.split_whitespace().nth(3).unwrap());
    assert_eq!(
        delivered, saved,
        "every resumed item delivered once: {done}"
    );
    // Nothing is left stored.
    let list = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["sessions", "list", "--data-dir"])
        .arg(dir.0.join("data"))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&list.stdout);
    assert!(listing.contains("no records"), "{listing}");
}

#[test]
fn a_second_sigint_skips_to_force() {
    let dir = TempDir::new("sigint");
    // A long grace and safe points 30 s apart: only force can end these sessions soon.
    write_config(
        &dir.0,
        "[shutdown]\ngrace = \"120s\"\nforce_timeout = \"5s\"\n",
    );
    let mut job = Job::start(
        &dir.0,
        &[
            "--config",
            dir.0.join("agentloop.toml").to_str().unwrap(),
            "--sessions",
            "2",
            "--items-per-session",
            "3",
            "--push-ms",
            "0",
            "--model-ms",
            "30000",
        ],
    );
    job.wait_for("ready:");
    // By the first progress line (1 s) every push has been accepted.
    job.wait_for("progress:");
    let started = Instant::now();
    job.signal(libc::SIGINT);
    job.wait_for("SIGINT received");
    job.signal(libc::SIGINT);
    job.wait_for("second signal (SIGINT): forcing");
    let (status, out) = job.finish();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the 120 s grace was cut"
    );
    assert_eq!(row(&out, "force requested"), "yes (second signal)");
    assert_eq!(number(&row(&out, "sessions")), 2);
    assert_eq!(number(&row(&out, "  forced")), 2, "{out}");
    assert_eq!(number(&row(&out, "  exited in grace")), 0, "{out}");
    assert_eq!(number(&row(&out, "checkpoints saved")), 2);
    assert_eq!(
        number(&row(&out, "items saved")),
        6,
        "every accepted item kept:\n{out}"
    );

    // And they come back.
    let mut job = Job::start(
        &dir.0,
        &[
            "--sessions",
            "0",
            "--config",
            dir.0.join("agentloop.toml").to_str().unwrap(),
        ],
    );
    assert_eq!(
        job.wait_for("agentloop: resumed"),
        "agentloop: resumed 2 sessions carrying 6 items (2 interrupted by a shutdown, 0 recovered after their process died)"
    );
    job.wait_for("ready:");
    job.signal(libc::SIGINT);
    job.wait_for("SIGINT received");
    job.signal(libc::SIGINT);
    let (status, _) = job.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn item_ids_that_could_repeat_across_runs_are_refused() {
    // Item ids keep 32 bits for the item: sessions x items must stay below 2^32.
    let dir = TempDir::new("ids");
    let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["run", "--sessions", "65536", "--items-per-session", "65536"])
        .arg("--data-dir")
        .arg(dir.0.join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--sessions 65536 x --items-per-session 65536 must be below 2^32"),
        "{err}"
    );
    assert!(!dir.0.join("data").exists(), "nothing was started");
}

/// Issue 16 (1, 2): a malformed duration in agentloop.toml names the file and the key
/// and says it is not a duration; a rerun right after a SIGKILL says whose the sessions
/// are and when that lease expires, instead of calling a dead process live.
#[test]
fn config_durations_are_explained_and_a_killed_runs_sessions_recovered_at_once() {
    let dir = TempDir::new("explained");
    let config = dir.0.join("agentloop.toml");
    for bad in ["banana", "5", "10S"] {
        std::fs::write(&config, format!("[shutdown]\ngrace = \"{bad}\"\n")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["run", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.0.join("data"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&config.display().to_string())
                && err.contains("`shutdown.grace`")
                && err.contains("is not a duration"),
            "{bad}: {err}"
        );
    }
    std::fs::remove_file(&config).unwrap();

    // A run killed with SIGKILL leaves its sessions Running under its instance. The
    // data directory is locked by one process at a time, so the next run knows that
    // instance is gone and recovers both at once, without waiting out its 30 s lease
    // (issue 28).
    let mut job = Job::start(
        &dir.0,
        &[
            "--sessions",
            "2",
            "--items-per-session",
            "100000",
            "--push-ms",
            "5",
        ],
    );
    job.wait_for("progress:");
    let (_, _) = job.kill();
    let job = Job::start(&dir.0, &["--sessions", "0"]);
    let (status, out) = job.finish();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(
        out.contains("agentloop: resumed 2 sessions"),
        "both recovered at once:\n{out}"
    );
    assert!(
        !out.lines()
            .any(|l| l.starts_with("agentloop: not resumed:")),
        "nothing waits for the dead instance's lease:\n{out}"
    );
}
