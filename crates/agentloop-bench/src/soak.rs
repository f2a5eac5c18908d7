//! Soak (issue 16, 3): the main job at full speed for 5 minutes must run in flat
//! memory. Target: RSS at the end ≤ 1.1 × RSS after the first minute. No baseline.
//!
//! It runs the real `agentloop` binary (the release build next to this harness: build
//! it first with `cargo build --release -p agentloop-cli`) as a child on a temp data
//! directory: `agentloop run --sessions 1000 --items-per-session 100000 --push-ms 5
//! --model-ms 5 --tool-ms 5`, with `[store] flush = "exit"`, so the runtime and the
//! simulated agent run flat out and the store is written only at the shutdown (what
//! grows per turn shows, undiluted by the store's cache). Every 5 s it reads the
//! child's `VmRSS` from `/proc/<pid>/status` and its progress line (turns so far); it
//! prints the curve every 30 s. At the end the child gets SIGTERM and must shut down
//! gracefully (exit 0) within 120 s.
//!
//! `SOAK_SECS=<n>` shortens the run (a diagnostic; the verdict then compares the end
//! with one fifth of the run); `SOAK_FLUSH=sync` (or `turn`) runs the job with that
//! `[store] flush` instead (a diagnostic: the store's cache then grows too).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::tempdir::TempDir;

/// The run's length.
const DEFAULT_SECS: u64 = 300;
/// The RSS sampling period.
const SAMPLE: Duration = Duration::from_secs(5);
/// The target: RSS at the end ≤ 1.1 × RSS after the first minute.
const TARGET: f64 = 1.1;

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn binary() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this harness: {e}"))?;
    let bin = me.with_file_name("agentloop");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "the soak runs the main job's binary, and {} does not exist: build it with \
             `cargo build --release -p agentloop-cli`, then run the soak again",
            bin.display()
        ))
    }
}

/// Runs the soak and prints its curve and verdict line (the last line).
pub async fn run() {
    let secs = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s >= 10)
        .unwrap_or(DEFAULT_SECS);
    let bin = match binary() {
        Ok(b) => b,
        Err(e) => {
            println!("soak: {e}");
            println!("SOAK rss_ratio=- target<={TARGET} FAIL");
            return;
        }
    };
    let dir = TempDir::new("soak", "main-job");
    let config = dir.path().join("agentloop.toml");
    let flush = std::env::var("SOAK_FLUSH")
        .ok()
        .filter(|f| ["sync", "turn", "exit"].contains(&f.as_str()))
        .unwrap_or_else(|| "exit".into());
    std::fs::write(&config, format!("[store]\nflush = \"{flush}\"\n"))
        .expect("writing the soak config");
    let data = dir.path().join("data");
    let args = [
        "run",
        "--config",
        config.to_str().expect("a UTF-8 temp path"),
        "--data-dir",
        data.to_str().expect("a UTF-8 temp path"),
        "--sessions",
        "1000",
        "--items-per-session",
        "100000",
        "--push-ms",
        "5",
        "--model-ms",
        "5",
        "--tool-ms",
        "5",
    ];
    println!(
        "soak: the main job ({}) at full speed for {secs} s: agentloop {}; RSS every {} s",
        bin.display(),
        args.join(" "),
        SAMPLE.as_secs()
    );
    let mut child = Command::new(&bin)
        .args(args)
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the main job");
    let pid = child.id();
    // The latest progress line (the job prints one every second).
    let last_line = Arc::new(Mutex::new(String::new()));
    let out = child.stdout.take().expect("the child's stdout");
    let seen = last_line.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if let Ok(mut s) = seen.lock() {
                *s = line;
            }
        }
    });
    let began = Instant::now();
    let mut curve: Vec<(u64, u64, String)> = Vec::new();
    let end = Duration::from_secs(secs);
    let mut next = SAMPLE;
    while began.elapsed() < end {
        tokio::time::sleep(next.saturating_sub(began.elapsed())).await;
        next += SAMPLE;
        let Some(rss) = rss_kib(pid) else {
            println!("soak: the main job exited early");
            break;
        };
        let t = began.elapsed().as_secs();
        let progress = last_line.lock().map(|s| s.clone()).unwrap_or_default();
        if t % 30 < SAMPLE.as_secs() {
            println!("  t={t:>4} s  RSS {:>8} KiB  {}", rss, progress.trim());
        }
        curve.push((t, rss, progress));
    }
    // SIGTERM: the job shuts down gracefully and exits 0.
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    let stop = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break Some(s);
        }
        if stop.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = reader.join();
    let mark = secs / 5;
    let at = |t: u64| curve.iter().find(|(s, _, _)| *s >= t).map(|(_, r, _)| *r);
    let (Some(first), Some(last)) = (at(mark), curve.last().map(|(_, r, _)| *r)) else {
        println!("SOAK rss_ratio=- target<={TARGET} FAIL (no samples)");
        return;
    };
    let ratio = last as f64 / first as f64;
    println!(
        "RSS after {mark} s: {first} KiB; at the end ({} s): {last} KiB; shutdown: {}",
        curve.last().map_or(0, |(t, _, _)| *t),
        match status {
            Some(s) if s.success() => "graceful, exit 0".to_string(),
            Some(s) => format!("exit {s}"),
            None => "did not exit within 120 s (killed)".to_string(),
        }
    );
    let ok = ratio <= TARGET && status.is_some_and(|s| s.success());
    println!();
    println!(
        "SOAK rss_ratio={ratio:.3} target<={TARGET} {}",
        if ok { "ok" } else { "FAIL" }
    );
}
