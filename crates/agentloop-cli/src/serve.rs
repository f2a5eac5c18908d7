//! `agentloop serve` (issue 17, S33–S35): the runtime as a service. Sessions of the
//! simulated agent (kind `sim`, configured by JSON `{"rounds", "model_ms",
//! "tool_ms"}`, each optional) on the data directory (sled by default), served by
//! `agentloop-http`'s router: REST, Server-Sent Events, `/metrics`, the live page.
//!
//! Shutdown is the runtime's: Ctrl+C or SIGTERM closes the drain gate (`/readyz` and
//! new work answer 503), stops every session (each event stream ends with `ended`,
//! reason `shutdown`), saves them `Interrupted`; the HTTP server then finishes the
//! requests in flight and closes. The next `agentloop serve` on the directory resumes
//! them. This file owns the service's flow and output; routes are `agentloop-http`'s.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agentloop::config::RuntimeConfig;
use agentloop::shutdown::{listen_for_signals, Signal};
use agentloop::Runtime;
use agentloop_http::HttpOptions;
use agentloop_sim::{SimEvent, SimItem};

use crate::cli::ServeFlags;
use crate::report_table::report_table;
use crate::run::{engine_from_flags, AgentConfig, ItemLog};

/// Where `agentloop serve` listens unless told otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7420";

/// How long the HTTP server may take to finish its requests once the runtime has shut
/// down; connections still open then are closed.
const HTTP_CLOSE: Duration = Duration::from_secs(5);

/// Prints a line to stdout at once (tests and operators read it as it happens).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// The token from `--token-file`, `--token` or `AGENTLOOP_TOKEN` (clap reads it into
/// `--token`), if any: checked by `check_bind` like the file's. A token given on the
/// command line shows in `ps`: warned.
fn token(flags: &ServeFlags) -> Result<Option<String>, String> {
    if let Some(path) = &flags.token_file {
        warn_if_others_read(path, "the token file");
        let text = agentloop::operator_file::read_text(path, "the token file (--token-file)")
            .map_err(|e| e.to_string())?;
        let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
        return Ok(Some(first.to_string()));
    }
    let Some(t) = &flags.token else {
        return Ok(None);
    };
    if std::env::var("AGENTLOOP_TOKEN").ok().as_deref() != Some(t.as_str()) {
        tracing::warn!(
            "the bearer token was given with --token, so any user of this machine can read it \
             in the process list; pass it in AGENTLOOP_TOKEN or with --token-file instead"
        );
    }
    Ok(Some(t.clone()))
}

/// Warns (S43) when a file holding a secret can be read by users other than its owner.
fn warn_if_others_read(path: &std::path::Path, what: &str) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    mode = format!("{:o}", mode & 0o777),
                    "{what} can be read by other users of this machine: make it readable by its owner alone (chmod 600)"
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what);
}

/// The provider kind `chat` calls, when `--model-url` is given (docs/models.md).
fn chat_provider(flags: &ServeFlags) -> Result<Option<agentloop_openai::Provider>, String> {
    let (Some(url), Some(model)) = (&flags.model_url, &flags.model) else {
        return Ok(None);
    };
    let mut b = agentloop_openai::Provider::builder(url.clone(), model.clone())
        .max_concurrency(flags.model_concurrency.unwrap_or(8));
    b = model_bounds(b, flags);
    if let Some(name) = &flags.model_provider {
        b = b.name(name.clone());
    }
    b = match (&flags.model_key_env, &flags.model_key_file) {
        (Some(var), _) => b.api_key_from_env(var).map_err(|e| e.to_string())?,
        (None, Some(file)) => b.api_key(model_key(file)?),
        (None, None) if std::env::var_os("OPENAI_API_KEY").is_some() => b
            .api_key_from_env("OPENAI_API_KEY")
            .map_err(|e| e.to_string())?,
        (None, None) => b,
    };
    let provider = b.build().map_err(|e| format!("--model-url: {e}"))?;
    tracing::info!(url = %url, model = %model, provider = %provider.name(), "serving agent kind `chat`");
    Ok(Some(provider))
}

/// The API key in `--model-key-file` (its first line, trimmed), read with a size bound
/// (issue 52).
fn model_key(file: &std::path::Path) -> Result<String, String> {
    let text =
        agentloop::operator_file::read_text(file, "the model API key file (--model-key-file)")
            .map_err(|e| e.to_string())?;
    let key = text.lines().next().unwrap_or("").trim().to_string();
    if key.is_empty() {
        return Err(format!(
            "the model API key file (--model-key-file) {} is empty: put the key on its first line",
            file.display()
        ));
    }
    Ok(key)
}

/// The model server bounds the flags set (issue 52); the others keep their defaults.
fn model_bounds(
    mut b: agentloop_openai::ProviderBuilder,
    flags: &ServeFlags,
) -> agentloop_openai::ProviderBuilder {
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    if let Some(t) = flags.model_first_byte_timeout {
        b = b.first_byte_timeout(t);
    }
    if let Some(t) = flags.model_call_timeout {
        b = b.call_timeout(t);
    }
    if let Some(t) = flags.model_idle_timeout {
        b = b.idle_timeout(t);
    }
    if let Some(n) = flags.model_max_response_bytes {
        b = b.max_response_bytes(n);
    }
    if let Some(n) = flags.model_max_text_bytes {
        b = b.max_text_bytes(size(n));
    }
    if let Some(n) = flags.model_max_tool_calls {
        b = b.max_tool_calls(size(n));
    }
    if let Some(n) = flags.model_max_tool_argument_bytes {
        b = b.max_tool_argument_bytes(size(n));
    }
    if let Some(n) = flags.model_max_line_bytes {
        b = b.max_line_bytes(size(n));
    }
    if let Some(n) = flags.model_max_error_body_bytes {
        b = b.max_error_body_bytes(size(n));
    }
    b
}

/// A `chat` session's agent: its spawn configuration may set `{"system": "…"}`.
fn chat_agent(
    provider: &agentloop_openai::Provider,
    config: &[u8],
) -> Result<agentloop_openai::ChatAgent<SimItem, SimEvent>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ChatConfig {
        system: Option<String>,
    }
    let mut agent = agentloop_openai::ChatAgent::new(provider.clone());
    if config.is_empty() || config == b"null" {
        return Ok(agent);
    }
    let c: ChatConfig = serde_json::from_slice(config).map_err(|e| {
        format!(
            "not a chat agent configuration ({}): send {{\"system\": \"instructions\"}}, or nothing",
            agentloop_http::plain_serde_message(&e.to_string())
        )
    })?;
    if let Some(s) = c.system {
        agent = agent.system(s);
    }
    Ok(agent)
}

pub(crate) async fn serve(flags: ServeFlags) -> Result<bool, String> {
    let mut config =
        RuntimeConfig::load(flags.store.config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(dir) = &flags.store.data_dir {
        config.store.data_dir = dir.clone();
    }
    if let Some(idle) = flags.idle_after {
        // The file's bounds apply to the flag too.
        config.supervisor.idle_after = Some(
            agentloop::config::check_idle_after(idle).map_err(|e| format!("--idle-after: {e}"))?,
        );
    }
    let (engine, durability) = (flags.store.engine_name(), flags.store.durability_name());
    if engine.is_some() || durability.is_some() {
        config.store.engine = engine_from_flags(&config, engine.as_deref(), durability.as_deref())?;
    }
    let listen = flags
        .listen
        .clone()
        .or_else(|| config.http.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let addr: SocketAddr = listen.parse().map_err(|e| {
        format!("--listen `{listen}` is not an address ({e}); write e.g. 127.0.0.1:7420")
    })?;
    // Every replay from the store shares one pace (issue 52).
    agentloop::events::set_replay_rate(config.limits.replay_rate);
    let mut options = HttpOptions {
        body_limit: config.http.body_limit,
        body_read_timeout: config.http.body_read_timeout,
        // The flag (or AGENTLOOP_TOKEN, read by clap) or the token file over the file.
        token: token(&flags)?.or_else(|| config.http.token.clone()),
        max_requests: config.http.max_requests,
        max_event_streams: config.http.max_event_streams,
        cors_origins: config.http.cors_origins.clone(),
        max_replay: Some(config.limits.replay),
        max_duration: Some(config.limits.duration),
        access_log: config.http.access_log,
        memory_budget: config.limits.memory_budget(),
        ..HttpOptions::default()
    };
    agentloop_http::check_bind(addr, &options)?;
    // S43: TLS at the front, read before anything starts (a bad file fails fast).
    // The flags over the file's [http] tls_cert and tls_key.
    let files = match (&flags.tls_cert, &flags.tls_key) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        _ => config
            .http
            .tls_cert
            .clone()
            .zip(config.http.tls_key.clone()),
    };
    let tls = match files {
        Some((cert, key)) => {
            warn_if_others_read(&key, "the TLS private key");
            // Files read off the tokio worker.
            let config = tokio::task::spawn_blocking(move || {
                agentloop_http::tls::server_config(&cert, &key)
            })
            .await
            .map_err(|e| format!("reading the TLS files failed: {e}"))?;
            Some(config.map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let data_dir = config.store.data_dir.clone();
    // Where the records live, for messages: the data directory, or the PostgreSQL
    // server (issue 18).
    // S15b: the level in force, on every store (PostgreSQL takes it from the same
    // flag and key as the embedded engines).
    let level = config.store.engine.durability();
    let place = match &flags.postgres {
        Some(url) => format!(
            "{}, PostgreSQL, durability {level}: {}",
            crate::sessions::postgres_name(url),
            level.survives()
        ),
        None => format!(
            "{}, {}: {}",
            data_dir.display(),
            config.store.engine,
            level.survives()
        ),
    };
    let shared = match &flags.postgres {
        Some(url) => Some(
            agentloop_postgres::PostgresStore::<SimItem>::connect(
                agentloop_postgres::PostgresOptions::new(url.clone()).durability(level),
            )
            .await
            .map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?,
        ),
        None => None,
    };

    let item_log = match &flags.item_log {
        Some(path) => Some(Arc::new(ItemLog::open(path)?)),
        None => None,
    };
    let limits = config.limits;
    let chat = chat_provider(&flags)?;
    let metrics_extra = chat.clone().map(|p| {
        Arc::new(move |r: &mut prometheus_client::registry::Registry| p.register_metrics(r))
            as agentloop_http::MetricsHook
    });
    options.metrics_extra = metrics_extra;
    let builder = Runtime::<SimItem, SimEvent>::builder()
        .config(&config)
        // S20a: sessions spawned over HTTP keep their events; resumed ones too.
        .keep_events();
    let mut builder = flags.store.versions.register(builder, move |bytes: &[u8]| {
        Ok(AgentConfig::from_json(bytes, &limits)?.logged_agent(item_log.as_ref()))
    });
    if let Some(provider) = chat {
        builder = builder.register_agent("chat", move |bytes: &[u8]| chat_agent(&provider, bytes));
    }
    if let Some(store) = shared {
        builder = builder.store(Arc::new(store));
    }
    if let Some(name) = &flags.node {
        builder = builder.node(name.clone());
    }
    if flags.rebalance {
        builder = builder.rebalance(agentloop::cluster::rebalance::Rebalance::default());
    }
    let (rt, start) = builder
        .start()
        .await
        .map_err(|e| format!("cannot start on {place}: {e}"))?;
    // A node of a cluster on ractor_cluster: requests for sessions other nodes run are
    // forwarded to their owners (issue 18).
    let _node = match (&flags.node, &flags.cluster_listen) {
        (Some(name), Some(listen)) => {
            let listen: SocketAddr = listen.parse().map_err(|e| {
                format!("--cluster-listen `{listen}` is not an address ({e}); write e.g. 10.0.0.11:7520")
            })?;
            let Some(cookie) = flags.cookie.clone() else {
                let _ = rt.shutdown().await;
                return Err("--cluster-listen needs --cookie (or AGENTLOOP_COOKIE): the secret every node of the cluster shares".into());
            };
            // S43: mutual TLS between nodes when its three files are given: the flags,
            // else the file's [cluster] table.
            let files = match (
                &flags.cluster_tls_cert,
                &flags.cluster_tls_key,
                &flags.cluster_ca,
            ) {
                (Some(cert), Some(key), Some(ca)) => (Some(cert), Some(key), Some(ca)),
                _ => (
                    config.cluster.tls_cert.as_ref(),
                    config.cluster.tls_key.as_ref(),
                    config.cluster.ca.as_ref(),
                ),
            };
            let tls = match files {
                (Some(cert), Some(key), Some(ca)) => {
                    warn_if_others_read(key, "the node's TLS private key");
                    let (cert, key, ca) = (cert.clone(), key.clone(), ca.clone());
                    let read = tokio::task::spawn_blocking(move || {
                        agentloop_cluster::NodeTls::from_files(&cert, &key, &ca)
                    })
                    .await
                    .map_err(|e| agentloop_cluster::NodeError::Tls(e.to_string()))
                    .and_then(|r| r);
                    match read {
                        Ok(t) => Some(t),
                        Err(e) => {
                            let _ = rt.shutdown().await;
                            return Err(e.to_string());
                        }
                    }
                }
                _ => None,
            };
            let config = agentloop_cluster::NodeConfig {
                name: name.clone(),
                listen,
                cookie,
                join: flags.join.clone(),
                tls,
            };
            match agentloop_cluster::ClusterNode::start(&rt, config).await {
                Ok(node) => Some(node),
                Err(e) => {
                    let _ = rt.shutdown().await;
                    return Err(e.to_string());
                }
            }
        }
        _ => None,
    };
    let shutdown = rt.shutdown_handle();
    // Bound before the signal handlers: a port in use fails before anything waits.
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            let _ = rt.shutdown().await;
            return Err(format!(
                "cannot listen on {addr}: {e}; choose another --listen address (port 0 picks a free one)"
            ));
        }
    };
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    let signals = listen_for_signals(shutdown.clone(), |sig: Signal, n: usize| {
        if n == 1 {
            say!("agentloop: {sig} received: draining (readyz answers 503), stopping sessions, saving them (send it again to force)");
        } else if n == 2 {
            say!("agentloop: second signal ({sig}): forcing the shutdown");
        }
    })
    .map_err(|e| format!("cannot install the signal handlers: {e}"))?;

    let app = agentloop_http::router(&rt, options.clone());
    // A bounded number of connections, and a header read timeout (S34a).
    let defaults = agentloop_http::server::ServeOptions::default();
    let serve_options = agentloop_http::server::ServeOptions {
        max_connections: config
            .http
            .max_connections
            .unwrap_or(defaults.max_connections),
        header_read_timeout: config
            .http
            .header_read_timeout
            .unwrap_or(defaults.header_read_timeout),
        write_timeout: config.http.write_timeout.unwrap_or(defaults.write_timeout),
        max_connections_per_peer: config.http.max_connections_per_peer,
        idle_timeout: config.http.idle_timeout.unwrap_or(defaults.idle_timeout),
        shutdown_write_timeout: config
            .http
            .shutdown_write_timeout
            .unwrap_or(defaults.shutdown_write_timeout),
        max_header_bytes: config
            .http
            .max_header_bytes
            .unwrap_or(defaults.max_header_bytes),
        tls,
    };
    let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(agentloop_http::server::serve(
        listener,
        app,
        serve_options,
        async move {
            let _ = close_rx.await;
        },
    ));
    say!(
        "agentloop: resumed {} session{} carrying {} item{} ({} recovered after their process died)",
        start.resumed.len(),
        plural(start.resumed.len()),
        start.items,
        plural(start.items),
        start.recovered,
    );
    for (id, why) in &start.skipped {
        say!("agentloop: not resumed: {id}: {why}");
    }
    match options.memory_budget {
        Some(b) => say!(
            "agentloop: memory budget {} MiB ([limits] memory; the process holds {} MiB now): over it, new work gets 503 over_memory",
            b.limit >> 20,
            agentloop::memory::used() >> 20
        ),
        None => say!("agentloop: no memory budget (the machine's memory could not be read; set [limits] memory)"),
    }
    say!(
        "agentloop: serving on {scheme}://{bound} ({}; data {place}{}, pid {}); Ctrl+C or SIGTERM shuts down gracefully",
        if options.token.is_some() { "bearer token required" } else { "no token: loopback only" },
        match &flags.node {
            Some(n) => format!(", node {n}"),
            None => String::new(),
        },
        std::process::id()
    );

    // Until a signal (or anything else) shut the runtime down.
    let report = shutdown
        .wait_report()
        .await
        .map_err(|_| "the shutdown coordinator is gone".to_string())?;
    // The sessions are down and every event stream ended: close the server, then
    // release the store.
    let _ = close_tx.send(());
    match tokio::time::timeout(HTTP_CLOSE, server).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the HTTP server task failed"),
        Err(_) => tracing::warn!(
            after = ?HTTP_CLOSE,
            "HTTP connections were still open after the shutdown; they were closed"
        ),
    }
    let _ = rt.shutdown().await;
    signals.abort();
    say!("{}", report_table(&report).trim_end());
    if report.checkpoints.failed > 0 || report.store_flush_error.is_some() {
        say!("agentloop: some records could not be written (see the report and the log)");
        return Ok(false);
    }
    if report.checkpoints.saved > 0 {
        say!(
            "agentloop: {} session{} saved Interrupted; the next `agentloop serve` on {place} resumes them",
            report.checkpoints.saved,
            plural(report.checkpoints.saved as usize),
        );
    }
    Ok(true)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
