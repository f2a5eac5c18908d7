//! Issue 53, point 7, against the real `agentloop serve --model-url`: the chat agent
//! sends no `Authorization` header when no model key is configured (it sent
//! `Authorization: Bearer ` with nothing after it, which a real proxy answered with a
//! 500, retried five times), and `Bearer <key>` when one is; the provider's name is
//! `openai` (the API it speaks, as the GenAI conventions name it) or
//! `--model-provider`'s, never the model's. The model server is a loopback TCP server
//! of the test's own that records every request's headers.

mod common;

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use common::{agent, base, stop, Headers, Job, TempDir, SECRET_MARKER};
use serde_json::json;

/// A model server on loopback that records each request's headers and answers "fine".
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<Headers>>>,
}

impl Recorder {
    fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let seen: Arc<Mutex<Vec<Headers>>> = Arc::default();
        let s = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || answer(conn, &s));
            }
        });
        Recorder { url, seen }
    }

    /// The headers of the requests received so far.
    fn requests(&self) -> Vec<Headers> {
        self.seen.lock().expect("seen").clone()
    }
}

/// Reads one request (its head and its `content-length` body), records its headers,
/// streams a short answer.
fn answer(conn: TcpStream, seen: &Mutex<Vec<Headers>>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone the socket"));
    let Some((headers, _body)) = common::read_request(&mut reader) else {
        return;
    };
    seen.lock().expect("seen").push(headers);
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        let v = json!({"id": "c", "object": "chat.completion.chunk", "created": 0,
            "model": "fake", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {v}\n\n")
    };
    let body = chunk(json!({"content": "fine"}), None)
        + &chunk(json!({}), Some("stop"))
        + "data: [DONE]\n\n";
    let mut conn = conn;
    let _ = conn
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
        )
        .and_then(|_| conn.write_all(body.as_bytes()));
}

/// `agentloop serve` on `model` with `flags`, `OPENAI_API_KEY` as `key_env` says
/// (`None`: unset); a chat session gets one message, and the model server's record of
/// that call, and `/metrics`, come back. The server is stopped.
fn one_call(tag: &str, key_env: Option<&str>, flags: &[&str]) -> (Headers, String) {
    let dir = TempDir::new(tag);
    let model = Recorder::start();
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command.arg("serve");
    match key_env {
        Some(k) => command.env("OPENAI_API_KEY", k),
        None => command.env_remove("OPENAI_API_KEY"),
    };
    let args = [
        &[
            "--listen",
            "127.0.0.1:0",
            "--model-url",
            model.url.as_str(),
            "--model",
            "fake",
        ],
        flags,
    ]
    .concat();
    let mut job = Job::spawn(command, &dir.0, &args, Stdio::inherit());
    let url = base(&mut job);
    let r = agent()
        .post(&format!("{url}/sessions"))
        .send_json(json!({"id": "c1", "kind": "chat"}))
        .expect("spawned");
    assert_eq!(r.status().as_u16(), 201, "spawn");
    let r = agent()
        .post(&format!("{url}/sessions/c1/items"))
        .send_json(json!({"item": {"id": 1, "text": "hello"}}))
        .expect("pushed");
    assert!(r.status().is_success(), "push: {}", r.status());
    common::wait_for("the model server's first request", 30, || {
        !model.requests().is_empty()
    });
    let metrics = agent()
        .get(&format!("{url}/metrics"))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .expect("text");
    stop(job);
    let requests = model.requests();
    assert_eq!(requests.len(), 1, "one call, not retried: {requests:?}");
    (requests[0].clone(), metrics)
}

fn authorization(headers: &Headers) -> Vec<&str> {
    headers
        .iter()
        .filter(|(k, _)| k == "authorization")
        .map(|(_, v)| v.as_str())
        .collect()
}

/// No key configured (`OPENAI_API_KEY` unset, no `--model-key-*`): no `Authorization`
/// header at all (the old client sent `Authorization: Bearer `).
#[test]
fn without_a_key_no_authorization_header_is_sent() {
    let (headers, _) = one_call("no-key", None, &[]);
    assert!(authorization(&headers).is_empty(), "{headers:?}");
}

/// `OPENAI_API_KEY` set but empty is no key either.
#[test]
fn an_empty_key_variable_sends_no_authorization_header() {
    let (headers, _) = one_call("empty-key", Some(""), &[]);
    assert!(authorization(&headers).is_empty(), "{headers:?}");
}

/// With a key (from `--model-key-file`, and from the environment): `Bearer <key>`,
/// once; the key shows in no output of the server (`Job` checks).
#[test]
fn with_a_key_the_bearer_is_sent() {
    let dir = TempDir::new("key-file");
    let key = format!("sk-{SECRET_MARKER}-file");
    let file = dir.0.join("model.key");
    std::fs::write(&file, format!("{key}\n")).expect("the key file");
    let (headers, _) = one_call(
        "key-file",
        None,
        &["--model-key-file", file.to_str().expect("utf-8")],
    );
    assert_eq!(
        authorization(&headers),
        [format!("Bearer {key}").as_str()],
        "{headers:?}"
    );
    let key = format!("sk-{SECRET_MARKER}-env");
    let (headers, _) = one_call("key-env", Some(&key), &[]);
    assert_eq!(
        authorization(&headers),
        [format!("Bearer {key}").as_str()],
        "{headers:?}"
    );
}

/// The provider's name in `/metrics` (label `provider`) is `openai` by default, not the
/// model's (`fake`), and `--model-provider`'s when given.
#[test]
fn the_provider_name_is_openai_or_model_provider_never_the_model() {
    let (_, metrics) = one_call("provider-default", None, &[]);
    let line = r#"agentloop_model_calls_in_flight{provider="openai",model="fake"}"#;
    assert!(metrics.contains(line), "{line} not in\n{metrics}");
    assert!(!metrics.contains(r#"provider="fake""#), "{metrics}");
    let (_, metrics) = one_call("provider-named", None, &["--model-provider", "ollama"]);
    let line = r#"agentloop_model_calls_in_flight{provider="ollama",model="fake"}"#;
    assert!(metrics.contains(line), "{line} not in\n{metrics}");
}

/// An empty `--model-provider` is a usage error (exit 2) that names the flag.
#[test]
fn an_empty_model_provider_is_refused() {
    let dir = TempDir::new("provider-empty");
    let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--data-dir"])
        .arg(dir.0.join("data"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--model-url",
            "http://127.0.0.1:1/v1",
            "--model",
            "m",
            "--model-provider",
            "",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--model-provider"), "{err}");
}
