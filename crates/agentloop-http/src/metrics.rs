//! `GET /metrics` (issue 17, S35): the runtime's counters and histograms
//! ([`agentloop::metrics::RuntimeMetrics`]) plus readings taken at scrape time, encoded
//! by the Prometheus client library in the OpenMetrics text format (which Prometheus
//! scrapes):
//!
//! - `agentloop_sessions{status}`: `live` sessions in this process, `sleeping` ones
//!   (S39: held as a hash of their id, their records on disk), and stored records
//!   by status (`running`, `stopped`, `interrupted`, `completed`, `canceled`, `failed`,
//!   `unreadable`); listing the records costs one store scan per scrape.
//! - `agentloop_sessions_known{status}`: every session known at every door (S26a: it
//!   runs, or its record, checkpoint history or kept events remain) by the status
//!   `GET /sessions` shows it with (`agentloop::lifecycle::judge`), `unreadable` for a
//!   record that does not decode; one more store scan per scrape for the kept ones.
//! - `agentloop_sessions_by_version{kind,version}`: stored sessions not finished yet
//!   by agent kind and the version that wrote their record (S40): what a deploy must
//!   still run or migrate.
//! - `agentloop_event_streams`: event streams open now.
//! - `agentloop_draining`: 1 once the shutdown began.
//!
//! This module only reads; it counts nothing itself.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::sessions::{AppState, Ev, Item};
use crate::{wire, ApiError};

/// Ids on one page of kept sessions a scrape reads (S26a); it reads pages until one
/// is short.
const KEPT_PAGE: usize = 10_000;

/// The OpenMetrics text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Metrics (OpenMetrics text).
#[utoipa::path(
    get, path = "/metrics", operation_id = "metrics", tag = "probes",
    responses((status = 200, description = "OpenMetrics text: turns, pushes, steps, checkpoints, sessions (docs/http.md, Metrics)", content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String),
        (status = 500, description = "`internal`: the store could not be listed", body = crate::schemas::ErrorBody))
)]
pub(crate) async fn metrics<I: Item, E: Ev>(
    State(st): State<AppState<I, E>>,
) -> Result<Response, ApiError> {
    // Every reading first: the registry is not `Send`, so no await may follow it.
    let counts = st.runtime.supervisor().counts().await;
    let stored = match st.runtime.store() {
        Some(store) => store.list_stored(None).await?,
        None => Vec::new(),
    };
    let draining = st.runtime.shutdown_handle().is_started().await;
    // The ids stored with a record; a session's liveness is read from the supervisor's
    // directory per id (no list of every live session is built for a scrape).
    let recorded: std::collections::HashSet<&str> =
        stored.iter().map(|e| e.session_id.as_str()).collect();
    let supervisor = st.runtime.supervisor();
    // S26a: the sessions kept only as history or events (no record), page by page.
    let mut kept_only: Vec<String> = Vec::new();
    if let Some(store) = st.runtime.store() {
        let mut after: Option<String> = None;
        loop {
            let page = store.list_kept_page(after.as_deref(), KEPT_PAGE).await?;
            let done = page.len() < KEPT_PAGE;
            after = page.last().cloned();
            kept_only.extend(
                page.into_iter()
                    .filter(|id| !recorded.contains(id.as_str())),
            );
            if done {
                break;
            }
        }
    }

    let mut registry = Registry::default();
    st.runtime.metrics().register(&mut registry);
    let sessions = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    sessions
        .get_or_create(&vec![("status", "live")])
        .set(counts.live as i64);
    sessions
        .get_or_create(&vec![("status", "sleeping")])
        .set(counts.sleeping as i64);
    for entry in &stored {
        let status = match &entry.record {
            Ok(stored) => wire::status(stored.status()),
            Err(_) => "unreadable",
        };
        sessions.get_or_create(&vec![("status", status)]).inc();
    }
    registry.register(
        "agentloop_sessions",
        "Sessions live in this process (status=live), asleep (status=sleeping, S39), and stored records by status",
        sessions,
    );
    // S26a: every session known, with the status every door shows (the one judgement).
    let known = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    for l in agentloop::lifecycle::Lifecycle::ALL {
        let _ = known.get_or_create(&vec![("status", l.as_str())]);
    }
    let judge = |facts: agentloop::lifecycle::Facts<'_>| {
        if let Some(l) = agentloop::lifecycle::judge(facts) {
            known.get_or_create(&vec![("status", l.as_str())]).inc();
        }
    };
    let mut live_with_record = 0usize;
    for entry in &stored {
        let live = supervisor.is_live(&entry.session_id);
        live_with_record += usize::from(live);
        match &entry.record {
            Ok(record) => judge(agentloop::lifecycle::Facts {
                live,
                record: Some(record.status()),
                asleep: crate::sessions::read::asleep(record),
                kept_beyond_record: false,
            }),
            Err(_) => {
                known.get_or_create(&vec![("status", "unreadable")]).inc();
            }
        }
    }
    for id in &kept_only {
        let live = supervisor.is_live(id);
        live_with_record += usize::from(live);
        judge(agentloop::lifecycle::Facts {
            live,
            kept_beyond_record: true,
            ..Default::default()
        });
    }
    // Live with nothing stored (not persistent, or its first write not landed yet):
    // running, whatever else is kept.
    let unstored = counts.live.saturating_sub(live_with_record);
    known
        .get_or_create(&vec![(
            "status",
            agentloop::lifecycle::Lifecycle::Running.as_str(),
        )])
        .inc_by(unstored as i64);
    registry.register(
        "agentloop_sessions_known",
        "Every session known at every door (S26a: running here or elsewhere, or its record, checkpoint history or kept events remain) by the status GET /sessions shows",
        known,
    );
    // S40: which versions of each kind the stored sessions that may still run need.
    let by_version = Family::<Vec<(&'static str, String)>, Gauge>::default();
    for entry in &stored {
        if let Ok(stored) = &entry.record {
            if !stored.status().is_terminal() {
                let kind = crate::sessions::kind_of(stored).to_string();
                let version = agentloop::versions::version_of(stored).to_string();
                by_version
                    .get_or_create(&vec![("kind", kind), ("version", version)])
                    .inc();
            }
        }
    }
    registry.register(
        "agentloop_sessions_by_version",
        "Stored sessions not yet finished (running, sleeping, stopped, interrupted) by agent kind and the version of it that wrote their record (S40)",
        by_version,
    );
    let streams = Gauge::<i64>::default();
    streams.set(st.streams.held() as i64);
    registry.register(
        "agentloop_event_streams",
        "Event streams (SSE) open now",
        streams,
    );
    let gauge = Gauge::<i64>::default();
    gauge.set(i64::from(draining));
    registry.register(
        "agentloop_draining",
        "1 once the shutdown began (the drain gate is closed)",
        gauge,
    );
    if let Some(extra) = &st.metrics_extra {
        extra(&mut registry);
    }

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the metrics could not be encoded: {e}"),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response())
}
