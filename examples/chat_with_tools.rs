//! A chat agent with tools on a real model server, and a tool call that happens once
//! even when the process dies mid-turn (issue 35; docs/models.md).
//!
//! With Ollama listening on 127.0.0.1:11434, this chats with it (model
//! `$AGENTLOOP_OLLAMA_MODEL`, default `llama3.2`): one question, the streamed answer,
//! the tool calls the model makes. Otherwise it plays every part itself:
//!
//! - an OpenAI-compatible model server on 127.0.0.1 (scripted: asked where order #42
//!   is, it calls `lookup_order` and `notify_customer`, then answers);
//! - an orders service whose `lookup` and `notify` requests carry the tool call's
//!   idempotency key (its step key) and are counted; `notify` waits until the service
//!   opens it;
//! - the agent process (`--agent <data-dir> <model-url> <orders-url>`): a runtime on a
//!   sled directory with a `ChatAgent` (kind `orders`), the session under
//!   `Durability::Sync`.
//!
//! The parent SIGKILLs the first agent process while `notify_customer` waits: the first
//! tool's result is journaled, the second's is not. The second agent process recovers
//! the session: `lookup_order` is answered from the journal (the orders service is not
//! called again), `notify_customer` runs again with the same key (the service counts it
//! once), the model answers and the turn completes.
//!
//! Run: `cargo run --example chat_with_tools`

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentloop::prelude::*;
use agentloop::EventFilter;
use agentloop_openai::{ChatAgent, ChatEvent, Provider, Tools};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

const SESSION: &str = "order-bot";
const QUESTION: &str = "Where is my order #42? Please let me know and tell the customer desk.";

// ---------------------------------------------------------------------------------
// The agent process.

#[derive(Deserialize, schemars::JsonSchema)]
struct OrderArgs {
    /// The order's number, e.g. "#42".
    order: String,
}

/// POSTs `body` to `url` with the tool call's key as its idempotency key.
async fn post_keyed(url: String, key: String, body: String) -> Result<String, String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    let req = hyper::Request::post(url)
        .header("idempotency-key", key)
        .body(http_body_util::Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    use http_body_util::BodyExt;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    if status.is_success() {
        Ok(text)
    } else {
        Err(format!("{status}: {text}"))
    }
}

fn tools(orders: &str) -> Tools {
    let (lookup, notify) = (format!("{orders}/lookup"), format!("{orders}/notify"));
    Tools::new()
        .add(
            "lookup_order",
            "Looks up where an order is.",
            move |a: OrderArgs, key| {
                let url = lookup.clone();
                async move {
                    let r = post_keyed(url, key.0, a.order).await;
                    println!(
                        "[agent] tool lookup_order ran: {}",
                        r.as_deref().unwrap_or("failed")
                    );
                    r
                }
            },
        )
        .add(
            "notify_customer",
            "Tells the customer desk about an order.",
            move |a: OrderArgs, key| {
                let url = notify.clone();
                async move {
                    println!("[agent] tool notify_customer called (key {key})");
                    post_keyed(url, key.0, a.order).await
                }
            },
        )
}

async fn agent(dir: &str, model: &str, orders: &str) -> Result<(), Box<dyn std::error::Error>> {
    let provider = Provider::builder(model, "scripted").build()?;
    let tools = tools(orders);
    let (ends, mut ended) = mpsc::unbounded_channel();
    let (rt, report) = Runtime::<String, ChatEvent>::builder()
        .data_dir(dir)
        .register_agent("orders", move |_config: &[u8]| {
            Ok(ChatAgent::<String, ChatEvent>::new(provider.clone())
                .system("You track orders.")
                .tools(tools.clone()))
        })
        .session_ends(ends)
        .start()
        .await?;
    if report.resumed.is_empty() {
        println!("[agent] new session {SESSION}: {QUESTION:?}");
        let session = rt
            .supervisor()
            .spawn(
                SessionSpec::new(SESSION, "orders")
                    .persistent(true)
                    .durability(Durability::Sync)
                    .replay(1024),
            )
            .await?;
        session.push(QUESTION.to_string()).await?;
    } else {
        println!("[agent] restarted: recovered {:?}", report.resumed);
    }
    // Every event of this incarnation (its replay buffer holds them from the start).
    let mut events = rt
        .supervisor()
        .subscribe_after(SESSION, 0, EventFilter::all())
        .await?;
    let printer = tokio::spawn(async move {
        let mut text = String::new();
        while let Some(e) = events.next().await {
            match e {
                SessionEvent::Agent { event, .. } => match event {
                    ChatEvent::Token { text: t } => text.push_str(&t),
                    ChatEvent::StreamRestarted { .. } => text.clear(),
                    ChatEvent::ToolResult {
                        name,
                        replayed: true,
                        output,
                        ..
                    } => println!(
                        "[agent] {name}: replayed from the journal ({output}; the orders service was not called)"
                    ),
                    _ => {}
                },
                SessionEvent::TurnEnded { .. } if !text.is_empty() => {
                    println!("[agent] model: {text}");
                    text.clear();
                }
                _ => {}
            }
        }
    });
    rt.supervisor().stop(SESSION, StopOptions::drain()).await?;
    let end = ended.recv().await.ok_or("the runtime ended first")?;
    // The stream ends after the session's last event: print everything first.
    let _ = printer.await;
    println!("[agent] {} ended {:?}", end.id, end.exit.reason);
    rt.shutdown().await?;
    if end.exit.reason != ExitReason::Completed {
        return Err("the session did not complete".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// The scripted model server (OpenAI's chat-completions streaming).

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let v = json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\n")
}

/// Asked a question, it calls both tools; given their results, it answers.
async fn model(body: axum::Json<Value>) -> axum::response::Response {
    let messages = body.0["messages"].as_array().cloned().unwrap_or_default();
    let tool_results = messages.iter().filter(|m| m["role"] == "tool").count();
    let mut out = String::new();
    if tool_results == 0 {
        out.push_str(&chunk(
            json!({"role": "assistant", "content": "Let me check. "}),
            None,
        ));
        for (i, (id, name)) in [
            ("call_lookup", "lookup_order"),
            ("call_notify", "notify_customer"),
        ]
        .iter()
        .enumerate()
        {
            out.push_str(&chunk(
                json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                    "function": {"name": name, "arguments": "{\"order\": \"#42\"}"}}]}),
                None,
            ));
        }
        out.push_str(&chunk(json!({}), Some("tool_calls")));
    } else {
        for t in ["Order #42 ", "ships tomorrow; ", "the customer desk knows."] {
            out.push_str(&chunk(json!({"content": t}), None));
        }
        out.push_str(&chunk(json!({}), Some("stop")));
    }
    out.push_str("data: [DONE]\n\n");
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(out))
        .expect("a response")
}

// ---------------------------------------------------------------------------------
// The orders service.

#[derive(Clone, Default)]
struct Orders {
    lookups: Arc<AtomicU32>,
    notified: Arc<Mutex<HashSet<String>>>,
    notify_requests: Arc<AtomicU32>,
    open: Arc<watch::Sender<bool>>,
}

async fn lookup(State(o): State<Orders>, order: String) -> String {
    o.lookups.fetch_add(1, Ordering::SeqCst);
    format!("{order} ships tomorrow")
}

async fn notify(State(o): State<Orders>, headers: HeaderMap, order: String) -> String {
    o.notify_requests.fetch_add(1, Ordering::SeqCst);
    let mut open = o.open.subscribe();
    let _ = open.wait_for(|v| *v).await;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    o.notified.lock().expect("the set").insert(key);
    format!("the customer desk knows about {order}")
}

/// Starts the model server and the orders service on their own thread; their URLs.
fn start_services(orders: Orders) -> (String, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the services' runtime");
        rt.block_on(async move {
            let m = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let o = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let _ = tx.send((m.local_addr().expect("addr"), o.local_addr().expect("addr")));
            let model_app = Router::new().route("/v1/chat/completions", post(model));
            let orders_app = Router::new()
                .route("/lookup", post(lookup))
                .route("/notify", post(notify))
                .with_state(orders);
            let _ = tokio::join!(axum::serve(m, model_app), axum::serve(o, orders_app));
        });
    });
    let (m, o) = rx.recv().expect("the services' addresses");
    (format!("http://{m}/v1"), format!("http://{o}"))
}

// ---------------------------------------------------------------------------------
// The parent.

fn start_agent(
    args: &[&str],
) -> Result<(std::process::Child, std::sync::mpsc::Receiver<String>), Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--agent")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, rx))
}

/// Echoes the agent's lines until one contains `until` (`true`), or until it ends
/// (`false`); an error after 60 s.
fn echo(
    lines: &std::sync::mpsc::Receiver<String>,
    until: Option<&str>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                println!("  {line}");
                if until.is_some_and(|u| line.contains(u)) {
                    return Ok(true);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(false),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err("the agent process took over 60 s".into())
            }
        }
    }
}

fn scripted() -> Result<(), Box<dyn std::error::Error>> {
    let orders = Orders::default();
    let (model_url, orders_url) = start_services(orders.clone());
    println!("model: a scripted OpenAI-compatible server at {model_url} (no Ollama found)");
    let dir =
        std::env::temp_dir().join(format!("agentloop-chat-with-tools-{}", std::process::id()));
    let dir_s = dir.display().to_string();
    let args = [dir_s.as_str(), model_url.as_str(), orders_url.as_str()];

    println!("first agent process:");
    let (mut first, lines) = start_agent(&args)?;
    let reached = echo(&lines, Some("tool notify_customer called"));
    first.kill()?;
    let status = first.wait()?;
    if !reached? {
        return Err("the first agent process ended before notify_customer ran".into());
    }
    println!("  killed mid-turn, while notify_customer waited ({status})");

    orders.open.send_replace(true);
    println!("the orders service opens notify; second agent process, same data directory:");
    let (mut second, lines) = start_agent(&args)?;
    let ended = echo(&lines, None);
    if ended.is_err() {
        let _ = second.kill();
    }
    let status = second.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    ended?;
    if !status.success() {
        return Err(format!("the second agent process failed: {status}").into());
    }
    let lookups = orders.lookups.load(Ordering::SeqCst);
    let notified = orders.notified.lock().expect("the set").clone();
    println!(
        "orders service: {lookups} lookup(s); the customer desk notified {} time(s) ({} request(s), one key)",
        notified.len(),
        orders.notify_requests.load(Ordering::SeqCst)
    );
    if lookups != 1 || notified.len() != 1 {
        return Err("a tool's effect happened more than once".into());
    }
    Ok(())
}

/// One question to the local Ollama, with the tools, printing the streamed answer.
async fn ollama(model: String) -> Result<(), Box<dyn std::error::Error>> {
    let orders = Orders::default();
    orders.open.send_replace(true);
    let (_, orders_url) = start_services(orders);
    println!("model: Ollama at 127.0.0.1:11434, model {model}");
    let provider = Provider::builder("http://127.0.0.1:11434/v1", model).build()?;
    let agent = ChatAgent::<String, ChatEvent>::new(provider)
        .system("You track orders. Use the tools.")
        .tools(tools(&orders_url));
    let h =
        SessionHandle::spawn(SessionSpec::new(SESSION, "orders"), Arc::new(agent), None).await?;
    let mut events = h.subscribe();
    h.push(QUESTION.to_string()).await?;
    h.stop(StopOptions::drain()).await?;
    while let Some(e) = events.next().await {
        match e {
            SessionEvent::Agent {
                event: ChatEvent::Token { text },
                ..
            } => print!("{text}"),
            SessionEvent::Agent {
                event:
                    ChatEvent::ToolCalled {
                        name, arguments, ..
                    },
                ..
            } => {
                println!("\n[tool call] {name}({arguments})")
            }
            SessionEvent::Ended(_) => break,
            _ => {}
        }
    }
    let exit = h.wait().await;
    println!("\nended {:?}", exit.reason);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--agent") {
        let (Some(dir), Some(model), Some(orders)) = (args.get(2), args.get(3), args.get(4)) else {
            return Err(
                "usage: chat_with_tools --agent <data-dir> <model-url> <orders-url>".into(),
            );
        };
        return tokio::runtime::Runtime::new()?.block_on(agent(dir, model, orders));
    }
    let ollama_up = std::net::TcpStream::connect_timeout(
        &"127.0.0.1:11434".parse().expect("an address"),
        Duration::from_millis(300),
    )
    .is_ok();
    if ollama_up && std::env::var_os("AGENTLOOP_EXAMPLE_SCRIPTED").is_none() {
        let model = std::env::var("AGENTLOOP_OLLAMA_MODEL").unwrap_or_else(|_| "llama3.2".into());
        return tokio::runtime::Runtime::new()?.block_on(ollama(model));
    }
    scripted()
}
