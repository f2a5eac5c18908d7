//! An OpenAI-compatible chat-completions server the tests start on loopback (axum):
//! each request takes the next scripted answer (streamed text, tool calls, an error
//! status with `Retry-After`, a stream cut mid-way, a malformed chunk), and the server
//! records what it was sent and how many streams were open at once.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use parking_lot::Mutex;
use serde_json::{json, Value};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Answer {
    /// These text chunks, then `stop`, with `pause` between chunks.
    Text(Vec<&'static str>, Duration),
    /// One call per (id, name, arguments), sent in two fragments each, then
    /// `tool_calls`.
    Tools(Vec<(&'static str, &'static str, &'static str)>),
    /// An error status, with `Retry-After` seconds when given.
    Status(u16, Option<u64>),
    /// These chunks, then the connection is cut (no finish reason, no `[DONE]`).
    Cut(Vec<&'static str>),
    /// A chunk that is not JSON.
    Malformed,
    /// Text chunks that wait for `gate` before the last one.
    Held(Vec<&'static str>, Arc<tokio::sync::Notify>),
    // Hostile answers (issue 52).
    /// These bytes, each its own write, as they are; then the body ends.
    Raw(Vec<String>),
    /// These bytes, then `repeat` again and again for as long as the client reads,
    /// `pause` between writes.
    Endless(String, String, Duration),
    /// This status with a body of this many bytes (`x`), its length in
    /// `Content-Length`, written 64 KiB at a time.
    ErrorBody(u16, usize),
    /// The connection is accepted, the request read, and nothing is ever answered.
    Silent,
}

/// The server's shared state.
#[derive(Default)]
pub struct Fake {
    pub script: Mutex<VecDeque<Answer>>,
    /// Every request body, in arrival order, with its arrival time.
    pub requests: Mutex<Vec<(Instant, Value)>>,
    pub open: AtomicUsize,
    pub max_open: AtomicUsize,
    /// Streams whose client went away before the server finished them.
    pub dropped: AtomicUsize,
    /// Bytes of `ErrorBody` and `Endless` bodies handed to the connection.
    pub body_bytes: AtomicUsize,
}

impl Fake {
    pub fn then(&self, a: Answer) -> &Self {
        self.script.lock().push_back(a);
        self
    }

    pub fn requests(&self) -> Vec<Value> {
        self.requests
            .lock()
            .iter()
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The messages of request `n` as (role, content) pairs.
    pub fn messages(&self, n: usize) -> Vec<(String, String)> {
        self.requests()[n]["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or("").to_string(),
                    m["content"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }
}

/// Starts the server; its base URL (`http://127.0.0.1:PORT/v1`) and state.
pub async fn start() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(complete))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/v1"), fake)
}

fn chunk(delta: Value, finish: Option<&str>) -> Bytes {
    let v = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    Bytes::from(format!("data: {v}\n\n"))
}

fn usage() -> Bytes {
    let v = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
        "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    });
    Bytes::from(format!("data: {v}\n\n"))
}

/// Counts the stream open until dropped (the client gone, or the body done).
struct Open {
    fake: Arc<Fake>,
    finished: bool,
}

impl Open {
    fn new(fake: &Arc<Fake>) -> Self {
        let now = fake.open.fetch_add(1, Ordering::SeqCst) + 1;
        fake.max_open.fetch_max(now, Ordering::SeqCst);
        Open {
            fake: fake.clone(),
            finished: false,
        }
    }
}

impl Open {
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.fake.open.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.fake.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn complete(State(fake): State<Arc<Fake>>, body: axum::Json<Value>) -> Response {
    fake.requests.lock().push((Instant::now(), body.0));
    let answer = fake
        .script
        .lock()
        .pop_front()
        .unwrap_or(Answer::Text(vec!["ok"], Duration::ZERO));
    let (parts, cut): (Vec<(Bytes, Duration)>, bool) = match answer {
        Answer::Status(code, retry) => {
            let mut r = (
                StatusCode::from_u16(code).expect("a status"),
                axum::Json(json!({"error": {"message": format!("scripted {code}"), "type": "test", "param": null, "code": null}})),
            )
                .into_response();
            if let Some(s) = retry {
                r.headers_mut().insert(
                    "retry-after",
                    HeaderValue::from_str(&s.to_string()).expect("header"),
                );
            }
            return r;
        }
        Answer::Malformed => (
            vec![
                (
                    chunk(json!({"role": "assistant", "content": "Hal"}), None),
                    Duration::ZERO,
                ),
                (Bytes::from("data: {this is not json\n\n"), Duration::ZERO),
            ],
            false,
        ),
        Answer::Text(texts, pause) => {
            let mut v: Vec<(Bytes, Duration)> = texts
                .iter()
                .map(|t| (chunk(json!({"content": t}), None), pause))
                .collect();
            v.push((chunk(json!({}), Some("stop")), Duration::ZERO));
            v.push((usage(), Duration::ZERO));
            v.push((Bytes::from("data: [DONE]\n\n"), Duration::ZERO));
            (v, false)
        }
        Answer::Tools(calls) => {
            let mut v = Vec::new();
            for (i, (id, name, args)) in calls.iter().enumerate() {
                let half = args.len() / 2;
                v.push((
                    chunk(
                        json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                            "function": {"name": name, "arguments": &args[..half]}}]}),
                        None,
                    ),
                    Duration::ZERO,
                ));
                v.push((
                    chunk(
                        json!({"tool_calls": [{"index": i, "function": {"arguments": &args[half..]}}]}),
                        None,
                    ),
                    Duration::ZERO,
                ));
            }
            v.push((chunk(json!({}), Some("tool_calls")), Duration::ZERO));
            v.push((usage(), Duration::ZERO));
            v.push((Bytes::from("data: [DONE]\n\n"), Duration::ZERO));
            (v, false)
        }
        Answer::Cut(texts) => (
            texts
                .iter()
                .map(|t| {
                    (
                        chunk(json!({"content": t}), None),
                        Duration::from_millis(20),
                    )
                })
                .collect(),
            true,
        ),
        Answer::Raw(parts) => (
            parts
                .into_iter()
                .map(|p| (Bytes::from(p), Duration::ZERO))
                .collect(),
            false,
        ),
        Answer::Endless(first, repeat, pause) => {
            let open = Open::new(&fake);
            let first = Bytes::from(first);
            let repeat = Bytes::from(repeat);
            let stream = futures::stream::unfold((Some(first), open), move |(first, open)| {
                let repeat = repeat.clone();
                async move {
                    let b = match first {
                        Some(b) => b,
                        None => {
                            if !pause.is_zero() {
                                tokio::time::sleep(pause).await;
                            }
                            repeat
                        }
                    };
                    open.fake.body_bytes.fetch_add(b.len(), Ordering::SeqCst);
                    Some((Ok::<Bytes, std::io::Error>(b), (None, open)))
                }
            });
            return sse(Body::from_stream(stream));
        }
        Answer::ErrorBody(code, len) => {
            const PIECE: usize = 64 << 10;
            let piece = Bytes::from(vec![b'x'; PIECE]);
            let counter = fake.clone();
            let stream = futures::stream::unfold(0usize, move |sent| {
                let piece = piece.clone();
                let counter = counter.clone();
                async move {
                    if sent >= len {
                        return None;
                    }
                    let n = PIECE.min(len - sent);
                    counter.body_bytes.fetch_add(n, Ordering::SeqCst);
                    Some((Ok::<Bytes, std::io::Error>(piece.slice(..n)), sent + n))
                }
            });
            return Response::builder()
                .status(code)
                .header("content-type", "text/plain")
                .header("content-length", len.to_string())
                .body(Body::from_stream(stream))
                .expect("a response");
        }
        Answer::Silent => {
            let _open = Open::new(&fake);
            std::future::pending::<()>().await;
            unreachable!("pending never ends")
        }
        Answer::Held(texts, gate) => {
            let open = Open::new(&fake);
            let n = texts.len();
            let stream = async_stream(open, texts, gate, n);
            return sse(Body::from_stream(stream));
        }
    };
    let open = Open::new(&fake);
    let stream = futures::stream::unfold(
        (parts.into_iter(), open, cut),
        |(mut it, mut open, cut)| async move {
            match it.next() {
                Some((b, pause)) => {
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                    Some((Ok::<Bytes, std::io::Error>(b), (it, open, cut)))
                }
                None if cut => {
                    // Cut by the script, not by the client: not counted as dropped.
                    // The chunks before it reach the client first.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    open.finish();
                    Some((
                        Err(std::io::Error::other("scripted cut")),
                        (it, open, false),
                    ))
                }
                None => {
                    open.finish();
                    None
                }
            }
        },
    );
    sse(Body::from_stream(stream))
}

fn async_stream(
    open: Open,
    texts: Vec<&'static str>,
    gate: Arc<tokio::sync::Notify>,
    n: usize,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold((0usize, open), move |(i, mut open)| {
        let gate = gate.clone();
        let texts = texts.clone();
        async move {
            if i + 1 == n {
                gate.notified().await;
            }
            if i < n {
                return Some((Ok(chunk(json!({"content": texts[i]}), None)), (i + 1, open)));
            }
            if i == n {
                return Some((Ok(chunk(json!({}), Some("stop"))), (i + 1, open)));
            }
            if i == n + 1 {
                open.finish();
                return Some((Ok(Bytes::from("data: [DONE]\n\n")), (i + 1, open)));
            }
            None
        }
    })
}

fn sse(body: Body) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .expect("a response")
}
