//! Issue 52: one `GET /sessions` page costs what it returns. Among 20 000 stored
//! records and a few live sessions, a page of five reads at most six records (the page
//! and one to know whether more follow), where a whole listing reads every one; the
//! pages keep their shape, their order and their `Link` to the next.

use std::sync::Arc;

use agentloop::store::MemoryStore;
use agentloop::{store::SessionRecord, store::SessionStatus, CheckpointStore, Runtime};
use agentloop_http::{router, HttpOptions};
use agentloop_sim::{SimEvent, SimItem};
use axum::http::StatusCode;
use serde_json::{json, Value};

mod common;
use common::*;

/// A page's rows (id, live) and its `Link` header.
async fn page(app: &axum::Router, uri: &str) -> (Vec<(String, bool)>, Option<String>) {
    let resp = get(app, uri).await;
    assert_eq!(resp.status(), StatusCode::OK, "{uri}");
    let link = resp
        .headers()
        .get("link")
        .map(|v| v.to_str().unwrap().to_string());
    let (_, bytes) = status_body(resp).await;
    let rows: Value = serde_json::from_slice(&bytes).unwrap();
    let rows = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["live"] == json!(true),
            )
        })
        .collect();
    (rows, link)
}

fn ids(rows: &[(String, bool)]) -> Vec<&str> {
    rows.iter().map(|(id, _)| id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_sessions_reads_only_the_records_it_lists() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .register_agent("sim", |_cfg: &[u8]| Ok(react_agent()))
        .flush_logs(None)
        .start()
        .await
        .unwrap();
    for n in 0..20_000u32 {
        let mut r = SessionRecord::new(format!("s{n:05}"), "sim", 3);
        r.status = SessionStatus::Stopped;
        store.insert(r);
    }
    let app = router(&rt, HttpOptions::default());
    // Two live sessions between stored ids.
    for id in ["s00004a", "s00006a"] {
        let (s, v) = spawn(&app, json!({"id": id, "kind": "sim"})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    let before = store.records_listed();
    let (rows, link) = page(&app, "/sessions?limit=5&after=s00003").await;
    assert_eq!(
        ids(&rows),
        ["s00004", "s00004a", "s00005", "s00006", "s00006a"]
    );
    let live: Vec<bool> = rows.iter().map(|(_, live)| *live).collect();
    assert_eq!(live, [false, true, false, false, true]);
    assert_eq!(
        link.as_deref(),
        Some("</sessions?limit=5&after=s00006a>; rel=\"next\"")
    );
    let read = store.records_listed() - before;
    assert!(read <= 6, "a page of 5 read {read} records of 20 000");

    // The next page from the Link, and the last one (no Link).
    let before = store.records_listed();
    let (rows, _) = page(&app, "/sessions?limit=5&after=s00006a").await;
    assert_eq!(
        ids(&rows),
        ["s00007", "s00008", "s00009", "s00010", "s00011"]
    );
    let (rows, link) = page(&app, "/sessions?limit=5&after=s19997").await;
    assert_eq!(ids(&rows), ["s19998", "s19999"]);
    assert_eq!(link, None, "the last page");
    let read = store.records_listed() - before;
    assert!(read <= 12, "two pages of 5 read {read} records");

    // The counter counts what a whole listing reads: the bound above means something.
    let before = store.records_listed();
    let all = store.list_stored(None).await.unwrap();
    assert!(all.len() >= 20_000);
    assert_eq!(store.records_listed() - before, all.len() as u64);
    rt.shutdown().await.unwrap();
}
