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
/// it was sent. Returns its base URL.
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
                        seen.lock().expect("seen").push(req);
                        let mut out = String::new();
                        for t in ["I have heard ", &users.to_string(), " message(s)."] {
                            let c = json!({"id": "c", "object": "chat.completion.chunk",
                                "created": 0, "model": "fake",
                                "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]});
                            out.push_str(&format!("data: {c}\n\n"));
                        }
                        let end = json!({"id": "c", "object": "chat.completion.chunk",
                            "created": 0, "model": "fake",
                            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
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
/// push, so nothing is missed).
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
                if name == "turn_ended" {
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

/// One span as the OTLP receiver got it.
#[derive(Clone, Debug)]
struct Span {
    name: String,
    id: Vec<u8>,
    parent: Vec<u8>,
    attributes: std::collections::HashMap<String, String>,
}

/// Starts an OTLP/HTTP receiver (protobuf) on loopback; its base URL and the spans it
/// got.
fn start_otlp() -> (String, Arc<Mutex<Vec<Span>>>) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let got = spans.clone();
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
                                    .iter()
                                    .map(|kv| {
                                        let v =
                                            match kv.value.as_ref().and_then(|v| v.value.clone()) {
                                                Some(Any::StringValue(s)) => s,
                                                Some(Any::IntValue(i)) => i.to_string(),
                                                Some(Any::BoolValue(b)) => b.to_string(),
                                                Some(Any::DoubleValue(d)) => d.to_string(),
                                                other => format!("{other:?}"),
                                            };
                                        (kv.key.clone(), v)
                                    })
                                    .collect();
                                got.lock().expect("spans").push(Span {
                                    name: s.name,
                                    id: s.span_id,
                                    parent: s.parent_span_id,
                                    attributes,
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

/// S42: with `--otlp-endpoint`, the session, its turn and the model call are exported as
/// spans, nested, the model call with OpenTelemetry's GenAI attributes (flushed when the
/// server shuts down).
#[test]
fn spans_with_genai_attributes_are_exported_over_otlp() {
    let dir = TempDir::new("chat-otlp");
    let seen: Seen = Arc::default();
    let model_url = start_model(seen);
    let (otlp, spans) = start_otlp();
    let mut job = Job::serve(
        &dir.0,
        &[
            "--model-url",
            model_url.as_str(),
            "--model",
            "fake",
            "--otlp-endpoint",
            otlp.as_str(),
        ],
    );
    let url = served_url(&mut job);
    let r = agent()
        .post(&format!("{url}/sessions"))
        .send_json(json!({"id": "t1", "kind": "chat"}))
        .expect("spawned");
    assert_eq!(r.status().as_u16(), 201, "spawn");
    let tokens = push_and_read_tokens(&url, "t1", "hello");
    assert_eq!(tokens.concat(), "I have heard 1 message(s).");
    job.signal(libc::SIGTERM);
    let (status, _) = job.finish();
    assert!(status.success(), "{status}");

    let spans = spans.lock().expect("spans").clone();
    let find = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span `{name}` in {spans:#?}"))
            .clone()
    };
    let session = find("session");
    assert_eq!(session.attributes["gen_ai.conversation.id"], "t1");
    let turn = find("turn");
    assert_eq!(turn.parent, session.id, "the turn is the session's child");
    let chat = find("chat fake");
    assert_eq!(chat.parent, turn.id, "the model call is the turn's child");
    for (k, v) in [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", "fake"),
        ("gen_ai.provider.name", "openai"),
        ("gen_ai.usage.input_tokens", "5"),
        ("gen_ai.usage.output_tokens", "3"),
        ("gen_ai.response.finish_reasons", "stop"),
    ] {
        assert_eq!(
            chat.attributes.get(k).map(String::as_str),
            Some(v),
            "{k}: {chat:#?}"
        );
    }
}
