//! The main job end to end (DESIGN §9, S27, S28): the real `agentloop` binary on a
//! temporary data directory, shut down by real signals, then started again on the same
//! directory to resume what the first run left `Interrupted`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "agentloop-run-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `agentloop run` whose stdout lines arrive on a channel.
struct Job {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Job {
    fn start(dir: &Path, args: &[&str]) -> Job {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .arg("run")
            .args(["--data-dir", dir.join("data").to_str().unwrap()])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the agentloop binary starts");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Job {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 60 s) for a line containing `needle`; returns it.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line containing {needle:?}; output so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) with the pid of our own child and a valid signal number.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    /// Waits (at most 60 s) for the exit; returns it and the whole output.
    fn finish(mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("agentloop did not exit; output:\n{}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends at EOF.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        (status, self.seen.join("\n"))
    }
}

/// The value of a report row, e.g. `row(out, "checkpoints saved")`.
fn row(out: &str, name: &str) -> String {
    out.lines()
        .find(|l| l.starts_with(&format!("| {name} ")))
        .unwrap_or_else(|| panic!("no report row {name:?} in:\n{out}"))
        .split('|')
        .nth(2)
        .unwrap()
        .trim()
        .to_string()
}

fn number(s: &str) -> u64 {
    s.parse()
        .unwrap_or_else(|_| panic!("{s:?} is not a number"))
}

#[test]
fn sigterm_shuts_down_gracefully_and_the_next_run_resumes() {
    let dir = TempDir::new("sigterm");
    // Busy sessions: items keep arriving, every turn has safe points every 20 ms.
    let mut job = Job::start(
        &dir.0,
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
    );
    job.wait_for("agentloop: resumed 0 interrupted sessions");
    job.wait_for("ready:");
    // Let some turns complete first (progress is printed every second).
    job.wait_for("progress:");
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
    let saved = number(&row(&out, "items saved"));
    assert!(saved > 0, "busy sessions leave items:\n{out}");

    // The next run on the same data directory resumes them, with their items.
    let mut job = Job::start(
        &dir.0,
        &["--sessions", "0", "--model-ms", "1", "--tool-ms", "1"],
    );
    let line = job.wait_for("agentloop: resumed");
    assert_eq!(
        line,
        format!("agentloop: resumed 3 interrupted sessions carrying {saved} items"),
    );
    // They finish their items and the job ends by itself.
    let (status, out) = job.finish();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("every session delivered its items"), "{out}");
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
    std::fs::write(
        dir.0.join("agentloop.toml"),
        "[shutdown]\ngrace = \"120s\"\nforce_timeout = \"5s\"\n",
    )
    .unwrap();
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
        "agentloop: resumed 2 interrupted sessions carrying 6 items"
    );
    job.wait_for("ready:");
    job.signal(libc::SIGINT);
    job.wait_for("SIGINT received");
    job.signal(libc::SIGINT);
    let (status, _) = job.finish();
    assert_eq!(status.code(), Some(0));
}
