//! `codec`: the measurement behind the payload encoding (issue 12, S15a), not a figure.
//!
//! Items and agent state must use a self-describing encoding so that any serde type
//! round-trips (tagged and untagged enums, `serde_json::Value`, `flatten`,
//! `skip_serializing_if`). The two maintained candidates are MessagePack (`rmp-serde`,
//! structs written as maps with `to_vec_named`) and CBOR (`ciborium`). This runs both on
//! payloads shaped like what agent frameworks store (chat messages typed by an
//! internally tagged `role`, tool calls with JSON arguments, an agent state holding a
//! conversation) and prints, per payload and encoding: the encoded size, the time to
//! encode and the time to decode (medians over rounds). Every round trip is checked for
//! equality first; a candidate that loses a value is reported, not timed.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::report::{print_table, summarize, Summary};

/// Rounds per measurement (odd: the median is one round).
const ROUNDS: usize = 7;

/// A chat message as agent frameworks type it: internally tagged by `role`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum ChatMessage {
    System {
        content: String,
    },
    User {
        content: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: serde_json::Value,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FunctionCall {
    name: String,
    arguments: serde_json::Value,
}

/// An agent state: the conversation so far, a step counter and free-form extras.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct AgentState {
    messages: Vec<ChatMessage>,
    step: u32,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

fn text(len: usize, seed: usize) -> String {
    let words = [
        "the", "model", "returned", "a", "tool", "call", "for", "weather", "in", "Paris",
    ];
    let mut s = String::with_capacity(len + 8);
    let mut i = seed;
    while s.len() < len {
        s.push_str(words[i % words.len()]);
        s.push(' ');
        i += 7;
    }
    s
}

fn user(len: usize, seed: usize) -> ChatMessage {
    ChatMessage::User {
        content: text(len, seed),
        name: None,
    }
}

fn tool_call(seed: usize) -> ChatMessage {
    ChatMessage::Assistant {
        content: None,
        tool_calls: vec![ToolCall {
            id: format!("call_{seed:08}"),
            kind: "function".into(),
            function: FunctionCall {
                name: "get_weather".into(),
                arguments: serde_json::json!({
                    "city": "Paris",
                    "units": "metric",
                    "days": 3,
                    "include": ["temperature", "wind", "rain"],
                    "precision": 0.5,
                }),
            },
        }],
    }
}

fn tool_result(seed: usize) -> ChatMessage {
    ChatMessage::Tool {
        tool_call_id: format!("call_{seed:08}"),
        content: serde_json::json!({
            "forecast": [
                {"day": 1, "t": 14.5, "wind": 12, "rain": false},
                {"day": 2, "t": 16.0, "wind": 8, "rain": true},
                {"day": 3, "t": 11.25, "wind": 20, "rain": false},
            ],
            "source": "simulated",
        }),
    }
}

fn state(messages: usize) -> AgentState {
    let mut msgs = vec![ChatMessage::System {
        content: text(400, 1),
    }];
    for i in 0..messages {
        msgs.push(match i % 3 {
            0 => user(200, i),
            1 => tool_call(i),
            _ => tool_result(i),
        });
    }
    let mut extra = BTreeMap::new();
    extra.insert("model".into(), serde_json::json!("sim-large"));
    extra.insert("tokens_used".into(), serde_json::json!(18_342));
    AgentState {
        messages: msgs,
        step: 7,
        extra,
    }
}

trait Candidate {
    const NAME: &'static str;
    fn encode<T: Serialize>(v: &T) -> Vec<u8>;
    fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, String>;
}

struct MessagePack;
impl Candidate for MessagePack {
    const NAME: &'static str = "MessagePack (rmp-serde, named)";
    fn encode<T: Serialize>(v: &T) -> Vec<u8> {
        rmp_serde::to_vec_named(v).expect("rmp-serde encodes the bench payloads")
    }
    fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, String> {
        rmp_serde::from_slice(b).map_err(|e| e.to_string())
    }
}

struct Cbor;
impl Candidate for Cbor {
    const NAME: &'static str = "CBOR (ciborium)";
    fn encode<T: Serialize>(v: &T) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(v, &mut out).expect("ciborium encodes the bench payloads");
        out
    }
    fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, String> {
        ciborium::from_reader(b).map_err(|e| e.to_string())
    }
}

/// (size, encode summary µs, decode summary µs), or why the round trip failed.
fn measure<C: Candidate, T>(value: &T, iters: usize) -> Result<(usize, Summary, Summary), String>
where
    T: Serialize + DeserializeOwned + PartialEq,
{
    let bytes = C::encode(value);
    let back: T = C::decode(&bytes)?;
    if &back != value {
        return Err("decoded value differs".into());
    }
    let mut enc = Vec::with_capacity(ROUNDS);
    let mut dec = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..iters {
            std::hint::black_box(C::encode(std::hint::black_box(value)));
        }
        enc.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        let t = Instant::now();
        for _ in 0..iters {
            let v: T = C::decode(std::hint::black_box(&bytes))?;
            std::hint::black_box(v);
        }
        dec.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    Ok((bytes.len(), summarize(&enc), summarize(&dec)))
}

fn compare<T>(name: &str, value: &T, iters: usize)
where
    T: Serialize + DeserializeOwned + PartialEq,
{
    let mut enc_rows = Vec::new();
    let mut dec_rows = Vec::new();
    let mut sizes = Vec::new();
    for (cand, r) in [
        (MessagePack::NAME, measure::<MessagePack, T>(value, iters)),
        (Cbor::NAME, measure::<Cbor, T>(value, iters)),
    ] {
        match r {
            Ok((size, e, d)) => {
                sizes.push(format!("{cand}: {size} B"));
                enc_rows.push((cand, e));
                dec_rows.push((cand, d));
            }
            Err(e) => println!("  {cand}: round trip FAILED for {name}: {e}"),
        }
    }
    println!("{name}: encoded size {}", sizes.join(", "));
    print_table(&format!("{name}: encode"), "µs", &enc_rows);
    print_table(&format!("{name}: decode"), "µs", &dec_rows);
    println!();
}

/// Runs the comparison and prints it.
pub async fn run() {
    println!(
        "codec: MessagePack vs CBOR on agent payloads (diagnostic behind S15a, not a figure); \
         {ROUNDS} rounds each"
    );
    compare("user message, 200 chars", &user(200, 3), 20_000);
    compare(
        "assistant tool call (JSON arguments)",
        &tool_call(5),
        20_000,
    );
    compare("tool result (JSON content)", &tool_result(5), 20_000);
    compare("agent state, 30 messages + flatten", &state(30), 2_000);
}
