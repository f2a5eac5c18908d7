//! A card is charged once, even when the process dies mid-turn (S1b, durable steps).
//!
//! The agent's turn charges a card, then waits for the warehouse to ship. The charge
//! runs inside `cx.step("charge", |key| …)`: the closure gets the step's key, the same
//! for every run of that step, and hands it to the payment service as its
//! `Idempotency-Key`; the step's result (the receipt) is journaled in the session's
//! record, durably under `Durability::Sync`, before `step` returns.
//!
//! This program plays every part. It starts a fake payment service (an HTTP server on
//! 127.0.0.1 that charges once per `Idempotency-Key` and counts charges; its warehouse
//! is closed at first), then runs itself as the agent process (`--agent <data-dir>
//! <service-url>`) on a sled data directory. As soon as the agent says the charge step
//! returned, it SIGKILLs that process: the turn is cut while it waits for the
//! warehouse. It opens the warehouse and starts the agent process again on the same
//! directory: the runtime recovers the session, the resumed turn asks for the charge
//! again and gets the receipt from the journal (the payment service is not called),
//! ships, and the turn completes. The service made one charge.
//!
//! Run: `cargo run --example payment_once`

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentloop::prelude::*;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

const SESSION: &str = "order-42";

// ---------------------------------------------------------------------------------
// The agent process.

/// What clients push: an order to charge and ship.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    id: String,
    amount: String,
}

/// What the charge step returns, journaled: the key it charged under and the receipt.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Charged {
    key: String,
    receipt: String,
}

type Http = Client<HttpConnector, Empty<Bytes>>;

/// A checkout agent: for each order, charge the card, then ship.
struct Checkout {
    http: Http,
    /// The payment service, `http://127.0.0.1:PORT`.
    service: String,
}

/// POSTs to the service with an idempotency key; its answer, or why none came.
async fn call(http: &Http, url: String, key: &str) -> Result<String, String> {
    let req = hyper::Request::post(url)
        .header("idempotency-key", key)
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let resp = http.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{status}: {body}"))
    }
}

impl Agent for Checkout {
    type Item = Order;
    type Event = String;
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        for order in &turn.items {
            // The side effect runs inside a durable step, under its key.
            let called = Arc::new(AtomicBool::new(false));
            let (flag, http) = (called.clone(), self.http.clone());
            let url = format!("{}/charge?amount={}", self.service, order.amount);
            let charged: Result<Charged, String> = cx
                .step("charge", |key| async move {
                    flag.store(true, Ordering::SeqCst);
                    let key = key.to_string();
                    call(&http, url, &key)
                        .await
                        .map(|receipt| Charged { key, receipt })
                })
                .await?;
            let charged = charged.map_err(|e| AgentError::failed(format!("charge: {e}")))?;
            if called.load(Ordering::SeqCst) {
                println!(
                    "[agent] charge step returned: {} for {} under key {} (journaled)",
                    charged.receipt, order.amount, charged.key
                );
            } else {
                println!(
                    "[agent] charge step replayed from the journal: {} under key {} \
                     (the payment service was not called)",
                    charged.receipt, charged.key
                );
            }
            println!("[agent] waiting for the warehouse to ship {}", order.id);
            let http = self.http.clone();
            let url = format!("{}/ship", self.service);
            let shipped: Result<String, String> = cx
                .step("ship", |key| async move {
                    call(&http, url, &key.to_string()).await
                })
                .await?;
            let tracking = shipped.map_err(|e| AgentError::failed(format!("ship: {e}")))?;
            println!("[agent] shipped {}: {tracking}", order.id);
        }
        Ok(TurnOutcome::Completed)
    }
}

/// The agent process: a runtime on `dir`; the first time it creates the session and
/// pushes the order, later it recovers what the killed process left. Either way it lets
/// the session handle what it has, then ends.
async fn agent(dir: &str, service: &str) -> Result<(), Box<dyn std::error::Error>> {
    let http: Http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let service = service.to_string();
    let (ends, mut ended) = mpsc::unbounded_channel();
    let (rt, report) = Runtime::<Order, String>::builder()
        .data_dir(dir)
        .register_agent("checkout", move |_config: &[u8]| {
            Ok(Checkout {
                http: http.clone(),
                service: service.clone(),
            })
        })
        .session_ends(ends)
        .start()
        .await?;
    if report.resumed.is_empty() {
        println!("[agent] new session {SESSION}: charge the card, then ship");
        let session = rt
            .supervisor()
            .spawn(
                SessionSpec::new(SESSION, "checkout")
                    .persistent(true)
                    .durability(Durability::Sync),
            )
            .await?;
        session
            .push(Order {
                id: "#42".into(),
                amount: "42.00EUR".into(),
            })
            .await?;
    } else {
        println!(
            "[agent] restarted: recovered {:?} ({} cut by a crash), carrying {} item(s)",
            report.resumed, report.recovered, report.items
        );
    }
    rt.supervisor().stop(SESSION, StopOptions::drain()).await?;
    let end = ended.recv().await.ok_or("the runtime ended first")?;
    println!("[agent] {} ended {:?}", end.id, end.exit.reason);
    rt.shutdown().await?;
    if end.exit.reason != ExitReason::Completed {
        return Err("the session did not complete".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// The fake payment service.

/// Charges once per `Idempotency-Key` (a repeat gets the first receipt back) and counts
/// what it did; ships once per key, when its warehouse is open.
#[derive(Clone, Default)]
struct Payments {
    charges: Arc<Mutex<HashMap<String, String>>>,
    charge_requests: Arc<AtomicU32>,
    shipments: Arc<Mutex<HashMap<String, String>>>,
    warehouse: Arc<watch::Sender<bool>>,
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    Some(headers.get("idempotency-key")?.to_str().ok()?.to_string())
}

async fn charge(State(p): State<Payments>, headers: HeaderMap) -> (StatusCode, String) {
    let Some(key) = key_of(&headers) else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key".into());
    };
    p.charge_requests.fetch_add(1, Ordering::SeqCst);
    let mut charges = p.charges.lock().unwrap();
    let n = charges.len() + 1;
    let receipt = charges
        .entry(key)
        .or_insert_with(|| format!("receipt r-{n}"));
    (StatusCode::OK, receipt.clone())
}

async fn ship(State(p): State<Payments>, headers: HeaderMap) -> (StatusCode, String) {
    let Some(key) = key_of(&headers) else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key".into());
    };
    // Closed at first: the request waits until the warehouse opens.
    let mut open = p.warehouse.subscribe();
    let _ = open.wait_for(|o| *o).await;
    let mut shipments = p.shipments.lock().unwrap();
    let n = shipments.len() + 1;
    let tracking = shipments
        .entry(key)
        .or_insert_with(|| format!("tracking t-{n}"));
    (StatusCode::OK, tracking.clone())
}

/// Starts the service on its own thread; its URL.
fn start_service(p: Payments) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the service's runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port");
            let _ = tx.send(listener.local_addr().expect("its address"));
            let app = Router::new()
                .route("/charge", post(charge))
                .route("/ship", post(ship))
                .with_state(p);
            let _ = axum::serve(listener, app).await;
        });
    });
    format!("http://{}", rx.recv().expect("the service's address"))
}

// ---------------------------------------------------------------------------------
// The parent: runs the agent process twice, killing the first one mid-turn.

/// Starts the agent process; its stdout lines come through the channel (closed when
/// the process ends).
fn start_agent(
    dir: &std::path::Path,
    url: &str,
) -> Result<(std::process::Child, std::sync::mpsc::Receiver<String>), Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--agent")
        .arg(dir)
        .arg(url)
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
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
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

fn parent() -> Result<(), Box<dyn std::error::Error>> {
    let payments = Payments::default();
    let url = start_service(payments.clone());
    println!("payment service at {url} (its warehouse is closed)");
    let dir = std::env::temp_dir().join(format!("agentloop-payment-once-{}", std::process::id()));

    println!("first agent process:");
    let (mut first, lines) = start_agent(&dir, &url)?;
    let charged = echo(&lines, Some("charge step returned"));
    // Right after the charge is journaled, mid-turn: SIGKILL.
    first.kill()?;
    let status = first.wait()?;
    if !charged? {
        return Err("the first agent process ended before its charge step returned".into());
    }
    println!("  killed mid-turn, while it waited for the warehouse ({status})");

    payments.warehouse.send_replace(true);
    println!("the warehouse opens; second agent process, same data directory:");
    let (mut second, lines) = start_agent(&dir, &url)?;
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

    let charges = payments.charges.lock().unwrap().clone();
    let requests = payments.charge_requests.load(Ordering::SeqCst);
    println!(
        "payment service: {requests} charge request(s), charges made: {}",
        charges.len()
    );
    for (key, receipt) in &charges {
        println!("  {receipt} under key {key}");
    }
    if charges.len() != 1 || requests != 1 {
        return Err("the card was charged more than once".into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--agent") {
        let (Some(dir), Some(url)) = (args.get(2), args.get(3)) else {
            return Err("usage: payment_once --agent <data-dir> <service-url>".into());
        };
        return tokio::runtime::Runtime::new()?.block_on(agent(dir, url));
    }
    parent()
}
