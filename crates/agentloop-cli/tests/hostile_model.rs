//! A hostile model server against the real `agentloop serve --model-url` (issue 52),
//! the server run under a 4 GiB address-space cap with its log (RUST_LOG=info) in a
//! file. The model server is a loopback TCP server of the test's own, answering every
//! request with the attack the test sets: a tool call at index 1 000 000 000, endless
//! tool-call arguments, endless tokens (read by a watcher), a 50 MB error body, a
//! 1 MiB malformed chunk, or nothing at all. Each time: the chat session fails with a clear message naming the
//! setting that raises the bound, the server survives (`/healthz` answers, a new chat
//! session gets its answer once the model behaves, SIGTERM ends it cleanly), and its
//! log stays small.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{agent, base, serve_capped_logged, stop, TempDir};
use serde_json::{json, Value};

/// The address-space cap the server runs under: the old server aborted at it.
const CAP: u64 = 4 << 30;

/// What the model server answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    /// "fine", a stop, the usage: a well-behaved answer.
    Fine,
    /// One tool call at index 1 000 000 000, then the connection closes.
    HugeIndex,
    /// A tool call whose arguments never end.
    EndlessArguments,
    /// Tokens that never end.
    EndlessTokens,
    /// HTTP 400 with a body of this many bytes.
    ErrorBody(usize),
    /// The request is read and nothing is ever answered.
    Silent,
    /// A 1 MiB chunk that is not JSON.
    Malformed,
}

/// A hostile model server on loopback: every request gets the current mode's answer.
struct Hostile {
    url: String,
    mode: Arc<Mutex<Model>>,
    requests: Arc<Mutex<usize>>,
}

impl Hostile {
    fn start(mode: Model) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let mode = Arc::new(Mutex::new(mode));
        let requests = Arc::new(Mutex::new(0));
        let (m, r) = (mode.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (m, r) = (m.clone(), r.clone());
                std::thread::spawn(move || answer(conn, &m, &r));
            }
        });
        Hostile {
            url,
            mode,
            requests,
        }
    }

    fn set(&self, mode: Model) {
        *self.mode.lock().expect("mode") = mode;
    }

    fn requests(&self) -> usize {
        *self.requests.lock().expect("requests")
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let v = json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\n")
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

/// Reads one request (its head and its `content-length` body), answers it as the mode
/// says. Writes fail once the client went away: the attack ends there.
fn answer(conn: TcpStream, mode: &Mutex<Model>, requests: &Mutex<usize>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone the socket"));
    if common::read_request(&mut reader).is_none() {
        return;
    }
    *requests.lock().expect("requests") += 1;
    let now = *mode.lock().expect("mode");
    let mut conn = conn;
    let _ = match now {
        Model::Fine => {
            let body = chunk(json!({"content": "fine"}), None)
                + &chunk(json!({}), Some("stop"))
                + "data: [DONE]\n\n";
            conn.write_all(SSE_HEAD.as_bytes())
                .and_then(|_| conn.write_all(body.as_bytes()))
        }
        Model::HugeIndex => {
            let c = chunk(
                json!({"tool_calls": [{"index": 1_000_000_000u64, "id": "x", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]}),
                None,
            );
            conn.write_all(SSE_HEAD.as_bytes())
                .and_then(|_| conn.write_all(c.as_bytes()))
        }
        Model::EndlessArguments => {
            let first = chunk(
                json!({"tool_calls": [{"index": 0, "id": "a", "type": "function",
                    "function": {"name": "f", "arguments": "{\"x\": \""}}]}),
                None,
            );
            let more = chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "y".repeat(8192)}}]}),
                None,
            );
            endless(&mut conn, &first, &more)
        }
        Model::EndlessTokens => {
            let more = chunk(json!({"content": "z".repeat(1000)}), None);
            endless(&mut conn, "", &more)
        }
        Model::ErrorBody(len) => {
            let head = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
            );
            let piece = vec![b'x'; 64 << 10];
            let mut r = conn.write_all(head.as_bytes());
            let mut sent = 0;
            while r.is_ok() && sent < len {
                let n = piece.len().min(len - sent);
                r = conn.write_all(&piece[..n]);
                sent += n;
            }
            r
        }
        Model::Malformed => {
            let c = format!("data: {{{}\n\n", "w".repeat(1 << 20));
            conn.write_all(SSE_HEAD.as_bytes())
                .and_then(|_| conn.write_all(c.as_bytes()))
        }
        Model::Silent => {
            // Held until the client goes away.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
            Ok(())
        }
    };
}

fn endless(conn: &mut TcpStream, first: &str, more: &str) -> std::io::Result<()> {
    conn.write_all(SSE_HEAD.as_bytes())?;
    conn.write_all(first.as_bytes())?;
    loop {
        conn.write_all(more.as_bytes())?;
    }
}

/// What a chat session's event stream said about one turn.
struct Run {
    /// The data of the event that ended the stream: `ended`, or `restarting`.
    ended: String,
    /// Bytes the watcher read.
    bytes: usize,
    /// `agent` token events.
    tokens: Vec<String>,
}

/// Spawns chat session `id`, watches its events, pushes one message, and reads the
/// stream to the session's end (a failed turn ends a chat session) or, when
/// `until_turn_end`, to the turn's end.
fn chat(url: &str, id: &str, until_turn_end: bool) -> Run {
    let r = agent()
        .post(&format!("{url}/sessions"))
        .send_json(json!({"id": id, "kind": "chat"}))
        .expect("spawned");
    assert_eq!(r.status().as_u16(), 201, "spawn {id}");
    let resp = agent()
        .get(&format!("{url}/sessions/{id}/events"))
        .call()
        .expect("the event stream");
    assert_eq!(resp.status().as_u16(), 200, "events of {id}");
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(resp.into_body().into_reader());
        let mut run = Run {
            ended: String::new(),
            bytes: 0,
            tokens: Vec::new(),
        };
        let mut name = String::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) => run.bytes += n,
            }
            let line = line.trim_end();
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let d = d.trim();
                match name.as_str() {
                    "agent" => {
                        let v: Value = serde_json::from_str(d).unwrap_or(Value::Null);
                        let e = &v["event"]["Model"]["event"];
                        if e["kind"] == "token" {
                            run.tokens
                                .push(e["text"].as_str().unwrap_or_default().to_string());
                        }
                    }
                    "turn_ended" if until_turn_end => {
                        run.ended = d.to_string();
                        break;
                    }
                    // A failed turn ends the stream with `ended` when nothing will run
                    // again (a permanent failure, the budget spent), or with
                    // `restarting` when the supervisor starts the session again (a
                    // transient one, issue 53): either carries the failure.
                    "ended" | "restarting" => {
                        run.ended = d.to_string();
                        break;
                    }
                    _ => {}
                }
            }
        }
        run
    });
    let r = agent()
        .post(&format!("{url}/sessions/{id}/items"))
        .send_json(json!({"item": {"id": 1, "text": "hello"}}))
        .expect("pushed");
    assert!(r.status().is_success(), "push to {id}: {}", r.status());
    reader.join().expect("the watcher")
}

/// The server survived: `/healthz` answers, and a new chat session gets the model's
/// answer once the model behaves.
fn survives(url: &str, model: &Hostile, id: &str) {
    let r = agent()
        .get(&format!("{url}/healthz"))
        .call()
        .expect("healthz");
    assert_eq!(r.status().as_u16(), 200);
    model.set(Model::Fine);
    let run = chat(url, id, true);
    assert!(run.ended.contains("completed"), "{}", run.ended);
    assert_eq!(run.tokens, ["fine"]);
}

/// The server's log stays small and holds no run of the model's bytes.
fn small_log(log: &Path) {
    let text = std::fs::read(log).expect("the log");
    assert!(
        text.len() < 256 << 10,
        "the log has {} bytes; it starts:\n{}",
        text.len(),
        String::from_utf8_lossy(&text[..text.len().min(4096)])
    );
    let text = String::from_utf8_lossy(&text);
    for run in ["x", "y", "z", "w"] {
        assert!(
            !text.contains(&run.repeat(8 << 10)),
            "8 KiB of the model's `{run}`s in the log"
        );
    }
}

/// Starts the capped server on the hostile model with `flags`; its URL, the job and
/// the log's path.
fn serve(
    dir: &TempDir,
    model: &Hostile,
    flags: &[&str],
) -> (String, common::Job, std::path::PathBuf) {
    let log = dir.0.join("serve.log");
    let args = [
        &["--model-url", model.url.as_str(), "--model", "fake"],
        flags,
    ]
    .concat();
    let mut job = serve_capped_logged(&dir.0, CAP, &args, &log);
    let url = base(&mut job);
    (url, job, log)
}

/// A fresh directory named after `tag`, the hostile model in `mode`, and the capped
/// server on it with `flags`: the directory, the model, the URL, the job and the log.
fn start(
    tag: &str,
    mode: Model,
    flags: &[&str],
) -> (TempDir, Hostile, String, common::Job, std::path::PathBuf) {
    let dir = TempDir::new(tag);
    let model = Hostile::start(mode);
    let (url, job, log) = serve(&dir, &model, flags);
    (dir, model, url, job, log)
}

/// A test's end: the server still serves a good model after it, stops cleanly, and
/// its log stayed small.
fn ends_well(url: &str, model: &Hostile, job: common::Job, log: &Path) {
    survives(url, model, "after");
    stop(job);
    small_log(log);
}

/// A tool call at index 1 000 000 000 grew a vector to that length: the server
/// aborted. Now the session fails naming `--model-max-tool-calls`.
#[test]
fn a_tool_call_at_a_huge_index_fails_the_session_not_the_server() {
    let (_dir, model, url, job, log) = start("hostile-index", Model::HugeIndex, &[]);
    let run = chat(&url, "index", false);
    assert!(
        run.ended.contains("failed")
            && run.ended.contains("tool call at index 1000000000")
            && run.ended.contains("--model-max-tool-calls"),
        "{}",
        run.ended
    );
    ends_well(&url, &model, job, &log);
}

/// Tool-call arguments that never end (+100 MB/s kept) fail the session at the
/// argument bound.
#[test]
fn endless_tool_call_arguments_fail_the_session_at_their_bound() {
    let (_dir, model, url, job, log) = start(
        "hostile-args",
        Model::EndlessArguments,
        &["--model-max-tool-argument-bytes", "262144"],
    );
    let run = chat(&url, "args", false);
    assert!(
        run.ended
            .contains("more than 262144 bytes in one tool call")
            && run.ended.contains("--model-max-tool-argument-bytes"),
        "{}",
        run.ended
    );
    ends_well(&url, &model, job, &log);
}

/// Tokens that never end, one watcher reading them: the session fails at the text
/// bound (default 1 MiB), and the watcher read about that much.
#[test]
fn endless_tokens_fail_the_session_at_the_text_bound() {
    let (_dir, model, url, job, log) = start("hostile-tokens", Model::EndlessTokens, &[]);
    let began = Instant::now();
    let run = chat(&url, "tokens", false);
    assert!(
        run.ended
            .contains("more than 1048576 bytes in the answer's text")
            && run.ended.contains("--model-max-text-bytes"),
        "{}",
        run.ended
    );
    let text: usize = run.tokens.iter().map(String::len).sum();
    assert!(text <= 1 << 20, "{text} bytes of tokens");
    assert!(run.bytes < 8 << 20, "the watcher read {} bytes", run.bytes);
    assert!(began.elapsed() < Duration::from_secs(20));
    ends_well(&url, &model, job, &log);
}

/// A 50 MB error body became 300 MB of log and two 50 MB events. Now 4 KiB of it is
/// read, and the failure says it was truncated and how long it was.
#[test]
fn a_50_mb_error_body_is_truncated_in_the_failure_and_the_log() {
    let len = 50 << 20;
    let (_dir, model, url, job, log) = start("hostile-body", Model::ErrorBody(len), &[]);
    let run = chat(&url, "body", false);
    assert!(
        run.ended.contains("answered HTTP 400")
            && run
                .ended
                .contains(&format!("the first 4096 bytes of {len} were read"))
            && run.ended.contains("--model-max-error-body-bytes"),
        "{}",
        &run.ended[..run.ended.len().min(2048)]
    );
    assert!(run.ended.len() < 8 << 10, "{} bytes", run.ended.len());
    assert!(run.bytes < 64 << 10, "the watcher read {} bytes", run.bytes);
    ends_well(&url, &model, job, &log);
}

/// A 1 MiB chunk that is not JSON was logged whole at ERROR. Now the failure quotes
/// its first 120 characters, and nothing logs more.
#[test]
fn a_huge_malformed_chunk_is_quoted_short_in_the_failure_and_the_log() {
    let (_dir, model, url, job, log) = start("hostile-malformed", Model::Malformed, &[]);
    let run = chat(&url, "malformed", false);
    assert!(
        run.ended.contains("sent a malformed chunk") && run.ended.contains("{wwww"),
        "{}",
        &run.ended[..run.ended.len().min(2048)]
    );
    assert!(run.ended.len() < 2048, "{} bytes", run.ended.len());
    ends_well(&url, &model, job, &log);
}

/// Model servers that accept and never answer held every `--model-concurrency` permit
/// forever. Now each call ends at its deadline: four sessions on two permits all fail
/// within a few seconds, and the permits come back.
#[test]
fn silent_model_servers_release_their_permits_at_the_deadlines() {
    let dir = TempDir::new("hostile-silent");
    let model = Hostile::start(Model::Silent);
    let (url, job, log) = serve(
        &dir,
        &model,
        &[
            "--model-concurrency",
            "2",
            "--model-first-byte-timeout",
            "300ms",
            "--model-call-timeout",
            "1500ms",
        ],
    );
    let began = Instant::now();
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || chat(&url, &format!("silent{i}"), false))
        })
        .collect();
    for r in runs {
        let run = r.join().expect("a session");
        assert!(
            run.ended.contains("did not finish within 1.5s")
                && run.ended.contains("--model-call-timeout"),
            "{}",
            run.ended
        );
    }
    let took = began.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(model.requests() >= 4, "{}", model.requests());
    survives(&url, &model, "after");
    // The supervisor restarts the failed sessions: their turns call the (now
    // well-behaved) model again. Once they are done, no permit is held.
    let in_flight = r#"agentloop_model_calls_in_flight{provider="openai",model="fake"} 0"#;
    common::wait_for("every model permit back", 10, || {
        agent()
            .get(&format!("{url}/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .is_some_and(|m| m.contains(in_flight))
    });
    stop(job);
    small_log(&log);
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(text.contains("no answer began within 300ms"), "{text}");
}
