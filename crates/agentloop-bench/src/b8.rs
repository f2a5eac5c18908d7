//! B8 (issue 17): push acknowledgement latency through the HTTP front against the same
//! push in process, same load, same run. Target: p50 ratio ≤ 1.5.
//!
//! * Server side: one runtime on sled (`sync` durability: a push is acknowledged once
//!   it is durable), 50 sessions of the simulated no-op agent, and `agentloop-http`'s
//!   router on a loopback socket, all on the harness's main tokio runtime.
//! * Client side: one separate tokio runtime (current-thread, its own OS thread) drives
//!   both: in process, `SupervisorHandle::push(id, item)`; over HTTP, `POST
//!   /sessions/{id}/items` through hyper's pooled HTTP/1.1 client (keep-alive).
//! * Saturation first, for each side: 50 closed-loop workers (one per session) push as
//!   fast as they are acknowledged for `SATURATION`; the in-process rate R is the load
//!   the figure runs at: half of it, 0.5 R, for both sides.
//! * Then rounds, open loop: pushes are sent at 0.5 R on a fixed schedule spread over
//!   the 50 sessions, each on its own task, for `WINDOW` per side (the order of the
//!   sides reverses every round); a push's latency is from its scheduled send time to
//!   its acknowledgement (so a backlog counts). Each side's p50 and p99 are over all its
//!   samples; per-round p50s are tabled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{Runtime, SessionSpec, SupervisorHandle};
use agentloop_http::{router, HttpOptions};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
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
/// The load, as a share of the in-process saturation rate.
const LOAD: f64 = 0.5;
const TARGET: f64 = 1.5;

type Http = Client<HttpConnector, Full<Bytes>>;

/// Where pushes go.
#[derive(Clone)]
enum Side {
    InProcess(SupervisorHandle<SimItem, SimEvent>),
    /// The client, the base URL, and a bound on requests in flight (its connection
    /// pool's size: an open-loop backlog waits for a connection instead of opening
    /// thousands).
    Http(Box<Http>, Arc<str>, Arc<tokio::sync::Semaphore>),
}

/// Connections the HTTP client keeps at most (requests in flight).
const CONNECTIONS: usize = 64;

impl Side {
    /// One push; panics on a refusal (the figure would be meaningless).
    async fn push(&self, session: usize, id: u64) {
        match self {
            Side::InProcess(sup) => {
                sup.push(&format!("b8-{session}"), SimItem::new(id, "b8"))
                    .await
                    .expect("B8: an in-process push was refused");
            }
            Side::Http(client, base, slots) => {
                let _slot = slots
                    .acquire()
                    .await
                    .expect("the semaphore is never closed");
                let body = format!(r#"{{"item":{{"id":{id},"text":"b8"}}}}"#);
                let req = hyper::Request::post(format!("{base}/sessions/b8-{session}/items"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .expect("a request");
                let resp = client.request(req).await.expect("B8: an HTTP push failed");
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

/// Runs the figure.
pub async fn run() {
    println!("B8: push acknowledgement through the HTTP front vs in process (sled, sync, {SESSIONS} sessions)");
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("B8: a loopback port");
    let addr = listener.local_addr().expect("B8: the address");
    let app = router(&rt, HttpOptions::default());
    // Small request, small answer: no Nagle delay on either end (`agentloop serve`
    // does the same).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let sup = rt.supervisor().clone();
    let base: Arc<str> = format!("http://{addr}").into();
    // The client runtime: its own thread, driving both sides.
    let (rates, rounds) = std::thread::spawn(move || {
        let client_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("B8: the client runtime");
        client_rt.block_on(async move {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            let http: Http = Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(CONNECTIONS)
                .build(connector);
            let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
            let sides = [
                Side::InProcess(sup),
                Side::Http(Box::new(http), base, slots),
            ];
            let ids = Arc::new(AtomicU64::new(0));
            // Warm-up, then saturation.
            for side in &sides {
                let mut w = open_loop(side, 200.0, &ids).await;
                if std::env::var_os("B8_DEBUG").is_some() {
                    let fds = std::fs::read_dir("/proc/self/fd")
                        .map(|d| d.count())
                        .unwrap_or(0);
                    println!(
                        "  diag: warm-up p50 {:.0} µs, {fds} fds open",
                        percentile(&mut w, 0.5)
                    );
                }
            }
            let mut rates = Vec::new();
            for side in &sides {
                rates.push(saturate(side, &ids).await);
                if std::env::var_os("B8_DEBUG").is_some() {
                    let fds = std::fs::read_dir("/proc/self/fd")
                        .map(|d| d.count())
                        .unwrap_or(0);
                    println!(
                        "  diag: saturation {:.0}/s, {fds} fds open",
                        rates[rates.len() - 1]
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
        "saturation: in process {:.0} pushes/s, HTTP front {:.0} pushes/s; load {:.0}/s ({:.0}% of in process)",
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
            ("in process", summarize(&p50s[0])),
            ("HTTP front", summarize(&p50s[1])),
        ],
    );
    let names = ["in process", "HTTP front"];
    let mut p50 = [0.0; 2];
    for i in 0..2 {
        p50[i] = percentile(&mut all[i], 0.5);
        let p99 = percentile(&mut all[i], 0.99);
        println!(
            "{}: p50 {:.0} µs, p99 {:.0} µs over {} pushes",
            names[i],
            p50[i],
            p99,
            all[i].len()
        );
    }
    server.abort();
    rt.shutdown().await.expect("B8: the runtime shuts down");
    println!("{}", ratio_line_max("B8", p50[1] / p50[0], TARGET));
}
