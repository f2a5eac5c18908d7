//! The chat agent against an OpenAI-compatible fake server on loopback
//! (`fake_server.rs`): streamed chunks arrive as events in order; the conversation is
//! carried to the next turn; a tool call runs once and is replayed after a crash
//! mid-turn; a preemption mid-stream drops the stream and the next turn sees both
//! messages; 429 with `Retry-After` is honoured; a stream cut mid-way is restarted or
//! fails typed; a malformed chunk fails typed; a tool that panics becomes its error;
//! the provider's concurrency limit holds across 50 sessions.

mod fake_server;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{
    CheckpointStore, Durability, EventStream, ExitReason, MemoryStore, Preempt, PushOptions,
    SafePoint, SessionEvent, SessionHandle, SessionSpec, StopOptions,
};
use agentloop_openai::{ChatAgent, ChatEvent, Provider, Tools};
use fake_server::Answer;
use schemars::JsonSchema;
use serde::Deserialize;

type Agent = ChatAgent<String, ChatEvent>;
type Handle = SessionHandle<String, ChatEvent>;

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn provider(url: &str) -> agentloop_openai::ProviderBuilder {
    Provider::builder(url, "fake").retries(3, Duration::from_millis(50), Duration::from_secs(2))
}

async fn spawn(id: &str, agent: Agent, store: Option<Arc<MemoryStore<String>>>) -> Handle {
    let spec = match &store {
        Some(_) => SessionSpec::new(id, "chat")
            .persistent(true)
            .durability(Durability::Sync),
        None => SessionSpec::new(id, "chat"),
    };
    SessionHandle::spawn(
        spec,
        Arc::new(agent),
        store.map(|s| s as Arc<dyn CheckpointStore<String>>),
    )
    .await
    .expect("spawn")
}

/// The chat events until the turn `turn` ends, and how it ended.
async fn turn_events(
    events: &mut EventStream<ChatEvent>,
    turn: u64,
) -> (Vec<ChatEvent>, agentloop::TurnEnd) {
    let mut got = Vec::new();
    loop {
        match within("the turn's events", events.next()).await {
            Some(SessionEvent::Agent { event, .. }) => got.push(event),
            Some(SessionEvent::TurnEnded {
                turn: t, outcome, ..
            }) if t == turn => return (got, outcome),
            Some(_) => {}
            None => panic!("the stream ended before turn {turn} did: {got:?}"),
        }
    }
}

/// Why the session failed (it must have).
async fn failure(h: Handle) -> String {
    let exit = within("exit", h.wait()).await;
    match exit.reason {
        ExitReason::Failed(why) => why,
        r => panic!("expected Failed, got {r:?}"),
    }
}

/// Reads the stream until the model's first token.
async fn first_token(events: &mut EventStream<ChatEvent>) {
    loop {
        match within("a token", events.next()).await {
            Some(SessionEvent::Agent {
                event: ChatEvent::Token { .. },
                ..
            }) => return,
            Some(_) => {}
            None => panic!("the stream ended before a token"),
        }
    }
}

fn tokens(events: &[ChatEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Token { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn streamed_chunks_arrive_as_events_in_order_and_the_conversation_carries_on() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Text(
        vec!["Hel", "lo, ", "Ada"],
        Duration::from_millis(5),
    ))
    .then(Answer::Text(vec!["Again"], Duration::ZERO));
    let agent = Agent::new(provider(&url).build().unwrap()).system("be brief");
    let h = spawn("s", agent, None).await;
    let mut events = h.subscribe();
    h.push("hi, I am Ada".into()).await.expect("push");
    let (got, end) = turn_events(&mut events, 0).await;
    assert_eq!(end, agentloop::TurnEnd::Completed);
    assert_eq!(tokens(&got), ["Hel", "lo, ", "Ada"]);
    assert!(
        got.iter().any(
            |e| matches!(e, ChatEvent::ModelCallEnded { usage, finish_reason }
            if usage.prompt_tokens == 11 && usage.completion_tokens == 7 && finish_reason == "stop")
        ),
        "{got:?}"
    );
    assert_eq!(
        got.last(),
        Some(&ChatEvent::TurnUsage {
            usage: agentloop_openai::Usage {
                prompt_tokens: 11,
                completion_tokens: 7
            },
            calls: 1
        }),
        "the turn's usage ends its events"
    );
    h.push("and again".into()).await.expect("push");
    let (got, _) = turn_events(&mut events, 1).await;
    assert_eq!(tokens(&got), ["Again"]);
    assert_eq!(
        fake.messages(1),
        [
            ("system".to_string(), "be brief".to_string()),
            ("user".into(), "hi, I am Ada".into()),
            ("assistant".into(), "Hello, Ada".into()),
            ("user".into(), "and again".into()),
        ],
        "the second turn sends the whole conversation"
    );
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

fn adder(runs: &Arc<AtomicU32>) -> Tools {
    let runs = runs.clone();
    Tools::new().add("add", "Adds two integers.", move |args: AddArgs, _key| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(args.a + args.b)
        }
    })
}

/// The tool's JSON Schema goes to the model; a call runs the tool once; its result
/// goes back; the model's answer ends the turn.
#[tokio::test]
async fn a_tool_call_runs_the_tool_and_its_result_goes_back_to_the_model() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Tools(vec![(
        "call_1",
        "add",
        r#"{"a": 2, "b": 40}"#,
    )]))
    .then(Answer::Text(vec!["42"], Duration::ZERO));
    let runs = Arc::new(AtomicU32::new(0));
    let agent = Agent::new(provider(&url).build().unwrap()).tools(adder(&runs));
    let h = spawn("t", agent, None).await;
    let mut events = h.subscribe();
    h.push("2 + 40?".into()).await.expect("push");
    let (got, end) = turn_events(&mut events, 0).await;
    assert_eq!(end, agentloop::TurnEnd::Completed, "{got:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(got.contains(&ChatEvent::TurnUsage {
        usage: agentloop_openai::Usage {
            prompt_tokens: 22,
            completion_tokens: 14
        },
        calls: 2
    }));
    assert!(got.contains(&ChatEvent::ToolResult {
        id: "call_1".into(),
        name: "add".into(),
        ok: true,
        output: "42".into(),
        replayed: false,
    }));
    let first = &fake.requests()[0];
    assert_eq!(first["tools"][0]["function"]["name"], "add");
    assert_eq!(
        first["tools"][0]["function"]["parameters"]["properties"]["a"]["type"],
        "integer"
    );
    let second = fake.requests()[1]["messages"].clone();
    assert_eq!(
        second[1]["tool_calls"][0]["function"]["arguments"],
        r#"{"a": 2, "b": 40}"#
    );
    assert_eq!(second[2]["role"], "tool");
    assert_eq!(second[2]["tool_call_id"], "call_1");
    assert_eq!(second[2]["content"], "42");
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

#[derive(Deserialize, JsonSchema)]
struct WaitArgs {}

/// A crash mid-turn, after the first of two tool calls was journaled and while the
/// second runs: the turn runs again from the record, the first call's result comes
/// from the journal (the tool does not run again), the second runs, the model answers.
#[tokio::test]
async fn a_tool_call_runs_once_and_is_replayed_after_a_crash_mid_turn() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Tools(vec![
        ("call_a", "add", r#"{"a": 1, "b": 1}"#),
        ("call_w", "wait", "{}"),
    ]))
    .then(Answer::Text(vec!["done"], Duration::ZERO));
    let runs = Arc::new(AtomicU32::new(0));
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let tools = {
        let hold = hold.clone();
        adder(&runs).add("wait", "Waits.", move |_: WaitArgs, _key| {
            let entered = entered_tx.clone();
            let hold = hold.load(Ordering::SeqCst);
            async move {
                let _ = entered.send(());
                if hold {
                    std::future::pending::<()>().await;
                }
                Ok::<_, String>("waited")
            }
        })
    };
    let store = Arc::new(MemoryStore::<String>::new());
    let agent = Agent::new(provider(&url).build().unwrap()).tools(tools.clone());
    let first = spawn("c", agent, Some(store.clone())).await;
    first.push("go".into()).await.expect("push");
    within("the second tool to run", entered.recv()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The crash: the store as it is now.
    let after = Arc::new(MemoryStore::<String>::new());
    after.insert(store.get("c").expect("the record"));
    drop(first);
    hold.store(false, Ordering::SeqCst);
    let agent = Agent::new(provider(&url).build().unwrap()).tools(tools);
    let second = spawn("c", agent, Some(after.clone())).await;
    let mut events = second.subscribe();
    let (got, end) = turn_events(&mut events, 0).await;
    assert_eq!(end, agentloop::TurnEnd::Completed, "{got:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the add tool ran once in all"
    );
    assert!(
        got.iter().any(
            |e| matches!(e, ChatEvent::ToolResult { id, replayed: true, output, .. }
            if id == "call_a" && output == "2")
        ),
        "the first call's result came from the journal: {got:?}"
    );
    assert!(got
        .iter()
        .any(|e| matches!(e, ChatEvent::ToolResult { id, replayed: false, .. } if id == "call_w")));
    // The model was called twice in all (once per run): the resumed turn did not ask
    // it again for the calls its state held.
    assert_eq!(fake.requests().len(), 2);
    second.stop(StopOptions::drain()).await.expect("stop");
    within("exit", second.wait()).await;
}

/// A preemption mid-stream drops the stream at once; the next turn sends both user
/// messages.
#[tokio::test]
async fn a_preempt_mid_stream_cuts_the_stream_and_the_next_turn_sees_both_messages() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Text(vec!["a"; 200], Duration::from_millis(50)))
        .then(Answer::Text(vec!["both seen"], Duration::ZERO));
    let agent = Agent::new(provider(&url).build().unwrap());
    let h = spawn("p", agent, None).await;
    let mut events = h.subscribe();
    h.push("first".into()).await.expect("push");
    first_token(&mut events).await;
    let began = Instant::now();
    h.push("second".into())
        .options(PushOptions::preempt(Preempt::at(SafePoint::AfterModelCall)))
        .await
        .expect("push");
    let (_, end) = turn_events(&mut events, 0).await;
    assert!(matches!(end, agentloop::TurnEnd::Preempted(_)), "{end:?}");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "the stream was dropped at once, not read to its end (10 s)"
    );
    let (got, _) = turn_events(&mut events, 1).await;
    assert_eq!(tokens(&got), ["both seen"]);
    let sent = fake.messages(1);
    assert_eq!(
        sent,
        [
            ("user".to_string(), "first".to_string()),
            ("user".into(), "second".into())
        ]
    );
    assert_eq!(
        fake.dropped.load(Ordering::SeqCst),
        1,
        "the server saw the client go"
    );
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

/// A graceful stop (a cancel at the next safe point) mid-stream drops the stream at
/// once: the session ends canceled with the message kept as the cut turn's item.
#[tokio::test]
async fn a_cancel_mid_stream_drops_the_stream_at_once() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Text(vec!["a"; 200], Duration::from_millis(50)));
    let agent = Agent::new(provider(&url).build().unwrap());
    let h = spawn("g", agent, None).await;
    let mut events = h.subscribe();
    h.push("long answer please".into()).await.expect("push");
    first_token(&mut events).await;
    let began = Instant::now();
    h.stop(StopOptions::graceful()).await.expect("stop");
    let exit = within("exit", h.wait()).await;
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "the stream was dropped at once, not read to its end (10 s)"
    );
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.interrupted_items, ["long answer please".to_string()]);
    within("the server to see the client go", async {
        while fake.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// 429 with `Retry-After: 1`: the request is sent again after a second, and the turn
/// completes.
#[tokio::test]
async fn a_429_with_retry_after_is_honoured() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Status(429, Some(1)))
        .then(Answer::Text(vec!["fine"], Duration::ZERO));
    let agent = Agent::new(provider(&url).build().unwrap());
    let h = spawn("r", agent, None).await;
    let mut events = h.subscribe();
    h.push("hello".into()).await.expect("push");
    let (got, end) = turn_events(&mut events, 0).await;
    assert_eq!(end, agentloop::TurnEnd::Completed);
    assert_eq!(tokens(&got), ["fine"]);
    let times: Vec<Instant> = fake.requests.lock().iter().map(|(t, _)| *t).collect();
    assert_eq!(times.len(), 2);
    let waited = times[1] - times[0];
    assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    assert!(
        waited < Duration::from_secs(3),
        "waited {waited:?}, not the backoff"
    );
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

/// A 5xx that does not end after the retries fails the turn with the status.
#[tokio::test]
async fn a_server_error_that_persists_fails_the_turn_with_the_status() {
    let (url, fake) = fake_server::start().await;
    for _ in 0..4 {
        fake.then(Answer::Status(503, None));
    }
    let agent = Agent::new(provider(&url).build().unwrap());
    let h = spawn("f", agent, None).await;
    h.push("hello".into()).await.expect("push");
    let why = failure(h).await;
    assert!(
        why.contains("HTTP 503") && why.contains("3 retries"),
        "{why}"
    );
    assert_eq!(fake.requests().len(), 4);
}

/// A stream cut mid-way is called again (the provider allows one restart): the
/// client is told to drop what it showed, and the turn completes.
#[tokio::test]
async fn a_stream_cut_mid_way_restarts_once_then_fails_typed() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Cut(vec!["par", "tial"]))
        .then(Answer::Text(vec!["whole"], Duration::ZERO));
    let agent = Agent::new(provider(&url).build().unwrap());
    let h = spawn("k", agent, None).await;
    let mut events = h.subscribe();
    h.push("hello".into()).await.expect("push");
    let (got, end) = turn_events(&mut events, 0).await;
    assert_eq!(end, agentloop::TurnEnd::Completed, "{got:?}");
    assert_eq!(tokens(&got), ["par", "tial", "whole"]);
    assert!(got
        .iter()
        .any(|e| matches!(e, ChatEvent::StreamRestarted { attempt: 2, .. })));
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;

    // With no restart allowed: the typed error.
    fake.then(Answer::Cut(vec!["par"]));
    let agent = Agent::new(provider(&url).stream_restarts(0).build().unwrap());
    let h = spawn("k0", agent, None).await;
    h.push("hello".into()).await.expect("push");
    let why = failure(h).await;
    assert!(why.contains("stream broke after 1 chunks"), "{why}");
}

/// A chunk that is not JSON fails the turn with a typed error naming it.
#[tokio::test]
async fn a_malformed_chunk_fails_the_turn_typed() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Malformed);
    let agent = Agent::new(provider(&url).build().unwrap());
    let h = spawn("m", agent, None).await;
    h.push("hello".into()).await.expect("push");
    let why = failure(h).await;
    assert!(
        why.contains("malformed chunk") && why.contains("this is not json"),
        "{why}"
    );
}

/// A tool that panics: the model reads the panic as the tool's error, the turn goes on.
#[tokio::test]
async fn a_tool_that_panics_becomes_its_error_and_the_turn_goes_on() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Tools(vec![("call_p", "boom", "{}")]))
        .then(Answer::Text(vec!["sorry"], Duration::ZERO));
    let tools = Tools::new().add("boom", "Panics.", |_: WaitArgs, _key| async move {
        if true {
            panic!("kaboom");
        }
        Ok::<_, String>(0)
    });
    let agent = Agent::new(provider(&url).build().unwrap()).tools(tools);
    let h = spawn("x", agent, None).await;
    let mut events = h.subscribe();
    h.push("go".into()).await.expect("push");
    let (got, end) = turn_events(&mut events, 0).await;
    assert_eq!(end, agentloop::TurnEnd::Completed, "{got:?}");
    assert!(
        got.iter().any(
            |e| matches!(e, ChatEvent::ToolResult { ok: false, output, .. }
        if output.contains("panicked: kaboom"))
        ),
        "{got:?}"
    );
    let second = fake.requests()[1]["messages"].clone();
    assert!(second[2]["content"].as_str().unwrap().contains("kaboom"));
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

/// 50 sessions share one provider limited to 4 calls at once: the server never sees
/// more than 4 streams open, and every session gets its answer.
#[tokio::test]
async fn the_concurrency_limit_holds_across_50_sessions() {
    let (url, fake) = fake_server::start().await;
    for _ in 0..50 {
        fake.then(Answer::Text(vec!["a", "b"], Duration::from_millis(20)));
    }
    let p = provider(&url).max_concurrency(4).build().unwrap();
    let mut handles = Vec::new();
    for i in 0..50 {
        let h = spawn(&format!("n{i}"), Agent::new(p.clone()), None).await;
        let events = h.subscribe();
        h.push(format!("hello {i}")).await.expect("push");
        handles.push((h, events));
    }
    for (h, mut events) in handles {
        let (got, end) = turn_events(&mut events, 0).await;
        assert_eq!(end, agentloop::TurnEnd::Completed);
        assert_eq!(tokens(&got), ["a", "b"]);
        h.stop(StopOptions::drain()).await.expect("stop");
        within("exit", h.wait()).await;
    }
    assert_eq!(fake.requests().len(), 50);
    let max = fake.max_open.load(Ordering::SeqCst);
    assert!(max <= 4, "{max} streams open at once");
    assert!(max >= 2, "the calls did overlap ({max})");
    assert_eq!(p.in_flight(), 0);
    assert_eq!(p.usage().1, 50);
}
