//! Issue 53, point 7: plain HTTP to the TLS port of the real `agentloop serve
//! --tls-cert --tls-key` is answered `400` with "this port speaks TLS: use
//! https://HOST:PORT/" (like Go's and nginx's servers), not with a TLS alert that curl
//! reported as "Received HTTP/0.9 when not allowed"; a TLS client on the same port is
//! still served, and a client that sends nothing is still closed by the header timeout.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use common::{stop, Job, TempDir};

/// `agentloop serve` with TLS on a certificate for `localhost` and 127.0.0.1; the job,
/// its `host:port` and the CA that signed it.
fn serve_tls(dir: &TempDir, extra: &[&str]) -> (Job, String, std::path::PathBuf) {
    let ca = common::TestCa::new(&dir.0, "plain");
    let (cert, key) = ca.issue("plain", &["localhost", "127.0.0.1"]);
    let args = [
        &[
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
        extra,
    ]
    .concat();
    let mut job = Job::serve(&dir.0, &args);
    let line = job.wait_for("serving on https://");
    let addr = line
        .split("serving on https://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the address")
        .trim_end_matches('/')
        .to_string();
    (job, addr, ca.ca)
}

/// Sends `request` on a plain TCP connection to `addr`; everything the server sent
/// until it closed.
fn plain(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(request).expect("send");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .expect("the server's answer, then its close");
    String::from_utf8_lossy(&buf).into_owned()
}

#[test]
fn plain_http_to_the_tls_port_is_answered_400_use_https() {
    let dir = TempDir::new("tls-plain");
    let (job, addr, ca) = serve_tls(&dir, &[]);
    let port = addr.rsplit(':').next().expect("a port").to_string();

    let answer = plain(
        &addr,
        format!("GET /healthz HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n").as_bytes(),
    );
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).expect("a body");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(v["code"], "tls_required", "{answer}");
    assert_eq!(
        v["message"],
        format!("this port speaks TLS: use https://localhost:{port}/"),
        "{answer}"
    );

    // A request with a body, and one with no Host: still the answer (the address it
    // reached), whole.
    let answer = plain(
        &addr,
        b"POST /sessions HTTP/1.0\r\ncontent-length: 11\r\n\r\n{\"id\": \"a\"}",
    );
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains(&format!("use https://{addr}/")), "{answer}");

    // Text that is not an HTTP request is closed unanswered.
    assert_eq!(plain(&addr, b"HELLO\r\n\r\n"), "");

    // curl, the client of the report: exit 0 (it was "Received HTTP/0.9 when not
    // allowed", exit 1), status 400, the message.
    let curl = std::process::Command::new("curl")
        .args([
            "-s",
            "-w",
            "\n%{http_code}",
            &format!("http://{addr}/healthz"),
        ])
        .output();
    match curl {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "curl: {out:?}");
            assert!(text.ends_with("\n400"), "{text}");
            assert!(
                text.contains("this port speaks TLS: use https://"),
                "{text}"
            );
        }
        Err(e) => eprintln!("curl is not installed ({e}): skipped its check"),
    }

    // A TLS client on the same port is served as before.
    let url = format!("https://localhost:{port}/healthz");
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(&ca)
        .arg(&url)
        .output();
    if let Ok(out) = out {
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    }
    stop(job);
}

/// A client that connects and sends nothing is still closed at the header timeout.
#[test]
fn a_silent_client_on_the_tls_port_is_still_closed_in_time() {
    let dir = TempDir::new("tls-plain-silent");
    let dir_config = dir.0.join("agentloop.toml");
    std::fs::write(&dir_config, "[http]\nheader_read_timeout = \"1s\"\n").expect("config");
    let (job, addr, _) = serve_tls(&dir, &["--config", dir_config.to_str().expect("utf-8")]);
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let began = std::time::Instant::now();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let took = began.elapsed();
    assert!(buf.is_empty(), "{buf:?}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(10),
        "closed after {took:?}"
    );
    stop(job);
}
