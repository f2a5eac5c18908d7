//! The router's routes, success and error paths (issue 17, first step), driven over a
//! real loopback socket with hyper's client: spawn, list, push, stop, cancel, health and
//! readiness, and the JSON errors with their codes.

use std::time::Duration;

use agentloop::StopOptions;
use agentloop_http::{router, HttpOptions};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_spawned_listed_pushed_to_stopped_and_canceled() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    assert_eq!(call(&app, "GET", "/healthz", None).await.0, StatusCode::OK);
    assert_eq!(call(&app, "GET", "/readyz", None).await.0, StatusCode::OK);

    let (s, v) = spawn(&app, json!({"id": "a", "kind": "sim"})).await;
    assert_eq!(
        (s, v["id"].as_str()),
        (StatusCode::CREATED, Some("a")),
        "{v}"
    );
    let (s, v) = spawn(&app, json!({"id": "b", "kind": "sim"})).await;
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

    let (s, v) = push(&app, "a", 1, "hello").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["preempt"], json!({"kind": "not_requested"}));

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
    assert_eq!(v["status"], "canceled", "{v}");
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
    let spawn_body = |id: &str| json!({"id": id, "kind": "sim"});
    assert_eq!(spawn(&app, spawn_body("x")).await.0, StatusCode::CREATED);
    for (method, uri, body, status, want) in [
        (
            "POST",
            "/sessions",
            Some(spawn_body("x")),
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
        // S20a: an absurd retention of kept events, and one without persistence.
        (
            "POST",
            "/sessions",
            Some(
                json!({"id": "z", "kind": "sim", "persistent": true, "events": {"count": u64::MAX}}),
            ),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions",
            Some(json!({"id": "z", "kind": "sim", "persistent": true, "events": {"max_age_s": 0}})),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/sessions",
            Some(json!({"id": "z", "kind": "sim", "events": {"count": 10}})),
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
    // Behind the closed drain gate, new work is 503 `draining` (S34): a push is not
    // accepted (whatever session it names), a spawn is refused.
    let mut push = (StatusCode::OK, json!(null));
    for _ in 0..200 {
        push = common::push(&app, "x", 3, "late").await;
        if push.0 == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        (push.0, code(&push.1)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        "{}",
        push.1
    );
    let (s, v) = spawn(&app, spawn_body("late")).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        "{v}"
    );
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_but_the_probes() {
    let rt = runtime().await;
    let app = router(
        &rt,
        HttpOptions {
            token: Some("s3cr3t-m4rk3r".into()),
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
            let resp = send(&app, req.body(Body::empty()).unwrap()).await;
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
        Some("s3cr3t-m4rk3r"),
        Some("Basic s3cr3t-m4rk3r"),
    ] {
        let (s, www) = send(bad).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{bad:?}");
        assert_eq!(www.unwrap(), "Bearer");
    }
    assert_eq!(send(Some("Bearer s3cr3t-m4rk3r")).await.0, StatusCode::OK);
    // The scheme is case-insensitive (RFC 9110).
    assert_eq!(send(Some("bearer s3cr3t-m4rk3r")).await.0, StatusCode::OK);
    assert_eq!(send(Some("BEARER s3cr3t-m4rk3r")).await.0, StatusCode::OK);
    // The probes answer without a token (load balancers do not carry one).
    assert_eq!(call(&app, "GET", "/healthz", None).await.0, StatusCode::OK);
    assert_eq!(call(&app, "GET", "/readyz", None).await.0, StatusCode::OK);
    let (s, v) = spawn(&app, json!({"id": "a", "kind": "sim"})).await;
    assert_eq!((s, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    // The page holds no data: it loads without a token (and sends the one it is given).
    assert_eq!(call(&app, "GET", "/", None).await.0, StatusCode::OK);
    // A browser's EventSource cannot set headers: the event stream (only) takes the
    // token as ?access_token=, percent-encoded like any query value.
    let get = |uri: &'static str| {
        let app = app.clone();
        async move { status_of(&app, uri).await }
    };
    assert_eq!(
        get("/sessions/a/events?access_token=wrong").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get("/sessions?access_token=s3cr3t-m4rk3r").await,
        StatusCode::UNAUTHORIZED
    );
    // Past authentication: the session does not exist, so 404 (not 401).
    assert_eq!(
        get("/sessions/a/events?access_token=s3cr3t-m4rk%33r").await,
        StatusCode::NOT_FOUND
    );
    rt.shutdown().await.unwrap();
}

/// A bare GET's status.
async fn status_of(app: &axum::Router, uri: &str) -> StatusCode {
    common::get(app, uri).await.status()
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
        token: Some("a-token-of-sixteen+".into()),
        ..HttpOptions::default()
    };
    assert!(check_bind("0.0.0.0:8080".parse().unwrap(), &guarded).is_ok());
    // A short token guards nothing (S34a).
    let weak = HttpOptions {
        token: Some("t".into()),
        ..HttpOptions::default()
    };
    let err = check_bind("0.0.0.0:8080".parse().unwrap(), &weak).unwrap_err();
    assert!(err.contains("at least 16"), "{err}");
}

/// S34a: without a token a web page cannot drive the server. A plain form post (no
/// JSON) is refused with 415 and changes nothing; a request naming a foreign `Host`
/// (DNS rebinding) is refused with 403, reads included; loopback names and JSON work,
/// and so does the client header. The probes answer whatever the request bound says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_a_web_page_cannot_drive_the_server() {
    use axum::body::Body;
    use axum::http::Request;
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    assert_eq!(
        spawn(&app, json!({"id": "v", "kind": "sim"})).await.0,
        StatusCode::CREATED
    );
    async fn raw(app: &axum::Router, req: Request<Body>) -> (StatusCode, serde_json::Value) {
        let (status, bytes) = status_body(send(app, req).await).await;
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }
    // What a <form method=post> sends: form-encoded or text/plain, no preflight.
    for ct in [
        "application/x-www-form-urlencoded",
        "text/plain",
        "multipart/form-data; boundary=x",
    ] {
        let req = Request::builder()
            .method("POST")
            .uri("/sessions/v/cancel")
            .header("content-type", ct)
            .body(Body::from("a=b"))
            .unwrap();
        let (s, v) = raw(&app, req).await;
        assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}: {v}");
        assert_eq!(v["code"], "json_required", "{v}");
    }
    let req = Request::builder()
        .method("POST")
        .uri("/sessions/v/stop")
        .body(Body::empty())
        .unwrap();
    assert_eq!(raw(&app, req).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (s, v) = call(&app, "GET", "/sessions/v", None).await;
    assert_eq!(
        (s, v["live"].clone()),
        (StatusCode::OK, json!(true)),
        "nothing was stopped"
    );
    // A rebound name: refused, reads too.
    for host in [
        "evil.example",
        "evil.example:7420",
        "localhost.evil.example",
    ] {
        let req = Request::builder()
            .uri("/sessions")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        let (s, v) = raw(&app, req).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{host}: {v}");
        assert_eq!(v["code"], "forbidden_host", "{v}");
    }
    // Loopback names and the client header work.
    for host in ["localhost:7420", "127.0.0.1", "[::1]:80"] {
        let req = Request::builder()
            .uri("/sessions")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(raw(&app, req).await.0, StatusCode::OK, "{host}");
    }
    let req = Request::builder()
        .method("POST")
        .uri("/sessions/v/stop")
        .header("x-agentloop-client", "1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(raw(&app, req).await.0, StatusCode::ACCEPTED);
}

/// S34a: the health probes never count against the request bound: with every request
/// slot held by a slow body, `/healthz` and `/readyz` still answer 200 while other
/// routes answer 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_while_every_request_slot_is_held() {
    use tokio::io::AsyncWriteExt;
    let rt = runtime().await;
    let app = router(
        &rt,
        HttpOptions {
            max_requests: Some(2),
            ..HttpOptions::default()
        },
    );
    let (addr, _server) = serve_loopback(app).await;
    // Two slow pushes: headers sent, the body never finished.
    let slow = || async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(
            b"POST /sessions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\"",
        )
        .await
        .unwrap();
        c
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(slow().await);
    }
    let get = |path: &'static str| async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut c, &mut out)
            .await
            .unwrap();
        out
    };
    // Wait until both slots are taken (the bound answers 429 for other routes): up to
    // about 7 s, well inside the 10 s body-read timeout that would free them (on a
    // loaded 2-core CI machine the two slow connections can take seconds to reach
    // their handlers).
    // A probe below can reach the server before a slow request and take its slot: that
    // request is then answered 429 and holds nothing, so it is sent again.
    let mut full = false;
    for _ in 0..700 {
        for c in held.iter_mut() {
            let mut answer = [0u8; 64];
            match c.try_read(&mut answer) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                _ => *c = slow().await,
            }
        }
        if get("/sessions").await.starts_with("HTTP/1.1 429") {
            full = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(full, "the slow bodies hold every slot");
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_as_sse_numbered_and_end_with_ended() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    spawn(&app, json!({"id": "ev", "kind": "sim"})).await;
    let resp = open_events(&app, "ev", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    // A reconnect after event 0 on a session without a replay buffer says what it missed.
    let resumed = open_events(&app, "ev", Some(0)).await;
    assert_eq!(resumed.status(), StatusCode::OK);
    let (s, _) = push(&app, "ev", 7, "hi").await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call(
        &app,
        "POST",
        "/sessions/ev/stop",
        Some(json!({"mode": "drain", "cause": "done"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("the stream ends after `ended`")
        .unwrap()
        .to_bytes();
    let events = sse_events(&String::from_utf8_lossy(&body));
    let names: Vec<&str> = events.iter().map(|(_, n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"turn_started")
            && names.contains(&"agent")
            && names.contains(&"turn_ended"),
        "{names:?}"
    );
    assert_eq!(names.last(), Some(&"ended"), "{names:?}");
    let ended = &events.last().unwrap().2;
    assert_eq!(ended["stop_cause"], "done");
    let ids: Vec<u64> = events.iter().map(|(i, _, _)| *i).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "gap-free ids: {ids:?}"
    );
    let agent = events.iter().find(|(_, n, _)| n == "agent").unwrap();
    assert!(
        agent.2["event"].is_object(),
        "the agent's event as JSON: {:?}",
        agent.2
    );
    // The resumed stream: events after 0 it cannot replay are announced first, then
    // the same live events with the same numbers.
    let body = tokio::time::timeout(Duration::from_secs(10), resumed.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    let again = sse_events(&String::from_utf8_lossy(&body));
    assert_eq!(again.last().map(|(_, n, _)| n.as_str()), Some("ended"));
    let live_ids: Vec<u64> = again
        .iter()
        .filter(|(_, n, _)| n != "lagged")
        .map(|(i, _, _)| *i)
        .collect();
    assert_eq!(live_ids, ids, "the same numbers for the same events");
    // Unknown sessions and bad ids are JSON errors.
    let (s, v) = call(&app, "GET", "/sessions/ghost/events", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "unknown_session"));
    spawn(&app, json!({"id": "ev2", "kind": "sim"})).await;
    let bad = send(
        &app,
        Request::builder()
            .uri("/sessions/ev2/events")
            .header("last-event-id", "yesterday")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    rt.stop(StopOptions::immediate()).await.unwrap();
}

/// A client that reconnects with `Last-Event-ID` gets exactly the events it missed
/// (from the session's replay buffer), then the live ones, with the same numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_replays_exactly_the_missed_events() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    let (s, _) = spawn(&app, json!({"id": "re", "kind": "sim", "replay": 64})).await;
    assert_eq!(s, StatusCode::CREATED);
    let mut first = open_events(&app, "re", None).await.into_body();
    push(&app, "re", 1, "a").await;
    let mut seen = read_until(&mut first, "turn_ended").await;
    let before = sse_events(&seen);
    let k = before[0].0; // the client "lost" everything after its first event
    let second = open_events(&app, "re", Some(k)).await.into_body();
    call(
        &app,
        "POST",
        "/sessions/re/stop",
        Some(json!({"mode": "drain"})),
    )
    .await;
    seen.push_str(&read_until(&mut first, "ended").await);
    let all = sse_events(&seen);
    let resumed = tokio::time::timeout(Duration::from_secs(10), second.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    let resumed = sse_events(&String::from_utf8_lossy(&resumed));
    let expected: Vec<_> = all.into_iter().filter(|(i, _, _)| *i > k).collect();
    assert!(!expected.is_empty());
    assert_eq!(
        resumed, expected,
        "the missed events, then the live ones, once each"
    );
    rt.stop(StopOptions::immediate()).await.unwrap();
}

/// S34a: errors are JSON with a stable code on every route, 404 and 405 included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_answer_json_errors() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    let (s, v) = call(&app, "GET", "/nowhere", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "{v}");
    assert!(v["message"].as_str().unwrap().contains("/nowhere"), "{v}");
    let (s, v) = call(&app, "DELETE", "/sessions", None).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        "{v}"
    );
    let (s, v) = call(&app, "GET", "/sessions/x/items", None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{v}");
    assert!(v["message"].as_str().unwrap().contains("GET"), "{v}");
}

/// S34a: a body declared over the limit is refused at once (before it is sent, and on a
/// route that reads no body), and the live page is served with headers that keep it from
/// being framed or sniffed and its URL (which may carry the token) from leaking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_bodies_are_refused_up_front_and_the_page_has_security_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = runtime().await;
    let app = router(
        &rt,
        HttpOptions {
            body_limit: Some(1024),
            ..HttpOptions::default()
        },
    );
    assert_eq!(
        spawn(&app, json!({"id": "b", "kind": "sim"})).await.0,
        StatusCode::CREATED
    );
    let (addr, _server) = serve_loopback(app.clone()).await;
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Headers only: the 10 MB body is never sent.
    c.write_all(
        b"POST /sessions/b/cancel HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 10000000\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = [0u8; 256];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), c.read(&mut head))
        .await
        .expect("answered before the body")
        .unwrap();
    let text = String::from_utf8_lossy(&head[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    let (s, v) = call(&app, "GET", "/sessions/b", None).await;
    assert_eq!(
        (s, v["live"].clone()),
        (StatusCode::OK, json!(true)),
        "not canceled: {v}"
    );

    let resp = common::get(&app, "/").await;
    let h = resp.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'self'"),
        "{csp}"
    );
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["referrer-policy"], "no-referrer");
}

/// S34a: an idempotency key names one request: a retry that changes the preempt options
/// is refused (409 `idempotency_mismatch`); a first push refused with a 4xx (the session
/// did not exist yet) is not replayed: the retry after the spawn is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_covers_the_preempt_and_does_not_keep_a_refusal() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    let keyed = |key: &'static str, body: serde_json::Value| {
        let app = app.clone();
        async move {
            let (status, bytes) = post_keyed(&app, "/sessions/late/items", key, &body).await;
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
            )
        }
    };
    let item = json!({"item": {"id": 1, "text": "x"}});
    let (s, v) = keyed("k1", item.clone()).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::NOT_FOUND, "unknown_session"),
        "{v}"
    );
    assert_eq!(
        spawn(&app, json!({"id": "late", "kind": "sim"})).await.0,
        StatusCode::CREATED
    );
    let (s, v) = keyed("k1", item.clone()).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "the retry ran against the new session: {v}"
    );
    let (s, v) = keyed("k1", item.clone()).await;
    assert_eq!(s, StatusCode::OK, "an accepted outcome is replayed: {v}");
    let with_preempt = json!({"item": {"id": 1, "text": "x"}, "preempt": {"at": "any"}});
    let (s, v) = keyed("k1", with_preempt).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::CONFLICT, "idempotency_mismatch"),
        "{v}"
    );
}

/// S34a: one id extractor: an invalid session id in the path is a 400 on every route
/// (never a 500 from the store), and the answer does not echo a 10 KB id back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_id_is_a_400_on_every_route_without_an_echo() {
    let rt = runtime().await;
    let app = router(&rt, HttpOptions::default());
    let long = "x".repeat(10_000);
    for id in [long.as_str(), "a%01b"] {
        for (method, suffix) in [
            ("GET", ""),
            ("DELETE", ""),
            ("POST", "/items"),
            ("POST", "/stop"),
            ("POST", "/detach"),
            ("POST", "/cancel"),
            ("POST", "/resume"),
            ("GET", "/history"),
            ("GET", "/history/1"),
            ("GET", "/events"),
        ] {
            let uri = format!("/sessions/{id}{suffix}");
            let body = match suffix {
                "/items" => Some(json!({"item": {"id": 1, "text": "x"}})),
                "/resume" => Some(json!({"answer": {"id": 1, "text": "x"}})),
                _ => None,
            };
            let (s, v) = call(&app, method, &uri, body).await;
            assert_eq!(
                (s, code(&v)),
                (StatusCode::BAD_REQUEST, "bad_request"),
                "{method} {suffix}: {v}"
            );
            let message = v["message"].as_str().unwrap_or("");
            assert!(
                message.contains("invalid session id") && message.len() < 400,
                "{method} {suffix}: {message}"
            );
        }
    }
}

/// S34a: a push is answered once its item is accepted. A preempt that waits (an hour's
/// delay here) answers `scheduled` at once instead of holding the client and its
/// request slot for the delay; what it does shows in the events (`preempted` when a
/// short delay lands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_preempt_is_answered_at_acceptance_and_reported_in_events() {
    let (rt, _) = common::Rt::builder()
        .register_agent("slow", |_cfg: &[u8]| {
            Ok(agentloop_sim::SimAgent::new(agentloop_sim::Script::react(
                50,
                std::time::Duration::from_millis(100),
                std::time::Duration::ZERO,
            )))
        })
        .flush_logs(None)
        .start()
        .await
        .unwrap();
    let app = router(&rt, HttpOptions::default());
    let (s, v) = spawn(&app, json!({"id": "slow", "kind": "slow"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let mut events = open_events(&app, "slow", None).await.into_body();
    let (s, v) = push(&app, "slow", 1, "first").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    read_until(&mut events, "turn_started").await;
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        call(
            &app,
            "POST",
            "/sessions/slow/items",
            Some(json!({"item": {"id": 2, "text": "later"},
                        "preempt": {"at": "any", "delay": "1h"}})),
        ),
    )
    .await
    .expect("answered at acceptance, not after the delay");
    assert_eq!(answered.0, StatusCode::OK, "{}", answered.1);
    assert_eq!(answered.1["preempt"]["kind"], "scheduled", "{}", answered.1);
    assert_eq!(answered.1["preempt"]["turn"], 0, "{}", answered.1);
    // A short delay: answered `scheduled` too, and its preempt lands in the events.
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/slow/items",
        Some(json!({"item": {"id": 3, "text": "soon"},
                    "preempt": {"at": "any", "delay": "200ms"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["preempt"]["kind"], "scheduled", "{v}");
    let text = read_until(&mut events, "preempted").await;
    let preempted = sse_events(&text)
        .into_iter()
        .find(|(_, n, _)| n == "preempted")
        .unwrap();
    assert_eq!(preempted.2["turn"], 0, "{text}");
}
