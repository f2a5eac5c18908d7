//! Shared by the tests that run the real `agentloop` binary (`run.rs`, `crash_loop.rs`,
//! `serve.rs`, ...): a temporary directory, a `Job` (a running `agentloop run` or
//! `serve` whose stdout lines arrive on a channel) and an HTTP client for `serve`.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A temporary directory, removed when dropped (kept, and named on stderr, when
/// `AGENTLOOP_KEEP_TEST_DIR` is set: a failure's evidence).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
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

    /// The path of `name` inside the directory, as text.
    pub fn sub(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("AGENTLOOP_KEEP_TEST_DIR").is_some() {
            eprintln!("kept the test directory {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `agentloop run` whose stdout lines arrive on a channel.
pub struct Job {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

/// A test that fails mid-way must not leave its server or job running.
impl Drop for Job {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Job {
    /// `agentloop run --data-dir DIR/data ARGS...` in `dir`, stderr discarded.
    pub fn start(dir: &Path, args: &[&str]) -> Job {
        Job::start_with_stderr(dir, args, Stdio::null())
    }

    /// The same, with stderr sent to `stderr` (e.g. a file, for a failure's evidence).
    pub fn start_with_stderr(dir: &Path, args: &[&str], stderr: impl Into<Stdio>) -> Job {
        Job::command(dir, "run", args, stderr.into())
    }

    /// `agentloop serve --data-dir DIR/data --listen 127.0.0.1:0 ARGS...` in `dir`,
    /// stderr inherited (its log shows in a failing test's output).
    pub fn serve(dir: &Path, args: &[&str]) -> Job {
        let args = [&["--listen", "127.0.0.1:0"], args].concat();
        Job::command(dir, "serve", &args, Stdio::inherit())
    }

    /// `agentloop serve --data-dir DIR/data --listen ADDR ARGS...` in `dir`: a restart
    /// on the same address, as systemd or Kubernetes would do it.
    pub fn serve_at(dir: &Path, addr: &str, args: &[&str]) -> Job {
        let args = [&["--listen", addr], args].concat();
        Job::command(dir, "serve", &args, Stdio::inherit())
    }

    /// `agentloop serve` as [`Job::serve`], under an address-space cap of `bytes`
    /// (`ulimit -v`, RLIMIT_AS, issue 52): a server that lets a client or a model
    /// server grow its memory without bound aborts at the cap instead of taking the
    /// machine's memory, and the test sees it exit.
    pub fn serve_capped(dir: &Path, bytes: u64, args: &[&str]) -> Job {
        let args = [&["--listen", "127.0.0.1:0"], args].concat();
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
        command.arg("serve");
        cap_address_space(&mut command, bytes);
        Job::spawn(command, dir, &args, Stdio::inherit())
    }

    /// `agentloop COMMAND --data-dir DIR/data ARGS...` in `dir`.
    pub fn command(dir: &Path, command: &str, args: &[&str], stderr: Stdio) -> Job {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
        cmd.arg(command);
        Job::spawn(cmd, dir, args, stderr)
    }

    /// Starts `command` (the binary and its subcommand, with what environment the test
    /// sets) with `--data-dir DIR/data ARGS...`.
    pub fn spawn(mut command: Command, dir: &Path, args: &[&str], stderr: Stdio) -> Job {
        let mut child = command
            .args(["--data-dir", dir.join("data").to_str().unwrap()])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(stderr)
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
    pub fn wait_for(&mut self, needle: &str) -> String {
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

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) with the pid of our own child and a valid signal number.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    /// Waits (at most 60 s) for the exit; returns it and the whole output.
    pub fn finish(mut self) -> (ExitStatus, String) {
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
        let out = self.drain();
        (status, out)
    }

    /// SIGKILL (`Child::kill`), reap; returns the exit status and every line printed.
    pub fn kill(mut self) -> (ExitStatus, String) {
        // An error only means it already exited; `wait` tells how.
        let _ = self.child.kill();
        let status = self.child.wait().expect("reap the child");
        let out = self.drain();
        (status, out)
    }

    /// The lines still in the pipe (the reader thread ends at EOF), then all of them;
    /// none may carry a test secret (S43).
    fn drain(&mut self) -> String {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        let out = self.seen.join("\n");
        assert_no_secret("agentloop's output", &out);
        out
    }
}

/// What every secret a test hands a process (tokens, cookies, database passwords)
/// contains (S43): no output of a process, and no line of a test run's log (`.ci/run`
/// scans it), may carry it.
pub const SECRET_MARKER: &str = "s3cr3t-m4rk3r";

/// Fails when `text` carries a test secret, showing it with the secret masked.
pub fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET_MARKER),
        "a secret reached {what}:\n{}",
        text.replace(SECRET_MARKER, "<SECRET>")
    );
}

/// The value of a report row, e.g. `row(out, "checkpoints saved")`.
pub fn row(out: &str, name: &str) -> String {
    out.lines()
        .find(|l| l.starts_with(&format!("| {name} ")))
        .unwrap_or_else(|| panic!("no report row {name:?} in:\n{out}"))
        .split('|')
        .nth(2)
        .unwrap()
        .trim()
        .to_string()
}

pub fn number(s: &str) -> u64 {
    s.parse()
        .unwrap_or_else(|_| panic!("{s:?} is not a number"))
}

/// A request's headers: names in lower case, in order.
pub type Headers = Vec<(String, String)>;

/// One HTTP/1.1 request read off a fake server's connection: its headers (names in
/// lower case, in order) and its `content-length` body; `None` if the client went away
/// first. The fake model servers of the process tests read their requests with it.
pub fn read_request(reader: &mut impl BufRead) -> Option<(Headers, Vec<u8>)> {
    let mut headers = Vec::new();
    let mut length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if std::mem::take(&mut first) {
            continue; // the request line
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
            if k == "content-length" {
                length = v.parse().unwrap_or(0);
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0; length];
    std::io::Read::read_exact(reader, &mut body).ok()?;
    Some((headers, body))
}

/// A loopback address with a port that was free a moment ago (for a server that must
/// come back on the same address after a restart).
///
/// The port is picked below the kernel's ephemeral range (`ip_local_port_range`, from
/// 32768 by default), not by binding port 0: a port from that range, released again,
/// may be given to another test's outgoing connection as its local port before the
/// server binds it ("Address already in use", seen in a full test run). Below the
/// range, only another pick like this one could take it.
pub fn free_addr() -> String {
    static PICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(32);
    for _ in 0..1000 {
        let n = PICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // splitmix64 of the seed and the pick's number: ports spread over the range.
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let port = 20_000 + (z % 12_000) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().expect("its address").to_string();
        }
    }
    panic!("no free port between 20000 and 31999 on 127.0.0.1 after 1000 tries")
}

/// An HTTP client that answers every status (tests look at it) and gives up after 20 s.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

/// The base URL a `serve` job printed (`serving on http://…`).
pub fn base(job: &mut Job) -> String {
    let line = job.wait_for("serving on http://");
    line.split("serving on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the address")
        .to_string()
}

/// One Server-Sent Event as a test reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sse {
    /// Its `id:` (the session's event number).
    pub id: Option<u64>,
    /// Its `event:` name.
    pub name: String,
    /// Its `data:` as JSON.
    pub data: serde_json::Value,
}

/// Opens the event stream at `url` (after `last_event_id` when given) and returns once
/// the server answered (the subscription exists); a thread reads it until `ended` or
/// the end of the stream and returns the events in order.
pub fn open_events(url: &str, last_event_id: Option<u64>) -> std::thread::JoinHandle<Vec<Sse>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = agent.get(url);
    if let Some(n) = last_event_id {
        req = req.header("Last-Event-ID", n.to_string());
    }
    let resp = req.call().expect("the event stream");
    read_events(resp)
}

/// [`open_events`], or `None` when the server answers anything but a `200` stream (a
/// session whose owner cannot be reached yet, say).
pub fn try_open_events(
    url: &str,
    last_event_id: Option<u64>,
) -> Option<std::thread::JoinHandle<Vec<Sse>>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = agent.get(url);
    if let Some(n) = last_event_id {
        req = req.header("Last-Event-ID", n.to_string());
    }
    let resp = req.call().ok()?;
    (resp.status().as_u16() == 200).then(|| read_events(resp))
}

/// Reads an event stream on a thread until `ended` or its end.
fn read_events(resp: ureq::http::Response<ureq::Body>) -> std::thread::JoinHandle<Vec<Sse>> {
    std::thread::spawn(move || {
        let reader = BufReader::new(resp.into_body().into_reader());
        let mut out = Vec::new();
        let (mut id, mut name) = (None, String::new());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("id:") {
                id = n.trim().parse().ok();
            } else if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let data = serde_json::from_str(d.trim()).unwrap_or(serde_json::Value::Null);
                let end = name == "ended";
                out.push(Sse {
                    id: id.take(),
                    name: name.clone(),
                    data,
                });
                if end {
                    break;
                }
            }
        }
        out
    })
}

/// Every `(id, event)` pair seen: one id never names two different events.
pub fn record(
    seen: &mut std::collections::BTreeMap<u64, (String, serde_json::Value)>,
    events: &[Sse],
) {
    for e in events {
        let (Some(id), false) = (e.id, e.name == "lagged") else {
            continue;
        };
        let ev = (e.name.clone(), e.data.clone());
        if let Some(before) = seen.insert(id, ev.clone()) {
            assert_eq!(before, ev, "id {id} was given to two different events");
        }
    }
}

/// A stream after `after`: ids strictly increasing from `after + 1`, each number either
/// an event or inside a `lagged` whose id is the last number it counts. Returns how
/// many numbers were reported missed.
pub fn check_gap_free(after: u64, events: &[Sse]) -> u64 {
    check_gap_free_but(after, events, &[])
}

/// [`check_gap_free`], where the numbers in `history` may be skipped silently: the
/// `ended` of an earlier process's shutdown, which a replay leaves out (history, not
/// news), as a filtered stream leaves out what its filter drops.
pub fn check_gap_free_but(after: u64, events: &[Sse], history: &[u64]) -> u64 {
    let mut next = after + 1;
    let mut missed = 0;
    for e in events {
        let id = e.id.expect("every event has an id");
        if e.name == "lagged" {
            let n = e.data["missed"].as_u64().expect("missed");
            assert!(n > 0, "an empty lagged: {events:?}");
            assert_eq!(
                id,
                next + n - 1,
                "lagged counts exactly the missing numbers: {events:?}"
            );
            missed += n;
        } else {
            while history.contains(&next) && id > next {
                next += 1;
            }
            assert_eq!(id, next, "in order, each once, no silent gap: {events:?}");
        }
        next = id + 1;
    }
    missed
}

/// A certificate authority a test makes (S43): PEM files for it and for certificates
/// it signs, in a directory.
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    /// The CA's certificate, PEM.
    pub ca: PathBuf,
    dir: PathBuf,
}

impl TestCa {
    /// A new CA named `tag`, its certificate written to `dir/<tag>-ca.pem`.
    pub fn new(dir: &Path, tag: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("agentloop test CA {tag}"),
        );
        let issuer = rcgen::CertifiedIssuer::self_signed(params, key).expect("the CA");
        let ca = dir.join(format!("{tag}-ca.pem"));
        std::fs::write(&ca, issuer.pem()).unwrap();
        TestCa {
            issuer,
            ca,
            dir: dir.to_path_buf(),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by this CA, and its
    /// key (mode 600): (cert.pem, key.pem) named after `tag`.
    pub fn issue(&self, tag: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName((*n).try_into().expect("a DNS name")),
            })
            .collect();
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        let paths = (
            self.dir.join(format!("{tag}-cert.pem")),
            self.dir.join(format!("{tag}-key.pem")),
        );
        std::fs::write(&paths.0, cert.pem()).unwrap();
        std::fs::write(&paths.1, key.serialize_pem()).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&paths.1, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        paths
    }
}

/// The item ids an item log (`--item-log`) says completed turns delivered, in delivery
/// order (a `turn` line lists its items' ids).
pub fn delivered(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("turn"))
        .flat_map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(|s| s.parse::<u64>().expect("an item id in the item log"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The `turn <id>...` lines of an item log, each the ids of one completed turn, whole
/// lines only (a SIGKILL during a write may leave the last one torn).
pub fn turn_lines(log: &Path) -> Vec<Vec<u64>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n') && l.starts_with("turn"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(|id| id.parse().expect("an item id"))
                .collect()
        })
        .collect()
}

/// Polls `done` every 50 ms until it holds; fails the test naming `what` after `secs`.
pub fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops a `serve` (or `run`) job gracefully (SIGTERM) and checks it exited cleanly;
/// returns its output.
pub fn stop(job: Job) -> String {
    job.signal(libc::SIGTERM);
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
    out
}

/// `agentloop serve --listen 127.0.0.1:0 ARGS...` under an address-space cap of
/// `bytes`, as [`Job::serve_capped`], with `RUST_LOG=info` and its log (stderr)
/// written to the file `log` (issue 52: a test bounds the log's size).
pub fn serve_capped_logged(dir: &Path, bytes: u64, args: &[&str], log: &Path) -> Job {
    let args = [&["--listen", "127.0.0.1:0"], args].concat();
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command.arg("serve").env("RUST_LOG", "info");
    cap_address_space(&mut command, bytes);
    let file = std::fs::File::create(log).expect("the log file");
    Job::spawn(command, dir, &args, Stdio::from(file))
}

/// Runs `command` under an address-space cap of `bytes` (`ulimit -v`, RLIMIT_AS).
fn cap_address_space(command: &mut Command, bytes: u64) {
    // SAFETY: setrlimit(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: bytes as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `POST url` with a JSON body: the status, `Retry-After` if any, and the JSON answer
/// (`null` when there is none).
pub fn post_json(url: &str, body: &serde_json::Value) -> (u16, Option<String>, serde_json::Value) {
    let mut r = agent().post(url).send_json(body).expect("POST");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (
        status,
        retry,
        r.body_mut().read_json().unwrap_or(serde_json::Value::Null),
    )
}

/// `GET url`: the status and the JSON answer (`null` when there is none).
pub fn get(url: &str) -> (u16, serde_json::Value) {
    let mut r = agent().get(url).call().expect("GET");
    let status = r.status().as_u16();
    (
        status,
        r.body_mut().read_json().unwrap_or(serde_json::Value::Null),
    )
}

/// `GET url`: the status only (the answer read and dropped).
pub fn get_status(url: &str) -> u16 {
    let mut r = agent().get(url).call().expect("GET");
    let status = r.status().as_u16();
    let _ = r.body_mut().read_to_string();
    status
}

/// `POST url` with a JSON body: the status and the JSON answer (`null` when there is none).
pub fn post(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let mut r = agent().post(url).send_json(body).expect("POST");
    let status = r.status().as_u16();
    (
        status,
        r.body_mut().read_json().unwrap_or(serde_json::Value::Null),
    )
}

/// `POST {url}/sessions` with the spawn request `body`; it must answer 201.
pub fn spawn(url: &str, body: serde_json::Value) {
    let (status, v) = post(&format!("{url}/sessions"), body.clone());
    assert_eq!(status, 201, "spawn {body}: {v}");
}

/// `POST {url}/sessions/{session}/items` of item `id` with `text`; it must answer 200.
pub fn push_item(url: &str, session: &str, id: u64, text: &str) {
    let (status, v) = post(
        &format!("{url}/sessions/{session}/items"),
        serde_json::json!({"item": {"id": id, "text": text}}),
    );
    assert_eq!(status, 200, "push {id} to {session}: {v}");
}

/// Writes `text` as the configuration file `dir/agentloop.toml`.
pub fn write_config(dir: &Path, text: &str) {
    std::fs::write(dir.join("agentloop.toml"), text).expect("the config");
}

/// Bytes a process printed, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `agentloop ARGS...`, run to its end: its status and output.
pub fn agentloop(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .output()
        .expect("run the agentloop binary")
}

/// Checks that `out` is a success; returns its stdout.
pub fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Checks that `out` exited with `code` and said `needle` on stderr.
pub fn fails_saying(out: &std::process::Output, code: i32, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr:\n{err}");
    assert!(
        err.contains(needle),
        "stderr should contain {needle:?}:\n{err}"
    );
}

/// Simulated items `message {id}`, one per id.
pub fn sim_items(ids: &[u64]) -> Vec<agentloop_sim::SimItem> {
    ids.iter()
        .map(|&i| agentloop_sim::SimItem::new(i, format!("message {i}")))
        .collect()
}

/// Spawns the persistent `sim` session `id` with `config` at `url`; it must answer 201.
pub fn spawn_sim(url: &str, id: &str, config: serde_json::Value) {
    spawn(
        url,
        serde_json::json!({"id": id, "kind": "sim", "persistent": true, "config": config}),
    );
}
