//! One model call: the request on the wire, the streamed chunks read as they arrive
//! (text handed on at once, tool-call fragments assembled), the provider's concurrency
//! limit held for the whole stream, a broken stream restarted as the provider allows.
//! The wire types are this crate's own: lenient about fields OpenAI-compatible servers
//! leave out, sent through async-openai's client (`byot`).

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::conversation::{Conversation, Message, Role, ToolCall};
use crate::error::ModelError;
use crate::events::{ChatEvent, Usage};
use crate::provider::Provider;

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
    index: usize,
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
/// operation, the provider, the model, and when it ends the token usage and the finish
/// reason (or the error).
pub(crate) async fn call<F, Fut>(
    provider: &Provider,
    conv: &Conversation,
    tools: &[serde_json::Value],
    emit: F,
) -> Result<Reply, ModelError>
where
    F: FnMut(ChatEvent) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use tracing::Instrument as _;
    let p = &provider.inner;
    let span = tracing::info_span!(
        "chat",
        otel.name = %format!("chat {}", p.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %p.name,
        gen_ai.request.model = %p.model,
        server.address = %p.base_url,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let out = call_inner(provider, conv, tools, emit)
        .instrument(span.clone())
        .await;
    match &out {
        Ok(r) => {
            span.record("gen_ai.usage.input_tokens", r.usage.prompt_tokens);
            span.record("gen_ai.usage.output_tokens", r.usage.completion_tokens);
            span.record("gen_ai.response.finish_reasons", r.finish_reason.as_str());
        }
        Err(e) => {
            span.record("error.type", e.kind());
        }
    }
    out
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
    let name = || p.name.clone();
    // The semaphore is never closed: an error cannot happen, but is said if it did.
    let _permit = p.limit.acquire().await.map_err(|_| ModelError::Connect {
        provider: name(),
        reason: "the provider's concurrency limit was closed".into(),
    })?;
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
    let mut restarts = 0;
    loop {
        let started = p
            .client
            .chat()
            .create_stream_byot::<_, Chunk>(&request)
            .await;
        let mut stream = match started {
            Ok(s) => s,
            Err(e) => return Err(request_error(provider, e)),
        };
        let mut got = Assembled::default();
        let broke = loop {
            let next = match tokio::time::timeout(p.idle_timeout, stream.next()).await {
                Err(_) => {
                    break Some(Broke::Fatal(ModelError::Idle {
                        provider: name(),
                        idle: p.idle_timeout,
                    }))
                }
                Ok(n) => n,
            };
            match next {
                None if got.finish.is_some() => break None,
                None => {
                    break Some(Broke::Cut(
                        "the stream ended without a finish reason".into(),
                    ))
                }
                Some(Err(async_openai::error::OpenAIError::JSONDeserialize(e, text))) => {
                    let start: String = text.chars().take(120).collect();
                    break Some(Broke::Fatal(ModelError::Malformed {
                        provider: name(),
                        reason: format!("{e} in `{start}`"),
                    }));
                }
                Some(Err(e)) => break Some(Broke::Cut(e.to_string())),
                Some(Ok(chunk)) => {
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
                                got.text.push_str(&text);
                                emit(ChatEvent::Token { text }).await;
                            }
                            for d in delta.tool_calls.unwrap_or_default() {
                                while got.calls.len() <= d.index {
                                    got.calls.push(ToolCall {
                                        id: String::new(),
                                        name: String::new(),
                                        arguments: String::new(),
                                    });
                                }
                                let c = &mut got.calls[d.index];
                                if let Some(id) = d.id {
                                    c.id = id;
                                }
                                if let Some(f) = d.function {
                                    if let Some(n) = f.name {
                                        c.name.push_str(&n);
                                    }
                                    if let Some(a) = f.arguments {
                                        c.arguments.push_str(&a);
                                    }
                                }
                            }
                        }
                        if let Some(f) = choice.finish_reason {
                            got.finish = Some(f);
                        }
                    }
                }
            }
        };
        match broke {
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
                    provider: name(),
                    chunks: got.chunks,
                    restarts,
                    reason,
                })
            }
        }
    }
}

/// A request that got no stream: the status the server kept answering (after the
/// provider's retries), or why it could not be reached.
fn request_error(provider: &Provider, e: async_openai::error::OpenAIError) -> ModelError {
    use async_openai::error::OpenAIError;
    let name = provider.inner.name.clone();
    match e {
        OpenAIError::ApiError(r) => {
            let status = r.status_code.as_u16();
            ModelError::Status {
                provider: name,
                status,
                retries: if status == 429 || status >= 500 {
                    provider.inner_retries()
                } else {
                    0
                },
                message: r.api_error.message,
            }
        }
        OpenAIError::Reqwest(e) => ModelError::Connect {
            provider: name,
            reason: e.to_string(),
        },
        other => ModelError::Connect {
            provider: name,
            reason: other.to_string(),
        },
    }
}
