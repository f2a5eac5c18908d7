//! One model call: the request on the wire, the streamed chunks read as they arrive
//! (text handed on at once, tool-call fragments assembled), the provider's concurrency
//! limit held for the whole stream, a broken stream restarted as the provider allows.
//! The wire types are this crate's own: lenient about fields OpenAI-compatible servers
//! leave out, sent with reqwest and read with a bounded, linear server-sent-events
//! parser (`sse.rs`). Every quantity the server controls is bounded (the provider's
//! bounds): the wait for its first byte and for the whole call, the response's
//! bytes, the text's, each tool call's, the number of tool calls, a line's, and the
//! part of an error body that is read at all.

use serde::{Deserialize, Serialize};

use crate::conversation::{Conversation, Message, Role, ToolCall};
use crate::error::ModelError;
use crate::events::{ChatEvent, Usage};
use crate::provider::Provider;
use crate::sse;

/// What a model call answered.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The assistant's message (text and tool calls).
    pub(crate) message: Message,
    /// What it used (zero when the server did not say).
    pub(crate) usage: Usage,
    /// Why the model stopped.
    pub(crate) finish_reason: String,
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tools: &'a [serde_json::Value],
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    // `null` for an assistant message that only calls tools.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<DeltaCall>>,
}

#[derive(Deserialize)]
struct DeltaCall {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<DeltaFunction>,
}

#[derive(Deserialize)]
struct DeltaFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

fn role(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn wire(conv: &Conversation) -> Vec<WireMessage<'_>> {
    conv.messages
        .iter()
        .map(|m| WireMessage {
            role: role(m.role),
            content: (!m.content.is_empty() || m.tool_calls.is_empty())
                .then_some(m.content.as_str()),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| WireCall {
                    id: &c.id,
                    r#type: "function",
                    function: WireFunction {
                        name: &c.name,
                        arguments: &c.arguments,
                    },
                })
                .collect(),
            tool_call_id: m.tool_call_id.as_deref(),
        })
        .collect()
}

/// What one attempt assembled.
#[derive(Default)]
struct Assembled {
    text: String,
    calls: Vec<ToolCall>,
    finish: Option<String>,
    usage: Usage,
    chunks: u64,
}

/// Why an attempt ended early.
enum Broke {
    /// Restartable: the stream broke.
    Cut(String),
    /// Not: the call fails with this.
    Fatal(ModelError),
}

/// Calls the model with `conv` and `tools`, handing each event to `emit` as it
/// arrives. Holds one of the provider's permits from the request to the stream's end.
/// The call is a span `chat <model>` with OpenTelemetry's GenAI attributes (S42): the
/// operation, the provider (`--model-provider`), the model, the server's host and port,
/// the conversation (the session `conversation`), and when it ends the token usage
/// (ints) and the finish reasons (a string array), or the error (status `ERROR`,
/// `error.type` from [`error_type`]).
pub(crate) async fn call<F, Fut>(
    provider: &Provider,
    conversation: &str,
    conv: &Conversation,
    tools: &[serde_json::Value],
    emit: F,
) -> Result<Reply, ModelError>
where
    F: FnMut(ChatEvent) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let p = &provider.inner;
    let (host, port) = server_address(&p.base_url);
    let span = tracing::info_span!(
        "chat",
        otel.name = %format!("chat {}", p.model),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %p.name,
        gen_ai.request.model = %p.model,
        gen_ai.conversation.id = %conversation,
        server.address = %host,
        server.port = port,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let out = call_inner(provider, conv, tools, emit)
        .instrument(span.clone())
        .await;
    match &out {
        Ok(r) => {
            // i64, not u64: tracing-opentelemetry exports a u64 field as a string.
            let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            span.record("gen_ai.usage.input_tokens", int(r.usage.prompt_tokens));
            span.record("gen_ai.usage.output_tokens", int(r.usage.completion_tokens));
            // A string array, as the conventions type it (a tracing field cannot be one).
            let reasons = if r.finish_reason.is_empty() {
                Vec::new()
            } else {
                vec![opentelemetry::StringValue::from(r.finish_reason.clone())]
            };
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(opentelemetry::Array::String(reasons)),
            );
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", error_type(e).as_str());
        }
    }
    out
}

/// The host and port of a provider's base URL (`server.address`, `server.port`): the
/// URL's port, else its scheme's (80, 443); a URL that does not parse is all host.
fn server_address(base_url: &str) -> (String, Option<i64>) {
    match reqwest::Url::parse(base_url) {
        Ok(u) => (
            u.host_str().unwrap_or_default().to_string(),
            u.port_or_known_default().map(i64::from),
        ),
        Err(_) => (base_url.to_string(), None),
    }
}

/// A failed model call's `error.type`, low-cardinality as the conventions want it: the
/// HTTP status of a refusal (`429`, `500`), `timeout` for a deadline or a silence,
/// else the error's kind (`connect`, `stream_cut`, `malformed`, ...).
pub(crate) fn error_type(e: &ModelError) -> String {
    match e {
        ModelError::Status { status, .. } => status.to_string(),
        ModelError::Idle { .. } | ModelError::FirstByte { .. } | ModelError::Deadline { .. } => {
            "timeout".to_string()
        }
        other => other.kind().to_string(),
    }
}

async fn call_inner<F, Fut>(
    provider: &Provider,
    conv: &Conversation,
    tools: &[serde_json::Value],
    mut emit: F,
) -> Result<Reply, ModelError>
where
    F: FnMut(ChatEvent) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let p = &provider.inner;
    // The semaphore is never closed: an error cannot happen, but is said if it did.
    let _permit = p.limit.acquire().await.map_err(|_| ModelError::Connect {
        provider: p.name.clone(),
        reason: "the provider's concurrency limit was closed".into(),
    })?;
    // The call's deadline runs from the permit: dropping the attempt at it drops the
    // connection, and the permit is released on return.
    let timeout = p.bounds.call_timeout;
    match tokio::time::timeout(timeout, attempts(provider, conv, tools, &mut emit)).await {
        Ok(out) => out,
        Err(_) => Err(ModelError::Deadline {
            provider: p.name.clone(),
            timeout,
        }),
    }
}

/// The request, sent again after each restartable break as the provider allows.
async fn attempts<F, Fut>(
    provider: &Provider,
    conv: &Conversation,
    tools: &[serde_json::Value],
    emit: &mut F,
) -> Result<Reply, ModelError>
where
    F: FnMut(ChatEvent) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let p = &provider.inner;
    let request = Request {
        model: &p.model,
        messages: wire(conv),
        tools,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        max_tokens: p.max_tokens,
    };
    let body = serde_json::to_vec(&request).map_err(|e| ModelError::Connect {
        provider: p.name.clone(),
        reason: format!("the request cannot be encoded: {e}"),
    })?;
    let mut restarts = 0;
    loop {
        let response = send(provider, &body).await?;
        let mut got = Assembled::default();
        match read(provider, response, &mut got, emit).await {
            None => {
                let finish_reason = got.finish.unwrap_or_default();
                let mut calls = got.calls;
                for (i, c) in calls.iter_mut().enumerate() {
                    if c.id.is_empty() {
                        // Some servers leave ids out: one the conversation can name.
                        c.id = format!("call-{i}");
                    }
                }
                provider.count(got.usage);
                return Ok(Reply {
                    message: Message {
                        role: Role::Assistant,
                        content: got.text,
                        tool_calls: calls,
                        tool_call_id: None,
                    },
                    usage: got.usage,
                    finish_reason,
                });
            }
            Some(Broke::Fatal(e)) => return Err(e),
            Some(Broke::Cut(reason)) if restarts < p.stream_restarts => {
                restarts += 1;
                tracing::warn!(provider = %p.name, chunks = got.chunks, restart = restarts, %reason, "the model's stream broke; calling again");
                emit(ChatEvent::StreamRestarted {
                    attempt: restarts + 1,
                    reason,
                })
                .await;
            }
            Some(Broke::Cut(reason)) => {
                return Err(ModelError::StreamCut {
                    provider: p.name.clone(),
                    chunks: got.chunks,
                    restarts,
                    reason,
                })
            }
        }
    }
}

/// Sends the request until the server answers 2xx, retrying 429, 5xx, connect
/// errors and a server that does not begin to answer within the first-byte timeout,
/// after `Retry-After` or the backoff, as many times as the provider allows.
async fn send(provider: &Provider, body: &[u8]) -> Result<reqwest::Response, ModelError> {
    use reqwest::header::{ACCEPT, CONTENT_TYPE};
    let p = &provider.inner;
    let first_byte = p.bounds.first_byte_timeout;
    let mut attempt = 0u32;
    loop {
        let mut request = p
            .http
            .post(&p.endpoint)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body.to_vec());
        if let Some(key) = &p.key {
            request = request.bearer_auth(key);
        }
        let more = attempt < p.max_retries;
        let (why, after) = match tokio::time::timeout(first_byte, request.send()).await {
            Ok(Ok(r)) if r.status().is_success() => return Ok(r),
            Ok(Ok(r)) => {
                let status = r.status().as_u16();
                if (status == 429 || status >= 500) && more {
                    // The body of an answer that is retried is not read.
                    (
                        format!("HTTP {status}"),
                        crate::provider::retry_after(r.headers()),
                    )
                } else {
                    return Err(status_error(provider, r, attempt).await);
                }
            }
            Ok(Err(e)) if e.is_connect() && more => (format!("connect: {}", chain(&e)), None),
            Ok(Err(e)) => {
                return Err(ModelError::Connect {
                    provider: p.name.clone(),
                    reason: chain(&e),
                })
            }
            Err(_) if more => (format!("no answer began within {first_byte:?}"), None),
            Err(_) => {
                return Err(ModelError::FirstByte {
                    provider: p.name.clone(),
                    timeout: first_byte,
                    retries: attempt,
                })
            }
        };
        let wait = p.retry_wait(attempt, after);
        attempt += 1;
        tracing::warn!(provider = %p.name, attempt, wait_ms = wait.as_millis() as u64, reason = %why, "model request retried");
        tokio::time::sleep(wait).await;
    }
}

/// An error and its sources, on one line (reqwest's own says little: "error sending
/// request").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    one_line(&out, 1024)
}

/// At most `max` bytes of `text` (cut at a character boundary, an ellipsis said),
/// with control characters (line ends included) as spaces: fit for one log line.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 3);
    for c in text.chars() {
        if out.len() + c.len_utf8() > max {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

/// A status the call ends with: at most the provider's `max_error_body_bytes` of its
/// body are read (a server's 50 MB error page is not), with the first-byte timeout for
/// the whole read; the message is the body's `error.message` when the body is whole
/// JSON, else its text, and says when it was cut and how long the body was.
async fn status_error(provider: &Provider, mut r: reqwest::Response, retries: u32) -> ModelError {
    let p = &provider.inner;
    let max = p.bounds.max_error_body_bytes;
    let status = r.status().as_u16();
    let length = r.content_length();
    let deadline = tokio::time::Instant::now() + p.bounds.first_byte_timeout;
    let mut body: Vec<u8> = Vec::new();
    // Why the body is not whole, if it is not.
    let mut cut: Option<Cut> = None;
    loop {
        match tokio::time::timeout_at(deadline, r.chunk()).await {
            Ok(Ok(Some(c))) => {
                let room = max - body.len();
                if c.len() > room {
                    body.extend_from_slice(&c[..room]);
                    cut = Some(Cut::Bound);
                    break;
                }
                body.extend_from_slice(&c);
            }
            Ok(Ok(None)) => break,
            Ok(Err(_)) => {
                cut = Some(Cut::Broke);
                break;
            }
            Err(_) => {
                cut = Some(Cut::Slow);
                break;
            }
        }
    }
    drop(r);
    let text = String::from_utf8_lossy(&body);
    let said = match cut {
        None => serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                let m = v["error"]["message"]
                    .as_str()
                    .or_else(|| v["error"].as_str())
                    .or_else(|| v["message"].as_str())?;
                Some(m.to_string())
            })
            .unwrap_or_else(|| text.to_string()),
        Some(_) => text.to_string(),
    };
    let mut message = one_line(said.trim(), max);
    if message.is_empty() {
        message = "(an empty body)".into();
    }
    match cut {
        None => {}
        Some(Cut::Bound) => {
            let of = length.map_or_else(|| "a longer body".to_string(), |n| format!("{n}"));
            message.push_str(&format!(
                " [truncated: the first {max} bytes of {of} were read; the provider's `max_error_body_bytes` setting (serve: --model-max-error-body-bytes) raises the bound]"
            ));
        }
        Some(Cut::Broke) => message.push_str(" [truncated: the body broke off]"),
        Some(Cut::Slow) => message.push_str(&format!(
            " [truncated: the rest of the body did not come within {:?}]",
            p.bounds.first_byte_timeout
        )),
    }
    ModelError::Status {
        provider: p.name.clone(),
        status,
        retries,
        message,
    }
}

/// Why an error body was not read whole.
enum Cut {
    /// It was longer than `max_error_body_bytes`.
    Bound,
    /// The connection broke.
    Broke,
    /// The rest did not come within the first-byte timeout.
    Slow,
}

fn too_large(
    provider: &Provider,
    what: &'static str,
    limit: u64,
    setting: &'static str,
    flag: &'static str,
) -> ModelError {
    ModelError::TooLarge {
        provider: provider.inner.name.clone(),
        what,
        limit,
        setting,
        flag,
    }
}

/// Reads one response's stream into `got`, handing text on as it arrives; `None` when
/// it finished, else why it broke.
async fn read<F, Fut>(
    provider: &Provider,
    mut response: reqwest::Response,
    got: &mut Assembled,
    emit: &mut F,
) -> Option<Broke>
where
    F: FnMut(ChatEvent) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let p = &provider.inner;
    let b = p.bounds;
    let mut parser = sse::Parser::new(b.max_line_bytes);
    let mut events = Vec::new();
    let mut bytes: u64 = 0;
    let ended = |got: &Assembled| {
        if got.finish.is_some() {
            None
        } else {
            Some(Broke::Cut(
                "the stream ended without a finish reason".into(),
            ))
        }
    };
    loop {
        let next = match tokio::time::timeout(p.idle_timeout, response.chunk()).await {
            Err(_) => {
                return Some(Broke::Fatal(ModelError::Idle {
                    provider: p.name.clone(),
                    idle: p.idle_timeout,
                }))
            }
            Ok(n) => n,
        };
        let chunk = match next {
            Ok(Some(c)) => c,
            Ok(None) => return ended(got),
            Err(e) => return Some(Broke::Cut(chain(&e))),
        };
        bytes += chunk.len() as u64;
        if bytes > b.max_response_bytes {
            return Some(Broke::Fatal(too_large(
                provider,
                "one response",
                b.max_response_bytes,
                "max_response_bytes",
                "max-response-bytes",
            )));
        }
        if parser.push(&chunk, &mut events).is_err() {
            return Some(Broke::Fatal(too_large(
                provider,
                "one line of its stream",
                b.max_line_bytes as u64,
                "max_line_bytes",
                "max-line-bytes",
            )));
        }
        for event in events.drain(..) {
            let data = match event {
                sse::Event::Done => return ended(got),
                sse::Event::Data(d) => d,
            };
            let chunk: Chunk = match serde_json::from_str(&data) {
                Ok(c) => c,
                Err(e) => {
                    return Some(Broke::Fatal(ModelError::Malformed {
                        provider: p.name.clone(),
                        reason: format!("{e} in `{}`", one_line(&data, 120)),
                    }))
                }
            };
            if let Err(e) = take(provider, chunk, got, emit).await {
                return Some(Broke::Fatal(e));
            }
        }
    }
}

/// Adds one chunk to what the attempt assembled, within the provider's bounds.
async fn take<F, Fut>(
    provider: &Provider,
    chunk: Chunk,
    got: &mut Assembled,
    emit: &mut F,
) -> Result<(), ModelError>
where
    F: FnMut(ChatEvent) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let b = provider.inner.bounds;
    got.chunks += 1;
    if let Some(u) = chunk.usage {
        got.usage = Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
        };
    }
    for choice in chunk.choices.unwrap_or_default() {
        if choice.index != 0 {
            continue;
        }
        if let Some(delta) = choice.delta {
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                if got.text.len() + text.len() > b.max_text_bytes {
                    return Err(too_large(
                        provider,
                        "the answer's text",
                        b.max_text_bytes as u64,
                        "max_text_bytes",
                        "max-text-bytes",
                    ));
                }
                got.text.push_str(&text);
                emit(ChatEvent::Token { text }).await;
            }
            for d in delta.tool_calls.unwrap_or_default() {
                let index = usize::try_from(d.index)
                    .ok()
                    .filter(|i| *i < b.max_tool_calls)
                    .ok_or_else(|| ModelError::TooManyToolCalls {
                        provider: provider.inner.name.clone(),
                        index: d.index,
                        max: b.max_tool_calls,
                    })?;
                while got.calls.len() <= index {
                    got.calls.push(ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                }
                let c = &mut got.calls[index];
                if let Some(id) = d.id {
                    c.id = id;
                }
                if let Some(f) = d.function {
                    let name = f.name.unwrap_or_default();
                    let args = f.arguments.unwrap_or_default();
                    let size = c.name.len() + c.arguments.len() + name.len() + args.len();
                    if size > b.max_tool_argument_bytes {
                        return Err(too_large(
                            provider,
                            "one tool call's name and arguments",
                            b.max_tool_argument_bytes as u64,
                            "max_tool_argument_bytes",
                            "max-tool-argument-bytes",
                        ));
                    }
                    c.name.push_str(&name);
                    c.arguments.push_str(&args);
                }
            }
        }
        if let Some(f) = choice.finish_reason {
            got.finish = Some(f);
        }
    }
    Ok(())
}

#[cfg(test)]
mod span_tests {
    use super::*;

    /// Issue 53: `server.address` is the host alone, `server.port` beside it.
    #[test]
    fn the_server_is_a_host_and_a_port() {
        assert_eq!(
            server_address("http://127.0.0.1:8000/v1"),
            ("127.0.0.1".to_string(), Some(8000))
        );
        assert_eq!(
            server_address("https://api.openai.com/v1"),
            ("api.openai.com".to_string(), Some(443))
        );
    }

    /// Issue 53: a failed call's `error.type` is low-cardinality.
    #[test]
    fn the_error_type_is_the_status_or_a_class() {
        let status = ModelError::Status {
            provider: "p".into(),
            status: 429,
            retries: 2,
            message: "slow down".into(),
        };
        assert_eq!(error_type(&status), "429");
        let deadline = ModelError::Deadline {
            provider: "p".into(),
            timeout: std::time::Duration::from_secs(1),
        };
        assert_eq!(error_type(&deadline), "timeout");
        let connect = ModelError::Connect {
            provider: "p".into(),
            reason: "refused".into(),
        };
        assert_eq!(error_type(&connect), "connect");
    }
}
