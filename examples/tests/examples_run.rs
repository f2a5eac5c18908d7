//! Every example runs to completion and prints what a newcomer is told to expect
//! (issue 13, 7). `cargo test` builds the examples before it runs tests; this runs each
//! built binary (target/<profile>/examples/NAME) with a deadline and checks its exit
//! status and the lines that show its use case worked.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The built example `name`, next to this test's own binary (target/<profile>/deps).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let path = profile
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds examples before tests; run it through cargo",
        path.display()
    );
    path
}

/// Runs example `name` with `args`, kills it after 120 s, and returns its stdout after
/// checking it succeeded and printed every line of `expected` (as substrings, in order).
fn run(name: &str, args: &[&str], expected: &[&str]) -> String {
    run_with(name, args, &[], expected)
}

/// [`run`] with no arguments and these environment variables.
fn run_env(name: &str, env: &[(&str, &str)], expected: &[&str]) -> String {
    run_with(name, &[], env, expected)
}

fn run_with(name: &str, args: &[&str], env: &[(&str, &str)], expected: &[&str]) -> String {
    let mut child = Command::new(example(name))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start example {name}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().expect("poll the example").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("example {name} did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("the example's output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rest = stdout.as_str();
    for line in expected {
        match rest.find(line) {
            Some(at) => rest = &rest[at + line.len()..],
            None => panic!("example {name} did not print {line:?} (in order):\n{stdout}"),
        }
    }
    stdout
}

#[test]
fn quickstart() {
    run(
        "quickstart",
        &[],
        &[
            "turn 0 started",
            "answer to \"what's the weather?\"",
            "answer to \"and tomorrow?\"",
            "session ended: user left",
            "2 turn(s) completed, 2 message(s) handled, 0 left over",
        ],
    );
}

#[test]
fn preempt() {
    run(
        "preempt",
        &[],
        &[
            "turn 0 started with 1 message(s)",
            "turn 0 will end at its next safe point",
            "turn 0 was preempted at a safe point",
            "turn 1 started with",
            "turn 1 ended: completed",
            "messages handled, 0 left over",
        ],
    );
}

#[test]
fn stop_and_resume() {
    let stdout = run(
        "stop_and_resume",
        &[],
        &[
            "[agent] step 1: searched the literature",
            "shutdown: 1 session(s) saved as Interrupted, carrying 1 item(s)",
            "second run, same data directory:",
            "[agent] step 3: wrote the summary",
            "report-1 ended Completed: 1 turn(s) completed, 1 item(s) handled",
        ],
    );
    // The resume turn starts while the runtime starts, so its first line and the
    // start report's line race: both must show in the second run, in either order.
    let second = stdout
        .split("second run, same data directory:")
        .nth(1)
        .expect("checked above");
    for line in [
        "resumed [\"report-1\"], carrying 1 item(s)",
        "[agent] resumes [\"what limits battery life?\"] after step",
    ] {
        assert!(
            second.contains(line),
            "second run did not print {line:?}:\n{stdout}"
        );
    }
}

#[test]
fn human_approval() {
    run(
        "human_approval",
        &[],
        &[
            "drafted an email to ops@example.com",
            "the session waits for an answer: approval required",
            "stored record: status Stopped, awaiting an answer: true",
            "a person answers",
            "sent to ops@example.com: \"the deploy is done\"",
            "the session ended Completed",
        ],
    );
}

#[test]
fn detach_and_cancel() {
    run(
        "detach_and_cancel",
        &[],
        &[
            "detached: record status Running",
            "indexed doc-",
            "canceled by id: record status Canceled",
            "index-all ended Canceled",
            "none lost",
        ],
    );
}

#[test]
fn history_and_fork() {
    run(
        "history_and_fork",
        &[],
        &[
            "todo ended after 4 turns",
            "after turn 0",
            "after turn 3",
            "after turn 1, still queued: [\"order food\",\"rent chairs\"]",
            "todo-branch (forked from turn 1 of todo) handled 2 task(s)",
        ],
    );
}

#[test]
fn embed_in_actor_tree() {
    let out = run("embed_in_actor_tree", &[], &[]);
    assert!(
        out.contains("support-1: ended Completed, 2 messages handled"),
        "{out}"
    );
    assert!(
        out.contains("support-2: ended Completed, 1 messages handled"),
        "{out}"
    );
}

#[test]
fn graceful_shutdown() {
    let dir =
        std::env::temp_dir().join(format!("agentloop-graceful-example-{}", std::process::id()));
    let arg = dir.to_string_lossy().into_owned();
    run(
        "graceful_shutdown",
        &[&arg],
        &[
            "resumed 0 sessions",
            "cleanup hook: closing connections",
            "shutdown: 3 sessions",
            "3 saved Interrupted",
        ],
    );
    // Run again on the same directory: it resumes what it saved.
    run(
        "graceful_shutdown",
        &[&arg],
        &[
            "resumed 3 sessions carrying 9 items",
            "shutdown: 6 sessions",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn payment_once() {
    let stdout = run(
        "payment_once",
        &[],
        &[
            "[agent] new session order-42: charge the card, then ship",
            "[agent] charge step returned: receipt r-1 for 42.00EUR under key order-42/0/0/charge (journaled)",
            "killed mid-turn, while it waited for the warehouse",
            "second agent process, same data directory:",
            "[agent] charge step replayed from the journal: receipt r-1 under key order-42/0/0/charge",
            "[agent] shipped #42: tracking t-1",
            "[agent] order-42 ended Completed",
            "payment service: 1 charge request(s), charges made: 1",
            "receipt r-1 under key order-42/0/0/charge",
        ],
    );
    // The resumed turn starts while the runtime starts: its lines and the start
    // report's line race, so the report's line is only checked to be in the second run.
    let second = stdout
        .split("second agent process, same data directory:")
        .nth(1)
        .expect("checked above");
    let line = "[agent] restarted: recovered [\"order-42\"] (1 cut by a crash), carrying 1 item(s)";
    assert!(
        second.contains(line),
        "the second run did not print {line:?}:\n{stdout}"
    );
}

#[test]
fn check_build_later() {
    run(
        "check_build_later",
        &[],
        &[
            "turn: started build-1, ended with a wake-up in 2 s",
            "asleep: live 0, sleeping 1",
            "timers: 1 armed, pushing Some(\"check build-1\")",
            "woken: the timer pushed \"check build-1\"",
            "shutdown before build-2's check was due",
            "restarted: the new runtime fired \"check build-2\"",
            "two digests, then canceled",
            "each check ran once: build-1 1, build-2 1",
        ],
    );
}

#[test]
fn deploy_new_version() {
    run(
        "deploy_new_version",
        &[],
        &[
            "v1: 1 message(s) so far",
            "v1: 2 message(s) so far",
            "shut down: the record says version 1",
            "version 2 alone: not resumed: ticket-7: session `ticket-7` was written by version 1 of agent kind `support`, and this runtime runs version(s) 2 of it",
            "dry run: ticket-7 would be migrated from version 1 to 2",
            "deployed: resumed [\"ticket-7\"]",
            "v2: 3 message(s) so far, topics [\"(before the upgrade)\", \"delivery\"]",
        ],
    );
}

#[test]
fn chat_with_tools() {
    // Scripted even where an Ollama listens: the test needs the kill choreography.
    let stdout = run_env(
        "chat_with_tools",
        &[("AGENTLOOP_EXAMPLE_SCRIPTED", "1")],
        &[
            "model: a scripted OpenAI-compatible server",
            "first agent process:",
            "[agent] new session order-bot",
            "[agent] tool lookup_order ran: #42 ships tomorrow",
            "[agent] tool notify_customer called (key order-bot/0/1/tool:call_notify)",
            "killed mid-turn, while notify_customer waited",
            "second agent process, same data directory:",
            "[agent] tool notify_customer called (key order-bot/0/1/tool:call_notify)",
            "[agent] model: Order #42 ships tomorrow; the customer desk knows.",
            "[agent] order-bot ended Completed",
            "orders service: 1 lookup(s); the customer desk notified 1 time(s)",
        ],
    );
    let second = stdout
        .split("second agent process, same data directory:")
        .nth(1)
        .expect("checked above");
    assert!(
        second.contains("[agent] lookup_order: replayed from the journal (#42 ships tomorrow"),
        "the second process did not replay lookup_order:\n{stdout}"
    );
    assert!(
        !second.contains("[agent] tool lookup_order ran"),
        "lookup_order ran again:\n{stdout}"
    );
}
