//! `agentloop serve --model-url URL --model NAME` (issue 35): kind `chat` beside `sim`,
//! through the real binary, a real HTTP client and an OpenAI-compatible fake model
//! server this test starts on loopback. Streamed tokens arrive as SSE `agent` events in
//! order; the conversation is carried to the next turn, also across a SIGKILL and a
//! restart of the server (the fake model is sent the whole conversation again); a bad
//! model URL is refused at start with the reason.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{agent, Job, TempDir};
use serde_json::{json, Value};

/// The requests the fake model server received (their bodies).
type Seen = Arc<Mutex<Vec<Value>>>;

/// Serves `app` on loopback from a thread of its own (the test itself is blocking);
/// its address.
fn serve_on_thread(app: impl FnOnce() -> axum::Router + Send + 'static) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let _ = tx.send(listener.local_addr().expect("addr"));
            let _ = axum::serve(listener, app()).await;
        });
    });
    rx.recv().expect("the server's address")
}

/// Starts the fake model server on its own thread: it answers every request by
/// streaming "I have heard N message(s)." in three chunks, N being the user messages
/// it was sent; but a last message "fail" gets HTTP 400, and a last message "call a
/// tool" gets a call of the tool `nope` (which no chat session has). Returns its base
/// URL.
fn start_model(seen: Seen) -> String {
    let addr = serve_on_thread(move || {
        axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let users = req["messages"]
                        .as_array()
                        .map(|m| m.iter().filter(|m| m["role"] == "user").count())
                        .unwrap_or(0);
                    let last = req["messages"]
                        .as_array()
                        .and_then(|m| m.last())
                        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
                        .unwrap_or_default();
                    seen.lock().expect("seen").push(req);
                    if last == "fail" {
                        return axum::response::Response::builder()
                            .status(400)
                            .header("content-type", "application/json")
                            .body(axum::body::Body::from(
                                r#"{"error":{"message":"no","type":"invalid_request_error"}}"#,
                            ))
                            .expect("a response");
                    }
                    let mut out = String::new();
                    let (deltas, finish) = if last == "call a tool" {
                        (
                            vec![json!({"tool_calls": [{"index": 0, "id": "call-1",
                                "type": "function",
                                "function": {"name": "nope", "arguments": "{}"}}]})],
                            "tool_calls",
                        )
                    } else {
                        (
                            ["I have heard ", &users.to_string(), " message(s)."]
                                .iter()
                                .map(|t| json!({"content": t}))
                                .collect(),
                            "stop",
                        )
                    };
                    for d in deltas {
                        let c = json!({"id": "c", "object": "chat.completion.chunk",
                                "created": 0, "model": "fake",
                                "choices": [{"index": 0, "delta": d, "finish_reason": null}]});
                        out.push_str(&format!("data: {c}\n\n"));
                    }
                    let end = json!({"id": "c", "object": "chat.completion.chunk",
                            "created": 0, "model": "fake",
                            "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 3}});
                    out.push_str(&format!("data: {end}\n\ndata: [DONE]\n\n"));
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from(out))
                        .expect("a response")
                }
            }),
        )
    });
    format!("http://{addr}/v1")
}

/// The tokens of the next turn, from the session's event stream (opened before the
/// push, so nothing is missed), read until the turn ends or the session does.
fn push_and_read_tokens(url: &str, id: &str, text: &str) -> Vec<String> {
    use std::io::BufRead as _;
    let resp = agent()
        .get(&format!("{url}/sessions/{id}/events"))
        .call()
        .expect("the event stream");
    let reader = std::thread::spawn(move || {
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        let (mut tokens, mut name) = (Vec::new(), String::new());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                // A failed turn ends the stream with `ended` (or `restarting`).
                if matches!(name.as_str(), "turn_ended" | "ended" | "restarting") {
                    break;
                }
                let v: Value = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
                let e = &v["event"]["Model"]["event"];
                if name == "agent" && e["kind"] == "token" {
                    tokens.push(e["text"].as_str().unwrap_or_default().to_string());
                }
            }
        }
        tokens
    });
    let r = agent()
        .post(&format!("{url}/sessions/{id}/items"))
        .send_json(json!({"item": {"id": 1, "text": text}}))
        .expect("pushed");
    assert!(r.status().is_success(), "push: {}", r.status());
    reader.join().expect("the reader")
}

/// The URL a server started on port 0 serves on, from its start line.
fn served_url(job: &mut Job) -> String {
    let line = job.wait_for("serving on http://");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    format!("http://{addr}")
}

#[test]
fn serve_with_a_model_streams_tokens_and_carries_the_conversation_across_a_sigkill() {
    let dir = TempDir::new("chat");
    let seen: Seen = Arc::default();
    let model_url = start_model(seen.clone());
    let args = ["--model-url", model_url.as_str(), "--model", "fake"];
    // Port 0 the first time (an address picked beforehand may be taken by another
    // test's connection before the server binds it: "Address already in use"); the
    // restart below takes the address this server had.
    let mut job = Job::serve(&dir.0, &args);
    let url = served_url(&mut job);
    let addr = url.trim_start_matches("http://").to_string();
    let r = agent()
        .post(&format!("{url}/sessions"))
        .send_json(json!({"id": "c1", "kind": "chat", "persistent": true,
                          "durability": "sync", "config": {"system": "be brief"}}))
        .expect("spawned");
    assert_eq!(r.status().as_u16(), 201, "spawn");
    let tokens = push_and_read_tokens(&url, "c1", "hello");
    assert_eq!(tokens, ["I have heard ", "1", " message(s)."]);

    // A SIGKILL and a restart on the same directory: the conversation is the session's
    // carried state, in its record.
    let (status, _) = job.kill();
    assert!(!status.success());
    let mut job = Job::serve_at(&dir.0, &addr, &args);
    job.wait_for("serving on http://");
    let tokens = push_and_read_tokens(&url, "c1", "again");
    assert_eq!(tokens, ["I have heard ", "2", " message(s)."]);
    let sent = seen
        .lock()
        .expect("seen")
        .last()
        .cloned()
        .expect("a request");
    let roles: Vec<(&str, &str)> = sent["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default(),
                m["content"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [
            ("system", "be brief"),
            ("user", "hello"),
            ("assistant", "I have heard 1 message(s)."),
            ("user", "again")
        ],
        "the model got the whole conversation after the restart"
    );
    let (s, view) = {
        let mut r = agent()
            .get(&format!("{url}/sessions/c1"))
            .call()
            .expect("the view");
        (
            r.status().as_u16(),
            r.body_mut().read_json::<Value>().unwrap_or(Value::Null),
        )
    };
    assert_eq!(s, 200, "{view}");
    assert_eq!(view["state_carried"], true, "{view}");
    // Token usage in /metrics: the restarted server's one call (5 + 3 tokens).
    let metrics = agent()
        .get(&format!("{url}/metrics"))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .expect("text");
    for line in [
        r#"agentloop_model_tokens_total{provider="openai",model="fake",kind="prompt"} 5"#,
        r#"agentloop_model_tokens_total{provider="openai",model="fake",kind="completion"} 3"#,
        r#"agentloop_model_calls_total{provider="openai",model="fake"} 1"#,
        r#"agentloop_model_calls_in_flight{provider="openai",model="fake"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert_eq!(
        view["state"]["messages"].as_array().map(Vec::len),
        Some(5),
        "{view}"
    );
    job.signal(libc::SIGTERM);
    let (status, _) = job.finish();
    assert!(status.success(), "{status}");
}

#[test]
fn a_bad_model_url_is_refused_at_start_with_the_reason() {
    let dir = TempDir::new("chat-bad");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--data-dir"])
        .arg(dir.0.join("data"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--model-url",
            "localhost:11434",
            "--model",
            "m",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--model-url") && err.contains("not an http"),
        "{err}"
    );
    let _ = Duration::ZERO;
}

/// An attribute's value as the OTLP receiver got it, its type kept.
#[derive(Clone, Debug, PartialEq)]
enum Attr {
    Str(String),
    Int(i64),
    Bool(bool),
    Double(f64),
    Strings(Vec<String>),
    Other(String),
}

impl Attr {
    fn str(s: &str) -> Attr {
        Attr::Str(s.to_string())
    }
}

/// One span as the OTLP receiver got it.
#[derive(Clone, Debug)]
struct Span {
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    attributes: std::collections::HashMap<String, Attr>,
    /// The span ids its links point at.
    links: Vec<Vec<u8>>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    status: i32,
}

/// Starts an OTLP/HTTP receiver (protobuf) on loopback; its base URL and the spans it
/// got.
fn start_otlp() -> (String, Arc<Mutex<Vec<Span>>>) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let got = spans.clone();
    let attr = |v: Option<Any>| match v {
        Some(Any::StringValue(s)) => Attr::Str(s),
        Some(Any::IntValue(i)) => Attr::Int(i),
        Some(Any::BoolValue(b)) => Attr::Bool(b),
        Some(Any::DoubleValue(d)) => Attr::Double(d),
        Some(Any::ArrayValue(a))
            if a.values
                .iter()
                .all(|v| matches!(v.value, Some(Any::StringValue(_)))) =>
        {
            Attr::Strings(
                a.values
                    .into_iter()
                    .filter_map(|v| match v.value {
                        Some(Any::StringValue(s)) => Some(s),
                        _ => None,
                    })
                    .collect(),
            )
        }
        other => Attr::Other(format!("{other:?}")),
    };
    let addr = serve_on_thread(move || {
        axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let got = got.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    for rs in req.resource_spans {
                        for ss in rs.scope_spans {
                            for s in ss.spans {
                                let attributes = s
                                    .attributes
                                    .into_iter()
                                    .map(|kv| (kv.key, attr(kv.value.and_then(|v| v.value))))
                                    .collect();
                                got.lock().expect("spans").push(Span {
                                    name: s.name,
                                    trace: s.trace_id,
                                    id: s.span_id,
                                    parent: s.parent_span_id,
                                    attributes,
                                    links: s.links.into_iter().map(|l| l.span_id).collect(),
                                    status: s.status.map_or(0, |st| st.code),
                                });
                            }
                        }
                    }
                    axum::http::StatusCode::OK
                }
            }),
        )
    });
    (format!("http://{addr}"), spans)
}

/// Serves with a fake model and `--otlp-endpoint` (and `extra` arguments), spawns chat
/// session `id`, pushes `texts` one turn at a time, shuts the server down (which
/// flushes the spans) and returns the spans the receiver got, with the model's port.
fn spans_of_turns(name: &str, extra: &[&str], id: &str, texts: &[&str]) -> (Vec<Span>, u16) {
    let dir = TempDir::new(name);
    let seen: Seen = Arc::default();
    let model_url = start_model(seen);
    let port: u16 = model_url
        .trim_start_matches("http://")
        .split(['/', ':'])
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("the model's port");
    let (otlp, spans) = start_otlp();
    let mut args = vec![
        "--model-url",
        model_url.as_str(),
        "--model",
        "fake",
        "--otlp-endpoint",
        otlp.as_str(),
    ];
    args.extend_from_slice(extra);
    let mut job = Job::serve(&dir.0, &args);
    let url = served_url(&mut job);
    let r = agent()
        .post(&format!("{url}/sessions"))
        .send_json(json!({"id": id, "kind": "chat"}))
        .expect("spawned");
    assert_eq!(r.status().as_u16(), 201, "spawn");
    for text in texts {
        push_and_read_tokens(&url, id, text);
    }
    job.signal(libc::SIGTERM);
    let (status, _) = job.finish();
    assert!(status.success(), "{status}");
    let spans = spans.lock().expect("spans").clone();
    (spans, port)
}

/// The spans of the traces the turns of `id` root, by turn: the turn's span first.
fn traces_of_turns(spans: &[Span], id: &str) -> Vec<Vec<Span>> {
    spans
        .iter()
        .filter(|s| {
            s.name == "turn" && s.attributes.get("gen_ai.conversation.id") == Some(&Attr::str(id))
        })
        .map(|turn| {
            let mut trace = vec![turn.clone()];
            trace.extend(
                spans
                    .iter()
                    .filter(|s| s.trace == turn.trace && s.id != turn.id)
                    .cloned(),
            );
            trace
        })
        .collect()
}

/// S42, issue 53: with `--otlp-endpoint`, each turn is a trace of its own (its span a
/// root, linked to the session's first turn), the model call its child with
/// OpenTelemetry's GenAI attributes typed as the conventions type them: token counts and
/// the turn's index ints, the finish reasons a string array, the provider `openai`, the
/// server a bare host and an int port; every span of a turn's trace names the
/// conversation. The session's span (as long as the session) is not exported.
#[test]
fn spans_with_genai_attributes_are_exported_over_otlp() {
    let (spans, port) = spans_of_turns("chat-otlp", &[], "t1", &["hello", "again"]);
    assert!(
        !spans.iter().any(|s| s.name == "session"),
        "the session's span is not exported: {spans:#?}"
    );
    let traces = traces_of_turns(&spans, "t1");
    assert_eq!(traces.len(), 2, "two turns, two traces: {spans:#?}");
    let (first, second) = (&traces[0][0], &traces[1][0]);
    assert_ne!(first.trace, second.trace, "one trace per turn");
    for (i, trace) in traces.iter().enumerate() {
        let turn = &trace[0];
        assert!(turn.parent.is_empty(), "a turn's span is a root: {turn:#?}");
        assert!(
            matches!(turn.attributes.get("index"), Some(Attr::Int(_))),
            "the turn's index is an int: {turn:#?}"
        );
        for s in trace {
            assert_eq!(
                s.attributes.get("gen_ai.conversation.id"),
                Some(&Attr::str("t1")),
                "every span of turn {i}'s trace names the conversation: {s:#?}"
            );
        }
        let chat = trace
            .iter()
            .find(|s| s.name == "chat fake")
            .unwrap_or_else(|| panic!("no model call in turn {i}: {trace:#?}"));
        assert_eq!(chat.parent, turn.id, "the model call is the turn's child");
        assert_eq!(chat.status, 0, "{chat:#?}");
        for (k, v) in [
            ("gen_ai.operation.name", Attr::str("chat")),
            ("gen_ai.request.model", Attr::str("fake")),
            ("gen_ai.provider.name", Attr::str("openai")),
            ("gen_ai.usage.input_tokens", Attr::Int(5)),
            ("gen_ai.usage.output_tokens", Attr::Int(3)),
            (
                "gen_ai.response.finish_reasons",
                Attr::Strings(vec!["stop".into()]),
            ),
            ("server.address", Attr::str("127.0.0.1")),
            ("server.port", Attr::Int(i64::from(port))),
        ] {
            assert_eq!(chat.attributes.get(k), Some(&v), "{k}: {chat:#?}");
        }
    }
    assert!(first.links.is_empty(), "{first:#?}");
    assert_eq!(
        second.links,
        std::slice::from_ref(&first.id),
        "a later turn links to the session's first"
    );
}

/// Issue 53: `gen_ai.provider.name` is `--model-provider`'s; a tool call that fails and
/// a model call the server refuses are spans with status ERROR and an `error.type`
/// (the unknown tool; the HTTP status), in the traces of their turns.
#[test]
fn failed_calls_are_error_spans_with_an_error_type() {
    let (spans, _) = spans_of_turns(
        "chat-otlp-errors",
        &["--model-provider", "vllm"],
        "t2",
        &["call a tool", "fail"],
    );
    let traces = traces_of_turns(&spans, "t2");
    assert_eq!(traces.len(), 2, "two turns, two traces: {spans:#?}");
    let tool = traces[0]
        .iter()
        .find(|s| s.name == "execute_tool nope")
        .unwrap_or_else(|| panic!("no tool call in {:#?}", traces[0]));
    assert_eq!(tool.status, 2, "a failed tool call is an error: {tool:#?}");
    assert_eq!(
        tool.attributes.get("error.type"),
        Some(&Attr::str("unknown_tool")),
        "{tool:#?}"
    );
    let chats: Vec<&Span> = traces
        .iter()
        .flatten()
        .filter(|s| s.name == "chat fake")
        .collect();
    assert_eq!(
        chats.len(),
        3,
        "two calls in the first turn, one in the second"
    );
    for c in &chats {
        assert_eq!(
            c.attributes.get("gen_ai.provider.name"),
            Some(&Attr::str("vllm")),
            "{c:#?}"
        );
    }
    let refused = traces[1]
        .iter()
        .find(|s| s.name == "chat fake")
        .expect("the refused call");
    assert_eq!(
        refused.status, 2,
        "a refused model call is an error: {refused:#?}"
    );
    assert_eq!(
        refused.attributes.get("error.type"),
        Some(&Attr::str("400")),
        "{refused:#?}"
    );
    for s in traces.iter().flatten() {
        assert_eq!(
            s.attributes.get("gen_ai.conversation.id"),
            Some(&Attr::str("t2")),
            "{s:#?}"
        );
    }
}
