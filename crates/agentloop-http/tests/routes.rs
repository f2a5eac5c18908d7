//! The router's routes, success and error paths (issue 17, first step), driven in
//! process through tower (no socket): spawn, list, push, stop, cancel, health and
//! readiness, and the JSON errors with their codes.

use std::time::Duration;

use agentloop::{Runtime, StopOptions};
use agentloop_http::{router, HttpOptions};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

type Rt = Runtime<SimItem, SimEvent>;

async fn runtime() -> Rt {
    let (rt, _) = Rt::builder()
        .register_agent("sim", |_cfg: &[u8]| {
            Ok(SimAgent::new(Script::react(
                1,
                Duration::ZERO,
                Duration::ZERO,
            )))
        })
        .flush_logs(None)
        .start()
        .await
        .unwrap();
    rt
}

async fn call(app: &Router, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)))
    };
    (status, v)
}

fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_spawned_listed_pushed_to_stopped_and_canceled() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    assert_eq!(call(&app, "GET", "/healthz", None).await.0, StatusCode::OK);
    assert_eq!(call(&app, "GET", "/readyz", None).await.0, StatusCode::OK);

    let (s, v) = call(
        &app,
        "POST",
        "/sessions",
        Some(json!({"id": "a", "kind": "sim"})),
    )
    .await;
    assert_eq!(
        (s, v["id"].as_str()),
        (StatusCode::CREATED, Some("a")),
        "{v}"
    );
    let (s, v) = call(
        &app,
        "POST",
        "/sessions",
        Some(json!({"id": "b", "kind": "sim"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = call(&app, "GET", "/sessions", None).await;
    assert_eq!(s, StatusCode::OK);
    let mut ids: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["a", "b"]);

    let (s, v) = call(
        &app,
        "POST",
        "/sessions/a/items",
        Some(json!({"item": {"id": 1, "text": "hello"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["preempt"], "not_requested");

    let (s, v) = call(
        &app,
        "POST",
        "/sessions/a/stop",
        Some(json!({"mode": "drain", "cause": "done"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = call(&app, "POST", "/sessions/b/cancel", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["status"].as_str().unwrap().contains("Canceled"), "{v}");
    rt.stop(StopOptions::immediate()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_json_with_a_stable_code() {
    let rt = runtime().await;
    let app = router(
        &rt,
        HttpOptions {
            body_limit: Some(256),
            ..HttpOptions::default()
        },
    );
    let spawn = |id: &str| json!({"id": id, "kind": "sim"});
    assert_eq!(
        call(&app, "POST", "/sessions", Some(spawn("x"))).await.0,
        StatusCode::CREATED
    );
    for (method, uri, body, status, want) in [
        (
            "POST",
            "/sessions",
            Some(spawn("x")),
            StatusCode::CONFLICT,
            "duplicate",
        ),
        (
            "POST",
            "/sessions",
            Some(json!({"id": "y", "kind": "nope"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions",
            Some(json!({"id": "", "kind": "sim"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions",
            Some(json!({"id": "z"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions",
            Some(json!({"id": "z", "kind": "sim", "durability": "often"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions/ghost/items",
            Some(json!({"item": {"id": 1, "text": "t"}})),
            StatusCode::NOT_FOUND,
            "unknown_session",
        ),
        (
            "POST",
            "/sessions/x/items",
            Some(json!({"item": "not an item"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions/x/items",
            Some(json!({"item": {"id": 2, "text": "y".repeat(400)}})),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        ),
        (
            "POST",
            "/sessions/x/stop",
            Some(json!({"mode": "soon"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions/x/stop",
            Some(json!({"timeout": "banana"})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions/ghost/stop",
            None,
            StatusCode::NOT_FOUND,
            "unknown_session",
        ),
        (
            "POST",
            "/sessions/ghost/cancel",
            None,
            StatusCode::NOT_FOUND,
            "unknown_session",
        ),
    ] {
        let (s, v) = call(&app, method, uri, body.clone()).await;
        assert_eq!(
            (s, code(&v)),
            (status, want),
            "{method} {uri} {body:?}: {v}"
        );
        assert!(!v["message"].as_str().unwrap_or("").is_empty(), "{v}");
    }
    // Nothing refused was half-accepted: x got no item.
    let (s, _) = call(
        &app,
        "POST",
        "/sessions/x/stop",
        Some(json!({"mode": "immediate"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);

    // Once the shutdown begins, readiness turns 503 and new sessions are refused.
    rt.shutdown_handle().begin();
    let mut ready = StatusCode::OK;
    for _ in 0..200 {
        ready = call(&app, "GET", "/readyz", None).await.0;
        if ready == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(call(&app, "GET", "/healthz", None).await.0, StatusCode::OK);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_but_the_probes() {
    let rt = runtime().await;
    let app = router(
        &rt,
        HttpOptions {
            token: Some("s3cret".into()),
            ..HttpOptions::default()
        },
    );
    let send = |auth: Option<&'static str>| {
        let app = app.clone();
        async move {
            let mut req = Request::builder().method("GET").uri("/sessions");
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            (
                resp.status(),
                resp.headers().get("www-authenticate").cloned(),
            )
        }
    };
    for bad in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cre"),
        Some("s3cret"),
        Some("Basic s3cret"),
    ] {
        let (s, www) = send(bad).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{bad:?}");
        assert_eq!(www.unwrap(), "Bearer");
    }
    assert_eq!(send(Some("Bearer s3cret")).await.0, StatusCode::OK);
    // The probes answer without a token (load balancers do not carry one).
    assert_eq!(call(&app, "GET", "/healthz", None).await.0, StatusCode::OK);
    assert_eq!(call(&app, "GET", "/readyz", None).await.0, StatusCode::OK);
    let (s, v) = call(
        &app,
        "POST",
        "/sessions",
        Some(json!({"id": "a", "kind": "sim"})),
    )
    .await;
    assert_eq!((s, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    rt.shutdown().await.unwrap();
}

#[test]
fn without_a_token_only_loopback_is_served() {
    use agentloop_http::check_bind;
    let open = HttpOptions::default();
    assert!(check_bind("127.0.0.1:8080".parse().unwrap(), &open).is_ok());
    assert!(check_bind("[::1]:8080".parse().unwrap(), &open).is_ok());
    let err = check_bind("0.0.0.0:8080".parse().unwrap(), &open).unwrap_err();
    assert!(
        err.contains("without a token") && err.contains("127.0.0.1"),
        "{err}"
    );
    let guarded = HttpOptions {
        token: Some("t".into()),
        ..HttpOptions::default()
    };
    assert!(check_bind("0.0.0.0:8080".parse().unwrap(), &guarded).is_ok());
}
