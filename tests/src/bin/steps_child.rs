//! The child process of the S1b crash test (issue 32, `tests/tests/s1b_crash.rs`):
//! `sync` sessions on a sled data directory whose agent makes five durable steps a
//! turn against the test's counting HTTP service, each with its step key as the
//! `Idempotency-Key`, until the process is killed. A later run re-spawns the same ids,
//! so each session resumes what the killed run left (its cut turn, its journal).
//!
//! Usage: `steps_child <data-dir> <run-number> <service-url> [--drain]`
//!
//! Lines (flushed one by one):
//! * `push <session> <item-id>`: the push was acknowledged (durable, S16a);
//! * `turn <session> <item-id>...`: a turn holding these items completed;
//! * `step ran <key> <body>`: the step's closure ran (it called the service) and its
//!   result, `<body>` (the service's answer), is journaled: `step` returned;
//! * `step replayed <key> <body>`: `step` returned `<body>` without running the closure;
//! * `step unknown <key>`: a `NoRetry` step that began in an earlier run and left no
//!   result; the closure did not run;
//! * `step mismatch <expected> <got>`: the key handed to the closure is not the one the
//!   agent expects from its turn and position (the test fails on it);
//! * `ended <session> <reason>`, `refused <session> <item-id>: <error>`: a session
//!   ended, or refused a push, in a run that pushes (it never should);
//! * `ready` once the sessions run; `drained` when `--drain` finished.
//!
//! With `--drain` it pushes nothing: it resumes every session, drains it and exits 0.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentloop::store::Engine;
use agentloop::{
    store::CheckpointActor, store::InstanceLease, turn::StepOutcome, Agent, AgentError,
    CheckpointStore, Durability, ExitReason, SafePoint, SessionHandle, SessionSpec, StepPolicy,
    StopOptions, Turn, TurnCx, TurnOutcome,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const SESSIONS: u64 = 3;

/// The turn's steps, in order: three `Retry`, two `NoRetry`.
const PROGRAM: [(&str, StepPolicy); 5] = [
    ("quote", StepPolicy::Retry),
    ("reserve", StepPolicy::NoRetry),
    ("charge", StepPolicy::Retry),
    ("capture", StepPolicy::NoRetry),
    ("receipt", StepPolicy::Retry),
];

/// The safe point comes after this many steps (its state: the steps done).
const SAFE_AFTER: usize = 2;

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

type Http = Client<HttpConnector, Empty<Bytes>>;

struct Payer {
    http: Http,
    /// `http://127.0.0.1:PORT`
    base: Arc<str>,
}

/// One call to the service: POST `/charge` with the key; its answer, or why none came.
async fn call(http: &Http, base: &str, key: &str) -> String {
    let req = match hyper::Request::post(format!("{base}/charge"))
        .header("idempotency-key", key)
        .body(Empty::new())
    {
        Ok(r) => r,
        Err(e) => return format!("error: request: {e}"),
    };
    let resp = match http.request(req).await {
        Ok(r) => r,
        Err(e) => return format!("error: send: {e}"),
    };
    let status = resp.status();
    match resp.into_body().collect().await {
        Ok(b) if status.is_success() => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Ok(b) => format!(
            "error: status {status}: {}",
            String::from_utf8_lossy(&b.to_bytes())
        ),
        Err(e) => format!("error: body: {e}"),
    }
}

impl Agent for Payer {
    type Item = u64;
    type Event = ();
    /// The steps done at the last safe point.
    type State = usize;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<usize>, AgentError> {
        let session = cx.session_id().to_string();
        let start = turn.resume.unwrap_or(0);
        for (at, (name, policy)) in PROGRAM.iter().enumerate().skip(start) {
            if at == SAFE_AFTER && start < SAFE_AFTER {
                cx.safe_point(SafePoint::AfterToolCalls, &SAFE_AFTER)?;
            }
            let expected = format!("{session}/{}/{at}/{name}", turn.index);
            let ran = Arc::new(AtomicBool::new(false));
            let (flag, http, base, want) = (
                ran.clone(),
                self.http.clone(),
                self.base.clone(),
                expected.clone(),
            );
            let out = cx
                .step_with(name, *policy, |key| async move {
                    flag.store(true, Ordering::SeqCst);
                    let key = key.to_string();
                    if key != want {
                        say(format!("step mismatch {want} {key}"));
                    }
                    call(&http, &base, &key).await
                })
                .await?;
            match out {
                StepOutcome::Done(body) if ran.load(Ordering::SeqCst) => {
                    say(format!("step ran {expected} {body}"))
                }
                StepOutcome::Done(body) => say(format!("step replayed {expected} {body}")),
                StepOutcome::Unknown { key } => {
                    if key.to_string() != expected {
                        say(format!("step mismatch {expected} {key}"));
                    }
                    if ran.load(Ordering::SeqCst) {
                        say(format!("step mismatch {expected} unknown-but-ran"));
                    }
                    say(format!("step unknown {expected}"))
                }
            }
        }
        // Reported before the turn returns, so the line is out before the record can
        // drop these items (as crash_child does).
        let ids: Vec<String> = turn.items.iter().map(u64::to_string).collect();
        say(format!("turn {session} {}", ids.join(" ")));
        Ok(TurnOutcome::Completed)
    }
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("steps_child: {e}");
    std::process::exit(1);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(run), Some(base)) = (
        args.get(1),
        args.get(2).and_then(|r| r.parse::<u64>().ok()),
        args.get(3),
    ) else {
        eprintln!("usage: steps_child <data-dir> <run-number> <service-url> [--drain]");
        std::process::exit(2);
    };
    let drain = args.iter().any(|a| a == "--drain");
    let client = CheckpointActor::<u64>::spawn_engine(dir, Engine::SLED)
        .await
        .unwrap_or_else(|e| fail(e));
    let store: Arc<dyn CheckpointStore<u64>> = Arc::new(client.clone());
    let lease = InstanceLease::start(store.clone(), Duration::from_millis(25))
        .await
        .unwrap_or_else(|e| fail(e));
    let http: Http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let base: Arc<str> = base.trim_end_matches('/').into();
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let name = format!("pay-{s}");
        let agent = Payer {
            http: http.clone(),
            base: base.clone(),
        };
        let spec = SessionSpec::new(name.clone(), "payer")
            .persistent(true)
            .durability(Durability::Sync)
            .owner(lease.id())
            .lease_timeout(Duration::from_millis(100));
        let h: SessionHandle<u64, ()> =
            SessionHandle::spawn(spec, Arc::new(agent), Some(store.clone()))
                .await
                .unwrap_or_else(|e| fail(format!("spawn {name}: {e}")));
        tasks.push((h, name, s));
    }
    say("ready".into());
    if drain {
        for (h, name, _) in tasks {
            if let Err(e) = h.stop(StopOptions::drain()).await {
                fail(format!("stop {name}: {e}"));
            }
            let exit = h.wait().await;
            if exit.reason != ExitReason::Completed
                || !exit.unhandled_items.is_empty()
                || !exit.interrupted_items.is_empty()
            {
                fail(format!("drain of {name} left items: {exit:?}"));
            }
        }
        let _ = client.close().await;
        say("drained".into());
        return;
    }
    let mut pushers = Vec::new();
    for (h, name, s) in tasks {
        // A session never ends while the run pushes: say so if it does.
        let h = Arc::new(h);
        let (watched, watcher) = (h.clone(), name.clone());
        tokio::spawn(async move {
            let exit = watched.wait().await;
            say(format!("ended {watcher} {:?}", exit.reason));
        });
        pushers.push(tokio::spawn(async move {
            for k in 0.. {
                let id = run * 1_000_000 + s * 100_000 + k;
                match h.push(id).await {
                    Ok(_) => say(format!("push {name} {id}")),
                    Err(e) => {
                        say(format!("refused {name} {id}: {e}"));
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for p in pushers {
        let _ = p.await;
    }
}
