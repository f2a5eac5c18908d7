//! Helpers shared by the router's tests: a runtime of simulated agents, one request
//! to the router over a real loopback socket with hyper's client, and SSE parsing.
#![allow(dead_code)]

pub mod contract;

use std::time::Duration;

use agentloop::Runtime;
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};

pub type Rt = Runtime<SimItem, SimEvent>;

/// A simulated agent of one round a turn, its model and tool calls instant.
pub fn react_agent() -> SimAgent {
    SimAgent::new(Script::react(1, Duration::ZERO, Duration::ZERO))
}

/// A runtime without a store, with kind `sim` (a [`react_agent`]).
pub async fn runtime() -> Rt {
    let (rt, _) = Rt::builder()
        .register_agent("sim", |_cfg: &[u8]| Ok(react_agent()))
        .flush_logs(None)
        .start()
        .await
        .unwrap();
    rt
}

/// Sends `req` to `app` over a real loopback socket: an HTTP/1.1 server of its own on
/// 127.0.0.1:0 (left running, so a streamed answer keeps flowing) and hyper's client.
pub async fn send(app: &Router, req: Request<Body>) -> axum::response::Response {
    let (addr, _server) = serve_loopback(app.clone()).await;
    let (mut parts, body) = req.into_parts();
    let method = parts.method.to_string();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    parts.uri = format!("http://{addr}{path}").parse().unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let resp = client
        .request(Request::from_parts(parts, body))
        .await
        .expect("the request reaches the server");
    // S43: every answer is checked against the OpenAPI document (an event stream's
    // events by `sse_events`).
    let route = path.split('?').next().unwrap_or("/").to_string();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if content_type
        .as_deref()
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        contract::check(
            &method,
            &route,
            resp.status().as_u16(),
            content_type.as_deref(),
            b"",
        );
        return resp.map(Body::new);
    }
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .expect("the answer's body arrives")
        .to_bytes();
    contract::check(
        &method,
        &route,
        parts.status.as_u16(),
        content_type.as_deref(),
        &bytes,
    );
    axum::response::Response::from_parts(parts, Body::from(bytes))
}

pub async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    // A well-behaved client sends every POST as JSON (`{}` when there is nothing to
    // send): a server without a token takes nothing else (S34a).
    let body = match (body, method) {
        (Some(v), _) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        (None, "POST") => {
            req = req.header("content-type", "application/json");
            Body::from("{}")
        }
        (None, _) => Body::empty(),
    };
    let resp = send(app, req.body(body).unwrap()).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)))
    };
    (status, v)
}

/// Serves `app` on a fresh loopback port (127.0.0.1:0); returns its address and the
/// server's task (left running unless the caller aborts it).
pub async fn serve_loopback(
    app: Router,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, server)
}

/// `POST /sessions` with `body` (a spawn request): the status and the answer.
pub async fn spawn(app: &Router, body: Value) -> (StatusCode, Value) {
    call(app, "POST", "/sessions", Some(body)).await
}

/// `POST /sessions/{id}/items` with item `n` of `text`: the status and the answer.
pub async fn push(app: &Router, id: &str, n: u64, text: &str) -> (StatusCode, Value) {
    call(
        app,
        "POST",
        &format!("/sessions/{id}/items"),
        Some(json!({"item": {"id": n, "text": text}})),
    )
    .await
}

/// `GET uri` with no body, through [`send`]: the whole response.
pub async fn get(app: &Router, uri: &str) -> axum::response::Response {
    send(
        app,
        Request::builder().uri(uri).body(Body::empty()).unwrap(),
    )
    .await
}

/// A response's status and its whole body.
pub async fn status_body(resp: axum::response::Response) -> (StatusCode, axum::body::Bytes) {
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes)
}

/// `POST uri` with the JSON `body` and an `Idempotency-Key` of `key`: the status and
/// the whole answer.
pub async fn post_keyed(
    app: &Router,
    uri: &str,
    key: &str,
    body: &Value,
) -> (StatusCode, axum::body::Bytes) {
    let req = Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_string()))
        .unwrap();
    status_body(send(app, req).await).await
}

/// The `code` of a JSON error answer (`""` when there is none).
pub fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

/// Reads SSE frames from `body` until an event named `until` arrives; returns the text.
pub async fn read_until(body: &mut Body, until: &str) -> String {
    let mut text = String::new();
    while !sse_events(&text).iter().any(|(_, n, _)| n == until) {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event in time")
            .expect("the stream is open")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    text
}

pub async fn open_events(app: &Router, id: &str, last: Option<u64>) -> axum::response::Response {
    let mut req = Request::builder().uri(format!("/sessions/{id}/events"));
    if let Some(l) = last {
        req = req.header("last-event-id", l.to_string());
    }
    send(app, req.body(Body::empty()).unwrap()).await
}

/// The SSE lines of a whole response: `(id, event, data)` per event.
pub fn sse_events(text: &str) -> Vec<(u64, String, Value)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let (mut id, mut name, mut data) = (None, None, None);
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().parse::<u64>().ok();
            } else if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data = serde_json::from_str(v.trim()).ok();
            }
        }
        if let (Some(id), Some(name), Some(data)) = (id, name, data) {
            contract::check_event(&name, &data);
            out.push((id, name, data));
        }
    }
    out
}
