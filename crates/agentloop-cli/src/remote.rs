//! The live commands (issue 17): `agentloop sessions list|show --server URL`,
//! `agentloop push|stop|cancel|resume|delete <id> --server URL` and `agentloop watch
//! <id> --server URL`, against a running `agentloop serve` (or any service that mounts
//! `agentloop-http`'s router). The token comes from `--token` or `AGENTLOOP_TOKEN`.
//!
//! Blocking HTTP (ureq), no tokio runtime. A push carries an `Idempotency-Key` made
//! for this invocation and is retried while the server cannot be reached or answers
//! `503 not_live` (issue 28: a restarted server recovering the session), so a retry
//! never delivers the item twice. `watch` prints every event and reconnects with the
//! last sequence number (`Last-Event-ID`) until the stream's `ended`, waiting as a
//! `not_live` event's `retry:` says. Server errors are printed as the server's
//! `code: message`. This module only talks HTTP; the server decides everything.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::time::Duration;

use serde_json::{json, Value};

use crate::Failure;

/// The longest a retry waits, whatever the server's `Retry-After` says.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);

/// An answer that is not a 2xx.
struct Refusal {
    status: u16,
    code: String,
    message: String,
    /// `Retry-After`, in seconds.
    retry_after: Option<u64>,
}

/// Where the server is and how to authenticate.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Server {
    base: String,
    token: Option<String>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Server {
    /// `url` without its trailing slash; `token` for `Authorization: Bearer`.
    pub(crate) fn new(url: &str, token: Option<String>) -> Result<Self, Failure> {
        let base = url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Failure::Usage {
                message: format!(
                    "--server `{url}` is not an http URL: write e.g. http://127.0.0.1:7420"
                ),
            });
        }
        if base.starts_with("https://") {
            return Err(Failure::Usage {
                message: format!(
                    "--server `{url}`: this build talks plain http; reach a TLS-terminating proxy's \
                     backend over http, or run the command where the server listens"
                ),
            });
        }
        Ok(Server { base, token })
    }

    fn agent(timeout: Option<Duration>) -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(timeout)
            .build()
            .into()
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    fn unreachable(&self, e: ureq::Error) -> Failure {
        Failure::Error(self.unreachable_text(e))
    }

    fn unreachable_text(&self, e: ureq::Error) -> String {
        format!(
            "cannot reach the server at {}: {e}; is `agentloop serve` running there?",
            self.base
        )
    }

    /// One request; the JSON answer of a 2xx, else the server's error.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        self.call_with(method, path, body, &[])
    }

    fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, Failure> {
        match self.call_raw(method, path, body, headers) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(r)) => Err(self.refused(r)),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    /// The server's refusal as a failure.
    fn refused(&self, r: Refusal) -> Failure {
        let hint = if r.status == 401 {
            " (pass the server's token with --token or AGENTLOOP_TOKEN)"
        } else {
            ""
        };
        Failure::Error(format!(
            "the server answered {} {}: {}{hint}",
            r.status, r.code, r.message
        ))
    }

    /// One request: the JSON of a 2xx, the server's refusal, or why it was not reached.
    fn call_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Result<Value, Refusal>, ureq::Error> {
        let url = format!("{}{path}", self.base);
        let agent = Self::agent(Some(Duration::from_secs(60)));
        let result = match (method, body) {
            ("GET", _) => {
                let mut r = self.auth(agent.get(&url));
                for (k, v) in headers {
                    r = r.header(*k, *v);
                }
                r.call()
            }
            ("DELETE", _) => self.auth(agent.delete(&url)).call(),
            (_, b) => {
                let mut r = self.auth(agent.post(&url));
                for (k, v) in headers {
                    r = r.header(*k, *v);
                }
                r.send_json(b.cloned().unwrap_or_else(|| json!({})))
            }
        };
        let mut resp = result?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if (200..300).contains(&status) {
            return Ok(Ok(value));
        }
        Ok(Err(Refusal {
            status,
            code: value["code"].as_str().unwrap_or("error").to_string(),
            message: value["message"]
                .as_str()
                .unwrap_or("(no message)")
                .to_string(),
            retry_after,
        }))
    }
}

/// A JSON argument, or stdin for `-`.
pub(crate) fn json_arg(what: &str, text: &str) -> Result<Value, Failure> {
    let text = if text == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Failure::Error(format!("cannot read the {what} from stdin: {e}")))?;
        s
    } else {
        text.to_string()
    };
    serde_json::from_str(&text).map_err(|e| Failure::Usage {
        message: format!("the {what} is not JSON ({e}): write it like '{{\"id\": 1, \"text\": \"hi\"}}', or - to read stdin"),
    })
}

/// `sessions list --server`.
pub(crate) fn list(server: &Server, statuses: &[String], json: bool) -> Result<String, Failure> {
    let v = server.call("GET", "/sessions", None)?;
    let rows: Vec<Value> = v
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| {
            statuses.is_empty()
                || statuses.iter().any(|s| {
                    r["status"].as_str() == Some(s.as_str()) || (s == "live" && r["live"] == true)
                })
        })
        .collect();
    if json {
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        ));
    }
    if rows.is_empty() {
        return Ok("no sessions\n".into());
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                text(&r["id"]),
                // S40: the kind with the version the session runs or its record says.
                match r["version"].as_u64() {
                    Some(v) => format!("{} v{v}", text(&r["kind"])),
                    None => text(&r["kind"]),
                },
                text(&r["status"]),
                if r["live"] == true { "yes" } else { "no" }.into(),
                text(&r["restarts"]),
            ]
        })
        .collect();
    Ok(crate::text_table::table(
        &["ID", "KIND", "STATUS", "LIVE", "RESTARTS"],
        &table,
    ))
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => crate::text_table::cell(s),
        other => crate::text_table::cell(&other.to_string()),
    }
}

fn path(id: &str, suffix: &str) -> String {
    let mut p = String::from("/sessions/");
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            p.push(b as char);
        } else {
            p.push_str(&format!("%{b:02X}"));
        }
    }
    p.push_str(suffix);
    p
}

/// `sessions show --server`.
pub(crate) fn show(server: &Server, id: &str) -> Result<String, Failure> {
    let v = server.call("GET", &path(id, ""), None)?;
    Ok(format!(
        "{}\n",
        serde_json::to_string_pretty(&v).unwrap_or_default()
    ))
}

/// `push <id> <item>`: with an idempotency key for this invocation, retried with that
/// key for up to `retry_for` while the server cannot be reached (a restart) or answers
/// `503 not_live` (the session is being recovered; waiting as its `Retry-After` says).
pub(crate) fn push(
    server: &Server,
    id: &str,
    item: Value,
    preempt: Option<&str>,
    key: Option<String>,
    retry_for: Duration,
) -> Result<String, Failure> {
    let mut body = json!({ "item": item });
    if let Some(at) = preempt {
        body["preempt"] = json!({ "at": at });
    }
    let key = key.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("cli-{}-{nanos}", std::process::id())
    });
    let deadline = std::time::Instant::now() + retry_for;
    let mut backoff = Duration::from_millis(100);
    loop {
        let answer = server.call_raw(
            "POST",
            &path(id, "/items"),
            Some(&body),
            &[("Idempotency-Key", &key)],
        );
        let (wait, why) = match answer {
            Ok(Ok(v)) => return Ok(format!("pushed to {id}: preempt {}\n", v["preempt"])),
            Ok(Err(r)) if r.status == 503 && r.code == "not_live" => {
                let wait = Duration::from_secs(r.retry_after.unwrap_or(1));
                (wait, format!("{}: {}", r.code, r.message))
            }
            Ok(Err(r)) => return Err(server.refused(r)),
            Err(e) => {
                backoff = (backoff * 2).min(Duration::from_secs(1));
                (backoff, server.unreachable_text(e))
            }
        };
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(Failure::Error(format!(
                "{why}; gave up after retrying for {} (--retry-for)",
                humantime::format_duration(retry_for)
            )));
        }
        let wait = wait.min(MAX_RETRY_WAIT).min(deadline - now);
        eprintln!(
            "agentloop: {why}; retrying in {} with the same Idempotency-Key",
            humantime::format_duration(Duration::from_millis(wait.as_millis() as u64))
        );
        std::thread::sleep(wait);
    }
}

/// `stop <id>`.
pub(crate) fn stop(server: &Server, id: &str, options: Value) -> Result<String, Failure> {
    server.call("POST", &path(id, "/stop"), Some(&options))?;
    Ok(format!("stopping {id}\n"))
}

/// `cancel <id>`.
pub(crate) fn cancel(server: &Server, id: &str) -> Result<String, Failure> {
    let v = server.call("POST", &path(id, "/cancel"), None)?;
    Ok(format!("{id}: {}\n", v["status"].as_str().unwrap_or("?")))
}

/// `resume <id> <answer>`.
pub(crate) fn resume(server: &Server, id: &str, answer: Value) -> Result<String, Failure> {
    server.call(
        "POST",
        &path(id, "/resume"),
        Some(&json!({ "answer": answer })),
    )?;
    Ok(format!("{id}: answered and resumed\n"))
}

/// `timer <id> <item> …`: arms a durable timer or schedule (S39).
pub(crate) fn arm_timer(server: &Server, id: &str, body: Value) -> Result<String, Failure> {
    let v = server.call("POST", &path(id, "/timers"), Some(&body))?;
    let due = v["due_ms"]
        .as_u64()
        .map(crate::timefmt::utc)
        .unwrap_or_else(|| "?".into());
    Ok(match v["schedule"].as_str() {
        Some(s) => format!("{id}: schedule #{} ({s}), next due {due}\n", v["id"]),
        None => format!("{id}: timer #{} due {due}\n", v["id"]),
    })
}

/// `cancel-timer <id> <n>`.
pub(crate) fn cancel_timer(server: &Server, id: &str, timer: u64) -> Result<String, Failure> {
    server.call("DELETE", &path(id, &format!("/timers/{timer}")), None)?;
    Ok(format!("{id}: timer #{timer} canceled\n"))
}

/// `delete <id>`.
pub(crate) fn delete(server: &Server, id: &str) -> Result<String, Failure> {
    server.call("DELETE", &path(id, ""), None)?;
    Ok(format!("{id}: deleted (record and history)\n"))
}

/// `watch <id>`: prints `#<seq> <event> <data>` per event until `ended`, reconnecting
/// with `Last-Event-ID` when the connection drops (at most `reconnects` times in a row
/// without an event in between). A session that is stored but not live yet (a restarted
/// server recovering it, issue 28) answers a `not_live` event and the SSE `retry:` to
/// wait; watch waits that long and reconnects, for up to `NOT_LIVE_FOR` in a row.
/// An `ended` whose reason is `shutdown` is the server going away, not the session's
/// end: watch keeps reconnecting (for up to `NOT_LIVE_FOR`) and, with the events kept in
/// the store (S20a), misses nothing across the restart.
pub(crate) fn watch(server: &Server, id: &str, reconnects: u32) -> Result<(), Failure> {
    /// How long watch waits for a session that stays not live.
    const NOT_LIVE_FOR: Duration = Duration::from_secs(600);
    let mut last: Option<u64> = None;
    let mut failures = 0;
    let mut not_live_since: Option<std::time::Instant> = None;
    // The server said it was shutting down: reconnect until it is back.
    let mut restarting_since: Option<std::time::Instant> = None;
    let url = format!("{}{}", server.base, path(id, "/events"));
    let mut out = std::io::stdout().lock();
    loop {
        let mut req = server.auth(Server::agent(None).get(&url));
        if let Some(seq) = last {
            req = req.header("Last-Event-ID", &seq.to_string());
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(e) => {
                if let Some(since) = restarting_since {
                    if since.elapsed() < NOT_LIVE_FOR {
                        std::thread::sleep(Duration::from_millis(500));
                        continue;
                    }
                }
                failures += 1;
                if failures > reconnects {
                    return Err(server.unreachable(e));
                }
                eprintln!("agentloop: {e}; reconnecting ({failures}/{reconnects})");
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let mut resp = resp;
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            return Err(Failure::Error(format!(
                "the server answered {status} {}: {}",
                v["code"].as_str().unwrap_or("error"),
                v["message"].as_str().unwrap_or("(no message)")
            )));
        }
        let reader = BufReader::new(resp.into_body().into_reader());
        let (mut seq, mut name) = (None::<u64>, String::new());
        let mut retry: Option<Duration> = None;
        let mut not_live: Option<String> = None;
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Some(v) = line.strip_prefix("id:") {
                seq = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("event:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("retry:") {
                retry = v.trim().parse().ok().map(Duration::from_millis);
            } else if let Some(v) = line.strip_prefix("data:") {
                if name == "not_live" {
                    let v: Value = serde_json::from_str(v.trim()).unwrap_or(Value::Null);
                    not_live = Some(v["message"].as_str().unwrap_or("not live yet").to_string());
                    continue;
                }
                failures = 0;
                not_live_since = None;
                restarting_since = None;
                if seq.is_some() {
                    last = seq;
                }
                let shown = seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
                let _ = writeln!(out, "#{shown} {name} {}", v.trim());
                let _ = out.flush();
                if name == "ended" {
                    let data: Value = serde_json::from_str(v.trim()).unwrap_or(Value::Null);
                    if data["reason"]["kind"] == "shutdown" {
                        eprintln!("agentloop: the server is shutting down; following {id} after it restarts (after event {last:?})");
                        restarting_since = Some(std::time::Instant::now());
                        break;
                    }
                    return Ok(());
                }
            }
        }
        if let Some(message) = not_live {
            let since = *not_live_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > NOT_LIVE_FOR {
                return Err(Failure::Error(format!(
                    "{message}; still not live after {}: giving up",
                    humantime::format_duration(NOT_LIVE_FOR)
                )));
            }
            let wait = retry.unwrap_or(Duration::from_secs(1)).min(MAX_RETRY_WAIT);
            eprintln!(
                "agentloop: {message}; reconnecting in {} after event {last:?}",
                humantime::format_duration(wait)
            );
            std::thread::sleep(wait);
            continue;
        }
        if restarting_since.is_some() {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        // The stream closed before `ended`: the server went away or a proxy cut it.
        failures += 1;
        if failures > reconnects {
            return Err(Failure::Error(format!(
                "the event stream of {id} closed {failures} times without `ended`; giving up \
                 (the server may be restarting: run watch again later)"
            )));
        }
        eprintln!("agentloop: the event stream closed; reconnecting after event {last:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}
