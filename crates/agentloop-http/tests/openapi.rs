//! The HTTP contract (S43): the OpenAPI 3.1 document at `GET /openapi.json` parses as
//! OpenAPI 3.1 (`oas3`), is the one checked in at `docs/openapi.json`, lists every
//! route the router serves (each documented method answers, every other method is a
//! 405), names every error code and event kind the server's source can produce, and
//! every answer of a scenario over all routes matches it (the other route tests check
//! their answers too, through `common::send`).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::contract::{check_event, document};
use common::{call, code, react_agent, read_until, runtime, send, spawn, sse_events, status_body};
use serde_json::{json, Value};

/// Where the document is checked in.
fn checked_in_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

#[test]
fn the_document_is_openapi_3_1_with_unique_operations_and_resolving_references() {
    let text = agentloop_http::openapi::document_json();
    let spec = oas3::from_json(text).expect("the document parses as OpenAPI 3.1 (oas3)");
    assert!(spec.openapi.starts_with("3.1"), "version {}", spec.openapi);
    let paths = spec.paths.as_ref().expect("paths");
    let mut ids = BTreeSet::new();
    for (path, item) in paths {
        for (method, op) in item.methods() {
            let id = op
                .operation_id
                .clone()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(ids.insert(id.clone()), "operationId {id} twice");
            assert!(
                op.responses.as_ref().is_some_and(|r| !r.is_empty()),
                "{method} {path} documents no answer"
            );
        }
    }
    // Every reference names a schema the document has.
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let mut refs = Vec::new();
    collect_refs(doc, &mut refs);
    assert!(!refs.is_empty());
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("a reference outside the schemas: {r}"));
        assert!(schemas.contains_key(name), "{r} does not resolve");
    }
}

/// The session id's documented constraints are the server's (S32): a client that
/// validates against the document sends no id the server refuses for its shape.
#[test]
fn the_documented_session_id_is_the_one_the_server_takes() {
    let doc = document();
    let param = doc["paths"]["/sessions/{id}"]["get"]["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .find(|p| p["name"] == "id")
        .expect("the id parameter")
        .clone();
    let body_id = doc["components"]["schemas"]["SpawnRequest"]["properties"]["id"].clone();
    for schema in [param["schema"].clone(), body_id] {
        // A reference into the document's schemas resolves with them beside it.
        let mut root = schema.clone();
        root["components"] = doc["components"].clone();
        let validator = jsonschema::draft202012::new(&root).expect("the id schema compiles");
        for id in ["a", "chat-1", "ü-snow", &"x".repeat(128)] {
            assert!(
                validator.is_valid(&json!(id)),
                "{id:?} is documented as invalid"
            );
            assert!(agentloop::ids::validate_session_id(id).is_ok());
        }
        for id in [
            "",
            "a\nb",
            "a\u{0}b",
            "a\u{7f}b",
            "a\u{85}b",
            &"x".repeat(129),
        ] {
            assert!(
                !validator.is_valid(&json!(id)),
                "{id:?} is documented as valid"
            );
            assert!(agentloop::ids::validate_session_id(id).is_err());
        }
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r.clone());
            }
            m.values().for_each(|c| collect_refs(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| collect_refs(c, out)),
        _ => {}
    }
}

#[test]
fn the_checked_in_document_is_the_served_one() {
    let served = agentloop_http::openapi::document_json();
    let path = checked_in_path();
    if std::env::var_os("AGENTLOOP_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, served).expect("write docs/openapi.json");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == served,
        "docs/openapi.json is not the document the server serves: regenerate it with \
         `AGENTLOOP_WRITE_OPENAPI=1 cargo test -p agentloop-http --test openapi` (or \
         `agentloop openapi > docs/openapi.json`) and commit it"
    );
}

#[test]
fn every_error_code_and_event_kind_the_source_can_produce_is_documented() {
    let doc = document();
    let codes: BTreeSet<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode is an enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let listed: BTreeSet<&str> = agentloop_http::openapi::ERROR_CODES.into_iter().collect();
    assert_eq!(codes, listed, "the ErrorCode schema and ERROR_CODES differ");
    // The codes the source writes: `StatusCode::X, "code"` and `code: "code"`.
    let sources = source_files();
    let mut found = BTreeSet::new();
    for (file, text) in &sources {
        let squashed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for (marker, after) in [("StatusCode::", ", \""), ("code: \"", "")] {
            let mut rest = squashed.as_str();
            while let Some(at) = rest.find(marker) {
                rest = &rest[at + marker.len()..];
                let tail = if after.is_empty() {
                    Some(rest)
                } else {
                    let upper = rest
                        .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                        .unwrap_or(0);
                    rest[upper..].strip_prefix(after)
                };
                if let Some(tail) = tail {
                    let name: String = tail
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !name.is_empty() && tail[name.len()..].starts_with('"') {
                        found.insert((name, file.clone()));
                    }
                }
            }
        }
    }
    assert!(
        found.len() >= 15,
        "the scan found too few codes to be right: {found:?}"
    );
    for (name, file) in &found {
        assert!(
            codes.contains(name.as_str()),
            "{file} answers the code `{name}`, which the OpenAPI document does not list"
        );
    }
    // The event kinds `events.rs` names.
    let kinds: BTreeSet<String> = doc["components"]["schemas"]["StreamEvent"]["oneOf"]
        .as_array()
        .expect("StreamEvent is a oneOf")
        .iter()
        .filter_map(|v| {
            v["properties"]["event"]["const"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    let listed: BTreeSet<String> = agentloop_http::openapi::EVENT_KINDS
        .into_iter()
        .map(str::to_string)
        .collect();
    assert_eq!(
        kinds, listed,
        "the StreamEvent schema and EVENT_KINDS differ"
    );
    let events = &sources
        .iter()
        .find(|(f, _)| f.ends_with("events.rs") && !f.contains("sessions"))
        .expect("src/events.rs")
        .1;
    let squashed: String = events.split_whitespace().collect::<Vec<_>>().join(" ");
    let body = squashed
        .split("fn event_json")
        .nth(1)
        .and_then(|rest| rest.split("fn redact_question").next())
        .expect("events.rs has event_json");
    let mut named = BTreeSet::new();
    for piece in body.split('(').skip(1) {
        if let Some(rest) = piece.trim_start().strip_prefix('"') {
            let name: String = rest.chars().take_while(|c| *c != '"').collect();
            if rest[name.len()..].starts_with("\",") {
                named.insert(name);
            }
        }
    }
    named.insert("not_live".into());
    assert!(named.len() >= 9, "the scan found {named:?}");
    assert_eq!(named, kinds, "events.rs names kinds the document does not");
}

/// The crate's source files, `(path, text)`.
fn source_files() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read");
                out.push((path.display().to_string(), text));
            }
        }
    }
    out
}

#[test]
fn the_router_is_built_from_the_documented_operations_only() {
    // Every route goes through `documented` (its path and methods are its operation's):
    // a bare `.route(` would serve a path the document does not list.
    let lib = include_str!("../src/lib.rs");
    assert!(
        !lib.contains(".route("),
        "lib.rs adds a route that is not taken from an OpenAPI operation"
    );
    assert!(lib.matches(".documented::<").count() >= 22);
}

/// The document's `(method, path template)` pairs.
fn operations() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in document()["paths"].as_object().expect("paths") {
        for method in ["get", "post", "put", "delete", "patch"] {
            if item.get(method).is_some() {
                out.push((method.to_string(), path.clone()));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served_and_every_other_method_is_refused() {
    let rt = runtime().await;
    let app = agentloop_http::router(&rt, Default::default());
    let ops = operations();
    assert!(ops.len() >= 22, "{ops:?}");
    let paths: BTreeSet<&String> = ops.iter().map(|(_, p)| p).collect();
    for path in paths {
        let concrete = path
            .replace("{id}", "s-openapi")
            .replace("{turn}", "1")
            .replace("{timer}", "1");
        for method in ["GET", "POST", "DELETE", "PUT", "PATCH"] {
            let documented = ops
                .iter()
                .any(|(m, p)| p == path && m.eq_ignore_ascii_case(method));
            let mut req = Request::builder().method(method).uri(&concrete);
            if method != "GET" && method != "DELETE" {
                req = req.header("content-type", "application/json");
            }
            let body = if method == "GET" || method == "DELETE" {
                Body::empty()
            } else {
                Body::from("{}")
            };
            // (The event stream's session does not exist: a 404, not an open stream.)
            let (status, bytes) = status_body(send(&app, req.body(body).unwrap()).await).await;
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if documented {
                assert!(
                    code(&v) != "not_found" && code(&v) != "method_not_allowed",
                    "{method} {concrete}: documented, but the router does not serve it: {status} {v}"
                );
            } else {
                assert_eq!(
                    (status, code(&v)),
                    (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
                    "{method} {concrete}: not documented, yet served"
                );
            }
        }
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_every_route_match_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = common::Rt::builder()
        .register_agent("sim", |_cfg: &[u8]| Ok(react_agent()))
        .data_dir(dir.path())
        .flush_logs(None)
        .start()
        .await
        .unwrap();
    let app = agentloop_http::router(&rt, Default::default());
    let mut seen: BTreeSet<(String, String, u16)> = BTreeSet::new();
    let mut note = |m: &str, p: &str, s: StatusCode| {
        seen.insert((m.to_string(), p.to_string(), s.as_u16()));
    };

    // Probes, the page, the metrics and the document itself.
    for p in ["/", "/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let (s, _) = call(&app, "GET", p, None).await;
        assert_eq!(s, StatusCode::OK, "{p}");
        note("get", p, s);
    }
    let (s, served) = call(&app, "GET", "/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(&served, document(), "/openapi.json serves the document");

    // A persistent session with history, spawned, pushed to, read and listed.
    let (s, v) = spawn(
        &app,
        json!({"id": "c1", "kind": "sim", "persistent": true, "history": 4,
                    "durability": "sync", "events": {"count": 100, "max_age_s": 60}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    note("post", "/sessions", s);
    let mut events = common::open_events(&app, "c1", None).await;
    assert_eq!(events.status(), StatusCode::OK);
    note("get", "/sessions/{id}/events", events.status());
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/c1/items",
        Some(
            json!({"item": {"id": 1, "text": "hello"}, "preempt": {"at": "any", "timeout": "5s"}}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    note("post", "/sessions/{id}/items", s);
    let text = read_until(events.body_mut(), "turn_ended").await;
    let kinds: BTreeSet<String> = sse_events(&text).into_iter().map(|(_, n, _)| n).collect();
    assert!(
        kinds.contains("turn_started") && kinds.contains("agent"),
        "{kinds:?}"
    );
    for (s, p) in [
        (call(&app, "GET", "/sessions", None).await.0, "/sessions"),
        (
            call(&app, "GET", "/sessions/c1", None).await.0,
            "/sessions/{id}",
        ),
        (
            call(&app, "GET", "/sessions/c1/history", None).await.0,
            "/sessions/{id}/history",
        ),
    ] {
        assert_eq!(s, StatusCode::OK, "{p}");
        note("get", p, s);
    }
    // A kept checkpoint, read and forked.
    let mut list = Value::Null;
    for _ in 0..200 {
        let (s, v) = call(&app, "GET", "/sessions/c1/history", None).await;
        assert_eq!(s, StatusCode::OK);
        list = v;
        if list.as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let turn = list[0]["turn"].as_u64().expect("a kept checkpoint");
    let (s, v) = call(&app, "GET", &format!("/sessions/c1/history/{turn}"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    note("get", "/sessions/{id}/history/{turn}", s);
    let (s, v) = call(
        &app,
        "POST",
        &format!("/sessions/c1/history/{turn}/fork"),
        Some(json!({"id": "c1-fork", "history": 2})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    note("post", "/sessions/{id}/history/{turn}/fork", s);

    // Timers: armed, listed, canceled.
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/c1/timers",
        Some(json!({"item": {"id": 9, "text": "later"}, "in": "1h"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    note("post", "/sessions/{id}/timers", s);
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/c1/timers",
        Some(json!({"item": {"id": 10, "text": "daily"}, "schedule": "every 1d"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let timer = v["id"].as_u64().expect("a timer id");
    let (s, v) = call(&app, "GET", "/sessions/c1/timers", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["timers"].as_array().map(Vec::len), Some(2));
    note("get", "/sessions/{id}/timers", s);
    let (s, _) = call(
        &app,
        "DELETE",
        &format!("/sessions/c1/timers/{timer}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    note("delete", "/sessions/{id}/timers/{timer}", s);
    let (s, v) = call(&app, "DELETE", "/sessions/c1/timers/99", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "unknown_timer"));
    let (s, v) = call(&app, "DELETE", "/sessions/c1/timers/x", None).await;
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, "bad_request"));

    // Stop it: the stream ends with `ended`.
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/c1/stop",
        Some(json!({"mode": "graceful", "timeout": "5s", "cause": "contract"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    note("post", "/sessions/{id}/stop", s);
    let text = read_until(events.body_mut(), "ended").await;
    assert!(sse_events(&text)
        .iter()
        .any(|(_, n, _)| n == "stop_requested"));
    // The fork runs: detach it, cancel another, resume refused, move refused.
    let (s, v) = call(&app, "POST", "/sessions/c1-fork/detach", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    note("post", "/sessions/{id}/detach", s);
    let (s, _) = spawn(&app, json!({"id": "c2", "kind": "sim"})).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, v) = call(&app, "POST", "/sessions/c2/cancel", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    note("post", "/sessions/{id}/cancel", s);
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/c1/resume",
        Some(json!({"answer": {"id": 2, "text": "yes"}})),
    )
    .await;
    // (c1 completed its work: its record is gone, or it awaits nothing.)
    assert!(
        matches!(code(&v), "unknown_session" | "wrong_state"),
        "{s} {v}"
    );
    note("post", "/sessions/{id}/resume", s);
    let (s, v) = call(&app, "POST", "/sessions/c1/move", Some(json!({"to": "n2"}))).await;
    assert!(s.is_client_error() || s.is_server_error(), "{s} {v}");
    note("post", "/sessions/{id}/move", s);

    // Errors of the shapes the document names.
    for want in [StatusCode::CREATED, StatusCode::CONFLICT] {
        let (s, v) = spawn(&app, json!({"id": "c3", "kind": "sim"})).await;
        assert_eq!(s, want, "{v}");
    }
    let (s, v) = spawn(&app, json!({"id": "x", "kind": "sim", "bogus": 1})).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{v}"
    );
    let (s, v) = call(&app, "GET", "/sessions/nobody", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "unknown_session"));
    let (s, v) = call(&app, "GET", "/sessions/nobody/timers", None).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::NOT_FOUND, "unknown_session"),
        "{v}"
    );
    // A session that runs here without a record has no timers, and exists.
    let (s, v) = call(&app, "GET", "/sessions/c3/timers", None).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"timers": []})));
    let (s, v) = call(&app, "GET", "/sessions?limit=0", None).await;
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, "bad_request"));
    let (s, v) = call(&app, "GET", "/sessions/c1/history/999", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "unknown_checkpoint"));
    let (s, v) = call(&app, "GET", "/nowhere", None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));

    // A foreign `Host` is refused on every route, the public ones too (no token): a
    // documented 403 there as well.
    for p in ["/", "/healthz", "/openapi.json", "/sessions"] {
        let req = Request::builder()
            .uri(p)
            .header("host", "evil.example")
            .body(Body::empty())
            .unwrap();
        let resp = send(&app, req).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{p}");
    }

    // Delete: the fork's record (detached, so finalized) is stored.
    let mut deleted = StatusCode::NOT_FOUND;
    for _ in 0..200 {
        let (s, v) = call(&app, "DELETE", "/sessions/c1-fork", None).await;
        deleted = s;
        if s == StatusCode::OK || code(&v) == "unknown_session" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    note("delete", "/sessions/{id}", deleted);

    // Every operation had a real answer checked against the document.
    let answered: BTreeSet<(String, String)> = seen
        .iter()
        .map(|(m, p, _)| (m.clone(), p.clone()))
        .collect();
    for op in operations() {
        assert!(answered.contains(&op), "no answer of {op:?} was checked");
    }
    // The `not_live` event of a stream for a session stored but not live is a
    // documented event too.
    check_event(
        "not_live",
        &json!({"code": "not_live", "message": "retry", "retry_after_ms": 500}),
    );
    rt.shutdown().await.unwrap();
}

/// The routes `auth.rs` passes without a token even when one is configured.
const PUBLIC: [&str; 4] = ["/", "/healthz", "/readyz", "/openapi.json"];

/// Issue 53: every operation has a `summary` (what generators name and document a
/// method by, and Redocly's `operation-summary` asks for), the document has `servers`,
/// the public routes say `security: []` and every other route takes the bearer or
/// nothing (`[{"bearer": []}, {}]` at the root, which they inherit: a server may run
/// without a token, and a client generated from the one document must work with it).
#[test]
fn every_operation_has_a_summary_and_says_which_token_it_takes() {
    let doc = document();
    let servers = doc["servers"].as_array().expect("servers");
    assert!(!servers.is_empty());
    let first = servers[0]["url"].as_str().expect("a server url");
    assert!(
        first.starts_with("http://") && !first.contains('{'),
        "servers[0] is the URL generators default to: a literal absolute one ({first})"
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let optional = json!([{"bearer": []}, {}]);
    assert_eq!(doc["security"], optional, "the root's security");
    for (method, path) in operations() {
        let op = &doc["paths"][&path][&method];
        let summary = op["summary"].as_str().unwrap_or("");
        assert!(
            !summary.trim().is_empty() && !summary.contains('\n') && summary.len() <= 60,
            "{method} {path}: a one-line summary, not {summary:?}"
        );
        if PUBLIC.contains(&path.as_str()) {
            assert_eq!(op["security"], json!([]), "{method} {path} is public");
        } else {
            assert_eq!(
                effective_security(&method, &path),
                optional,
                "{method} {path}: the bearer, or nothing where no token is configured"
            );
        }
    }
}

/// An operation's security: its own, else the document's.
fn effective_security(method: &str, path: &str) -> Value {
    let doc = document();
    doc["paths"][path][method]
        .get("security")
        .unwrap_or(&doc["security"])
        .clone()
}

/// What the document says of the token is what a server with one checks: every route
/// whose `security` is not `[]` answers 401 without the token, no public one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_security_is_what_a_server_with_a_token_checks() {
    let rt = runtime().await;
    let app = agentloop_http::router(
        &rt,
        agentloop_http::HttpOptions {
            token: Some("s3cr3t-0p3n4p1".into()),
            ..Default::default()
        },
    );
    for (method, path) in operations() {
        let public = effective_security(&method, &path) == json!([]);
        let concrete = path
            .replace("{id}", "s-openapi")
            .replace("{turn}", "1")
            .replace("{timer}", "1");
        let body = (method == "post").then(|| json!({}));
        let (status, v) = call(&app, &method.to_ascii_uppercase(), &concrete, body).await;
        if public {
            assert!(
                status.is_success(),
                "{method} {path} is documented public, yet answers {status} {v}"
            );
        } else {
            assert_eq!(
                (status, code(&v)),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{method} {path} is documented as taking the token"
            );
        }
    }
    rt.shutdown().await.unwrap();
}

/// Issue 53: the event stream's schema is a oneOf of one envelope per event as
/// SSE-aware generators read `text/event-stream` (hey-api lost the event's name with
/// the old `enum` of one value): `event` a `const`, `data` a reference to the event's
/// own schema, `id` the event's number (`not_live`: `retry` instead).
#[test]
fn each_event_of_the_stream_names_its_data_schema() {
    let doc = document();
    let media = &doc["paths"]["/sessions/{id}/events"]["get"]["responses"]["200"]["content"]
        ["text/event-stream"];
    assert_eq!(
        media["schema"]["$ref"], "#/components/schemas/StreamEvent",
        "{media}"
    );
    let members = doc["components"]["schemas"]["StreamEvent"]["oneOf"]
        .as_array()
        .expect("StreamEvent is a oneOf");
    let mut names = BTreeSet::new();
    for m in members {
        let props = &m["properties"];
        let name = props["event"]["const"]
            .as_str()
            .unwrap_or_else(|| panic!("an event whose name is not a const: {m}"));
        assert!(props["event"].get("enum").is_none(), "{m}");
        assert!(names.insert(name.to_string()), "{name} twice");
        let data = props["data"]["$ref"]
            .as_str()
            .unwrap_or_else(|| panic!("`{name}`'s data names no schema: {m}"));
        let schema = data
            .strip_prefix("#/components/schemas/")
            .expect("a schema");
        assert!(doc["components"]["schemas"].get(schema).is_some(), "{data}");
        assert_eq!(m["required"], json!(["data", "event"]), "{name}");
        let line = if name == "not_live" { "retry" } else { "id" };
        assert!(props.get(line).is_some(), "`{name}` has no `{line}`: {m}");
    }
    let listed: BTreeSet<String> = agentloop_http::openapi::EVENT_KINDS
        .into_iter()
        .map(str::to_string)
        .collect();
    assert_eq!(names, listed);
}

/// Issue 53: no schema is named as one of its properties (`Timers.timers`): the
/// Python openapi-python-client generates binds the model's snake-case name as a
/// local in `from_dict` beside each property's, so such a model fails `mypy --strict`.
#[test]
fn no_schema_is_named_as_one_of_its_properties() {
    fn snake(name: &str) -> String {
        let mut out = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    }
    fn properties(schema: &Value, out: &mut BTreeSet<String>) {
        if let Some(p) = schema["properties"].as_object() {
            out.extend(p.keys().cloned());
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            for member in schema[key].as_array().into_iter().flatten() {
                properties(member, out);
            }
        }
    }
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let mut collisions = Vec::new();
    for (name, schema) in schemas {
        let mut props = BTreeSet::new();
        properties(schema, &mut props);
        if props.contains(&snake(name)) {
            collisions.push(name.clone());
        }
    }
    assert!(collisions.is_empty(), "named as a property: {collisions:?}");
    assert!(schemas.contains_key("TimerList"));
}
