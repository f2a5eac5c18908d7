//! The chat turn: the conversation carried from the last turn, the turn's items
//! appended as messages, then model calls and rounds of tool calls until the model
//! answers without asking for tools. A safe point follows every model call and every
//! round of tool calls; a cancel or preemption that the next safe point would capture
//! drops the model's stream at once.

use std::marker::PhantomData;

use agentloop::{Agent, AgentError, SafePoint, Turn, TurnCx, TurnOutcome};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::conversation::{Conversation, ConversationBound, Message, ToolCall};
use crate::events::ChatEvent;
use crate::provider::Provider;
use crate::tools::{ToolKey, ToolOutcome, Tools};

/// An item a chat session takes: what it says to the model.
pub trait ChatInput:
    Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static
{
    /// The message this item adds to the conversation.
    fn to_message(&self) -> Message;
}

impl ChatInput for String {
    fn to_message(&self) -> Message {
        Message::user(self.clone())
    }
}

impl ChatInput for Message {
    fn to_message(&self) -> Message {
        self.clone()
    }
}

/// An agent that talks to a model over the chat-completions API.
///
/// Spawn its sessions persistent with `Durability::Sync` for exact replay: every safe
/// point is then on record before the next tool runs, so a turn that runs again after a
/// crash meets the same tool calls and gets their journaled results.
pub struct ChatAgent<I, E> {
    provider: Provider,
    tools: Tools,
    system: Option<String>,
    bound: ConversationBound,
    max_rounds: u32,
    _types: PhantomData<fn() -> (I, E)>,
}

impl<I, E> ChatAgent<I, E> {
    /// An agent calling `provider`, without tools or instructions.
    pub fn new(provider: Provider) -> Self {
        ChatAgent {
            provider,
            tools: Tools::new(),
            system: None,
            bound: ConversationBound::default(),
            max_rounds: 16,
            _types: PhantomData,
        }
    }

    /// The tools the model may call.
    pub fn tools(mut self, tools: Tools) -> Self {
        self.tools = tools;
        self
    }

    /// The system message a new conversation starts with.
    pub fn system(mut self, text: impl Into<String>) -> Self {
        self.system = Some(text.into());
        self
    }

    /// How large the conversation may grow (see [`Conversation::truncate`]).
    pub fn bound(mut self, bound: ConversationBound) -> Self {
        self.bound = bound;
        self
    }

    /// The most model calls one turn makes (default 16): a model that keeps asking
    /// for tools past it fails the turn with the reason.
    pub fn max_rounds(mut self, n: u32) -> Self {
        self.max_rounds = n;
        self
    }

    /// The provider it calls.
    pub fn provider(&self) -> &Provider {
        &self.provider
    }
}

impl<I, E> Agent for ChatAgent<I, E>
where
    I: ChatInput,
    E: From<ChatEvent> + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    type Item = I;
    type Event = E;
    type State = Conversation;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<Conversation>, AgentError> {
        // A resumed turn's state already holds its items.
        let resumed = turn.resume.is_some();
        let mut conv = turn
            .resume
            .or(turn.state)
            .unwrap_or_else(|| Conversation::new(self.system.as_deref()));
        if !resumed {
            conv.extend_items(turn.items.iter().map(ChatInput::to_message));
        }
        let mut rounds = 0;
        let mut used = crate::events::Usage::default();
        loop {
            let pending = conv.pending_tool_calls();
            if !pending.is_empty() {
                for call in pending {
                    let (outcome, replayed) = self.run_tool(&cx, &call).await?;
                    cx.emit(E::from(ChatEvent::ToolResult {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        ok: outcome.ok,
                        output: outcome.output.clone(),
                        replayed,
                    }))
                    .await;
                    conv.push(Message::tool(call.id, outcome.output));
                }
                cx.safe_point(SafePoint::AfterToolCalls, &conv)?;
                continue;
            }
            if conv.answered() {
                break;
            }
            if rounds == self.max_rounds {
                return Err(AgentError::failed(format!(
                    "the model asked for tools {rounds} rounds in a row; raise ChatAgent::max_rounds if that is expected"
                )));
            }
            rounds += 1;
            conv.truncate(self.bound);
            let specs = self.tools.specs();
            let call = crate::stream::call(&self.provider, cx.session_id(), &conv, specs, |ev| {
                let cx = &cx;
                async move { cx.emit(E::from(ev)).await }
            });
            let reply = tokio::select! {
                // A 4xx refusal or an undecodable answer is permanent (no restart).
                r = call => r.map_err(crate::ModelError::into_agent_error)?,
                _ = cx.cancel_requested(SafePoint::AfterModelCall) => {
                    // Dropped the stream; the safe point captures the cancel.
                    cx.safe_point(SafePoint::AfterModelCall, &conv)?;
                    return Err(AgentError::failed(
                        "a cancel in force was not captured at its safe point",
                    ));
                }
            };
            used.add(reply.usage);
            conv.usage.add(reply.usage);
            cx.emit(E::from(ChatEvent::ModelCallEnded {
                usage: reply.usage,
                finish_reason: reply.finish_reason.clone(),
            }))
            .await;
            for c in &reply.message.tool_calls {
                cx.emit(E::from(ChatEvent::ToolCalled {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                }))
                .await;
            }
            conv.push(reply.message);
            cx.safe_point(SafePoint::AfterModelCall, &conv)?;
        }
        conv.truncate(self.bound);
        cx.emit(E::from(ChatEvent::TurnUsage {
            usage: used,
            calls: rounds,
        }))
        .await;
        Ok(TurnOutcome::CompletedWith { state: conv })
    }
}

impl<I, E> ChatAgent<I, E>
where
    I: ChatInput,
    E: From<ChatEvent> + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    /// Runs one tool call as the durable step `tool:<call id>`: once, its outcome
    /// journaled; a turn that runs again gets the journaled outcome (`replayed`).
    async fn run_tool(
        &self,
        cx: &TurnCx<Self>,
        call: &ToolCall,
    ) -> Result<(ToolOutcome, bool), AgentError> {
        use tracing::Instrument as _;
        let name = format!("tool:{}", call.id.replace('/', "_"));
        let ran = std::sync::atomic::AtomicBool::new(false);
        let tools = &self.tools;
        // S42: OpenTelemetry's GenAI span of a tool call (its durable step's span is a
        // child of it); a failed call's status is ERROR with `error.type`.
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = %format!("execute_tool {}", call.name),
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.conversation.id = %cx.session_id(),
            gen_ai.tool.name = %call.name,
            gen_ai.tool.call.id = %call.id,
            gen_ai.tool.type = "function",
            error.type = tracing::field::Empty,
        );
        let outcome = cx
            .step(&name, |key| {
                ran.store(true, std::sync::atomic::Ordering::Relaxed);
                async move { tools.run(call, ToolKey(key.to_string())).await }
            })
            .instrument(span.clone())
            .await;
        let failed = match &outcome {
            Ok(o) if o.ok => None,
            // The model reads the failure; the span says what kind it was.
            Ok(_) if !tools.has(&call.name) => Some("unknown_tool"),
            Ok(_) => Some("tool_error"),
            // The step itself failed: the variant's name.
            Err(agentloop::turn::StepFailed::Canceled(_)) => Some("canceled"),
            Err(agentloop::turn::StepFailed::Refused { .. }) => Some("refused"),
            Err(agentloop::turn::StepFailed::Encode { .. }) => Some("encode"),
            Err(agentloop::turn::StepFailed::Decode { .. }) => Some("decode"),
            Err(agentloop::turn::StepFailed::NotDurable { .. }) => Some("not_durable"),
        };
        if let Some(kind) = failed {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", kind);
        }
        let outcome: ToolOutcome = outcome?;
        Ok((outcome, !ran.load(std::sync::atomic::Ordering::Relaxed)))
    }
}
