//! Durable timers and schedules (S39, issue 34) through the real `agentloop serve` and a
//! real HTTP client: a timer and a schedule armed over HTTP survive a SIGKILL of the
//! server (the next process reads the store's due-time index), the timer's item is
//! delivered once, the schedule keeps firing until it is canceled, and the errors say
//! what to do.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{agent, free_addr, Job, TempDir};
use serde_json::{json, Value};

fn delivered(log: &Path, id: u64) -> usize {
    common::delivered(log).iter().filter(|i| **i == id).count()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn call(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let a = agent();
    let r = match (method, body) {
        ("POST", Some(b)) => a.post(url).send_json(b),
        ("GET", _) => a.get(url).call(),
        ("DELETE", _) => a.delete(url).call(),
        other => panic!("{other:?}"),
    };
    let mut r = r.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = r.status().as_u16();
    let v = r.body_mut().read_json().unwrap_or(Value::Null);
    (status, v)
}

/// A real `agentloop serve` on a fresh data directory, with an item log, and one
/// persistent session of the simulated agent spawned over HTTP.
struct Served {
    dir: TempDir,
    log: std::path::PathBuf,
    log_arg: String,
    addr: String,
    url: String,
    job: Job,
}

fn serve_with_session(tag: &str, id: &str) -> Served {
    let dir = TempDir::new(tag);
    let log = dir.0.join("turns.log");
    let log_arg = log.display().to_string();
    let addr = free_addr();
    let url = format!("http://{addr}");
    let mut job = Job::serve_at(&dir.0, &addr, &["--item-log", &log_arg]);
    job.wait_for("serving on http://");
    let (s, v) = call(
        "POST",
        &format!("{url}/sessions"),
        Some(json!({"id": id, "kind": "sim", "persistent": true,
                    "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}})),
    );
    assert_eq!(s, 201, "{v}");
    Served {
        dir,
        log,
        log_arg,
        addr,
        url,
        job,
    }
}

#[test]
fn timers_armed_over_http_fire_once_across_a_sigkill_and_schedules_stop_when_canceled() {
    let Served {
        dir,
        log,
        log_arg,
        addr,
        url,
        job,
    } = serve_with_session("timers", "tm");
    let timers = format!("{url}/sessions/tm/timers");
    let (s, once) = call(
        "POST",
        &timers,
        Some(json!({"item": {"id": 101, "text": "check the build"}, "in": "3s"})),
    );
    assert_eq!(s, 201, "{once}");
    let (s, every) = call(
        "POST",
        &timers,
        Some(json!({"item": {"id": 202, "text": "digest"}, "schedule": "every 1s"})),
    );
    assert_eq!(s, 201, "{every}");
    assert_eq!(every["schedule"], "every 1000ms");
    let (s, listed) = call("GET", &timers, None);
    assert_eq!(s, 200);
    assert_eq!(
        listed["timers"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    assert_eq!(listed["timers"][0]["item"]["id"], 101);

    // Killed before either is due; the next process on the same store fires them.
    job.kill();
    assert_eq!(delivered(&log, 101), 0);
    let mut job = Job::serve_at(&dir.0, &addr, &["--item-log", &log_arg]);
    job.wait_for("serving on http://");
    wait_until("the timer's item delivered", || delivered(&log, 101) == 1);
    wait_until("the schedule fired twice", || delivered(&log, 202) >= 2);

    let cancel = format!("{timers}/{}", every["id"]);
    let (s, v) = call("DELETE", &cancel, None);
    assert_eq!(s, 204, "{v}");
    let fired = delivered(&log, 202);
    let (s, v) = call("DELETE", &cancel, None);
    assert_eq!((s, v["code"].as_str()), (404, Some("unknown_timer")), "{v}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        delivered(&log, 202) <= fired + 1,
        "a canceled schedule stops (one fire in flight at most): {} after {fired}",
        delivered(&log, 202)
    );
    assert_eq!(
        delivered(&log, 101),
        1,
        "the timer fired once, across the SIGKILL"
    );
    let (_, listed) = call("GET", &timers, None);
    assert_eq!(listed["timers"], json!([]), "{listed}");

    // Errors that say what to do.
    let (s, v) = call(
        "POST",
        &timers,
        Some(json!({"item": {"id": 1, "text": "x"}, "schedule": "61 * * * *"})),
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap_or("").contains("is not valid"),
        "{v}"
    );
    let (s, v) = call(
        "POST",
        &timers,
        Some(json!({"item": {"id": 1, "text": "x"}, "in": "1s", "at_ms": 5})),
    );
    assert_eq!(s, 400, "{v}");
    let (s, v) = call(
        "POST",
        &format!("{url}/sessions/nobody/timers"),
        Some(json!({"item": {"id": 1, "text": "x"}, "in": "1s"})),
    );
    assert_eq!(
        (s, v["code"].as_str()),
        (404, Some("unknown_session")),
        "{v}"
    );

    // Absurd times are refused, not stored.
    for when in [json!({"at_ms": u64::MAX}), json!({"in": "20000d"})] {
        let mut body = json!({"item": {"id": 1, "text": "x"}});
        body.as_object_mut()
            .unwrap()
            .extend(when.as_object().unwrap().clone());
        let (s, v) = call("POST", &timers, Some(body));
        assert_eq!(s, 400, "{when}: {v}");
    }

    // Shown in the session's view, and listed offline once the server is gone.
    let (s, later) = call(
        "POST",
        &timers,
        Some(json!({"item": {"id": 303, "text": "tomorrow"}, "schedule": "0 9 * * *"})),
    );
    assert_eq!(s, 201, "{later}");
    let (s, view) = call("GET", &format!("{url}/sessions/tm"), None);
    assert_eq!(s, 200, "{view}");
    assert_eq!(view["timers"][0]["id"], later["id"], "{view}");
    assert_eq!(view["timers"][0]["schedule"], "0 9 * * *");
    assert_eq!(view["timers"][0]["item"]["id"], 303);
    job.signal(libc::SIGTERM);
    let (status, _) = job.finish();
    assert!(status.success(), "{status:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["sessions", "timers", "tm", "--data-dir"])
        .arg(dir.0.join("data"))
        .output()
        .expect("agentloop sessions timers");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("#{} due ", later["id"]))
            && text.contains("0 9 * * *")
            && text.contains("303"),
        "{text}"
    );
}

/// `agentloop timer` and `agentloop cancel-timer` against the real server: a one-off
/// timer's item delivered once, a schedule fired and canceled by its number, and the
/// errors (an unknown number, a bad cron expression, no time given) said plainly.
#[test]
fn the_cli_arms_and_cancels_timers_on_a_running_server() {
    let Served {
        dir: _dir,
        log,
        url,
        job,
        ..
    } = serve_with_session("timers-cli", "c");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(args)
            .args(["--server", &url])
            .output()
            .expect("the CLI runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = cli(&["timer", "c", r#"{"id": 404, "text": "once"}"#, "--in", "1s"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("c: timer #1 due "), "{out}");
    wait_until("the timer's item delivered", || delivered(&log, 404) == 1);

    let (code, out, err) = cli(&[
        "timer",
        "c",
        r#"{"id": 505, "text": "tick"}"#,
        "--every",
        "1s",
    ]);
    assert_eq!(code, Some(0), "{err}");
    // Numbers are per session and never given twice (the fired one kept #1).
    let n = out
        .strip_prefix("c: schedule #")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert_eq!(n, "2", "#1 is not given again: {out}");
    assert!(
        out.contains(&format!("schedule #{n} (every 1000ms), next due ")),
        "{out}"
    );
    wait_until("the schedule fired", || delivered(&log, 505) >= 1);
    let (code, out, err) = cli(&["cancel-timer", "c", &n]);
    assert_eq!(
        (code, out),
        (Some(0), format!("c: timer #{n} canceled\n")),
        "{err}"
    );
    let (code, _, err) = cli(&["cancel-timer", "c", &n]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404 unknown_timer"), "{err}");
    let (code, _, err) = cli(&[
        "timer",
        "c",
        r#"{"id": 1, "text": "x"}"#,
        "--cron",
        "61 * * * *",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("400") && err.contains("cron"), "{err}");
    let (code, _, err) = cli(&["timer", "c", r#"{"id": 1, "text": "x"}"#]);
    assert_eq!(code, Some(2), "no time given is a usage error: {err}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(delivered(&log, 404), 1, "once");
    let fired = delivered(&log, 505);
    std::thread::sleep(Duration::from_secs(2));
    assert!(delivered(&log, 505) <= fired + 1, "canceled: it stops");
    let _ = job.kill();
}
