//! S34a (issue 29): running out of file descriptors is said, and survived. `agentloop
//! serve` under a small descriptor limit (`RLIMIT_NOFILE` 128) meets more connections
//! than it has descriptors: each failed accept is logged at WARN (at most one line a
//! second), nothing crashes, and once the connections go the server answers again (on
//! main, 20 000 half-sent requests took every descriptor and nothing was logged).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{agent, TempDir};

/// Kills the server if the test fails half-way.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn out_of_descriptors_is_logged_and_the_server_recovers() {
    let dir = TempDir::new("descriptors");
    let log = dir.0.join("stderr.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    cmd.arg("serve")
        .args(["--data-dir", dir.0.join("data").to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(&dir.0)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: setrlimit(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 128,
                rlim_max: 128,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut server = Server(cmd.spawn().expect("the agentloop binary starts"));
    let out = server.0.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let url = loop {
        let line = lines.next().expect("a line").expect("stdout");
        if let Some(rest) = line.split("serving on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let addr = url.trim_start_matches("http://").to_string();
    // More half-sent requests than the server has descriptors.
    let mut held = Vec::new();
    for _ in 0..200 {
        if let Ok(mut c) = TcpStream::connect(&addr) {
            let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
            held.push(c);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("cannot accept a connection") {
            assert!(text.contains("WARN"), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "running out of descriptors was not logged: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The connections go: the server answers again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut r) = agent().get(&format!("{url}/healthz")).call() {
            if r.status().as_u16() == 200 {
                let _ = r.body_mut().read_to_string();
                break;
            }
        }
        assert!(Instant::now() < deadline, "the server did not recover");
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let warnings = text
        .lines()
        .filter(|l| l.contains("cannot accept a connection"))
        .count();
    assert!(warnings <= 40, "a flood of log lines: {warnings}");
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGTERM) };
    let status = server.0.wait().expect("reap");
    assert!(status.success(), "{status:?}");
}
