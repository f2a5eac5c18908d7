//! A hostile or broken model server (issue 52) against the chat agent: every quantity
//! the server controls is bounded by the provider, and each bound fails the model call
//! with a clear error that names the setting raising it. A tool call at index
//! 1 000 000 000, endless tool-call arguments, endless tokens, an endless response of
//! empty chunks, a line that never ends, a 50 MB error body, a huge malformed chunk, a
//! server that accepts and never answers, one that answers too slowly to finish: each
//! fails its session quickly and typed, its message stays short, and the provider's
//! concurrency permits come back.

mod fake_server;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{ExitReason, SessionHandle, SessionSpec};
use agentloop_openai::{ChatAgent, ChatEvent, Provider};
use fake_server::Answer;
use serde_json::json;

type Agent = ChatAgent<String, ChatEvent>;
type Handle = SessionHandle<String, ChatEvent>;

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn provider(url: &str) -> agentloop_openai::ProviderBuilder {
    Provider::builder(url, "fake").retries(1, Duration::from_millis(10), Duration::from_millis(50))
}

/// Spawns a session on `provider`, pushes one message, and returns why it failed (it
/// must fail) and how long that took.
async fn fails(id: &str, provider: &Provider) -> (String, Duration) {
    let h: Handle = SessionHandle::spawn(
        SessionSpec::new(id, "chat"),
        Arc::new(Agent::new(provider.clone())),
        None,
    )
    .await
    .expect("spawn");
    let began = Instant::now();
    h.push("hello".into()).await.expect("push");
    let exit = within("the session's exit", h.wait()).await;
    match exit.reason {
        ExitReason::Failed(why) => (why, began.elapsed()),
        r => panic!("expected Failed, got {r:?}"),
    }
}

/// One chunk of a stream, `data: {...}\n\n`.
fn chunk(delta: serde_json::Value) -> String {
    let v = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    format!("data: {v}\n\n")
}

/// The error a session reported is short: the bound is said, not the server's bytes.
fn short(why: &str) {
    assert!(why.len() < 2048, "{} bytes: {}", why.len(), &why[..300]);
}

/// A tool call at index 1 000 000 000 made the old parser grow a vector to that length
/// (72 GB: the process aborted). Now an index past `max_tool_calls` (default 128)
/// fails the call at once, naming the setting; one below it is fine.
#[tokio::test]
async fn a_tool_call_at_a_huge_index_fails_typed() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Raw(vec![chunk(
        json!({"tool_calls": [{"index": 1_000_000_000u64, "id": "x", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]}),
    )]));
    let p = provider(&url).build().unwrap();
    let (why, _) = fails("huge", &p).await;
    assert!(
        why.contains("tool call at index 1000000000")
            && why.contains("128 tool calls")
            && why.contains("max_tool_calls")
            && why.contains("--model-max-tool-calls"),
        "{why}"
    );
    short(&why);
    // Past a smaller bound, by one.
    fake.then(Answer::Raw(vec![chunk(
        json!({"tool_calls": [{"index": 2, "id": "y", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]}),
    )]));
    let p = provider(&url).max_tool_calls(2).build().unwrap();
    let (why, _) = fails("three", &p).await;
    assert!(
        why.contains("index 2") && why.contains("bound of 2"),
        "{why}"
    );
    assert_eq!(p.in_flight(), 0);
}

/// Tool-call arguments that never end (the old client kept them all: +100 MB/s) fail
/// the call at `max_tool_argument_bytes`; the stream is dropped.
#[tokio::test]
async fn endless_tool_call_arguments_fail_at_their_bound() {
    let (url, fake) = fake_server::start().await;
    let first = chunk(
        json!({"tool_calls": [{"index": 0, "id": "a", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": \""}}]}),
    );
    let more = chunk(json!({"tool_calls": [{"index": 0,
        "function": {"arguments": "y".repeat(4096)}}]}));
    fake.then(Answer::Endless(first, more, Duration::ZERO));
    let p = provider(&url)
        .max_tool_argument_bytes(256 << 10)
        .build()
        .unwrap();
    let (why, took) = fails("args", &p).await;
    assert!(
        why.contains("more than 262144 bytes in one tool call's name and arguments")
            && why.contains("max_tool_argument_bytes")
            && why.contains("--model-max-tool-argument-bytes"),
        "{why}"
    );
    short(&why);
    assert!(took < Duration::from_secs(10), "{took:?}");
    within("the server to see the client go", async {
        while fake.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        fake.body_bytes.load(Ordering::SeqCst) < 64 << 20,
        "the stream was dropped near the bound"
    );
}

/// Tokens that never end fail the call at `max_text_bytes` (default 1 MiB).
#[tokio::test]
async fn endless_tokens_fail_at_the_text_bound() {
    let (url, fake) = fake_server::start().await;
    let more = chunk(json!({"content": "z".repeat(1000)}));
    fake.then(Answer::Endless(String::new(), more, Duration::ZERO));
    let p = provider(&url).build().unwrap();
    let (why, took) = fails("tokens", &p).await;
    assert!(
        why.contains("more than 1048576 bytes in the answer's text")
            && why.contains("max_text_bytes")
            && why.contains("--model-max-text-bytes"),
        "{why}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert_eq!(p.in_flight(), 0);
}

/// A response of endless chunks that carry nothing (no text, no tool call) fails the
/// call at `max_response_bytes`.
#[tokio::test]
async fn an_endless_response_fails_at_the_response_bound() {
    let (url, fake) = fake_server::start().await;
    let nothing = format!("data: {}\n\n", json!({"choices": []})).repeat(100);
    fake.then(Answer::Endless(String::new(), nothing, Duration::ZERO));
    let p = provider(&url)
        .max_response_bytes(512 << 10)
        .build()
        .unwrap();
    let (why, _) = fails("bytes", &p).await;
    assert!(
        why.contains("more than 524288 bytes in one response")
            && why.contains("max_response_bytes")
            && why.contains("--model-max-response-bytes"),
        "{why}"
    );
}

/// A `data:` line that never ends, in small writes: the old parser scanned its whole
/// buffer again on every write (quadratic) and kept it all; now the line is refused at
/// `max_line_bytes`, quickly.
#[tokio::test]
async fn a_line_that_never_ends_fails_at_the_line_bound_quickly() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Endless(
        "data: {\"choices\": \"".into(),
        "a".repeat(64),
        Duration::ZERO,
    ));
    let p = provider(&url).max_line_bytes(2 << 20).build().unwrap();
    let (why, took) = fails("line", &p).await;
    assert!(
        why.contains("more than 2097152 bytes in one line of its stream")
            && why.contains("max_line_bytes")
            && why.contains("--model-max-line-bytes"),
        "{why}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A 50 MB error body (the old client read it whole, logged it whole at WARN and put
/// it in the session's failure: 300 MB of log, two 50 MB events) is read up to
/// `max_error_body_bytes` (default 4 KiB): the failure says the status, the start of
/// the body, that it was truncated and how long it was.
#[tokio::test]
async fn a_50_mb_error_body_is_read_to_its_bound_and_said_truncated() {
    let (url, fake) = fake_server::start().await;
    let len = 50 << 20;
    fake.then(Answer::ErrorBody(400, len));
    let p = provider(&url).build().unwrap();
    let (why, _) = fails("body", &p).await;
    assert!(
        why.contains("answered HTTP 400 after 0 retries: xxxx"),
        "{why}"
    );
    assert!(
        why.contains(&format!(
            "truncated: the first 4096 bytes of {len} were read"
        )) && why.contains("max_error_body_bytes")
            && why.contains("--model-max-error-body-bytes"),
        "{why}"
    );
    assert!(why.len() < 4096 + 1024, "{} bytes", why.len());
    // The server could hand the connection little more than the socket buffers hold.
    let sent = fake.body_bytes.load(Ordering::SeqCst);
    assert!(
        sent < len / 2,
        "{sent} bytes of the body were sent: read whole"
    );
    // A whole JSON error body still gives its message.
    fake.then(Answer::Status(403, None));
    let (why, _) = fails("json", &p).await;
    assert!(
        why.ends_with("answered HTTP 403 after 0 retries: scripted 403"),
        "{why}"
    );
}

/// A huge chunk that is not JSON: the failure quotes its start only.
#[tokio::test]
async fn a_huge_malformed_chunk_is_quoted_short() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Raw(vec![format!(
        "data: {}\n\n",
        "{not json".repeat(100_000)
    )]));
    let p = provider(&url).build().unwrap();
    let (why, _) = fails("malformed", &p).await;
    assert!(
        why.contains("malformed chunk") && why.contains("{not json"),
        "{why}"
    );
    short(&why);
}

/// Model servers that accept and never answer held every concurrency permit forever.
/// Now each attempt waits `first_byte_timeout`, the call is retried as a connect error
/// is, then fails typed, and the permits come back: four sessions on a limit of two
/// all fail within the bound.
#[tokio::test]
async fn servers_that_never_answer_fail_at_the_first_byte_timeout_and_release_permits() {
    let (url, fake) = fake_server::start().await;
    for _ in 0..8 {
        fake.then(Answer::Silent);
    }
    let p = provider(&url)
        .max_concurrency(2)
        .first_byte_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let began = Instant::now();
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let p = p.clone();
            tokio::spawn(async move { fails(&format!("silent{i}"), &p).await })
        })
        .collect();
    for r in runs {
        let (why, _) = r.await.expect("the session's task");
        assert!(
            why.contains("did not begin to answer within 300ms (1 retries)")
                && why.contains("first_byte_timeout")
                && why.contains("--model-first-byte-timeout"),
            "{why}"
        );
    }
    // Two rounds of two calls, each two attempts of 300 ms (and a short backoff).
    let took = began.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(fake.requests().len(), 8);
    assert_eq!(p.in_flight(), 0, "every permit came back");
}

/// A server that keeps the stream alive, a token every 50 ms, never finishing: the
/// idle timeout never fires, the call timeout does; the permit comes back.
#[tokio::test]
async fn a_call_that_never_finishes_fails_at_the_call_timeout() {
    let (url, fake) = fake_server::start().await;
    fake.then(Answer::Endless(
        String::new(),
        chunk(json!({"content": "."})),
        Duration::from_millis(50),
    ));
    let p = provider(&url)
        .call_timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    let (why, took) = fails("slow", &p).await;
    assert!(
        why.contains("did not finish within 700ms")
            && why.contains("call_timeout")
            && why.contains("--model-call-timeout"),
        "{why}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(p.in_flight(), 0);
    within("the server to see the client go", async {
        while fake.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Every bound is at least 1: a zero is refused when the provider is built.
#[test]
fn a_zero_bound_is_refused() {
    let e = Provider::builder("http://x", "m")
        .max_tool_calls(0)
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("max_tool_calls must be at least 1"),
        "{e}"
    );
    let e = Provider::builder("http://x", "m")
        .call_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("call_timeout must be longer than zero"),
        "{e}"
    );
}
