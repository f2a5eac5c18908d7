//! The tools a chat agent offers its model: each a name, a description, the JSON
//! Schema of its arguments (from the Rust type, by `schemars`) and an async function.
//! A call runs as a durable step (S1b) named after the tool-call id: once, its result
//! journaled, replayed (not run again) when the turn runs again after a crash.
//! Arguments that do not parse, an unknown tool, an error or a panic become the
//! result the model reads, never a lost turn.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures::FutureExt;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::conversation::ToolCall;

/// The durable step's key of one tool call (`<session>/<turn>/<occurrence>/<name>`):
/// the same for every run of that call, so an external API deduplicates with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolKey(pub String);

impl std::fmt::Display for ToolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type BoxFut = Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>>;
type Run = Arc<dyn Fn(serde_json::Value, ToolKey) -> BoxFut + Send + Sync>;

struct Entry {
    spec: serde_json::Value,
    run: Run,
}

/// The registered tools.
#[derive(Clone, Default)]
pub struct Tools {
    by_name: Arc<HashMap<String, Arc<Entry>>>,
    specs: Arc<Vec<serde_json::Value>>,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}

/// A tool call's result as journaled and as the model reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ToolOutcome {
    pub(crate) ok: bool,
    pub(crate) output: String,
}

impl Tools {
    /// No tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds tool `name`: the model sees `description` and the JSON Schema of `Args`;
    /// a call runs `f` with the parsed arguments and the call's [`ToolKey`]. `Ok`'s
    /// value (as JSON) is the result; `Err`'s text is the result, marked an error.
    pub fn add<Args, Out, F, Fut>(self, name: &str, description: &str, f: F) -> Self
    where
        Args: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + 'static,
        F: Fn(Args, ToolKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Out, String>> + Send + 'static,
    {
        let schema = serde_json::to_value(schemars::schema_for!(Args))
            .unwrap_or_else(|_| serde_json::json!({"type": "object"}));
        let spec = serde_json::json!({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": schema,
            }
        });
        let f = Arc::new(f);
        let tool = name.to_string();
        let run: Run = Arc::new(move |args, key| {
            let f = f.clone();
            let tool = tool.clone();
            Box::pin(async move {
                let args: Args = serde_json::from_value(args)
                    .map_err(|e| format!("invalid arguments for `{tool}`: {e}"))?;
                let out = f(args, key).await?;
                serde_json::to_value(out).map_err(|e| format!("`{tool}`'s result is not JSON: {e}"))
            })
        });
        let mut by_name = (*self.by_name).clone();
        let mut specs = (*self.specs).clone();
        specs.retain(|s| s["function"]["name"] != name);
        specs.push(spec.clone());
        by_name.insert(name.to_string(), Arc::new(Entry { spec, run }));
        Tools {
            by_name: Arc::new(by_name),
            specs: Arc::new(specs),
        }
    }

    /// The tools' specifications as the request's `tools` lists them.
    pub(crate) fn specs(&self) -> &[serde_json::Value] {
        &self.specs
    }

    /// Whether a tool named `name` is registered.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Runs `call` (inside its durable step).
    pub(crate) async fn run(&self, call: &ToolCall, key: ToolKey) -> ToolOutcome {
        let Some(entry) = self.by_name.get(&call.name).cloned() else {
            return ToolOutcome {
                ok: false,
                output: format!(
                    "there is no tool named `{}`; the tools are: {}",
                    call.name,
                    self.names().join(", ")
                ),
            };
        };
        let _ = &entry.spec;
        let args = if call.arguments.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            match serde_json::from_str(&call.arguments) {
                Ok(v) => v,
                Err(e) => {
                    return ToolOutcome {
                        ok: false,
                        output: format!("the arguments are not JSON: {e}"),
                    }
                }
            }
        };
        match AssertUnwindSafe((entry.run)(args, key))
            .catch_unwind()
            .await
        {
            Ok(Ok(v)) => ToolOutcome {
                ok: true,
                output: match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                },
            },
            Ok(Err(e)) => ToolOutcome {
                ok: false,
                output: e,
            },
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                tracing::error!(tool = %call.name, call = %call.id, panic = %msg, "a tool panicked; the model gets the panic as the tool's error");
                ToolOutcome {
                    ok: false,
                    output: format!("the tool `{}` failed: it panicked: {msg}", call.name),
                }
            }
        }
    }

    fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.by_name.keys().cloned().collect();
        n.sort();
        n
    }
}
