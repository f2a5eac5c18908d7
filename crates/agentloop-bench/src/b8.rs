//! B8 (issue 17, restated 2026-11-28): push acknowledgement latency through
//! `agentloop-http`'s router against the same push through a bare axum handler on the
//! same server, same load, same run. Targets: p50 ratio (router / bare) ≤ 1.5, and the
//! router's saturation rate ≥ 0.7× the bare handler's.
//!
//! The baseline before the restatement was the push in process at half of *its*
//! saturation rate: on 2 cores that load sat past the HTTP front's knee, so the figure
//! measured HTTP itself (socket syscalls, connection tasks), not the router. Now both
//! sides pay the same HTTP; only the router's layers differ.
//!
//! * Server side: one runtime on sled (session durability `sync` at the store's default
//!   level: a push is acknowledged once it is durable), 50 sessions of the simulated
//!   no-op agent, and two loopback listeners served by `axum::serve` on the harness's
//!   main tokio runtime, both with `TCP_NODELAY`:
//!   - the router: `agentloop_http::router(&rt, HttpOptions::default())`, unchanged
//!     (no token, no access log: the defaults `agentloop serve` runs on loopback);
//!   - the bare handler: an axum `Router` with one route, `POST /sessions/{id}/items`,
//!     that reads the body as bytes, parses `{"item": …}` into the same item type with
//!     `serde_json`, calls the push the router's push route ends in
//!     (`runtime.push(id, item).options(PushOptions::new().answer_at_acceptance())`)
//!     and answers `{"preempt": {"kind": …}}` as JSON, as the router does.
//! * Client side: one separate tokio runtime (current-thread, its own OS thread) drives
//!   both through hyper's pooled HTTP/1.1 client (keep-alive, at most 64 requests in
//!   flight per side), the same request to each: `POST /sessions/{id}/items` with
//!   `{"item":{"id":…,"text":"b8"}}`.
//! * Saturation first, for each side: 50 closed-loop workers (one per session) push as
//!   fast as they are acknowledged for `SATURATION`. The bare handler's rate R is the
//!   load the figure runs at: half of it, 0.5 R, for both sides. The router's rate over
//!   R is the second figure.
//! * Then rounds, open loop: pushes are sent at 0.5 R on a fixed schedule spread over
//!   the 50 sessions, each on its own task, for `WINDOW` per side (the order of the
//!   sides reverses every round); a push's latency is from its scheduled send time to
//!   its acknowledgement (so a backlog counts). Each side's p50 and p99 are over all its
//!   samples; per-round p50s are tabled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{PreemptAck, PushOptions, Runtime, RuntimeHandle, SessionSpec};
use agentloop_http::{router, HttpOptions};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::report::{print_table, ratio_line_max, summarize};
use crate::tempdir::TempDir;

const SESSIONS: usize = 50;
/// Closed-loop saturation run per side.
const SATURATION: Duration = Duration::from_secs(3);
/// Open-loop window per side and round.
const WINDOW: Duration = Duration::from_secs(2);
/// Rounds (odd).
const ROUNDS: usize = 5;
/// The load, as a share of the bare handler's saturation rate.
const LOAD: f64 = 0.5;
/// p50 through the router over p50 through the bare handler, at most.
const TARGET: f64 = 1.5;
/// The router's saturation rate over the bare handler's, at least.
const SATURATION_TARGET: f64 = 0.7;

type Http = Client<HttpConnector, Full<Bytes>>;
type Handle = RuntimeHandle<SimItem, SimEvent>;

/// The sides, in the order of every table: the baseline first.
const NAMES: [&str; 2] = ["bare handler", "router"];

// ---------------------------------------------------------------------------------
// The baseline: a bare axum handler.

/// The body the bare handler reads: the same JSON the router's push route takes.
#[derive(serde::Deserialize)]
struct BareBody {
    item: SimItem,
}

/// `POST /sessions/{id}/items` with nothing around it: parse, push, answer.
async fn bare_push(State(rt): State<Handle>, Path(id): Path<String>, body: Bytes) -> Response {
    let b: BareBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    match rt
        .push(&id, b.item)
        .options(PushOptions::new().answer_at_acceptance())
        .await
    {
        Ok(ack) => {
            let kind = match ack {
                PreemptAck::NotRequested => "not_requested",
                PreemptAck::NoTarget => "no_target",
                PreemptAck::Submitted { .. } => "submitted",
                PreemptAck::TargetEnded { .. } => "target_ended",
                PreemptAck::Scheduled { .. } => "scheduled",
                PreemptAck::Duplicate => "duplicate",
            };
            let answer = serde_json::to_vec(&serde_json::json!({ "preempt": { "kind": kind } }))
                .expect("a JSON answer");
            ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
        }
        Err(e) => (StatusCode::CONFLICT, e.to_string()).into_response(),
    }
}

fn bare_router(rt: Handle) -> axum::Router {
    axum::Router::new()
        .route("/sessions/{id}/items", axum::routing::post(bare_push))
        .with_state(rt)
}

/// Serves `app` on a fresh loopback port (no Nagle delay: small requests, small
/// answers; `agentloop serve` does the same); its base URL and its task.
async fn serve(
    app: axum::Router,
) -> (
    Arc<str>,
    tokio::task::JoinHandle<Result<(), std::io::Error>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("B8: a loopback port");
    let addr = listener.local_addr().expect("B8: the address");
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}").into(), task)
}

// ---------------------------------------------------------------------------------
// The client.

/// Where pushes go: the client, the base URL, and a bound on requests in flight (its
/// connection pool's size: an open-loop backlog waits for a connection instead of
/// opening thousands).
#[derive(Clone)]
struct Side {
    client: Http,
    base: Arc<str>,
    slots: Arc<tokio::sync::Semaphore>,
}

/// Connections the HTTP client keeps at most per side (requests in flight).
const CONNECTIONS: usize = 64;

impl Side {
    fn new(base: Arc<str>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(CONNECTIONS)
            .build(connector);
        Side {
            client,
            base,
            slots: Arc::new(tokio::sync::Semaphore::new(CONNECTIONS)),
        }
    }

    /// One push; panics on a refusal (the figure would be meaningless).
    async fn push(&self, session: usize, id: u64) {
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let body = format!(r#"{{"item":{{"id":{id},"text":"b8"}}}}"#);
        let req = hyper::Request::post(format!("{}/sessions/b8-{session}/items", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a request");
        let resp = self
            .client
            .request(req)
            .await
            .expect("B8: an HTTP push failed");
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .expect("B8: a body")
            .to_bytes();
        assert!(
            status.is_success(),
            "B8: an HTTP push was refused: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    }
}

/// Closed loop: one worker per session for `SATURATION`; pushes per second.
async fn saturate(side: &Side, ids: &Arc<AtomicU64>) -> f64 {
    let deadline = Instant::now() + SATURATION;
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let (side, ids, done) = (side.clone(), ids.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    side.push(s, ids.fetch_add(1, Ordering::Relaxed)).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    for w in workers {
        w.await.expect("a B8 worker");
    }
    done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

/// Open loop at `rate` per second for `WINDOW`: each push's latency in µs, from its
/// scheduled time.
async fn open_loop(side: &Side, rate: f64, ids: &Arc<AtomicU64>) -> Vec<f64> {
    let n = (rate * WINDOW.as_secs_f64()).round() as usize;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let t0 = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for k in 0..n {
        let at = t0 + gap * k as u32;
        tokio::time::sleep_until(at).await;
        let (side, id) = (side.clone(), ids.fetch_add(1, Ordering::Relaxed));
        tasks.push(tokio::spawn(async move {
            side.push(k % SESSIONS, id).await;
            at.elapsed().as_secs_f64() * 1e6
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("a B8 push task"));
    }
    out
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

/// The verdict line of the saturation figure (a lower bound), e.g.
/// `B8 saturation_ratio=0.82 target>=0.7 ok`.
fn saturation_line(ratio: f64) -> String {
    let verdict = if ratio >= SATURATION_TARGET {
        "ok"
    } else {
        "FAIL"
    };
    format!("B8 saturation_ratio={ratio:.2} target>={SATURATION_TARGET} {verdict}")
}

fn fds_open() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Runs the figure.
pub async fn run() {
    println!(
        "B8: push acknowledgement through agentloop-http's router vs a bare axum handler \
         (same server, sled, sync, {SESSIONS} sessions)"
    );
    let dir = TempDir::new("b8", "sled");
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("noop", |_cfg: &[u8]| {
            Ok(SimAgent::new(Script::noop()).without_ledger())
        })
        .start()
        .await
        .expect("B8: the runtime starts");
    for s in 0..SESSIONS {
        rt.supervisor()
            .spawn(SessionSpec::new(format!("b8-{s}"), "noop").persistent(true))
            .await
            .expect("B8: a session spawns");
    }
    let handle: Handle = (*rt).clone();
    let (bare_base, bare_server) = serve(bare_router(handle.clone())).await;
    let (router_base, router_server) = serve(router(&handle, HttpOptions::default())).await;

    let debug = std::env::var_os("B8_DEBUG").is_some();
    // The client runtime: its own thread, driving both sides.
    let (rates, rounds) = std::thread::spawn(move || {
        let client_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("B8: the client runtime");
        client_rt.block_on(async move {
            let sides = [Side::new(bare_base), Side::new(router_base)];
            let ids = Arc::new(AtomicU64::new(0));
            // Warm-up, then saturation.
            for (i, side) in sides.iter().enumerate() {
                let mut w = open_loop(side, 200.0, &ids).await;
                if debug {
                    println!(
                        "  diag: {} warm-up p50 {:.0} µs, {} fds open",
                        NAMES[i],
                        percentile(&mut w, 0.5),
                        fds_open()
                    );
                }
            }
            let mut rates = [0.0; 2];
            for (i, side) in sides.iter().enumerate() {
                rates[i] = saturate(side, &ids).await;
                if debug {
                    println!(
                        "  diag: {} saturation {:.0}/s, {} fds open",
                        NAMES[i],
                        rates[i],
                        fds_open()
                    );
                }
            }
            let rate = rates[0] * LOAD;
            let mut rounds: Vec<[Vec<f64>; 2]> = Vec::new();
            for r in 0..ROUNDS {
                let mut pair: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
                let order: [usize; 2] = if r % 2 == 0 { [0, 1] } else { [1, 0] };
                for i in order {
                    pair[i] = open_loop(&sides[i], rate, &ids).await;
                }
                rounds.push(pair);
            }
            (rates, rounds)
        })
    })
    .join()
    .expect("B8: the client thread");

    let rate = rates[0] * LOAD;
    println!(
        "saturation: bare handler {:.0} pushes/s, router {:.0} pushes/s; load {:.0}/s ({:.0}% of the bare handler's)",
        rates[0],
        rates[1],
        rate,
        LOAD * 100.0
    );
    let mut all: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut p50s: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for pair in rounds {
        for (i, mut samples) in pair.into_iter().enumerate() {
            p50s[i].push(percentile(&mut samples, 0.5));
            all[i].extend(samples);
        }
    }
    print_table(
        "per-round p50 push acknowledgement latency",
        "µs",
        &[
            (NAMES[0], summarize(&p50s[0])),
            (NAMES[1], summarize(&p50s[1])),
        ],
    );
    let mut p50 = [0.0; 2];
    for i in 0..2 {
        p50[i] = percentile(&mut all[i], 0.5);
        let p99 = percentile(&mut all[i], 0.99);
        println!(
            "{}: p50 {:.0} µs, p99 {:.0} µs over {} pushes",
            NAMES[i],
            p50[i],
            p99,
            all[i].len()
        );
    }
    bare_server.abort();
    router_server.abort();
    rt.shutdown().await.expect("B8: the runtime shuts down");
    println!("{}", saturation_line(rates[1] / rates[0]));
    println!("{}", ratio_line_max("B8", p50[1] / p50[0], TARGET));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_verdict() {
        assert_eq!(
            saturation_line(0.7),
            "B8 saturation_ratio=0.70 target>=0.7 ok"
        );
        assert_eq!(
            saturation_line(0.69),
            "B8 saturation_ratio=0.69 target>=0.7 FAIL"
        );
    }
}
