//! A session that is stored but not live yet is not unknown (issue 28): by-id requests
//! for it answer `503 not_live` with `Retry-After` (the event stream a `200` stream of
//! one `not_live` event with SSE's `retry:`), a stored session that nothing will run
//! answers `409 wrong_state` with what to do, and only an id with nothing stored is
//! `404 unknown_session`. On a shared store the runtime's recovery sweep takes the
//! record once its owner's lease expires, and the push that was refused is accepted.

use std::sync::Arc;
use std::time::Duration;

use agentloop::store::{now_ms, MemoryStore};
use agentloop::{store::SessionRecord, store::SessionStatus, CheckpointStore, Runtime};
use agentloop_http::{router, HttpOptions};
use agentloop_sim::{SimEvent, SimItem};
use axum::body::Body;
use axum::http::{Request, StatusCode};

mod common;
use common::*;

const BEAT: Duration = Duration::from_millis(50);
const LEASE: Duration = Duration::from_millis(600);

fn record(id: &str, status: SessionStatus, owner: Option<&str>) -> SessionRecord<SimItem> {
    let mut r = SessionRecord::new(id, "sim", 3);
    r.status = status;
    r.owner = owner.map(str::to_string);
    r.heartbeat_ms = now_ms();
    r
}

async fn retry_after(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, Option<u64>, String) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    let body = Body::from(body.unwrap_or("{}").to_string());
    let resp = send(app, req.body(body).unwrap()).await;
    let after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let (status, bytes) = status_body(resp).await;
    (status, after, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_but_not_live_is_503_with_retry_after_until_the_sweep_recovers_it() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    // Another process runs `s1` and beats; `done` and `asks` are stored, not running.
    store.beat("other", now_ms()).await.unwrap();
    store.insert(record("s1", SessionStatus::Running, Some("other")));
    store.insert(record("done", SessionStatus::Stopped, None));
    let mut asks = record("asks", SessionStatus::Stopped, None);
    asks.awaiting_answer = true;
    store.insert(asks);
    let (rt, report) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .heartbeat(BEAT, LEASE)
        .flush_logs(None)
        .register_agent("sim", |_cfg: &[u8]| Ok(react_agent()))
        .start()
        .await
        .unwrap();
    assert!(report.resumed.is_empty(), "{report:?}");
    let app = router(&rt, HttpOptions::default());

    // Not live yet: 503, when to retry, and whose lease it waits for.
    let push = r#"{"item": {"id": 1, "text": "hi"}}"#;
    let (s, after, body) = retry_after(&app, "POST", "/sessions/s1/items", Some(push)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body.contains("\"not_live\"") && body.contains("`other`"),
        "{body}"
    );
    assert!(after.is_some_and(|a| a >= 1), "Retry-After: {after:?}");
    let (s, after, body) = retry_after(&app, "POST", "/sessions/s1/stop", None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(after.is_some() && body.contains("not_live"), "{body}");
    let (s, _, body) = retry_after(&app, "POST", "/sessions/s1/detach", None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // The event stream: 200, one `not_live` event after `retry:`, then closed, so an
    // EventSource reconnects instead of giving up.
    let resp = open_events(&app, "s1", Some(7)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    assert!(resp.headers().get("retry-after").is_some());
    let text = String::from_utf8_lossy(&status_body(resp).await.1).into_owned();
    let retry: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("retry: "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a retry: field in {text:?}"));
    // The lease left plus one sweep.
    assert!(
        retry > BEAT.as_millis() as u64 && retry <= (LEASE + BEAT).as_millis() as u64,
        "{text}"
    );
    assert!(
        text.contains("event: not_live\n") && text.contains("\"retry_after_ms\""),
        "{text}"
    );
    assert!(
        !text.contains("id:"),
        "no event id, so Last-Event-ID stays: {text}"
    );

    // Stored, not running: 409 with what to do. Nothing stored: 404.
    let (s, v) = common::push(&app, "done", 2, "x").await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("spawn it again"),
        "{v}"
    );
    let (s, v) = call(&app, "POST", "/sessions/asks/stop", None).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
    assert!(v["message"].as_str().unwrap().contains("answer"), "{v}");
    let (s, v) = common::push(&app, "nobody", 3, "x").await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::NOT_FOUND, "unknown_session"),
        "{v}"
    );
    let resp = open_events(&app, "nobody", None).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);

    // The other process stops beating (it died): once its lease expires, this
    // runtime's recovery sweep resumes the session without a restart, and the push a
    // client retries on `not_live` is accepted.
    let died = std::time::Instant::now();
    let mut accepted = false;
    for _ in 0..200 {
        let (s, _, body) = retry_after(&app, "POST", "/sessions/s1/items", Some(push)).await;
        if s == StatusCode::OK {
            accepted = true;
            break;
        }
        assert_eq!(
            s,
            StatusCode::SERVICE_UNAVAILABLE,
            "only not_live meanwhile: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(accepted, "the sweep recovered s1");
    assert!(
        died.elapsed() < LEASE + BEAT * 20,
        "within the lease and a sweep: {:?}",
        died.elapsed()
    );
    let rec = store.get("s1").expect("the record");
    assert_eq!(
        rec.owner.as_deref(),
        Some(rt.instance_id()),
        "claimed by this runtime"
    );
    rt.stop(agentloop::StopOptions::immediate().shutdown())
        .await
        .unwrap();
}
