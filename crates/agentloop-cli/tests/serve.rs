//! `agentloop serve` end to end (issue 17, S33–S35): the real binary on a free loopback
//! port and a temporary data directory, driven by a real HTTP client. A SIGTERM drains
//! (the event stream of a busy session ends with `ended`, reason `shutdown`), saves the
//! session `Interrupted`, the process exits 0; the next `serve` on the directory
//! resumes it and its items are delivered.

mod common;

use std::time::{Duration, Instant};

use common::{agent, base, get, open_events, post, stop, write_config, Job, TempDir};
use serde_json::{json, Value};

/// S15b: with no configuration, `serve` writes at `power` on sled, and its start line
/// says so; `--durability crash` and `--engine fjall` are said too.
#[test]
fn the_start_line_says_the_store_and_its_level() {
    for (args, says) in [
        (&[][..], "sled, durability power: survives a power loss"),
        (
            &["--durability", "crash"][..],
            "sled, durability crash: survives a process crash, not a power loss",
        ),
        (
            &["--engine", "fjall"][..],
            "fjall, durability power: survives a power loss",
        ),
    ] {
        let dir = TempDir::new("serve-level");
        let mut job = Job::serve(&dir.0, args);
        let line = job.wait_for("serving on http://");
        assert!(line.contains(says), "{args:?}: {line}");
        common::stop(job);
    }
}

#[test]
fn serve_drains_on_sigterm_and_the_next_serve_resumes() {
    let dir = TempDir::new("serve");
    let mut job = Job::serve(&dir.0, &[]);
    job.wait_for("resumed 0 sessions");
    let url = base(&mut job);
    assert_eq!(get(&format!("{url}/healthz")).0, 200);
    assert_eq!(get(&format!("{url}/readyz")).0, 200);
    let (s, page) = {
        let mut r = agent().get(&format!("{url}/")).call().expect("the page");
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    assert_eq!(s, 200);
    assert!(
        page.contains("<html") && page.contains("/sessions"),
        "the live page"
    );

    // A busy persistent session: slow turns, several items waiting.
    let (s, v) = post(
        &format!("{url}/sessions"),
        json!({"id": "busy", "kind": "sim", "persistent": true,
               "config": {"rounds": 1, "model_ms": 150, "tool_ms": 150}}),
    );
    assert_eq!(s, 201, "{v}");
    let events = open_events(&format!("{url}/sessions/busy/events"), None);
    for i in 0..5 {
        let (s, v) = post(
            &format!("{url}/sessions/busy/items"),
            json!({"item": {"id": i, "text": format!("m{i}")}}),
        );
        assert_eq!(s, 200, "{v}");
    }
    // The first turn runs before the signal.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = get(&format!("{url}/sessions/busy"));
        if v["run"]["phase"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "no turn started: {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
    job.signal(libc::SIGTERM);
    let seen = events.join().expect("the reader");
    let last = seen.last().cloned().expect("some events");
    assert_eq!(last.name, "ended", "{seen:?}");
    assert_eq!(last.data["reason"]["kind"], "shutdown", "{last:?}");
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
    assert!(out.contains("saved Interrupted"), "{out}");

    // The next serve resumes the session; its items are delivered.
    let mut job = Job::serve(&dir.0, &[]);
    let line = job.wait_for("agentloop: resumed");
    assert!(line.contains("resumed 1 session"), "{line}");
    let url = base(&mut job);
    let (s, v) = get(&format!("{url}/sessions/busy"));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["live"], true, "{v}");
    let (s, v) = post(
        &format!("{url}/sessions/busy/stop"),
        json!({"mode": "drain"}),
    );
    assert_eq!(s, 202, "{v}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, v) = get(&format!("{url}/sessions/busy"));
        if s == 404 || v["live"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "the drain did not end: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop(job);
}

#[test]
fn serve_refuses_a_public_address_without_a_token() {
    let dir = TempDir::new("serve-public");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.0.join("data"))
        .env_remove("AGENTLOOP_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without a token"), "{err}");
}

/// Runs `agentloop ARGS` (stdin from `input`), with the token in the environment when
/// given; returns (exit code, stdout, stderr).
fn cli(args: &[&str], token: Option<&str>, input: Option<&str>) -> (i32, String, String) {
    use std::io::Write as _;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.args(args)
        .env_remove("AGENTLOOP_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(t) = token {
        cmd.env("AGENTLOOP_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("agentloop runs");
    if let Some(text) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().expect("agentloop exits");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    common::assert_no_secret("the client's stdout", &stdout);
    common::assert_no_secret("the client's stderr", &stderr);
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

#[test]
fn live_commands_drive_a_token_protected_server() {
    let dir = TempDir::new("serve-live");
    let mut job = Job::serve(&dir.0, &["--token", "s3cr3t-m4rk3r-serve-tok"]);
    let url = base(&mut job);
    let tok = Some("s3cr3t-m4rk3r-serve-tok");
    // Sessions are spawned over HTTP (the CLI has no spawn: sessions come from services).
    for id in ["w", "c"] {
        let mut r = agent()
            .post(&format!("{url}/sessions"))
            .header("Authorization", "Bearer s3cr3t-m4rk3r-serve-tok")
            .send_json(json!({"id": id, "kind": "sim", "persistent": true,
                              "config": {"rounds": 1, "model_ms": 5, "tool_ms": 5}}))
            .expect("spawn");
        assert_eq!(
            r.status().as_u16(),
            201,
            "{}",
            r.body_mut().read_to_string().unwrap()
        );
    }

    // Without the token: refused, and told how to pass one.
    let (code, _, err) = cli(&["sessions", "list", "--server", &url], None, None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401") && err.contains("--token"), "{err}");

    let (code, out, err) = cli(&["sessions", "list", "--server", &url], tok, None);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("ID")
            && out
                .lines()
                .any(|l| l.starts_with("w ") && l.contains(" sim v1 ")),
        "{out}"
    );
    let (code, out, err) = cli(&["sessions", "list", "--server", &url, "--json"], tok, None);
    assert_eq!(code, 0, "{err}");
    let rows: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(rows.as_array().unwrap().len(), 2, "{out}");

    // watch tails w's events until it ends.
    let watcher = {
        let url = url.clone();
        std::thread::spawn(move || {
            cli(
                &["watch", "w", "--server", &url],
                Some("s3cr3t-m4rk3r-serve-tok"),
                None,
            )
        })
    };
    // Give the watcher a moment to subscribe (it prints what it sees; the checks
    // below do not depend on when it attached: the drain comes after the pushes).
    std::thread::sleep(Duration::from_millis(300));
    let (code, out, err) = cli(
        &[
            "push",
            "w",
            r#"{"id": 1, "text": "from an argument"}"#,
            "--server",
            &url,
        ],
        tok,
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pushed to w"), "{out}");
    let (code, _, err) = cli(
        &["push", "w", "-", "--server", &url, "--preempt", "any"],
        tok,
        Some(r#"{"id": 2, "text": "from stdin"}"#),
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&["push", "w", "not json", "--server", &url], tok, None);
    assert_eq!(code, 2, "a bad item is a usage error: {err}");
    let (code, out, err) = cli(&["sessions", "show", "w", "--server", &url], tok, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"live\": true"), "{out}");
    let (code, _, err) = cli(
        &[
            "stop", "w", "--mode", "drain", "--cause", "done", "--server", &url,
        ],
        tok,
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = watcher.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().last().unwrap_or("").contains(" ended "),
        "{out}"
    );
    assert!(out.contains("turn_ended"), "{out}");

    // cancel (c has a record once it took an item), resume refused (nothing awaits an
    // answer), delete.
    let (code, _, err) = cli(
        &["push", "c", r#"{"id": 3, "text": "t"}"#, "--server", &url],
        tok,
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["cancel", "c", "--server", &url], tok, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("canceled"), "{out}");
    let (code, _, err) = cli(
        &[
            "resume",
            "c",
            r#"{"id": 9, "text": "yes"}"#,
            "--server",
            &url,
        ],
        tok,
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("409 wrong_state"), "{err}");
    let (code, out, err) = cli(&["delete", "c", "--server", &url], tok, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted"), "{out}");
    let (code, _, err) = cli(&["delete", "c", "--server", &url], tok, None);
    assert_eq!(code, 1);
    assert!(err.contains("404 unknown_session"), "{err}");

    // An unreachable server is named.
    let (code, _, err) = cli(
        &["cancel", "c", "--server", "http://127.0.0.1:9"],
        tok,
        None,
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the server at http://127.0.0.1:9"),
        "{err}"
    );

    stop(job);
}

/// S34a (issue 29): a token is never empty or short, from any source (flag, environment,
/// token file, configuration file): the server refuses to start and says why; a token
/// read from a file guards every route; a token on the command line is warned about
/// (it shows in `ps`).
#[test]
fn a_token_is_never_empty_or_short_from_any_source() {
    let dir = TempDir::new("serve-tokens");
    let data = dir.0.join("data");
    let serve = |args: &[&str], env: Option<&str>, cwd: &std::path::Path| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
        c.arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(args)
            .current_dir(cwd)
            .env_remove("AGENTLOOP_TOKEN");
        if let Some(v) = env {
            c.env("AGENTLOOP_TOKEN", v);
        }
        c.output().expect("run")
    };
    let refused = |out: std::process::Output, why: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(why), "{why}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("serving on"));
    };
    refused(serve(&["--token", ""], None, &dir.0), "empty");
    refused(serve(&["--token", "   "], None, &dir.0), "empty");
    refused(serve(&["--token", "short"], None, &dir.0), "at least 16");
    refused(serve(&[], Some("short-too"), &dir.0), "at least 16");
    let file = dir.0.join("token");
    std::fs::write(&file, "\n").unwrap();
    refused(
        serve(&["--token-file", file.to_str().unwrap()], None, &dir.0),
        "empty",
    );
    let conf = dir.0.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    write_config(&conf, "[http]\ntoken = \"tiny\"\n");
    refused(serve(&[], None, &conf), "at least 16");
    // An empty AGENTLOOP_TOKEN is no token: beyond loopback that is refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(&data)
        .env("AGENTLOOP_TOKEN", "")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("serving on"));

    // A good token from a file guards the routes.
    let secret = "s3cr3t-m4rk3r-file-0123456789";
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let mut job = Job::serve(&dir.0, &["--token-file", file.to_str().unwrap()]);
    let url = base(&mut job);
    let r = agent().get(&format!("{url}/sessions")).call().expect("GET");
    assert_eq!(r.status().as_u16(), 401);
    let r = agent()
        .get(&format!("{url}/sessions"))
        .header("Authorization", &format!("Bearer {secret}"))
        .call()
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    stop(job);

    // On the command line it works, with a warning on stderr.
    let (child, _stdout) = serve_piped(&data, &["--token", secret], &[]);
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().expect("exit");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token") && err.contains("process list") && !err.contains(secret),
        "{err}"
    );
}

/// S34a (issue 29): with stdout and stderr a closed pipe (`agentloop serve 2>&1 | head`
/// after `head` exited), SIGTERM still shuts the server down: the shutdown starts before
/// anything is logged, and a log line that cannot be written is dropped, not a panic.
#[test]
fn sigterm_shuts_down_when_stderr_is_a_closed_pipe() {
    let dir = TempDir::new("serve-epipe");
    let (mut child, stdout) = serve_piped(&dir.0.join("data"), &[], &[("RUST_LOG", "info")]);
    // The reader goes away, as `head` does.
    drop(stdout);
    drop(child.stderr.take());
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("SIGTERM was ignored with a closed stderr");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

/// `agentloop serve` on loopback with `args` and `env` (no AGENTLOOP_TOKEN otherwise),
/// stdout and stderr piped; returns once it printed `serving on`, with its stdout.
fn serve_piped(
    data: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(args)
        .env_remove("AGENTLOOP_TOKEN")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving on") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "it started");
    }
    (child, stdout)
}
