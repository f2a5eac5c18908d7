//! Idempotent pushes (issue 17, S33): a push may carry an `Idempotency-Key` header; the
//! first push with a key runs, and every retry with the same key for the same session
//! gets that first outcome (status and body) and never delivers the item again, also
//! while the first is still in flight (it waits for it).
//!
//! The first push runs in its own task, so a client that disconnects mid-push cannot
//! leave a delivered item without a remembered outcome. Keys are remembered for a
//! bounded window: at most [`DEFAULT_IDEMPOTENCY_KEYS`] keys (the oldest are forgotten
//! first) for at most [`DEFAULT_IDEMPOTENCY_TTL`], in memory: a retry after a restart of
//! the server is a new push. A retry whose item differs from the first is refused (409
//! `idempotency_mismatch`). A first outcome that accepted nothing (a 4xx, or `503`
//! `not_live` / `draining`) is not kept, so the retry runs again (issues 28, 29). The
//! fingerprint covers the item and its preempt options. This module remembers outcomes;
//! pushing is the caller's.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::watch;

use crate::error::ApiError;

/// Keys remembered at most (the oldest are forgotten first).
pub const DEFAULT_IDEMPOTENCY_KEYS: usize = 100_000;

/// How long a key is remembered at most.
pub const DEFAULT_IDEMPOTENCY_TTL: Duration = Duration::from_secs(600);

/// The longest key accepted.
pub const MAX_KEY_LEN: usize = 256;

/// An outcome as sent: status and JSON body.
pub(crate) type Outcome = (StatusCode, Value);

struct Entry {
    /// Hash of the session id and the item's JSON, to refuse a reused key.
    fingerprint: u64,
    outcome: watch::Receiver<Option<Outcome>>,
    at: Instant,
}

/// The remembered keys.
pub(crate) struct Idempotency {
    max_keys: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<(String, String), Entry>,
    /// Insertion order, oldest first, for eviction.
    order: VecDeque<((String, String), Instant)>,
}

/// What a keyed push should do.
enum Claim {
    /// First with this key: run and publish through the sender.
    Run(watch::Sender<Option<Outcome>>),
    /// Seen before: wait for (or take) the first outcome.
    Wait(watch::Receiver<Option<Outcome>>),
}

/// The hash of the session id and the item's JSON text as sent (a retry sends the same
/// bytes).
fn fingerprint(session: &str, item: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    session.hash(&mut h);
    item.hash(&mut h);
    h.finish()
}

/// A response as an outcome to remember: its status and JSON body.
pub(crate) async fn outcome(resp: axum::response::Response) -> Outcome {
    let status = resp.status();
    let body = match axum::body::to_bytes(resp.into_body(), usize::MAX).await {
        Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    (status, body)
}

impl Idempotency {
    pub(crate) fn new(max_keys: usize, ttl: Duration) -> Self {
        Idempotency {
            max_keys: max_keys.max(1),
            ttl,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Keys remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    fn claim(&self, session: &str, key: &str, item: &str) -> Result<Claim, ApiError> {
        let now = Instant::now();
        let fp = fingerprint(session, item);
        let mut inner = self.inner.lock();
        // Forget what is too old or too many, oldest first.
        while let Some((k, at)) = inner.order.front().cloned() {
            let expired = now.duration_since(at) > self.ttl;
            if !expired && inner.order.len() < self.max_keys {
                break;
            }
            inner.order.pop_front();
            if inner.entries.get(&k).is_some_and(|e| e.at == at) {
                inner.entries.remove(&k);
            }
        }
        let k = (session.to_string(), key.to_string());
        // A first outcome that accepted nothing is not kept: a retry runs again. That
        // is every 4xx (the item was refused and handed back: unknown session, wrong
        // state, bad request...) and 503 (not live yet, draining). A 2xx, and any other
        // 5xx (an owner that may have taken it before it timed out), are kept.
        let retry = |e: &Entry| {
            e.outcome
                .borrow()
                .as_ref()
                .is_some_and(|(s, _)| s.is_client_error() || *s == StatusCode::SERVICE_UNAVAILABLE)
        };
        if let Some(e) = inner.entries.get(&k).filter(|e| !retry(e)) {
            if e.fingerprint != fp {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "idempotency_mismatch",
                    format!(
                        "Idempotency-Key `{key}` was used for another item to session `{session}`: \
                         a retry must send the same item; use a new key for a new item"
                    ),
                ));
            }
            return Ok(Claim::Wait(e.outcome.clone()));
        }
        let (tx, rx) = watch::channel(None);
        inner.entries.insert(
            k.clone(),
            Entry {
                fingerprint: fp,
                outcome: rx,
                at: now,
            },
        );
        inner.order.push_back((k, now));
        Ok(Claim::Run(tx))
    }

    /// Runs `push` once per (session, key): the first call spawns it and every call
    /// (the first included) answers its outcome.
    pub(crate) async fn run<F>(
        &self,
        session: &str,
        key: &str,
        item: &str,
        push: F,
    ) -> Result<Outcome, ApiError>
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        if key.is_empty() || key.len() > MAX_KEY_LEN || key.chars().any(char::is_control) {
            return Err(ApiError::bad_request(format!(
                "Idempotency-Key must be 1 to {MAX_KEY_LEN} bytes without control characters"
            )));
        }
        let mut rx = match self.claim(session, key, item)? {
            Claim::Run(tx) => {
                let mut rx = tx.subscribe();
                // Its own task: the push completes and its outcome is published even if
                // this request is dropped.
                tokio::spawn(async move {
                    let outcome = push.await;
                    let _ = tx.send(Some(outcome));
                });
                rx.mark_unchanged();
                rx
            }
            Claim::Wait(rx) => rx,
        };
        let lost = || {
            // The item may or may not have reached the session: say so where operators
            // look, naming the push.
            tracing::warn!(session, key, "a keyed push ended without an outcome (its task panicked); whether its item was accepted is unknown");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the first push with this Idempotency-Key ended without an outcome \
                 (its task panicked); check the server log before retrying with a new key",
            )
        };
        let outcome = rx.wait_for(Option::is_some).await.map_err(|_| lost())?;
        outcome.as_ref().cloned().ok_or_else(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn ok() -> Outcome {
        (StatusCode::OK, serde_json::json!({"ok": true}))
    }

    #[tokio::test]
    async fn a_refusal_is_not_kept_so_the_retry_runs_again() {
        let idem = Idempotency::new(10, Duration::from_secs(60));
        let first = idem
            .run("s", "k", "{}", async {
                (
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"code": "unknown_session"}),
                )
            })
            .await
            .unwrap();
        assert_eq!(first.0, StatusCode::NOT_FOUND);
        let second = idem.run("s", "k", "{}", async { ok() }).await.unwrap();
        assert_eq!(
            second.0,
            StatusCode::OK,
            "the session exists now: the retry ran"
        );
    }

    #[tokio::test]
    async fn a_503_is_not_kept_so_the_retry_runs_again() {
        let idem = Idempotency::new(10, Duration::from_secs(60));
        let runs = Arc::new(AtomicUsize::new(0));
        let push = |status: StatusCode| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (status, serde_json::json!({"code": "not_live"}))
            }
        };
        let first = idem
            .run("s", "k", "{}", push(StatusCode::SERVICE_UNAVAILABLE))
            .await
            .unwrap();
        assert_eq!(first.0, StatusCode::SERVICE_UNAVAILABLE);
        let second = idem
            .run("s", "k", "{}", push(StatusCode::OK))
            .await
            .unwrap();
        assert_eq!(second.0, StatusCode::OK, "the retry ran");
        let third = idem
            .run("s", "k", "{}", push(StatusCode::SERVICE_UNAVAILABLE))
            .await
            .unwrap();
        assert_eq!(third.0, StatusCode::OK, "an accepted outcome is kept");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_retry_gets_the_first_outcome_and_runs_nothing() {
        let idem = Idempotency::new(10, Duration::from_secs(60));
        let runs = Arc::new(AtomicUsize::new(0));
        let item = r#"{"id": 1}"#;
        for _ in 0..3 {
            let r = runs.clone();
            let out = idem
                .run("s", "k", item, async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    ok()
                })
                .await
                .expect("outcome");
            assert_eq!(out, ok());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_concurrent_retry_waits_for_the_first() {
        let idem = Arc::new(Idempotency::new(10, Duration::from_secs(60)));
        let (gate_tx, gate_rx) = tokio::sync::oneshot::channel::<()>();
        let item = "1";
        let first = {
            let idem = idem.clone();
            tokio::spawn(async move {
                idem.run("s", "k", item, async move {
                    let _ = gate_rx.await;
                    (StatusCode::ACCEPTED, serde_json::json!("first"))
                })
                .await
            })
        };
        tokio::task::yield_now().await;
        let second = {
            let idem = idem.clone();
            tokio::spawn(async move {
                idem.run("s", "k", item, async { panic!("a retry must not run") })
                    .await
            })
        };
        tokio::task::yield_now().await;
        assert!(!second.is_finished());
        gate_tx.send(()).expect("gate");
        let a = first.await.expect("join").expect("first");
        let b = second.await.expect("join").expect("second");
        assert_eq!(a, b);
        assert_eq!(a.0, StatusCode::ACCEPTED);
    }

    #[tokio::test]
    async fn a_reused_key_with_another_item_is_refused() {
        let idem = Idempotency::new(10, Duration::from_secs(60));
        idem.run("s", "k", "1", async { ok() })
            .await
            .expect("first");
        let e = idem
            .run("s", "k", "2", async { ok() })
            .await
            .expect_err("mismatch");
        assert_eq!(e.code, "idempotency_mismatch");
        // The same key on another session is another key.
        idem.run("t", "k", "2", async { ok() })
            .await
            .expect("other session");
    }

    #[tokio::test]
    async fn the_window_is_bounded() {
        let idem = Idempotency::new(3, Duration::from_secs(60));
        for i in 0..10 {
            idem.run("s", &format!("k{i}"), &i.to_string(), async { ok() })
                .await
                .expect("run");
        }
        assert!(idem.len() <= 3, "{} keys kept", idem.len());
    }
}
