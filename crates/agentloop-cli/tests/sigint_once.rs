//! Issue 53, point 7: `agentloop run` said a SIGINT twice, once as its own line and
//! once as a WARN log line from the library's signal listener. The real binary, with
//! its default log filter, SIGINT'ed mid-run: its stdout and stderr together say it
//! once.

mod common;

use std::process::{Command, Stdio};

use common::{Job, TempDir};

#[test]
fn a_sigint_is_said_once() {
    let dir = TempDir::new("sigint-once");
    let stderr = dir.0.join("stderr.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    // The binary's default log filter (WARN), whatever the test's environment says.
    command.arg("run").env_remove("RUST_LOG");
    let mut job = Job::spawn(
        command,
        &dir.0,
        &[
            "--sessions",
            "2",
            "--items-per-session",
            "100000",
            "--push",
            "1ms",
            "--model",
            "20ms",
            "--tool",
            "5ms",
        ],
        Stdio::from(std::fs::File::create(&stderr).expect("the stderr file")),
    );
    job.wait_for("ready:");
    job.wait_for("progress:");
    job.signal(libc::SIGINT);
    let (status, stdout) = job.finish();
    assert!(status.success(), "{stdout}");
    let stderr = std::fs::read_to_string(&stderr).expect("stderr");
    let all = format!("{stdout}\n{stderr}");
    let said: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("SIGINT") && l.contains("shutting down"))
        .collect();
    assert_eq!(said.len(), 1, "said {} times:\n{all}", said.len());
    assert!(
        said[0].contains("SIGINT received: shutting down gracefully"),
        "{all}"
    );
}
