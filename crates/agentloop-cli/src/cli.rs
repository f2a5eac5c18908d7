//! The command line, declared with clap (issue 16): `agentloop run` and `agentloop
//! sessions list|show|history|delete|export|import`, with `--version`, a description
//! and a help page per command, suggestions for typos, and usage errors that exit 2
//! with one line saying what was wrong. Durations in flags are humantime's (`5ms`,
//! `1m30s`). This module only declares and parses; `run.rs` and `sessions.rs` act.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Long-running agent sessions on actors: safe points, checkpoints, graceful shutdown.
#[derive(Debug, Parser)]
#[command(name = "agentloop", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// Run simulated agent sessions with live progress and a graceful shutdown.
    ///
    /// Sessions of the simulated agent run on the data directory (sled by default).
    /// Ctrl+C or SIGTERM shuts down gracefully and prints the report (a second signal
    /// forces); the next run resumes what was interrupted first.
    Run(RunFlags),
    /// Serve sessions over HTTP: REST, Server-Sent Events, /metrics and a live page.
    ///
    /// Sessions of the simulated agent (kind `sim`, and with --model-url kind `chat`,
    /// a chat agent on an OpenAI-compatible model server) on the data directory (sled
    /// by default). Without a token it listens on loopback only. Ctrl+C or SIGTERM
    /// drains (readyz 503), ends every event stream with `ended`, saves the sessions
    /// Interrupted; the next `agentloop serve` resumes them.
    Serve(Box<ServeFlags>),
    /// Push an item to a session of a running server.
    Push(PushFlags),
    /// Stop a session of a running server (graceful unless told otherwise).
    Stop(StopFlags),
    /// Cancel a session of a running server by id (its record turns Canceled).
    Cancel(IdFlags),
    /// Answer a session's business interrupt on a running server and resume it.
    Resume(ResumeFlags),
    /// Delete a stored session (record and history) through a running server.
    Delete(IdFlags),
    /// Arm a durable timer or schedule on a session of a running server (S39): its
    /// item is pushed into the session at its time (waking it if it sleeps), once,
    /// across restarts; a schedule recurs until canceled.
    Timer(TimerFlags),
    /// Cancel a durable timer or schedule of a session of a running server by number
    /// (`agentloop sessions timers ID` lists them).
    CancelTimer(CancelTimerFlags),
    /// Print a session's events as they happen, reconnecting where it left off, until
    /// the session ends.
    Watch(WatchFlags),
    /// Inspect, delete, export and import stored session records, offline (list and
    /// show also from a running server with --server).
    ///
    /// The data directory is read offline: stop the process that uses it first, or ask
    /// the server that holds it (`list --server URL`, `show ID --server URL`).
    #[command(subcommand)]
    Sessions(SessionsCmd),
    /// Print the HTTP front's OpenAPI 3.1 document (what `GET /openapi.json` serves),
    /// to generate a client from it: `agentloop openapi > openapi.json`.
    Openapi,
}

/// The embedded store engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum EngineArg {
    /// sled 0.34 (the default).
    Sled,
    /// fjall 3.
    Fjall,
}

/// What an acknowledged write survives (S15b; docs/operations.md, "Durability levels").
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DurabilityArg {
    /// The default: an fsync before every acknowledgement; survives a power loss.
    Power,
    /// Survives a process crash, not a power loss (sled: a power cut loses up to its
    /// 500 ms flush interval; fjall: what the kernel had not written back, up to ~30 s;
    /// PostgreSQL: synchronous_commit = off). Faster.
    Crash,
}

impl DurabilityArg {
    /// The store's level.
    pub(crate) fn level(self) -> agentloop::store::StoreDurability {
        match self {
            DurabilityArg::Power => agentloop::store::StoreDurability::Power,
            DurabilityArg::Crash => agentloop::store::StoreDurability::Crash,
        }
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!("`{text}` is not a duration ({e}); write a number with a unit, like 5ms or 1s")
    })
}

/// Where `run` and `serve` keep their sessions: the configuration file, the data
/// directory and the engine.
#[derive(Debug, Args)]
pub(crate) struct StoreFlags {
    #[command(flatten)]
    pub versions: SimVersions,
    /// Configuration file (default: ./agentloop.toml when it exists).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (default: [store] data_dir, ./agentloop-data).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Embedded store engine (default: [store] engine, sled); a directory the other
    /// engine wrote is refused.
    #[arg(long, value_enum)]
    pub engine: Option<EngineArg>,
    /// What an acknowledged write survives, on every engine (default: [store]
    /// durability, power).
    #[arg(long, value_enum)]
    pub durability: Option<DurabilityArg>,
}

/// The versions of the simulated agent kind `sim` a process registers (S40). The
/// simulated agent's versions share its code; they let a deploy be rehearsed with this
/// binary: pinning, migration and refusal work as for any agent.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub(crate) struct SimVersions {
    /// The versions of kind `sim` to register, e.g. `1,2`: new sessions run the newest;
    /// a stored session resumes on its own version when listed here, else migrated
    /// (with --sim-migrations), else refused with its record kept.
    #[arg(long, value_name = "V,...", value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u32).range(1..))]
    pub sim_versions: Vec<u32>,
    /// Also register migrations of `sim` records from each version to the next, up to
    /// the newest listed (they change the version only: the versions share a state
    /// type).
    #[arg(long)]
    pub sim_migrations: bool,
}

impl SimVersions {
    /// Registers kind `sim` at these versions (each built by `factory`), with the
    /// migrations when asked.
    pub fn register<A, F>(
        &self,
        mut builder: agentloop::RuntimeBuilder<agentloop_sim::SimItem, agentloop_sim::SimEvent>,
        factory: F,
    ) -> agentloop::RuntimeBuilder<agentloop_sim::SimItem, agentloop_sim::SimEvent>
    where
        A: agentloop::Agent<Item = agentloop_sim::SimItem, Event = agentloop_sim::SimEvent>,
        F: Fn(&[u8]) -> Result<A, String> + Clone + Send + Sync + 'static,
    {
        for &v in &self.sim_versions {
            builder = builder.register_agent_version("sim", v, factory.clone());
        }
        if self.sim_migrations {
            let newest = self.sim_versions.iter().copied().max().unwrap_or(1);
            for from in 1..newest {
                builder =
                    builder.register_migration("sim", from, agentloop::versions::Migration::new());
            }
        }
        builder
    }
}

impl StoreFlags {
    /// `--engine` as the configuration file writes it.
    pub fn engine_name(&self) -> Option<String> {
        self.engine.map(|e| match e {
            EngineArg::Sled => "sled".to_string(),
            EngineArg::Fjall => "fjall".to_string(),
        })
    }

    /// `--durability` as the configuration file writes it.
    pub fn durability_name(&self) -> Option<String> {
        self.durability.map(|d| d.level().as_str().to_string())
    }
}

/// `agentloop run`.
#[derive(Debug, Args)]
pub(crate) struct RunFlags {
    #[command(flatten)]
    pub store: StoreFlags,
    /// New sessions to spawn (0 only resumes).
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Items pushed to each new session (sessions x items must be below 2^32).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub items_per_session: u64,
    /// Pause between two pushes to a session, e.g. 50ms [default: 50ms].
    #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with = "push_ms")]
    pub push: Option<Duration>,
    /// The same in milliseconds.
    #[arg(long, value_name = "MS")]
    pub push_ms: Option<u64>,
    /// Model-call + tool-round pairs per turn.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Latency of a simulated model call, e.g. 40ms [default: 40ms].
    #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with = "model_ms")]
    pub model: Option<Duration>,
    /// The same in milliseconds.
    #[arg(long, value_name = "MS")]
    pub model_ms: Option<u64>,
    /// Latency of a simulated tool round, e.g. 20ms [default: 20ms].
    #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with = "tool_ms")]
    pub tool: Option<Duration>,
    /// The same in milliseconds.
    #[arg(long, value_name = "MS")]
    pub tool_ms: Option<u64>,
    /// Append an audit line per event to FILE: `pushing <session> <id>` before a push,
    /// `acked <session> <id>` once it is acknowledged (durable under flush = "sync"),
    /// `turn <id>...` when a turn of the simulated agent completes.
    #[arg(long, value_name = "FILE")]
    pub item_log: Option<PathBuf>,
}

impl RunFlags {
    /// A duration flag in milliseconds: the humantime form, its `-ms` twin, or `default`.
    pub fn millis(d: Option<Duration>, ms: Option<u64>, default: u64) -> u64 {
        d.map(|d| d.as_millis() as u64).or(ms).unwrap_or(default)
    }
}

/// `agentloop serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeFlags {
    /// Its [http] table sets the address, token, bounds and CORS origins.
    #[command(flatten)]
    pub store: StoreFlags,
    /// Address to listen on (default: [http] listen, 127.0.0.1:7420; port 0 picks a
    /// free port, printed at start).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Bearer token clients must send (default: [http] token); needed to listen
    /// beyond loopback; at least 16 characters. Prefer AGENTLOOP_TOKEN or --token-file:
    /// a flag's value shows in `ps`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "AGENTLOOP_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,
    /// Read the bearer token from FILE (its first line), e.g. a mounted secret. A file
    /// other users may read is warned about: chmod 600 it.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTPS (S43): the server's certificate chain, PEM (the certificate first,
    /// then its intermediates); HTTP/2 and HTTP/1.1 are offered. Needs --tls-key. The
    /// bearer token is still required beyond loopback.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Append `turn <id>...` to FILE when a turn of the simulated agent completes (an
    /// audit of deliveries across restarts).
    #[arg(long, value_name = "FILE")]
    pub item_log: Option<PathBuf>,
    /// Keep the records in PostgreSQL instead of the data directory, e.g.
    /// postgresql://agentloop@db.internal/agentloop (a cluster's shared store).
    #[arg(
        long,
        value_name = "URL",
        env = "AGENTLOOP_POSTGRES",
        hide_env_values = true
    )]
    pub postgres: Option<String>,
    /// Run as node NAME of a cluster sharing the --postgres store: a restarted node
    /// resumes its own sessions, and the sessions of a node that died are adopted by
    /// the live nodes (names must be unique among the nodes).
    #[arg(long, value_name = "NAME", requires = "postgres")]
    pub node: Option<String>,
    /// Where this node listens for other nodes (ractor_cluster), e.g. 10.0.0.11:7520;
    /// loopback or a private address only (the cookie does not encrypt).
    #[arg(long, value_name = "ADDR", requires = "node")]
    pub cluster_listen: Option<String>,
    /// A node to join at start (its --cluster-listen address); repeat for several.
    #[arg(long, value_name = "ADDR", requires = "cluster_listen")]
    pub join: Vec<String>,
    /// The cluster's shared secret (the same on every node).
    #[arg(
        long,
        value_name = "SECRET",
        env = "AGENTLOOP_COOKIE",
        hide_env_values = true,
        requires = "cluster_listen"
    )]
    pub cookie: Option<String>,
    /// Encrypt the links to the other nodes (S43): this node's certificate chain, PEM,
    /// from the cluster's CA (--cluster-ca); with TLS a node may listen beyond loopback
    /// and private ranges. Needs --cluster-tls-key and --cluster-ca.
    #[arg(long, value_name = "FILE", requires_all = ["cluster_tls_key", "cluster_ca", "cluster_listen"])]
    pub cluster_tls_cert: Option<PathBuf>,
    /// The private key of --cluster-tls-cert, PEM.
    #[arg(long, value_name = "FILE", requires = "cluster_tls_cert")]
    pub cluster_tls_key: Option<PathBuf>,
    /// The cluster's CA (PEM): every node's certificate must chain to it; a node that
    /// presents none, or one from another CA, is refused.
    #[arg(long, value_name = "FILE", requires = "cluster_tls_cert")]
    pub cluster_ca: Option<PathBuf>,
    /// Move the sessions this node runs to the node placement names when placement
    /// changes (a node joined), at their next safe point, once membership has been
    /// stable for 6 s (docs/operations.md, "Rebalancing").
    #[arg(long, requires = "cluster_listen")]
    pub rebalance: bool,
    /// Put sessions to sleep after DURATION idle (no turn, nothing buffered, nobody
    /// subscribed), e.g. 10m: their records hold them and the next request wakes them
    /// (default: [supervisor] idle_after; off unless set).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub idle_after: Option<Duration>,
    /// Serve agent kind `chat` beside `sim`: a chat agent on the OpenAI-compatible
    /// server at URL, e.g. http://127.0.0.1:11434/v1 (Ollama) or
    /// https://api.openai.com/v1 (docs/models.md).
    #[arg(long, value_name = "URL", requires = "model")]
    pub model_url: Option<String>,
    /// The model kind `chat` calls, e.g. llama3.2 or gpt-4o-mini.
    #[arg(long, value_name = "NAME", requires = "model_url")]
    pub model: Option<String>,
    /// The model server's provider name in /metrics (label `provider`), traces
    /// (`gen_ai.provider.name`), logs and errors, e.g. ollama or vllm [default: openai,
    /// the API it speaks; azure.ai.openai for Azure OpenAI] (docs/models.md).
    #[arg(long, value_name = "NAME", requires = "model_url", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub model_provider: Option<String>,
    /// The API key's environment variable (default: OPENAI_API_KEY when it is set;
    /// local servers need none).
    #[arg(
        long,
        value_name = "VAR",
        requires = "model_url",
        conflicts_with = "model_key_file"
    )]
    pub model_key_env: Option<String>,
    /// Read the API key from FILE (its first line), e.g. a mounted secret.
    #[arg(long, value_name = "FILE", requires = "model_url")]
    pub model_key_file: Option<PathBuf>,
    /// Model calls in flight at once over every chat session [default: 8].
    #[arg(long, value_name = "N", requires = "model_url")]
    pub model_concurrency: Option<usize>,
    /// Model server bounds (docs/operations.md, "Model server bounds"): the longest
    /// wait for the model server to begin answering, per attempt [default: 2m].
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = "model_url")]
    pub model_first_byte_timeout: Option<Duration>,
    /// The longest a model call may take in all, retries included [default: 10m].
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = "model_url")]
    pub model_call_timeout: Option<Duration>,
    /// The longest silence mid-answer [default: 2m].
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = "model_url")]
    pub model_idle_timeout: Option<Duration>,
    /// The most bytes of one model response on the wire [default: 32 MiB].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..), requires = "model_url")]
    pub model_max_response_bytes: Option<u64>,
    /// The most bytes of an answer's text [default: 1 MiB].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..), requires = "model_url")]
    pub model_max_text_bytes: Option<u64>,
    /// The most tool calls in one answer [default: 128].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "model_url")]
    pub model_max_tool_calls: Option<u64>,
    /// The most bytes of one tool call's name and arguments [default: 1 MiB].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..), requires = "model_url")]
    pub model_max_tool_argument_bytes: Option<u64>,
    /// The most bytes of one line of the model's stream [default: 4 MiB].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..), requires = "model_url")]
    pub model_max_line_bytes: Option<u64>,
    /// The most bytes of a model error body read (and shown) [default: 4 KiB].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..), requires = "model_url")]
    pub model_max_error_body_bytes: Option<u64>,
    /// Export traces (spans of sessions, turns, steps, model and tool calls, with
    /// OpenTelemetry's GenAI attributes) to the OTLP/HTTP collector at URL, e.g.
    /// http://127.0.0.1:4318 (docs/models.md, "Traces"). Off unless set.
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// A running server to talk to: `--server` and `--token`.
#[derive(Debug, Args)]
pub(crate) struct Remote {
    /// The server's URL, e.g. http://127.0.0.1:7420 (`agentloop serve` prints it).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The server's bearer token.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "AGENTLOOP_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

/// A running server, required.
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// The server's URL, e.g. http://127.0.0.1:7420 (`agentloop serve` prints it).
    #[arg(long, value_name = "URL", required = true)]
    pub server: String,
    /// The server's bearer token.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "AGENTLOOP_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

/// `agentloop cancel|delete <id>`.
#[derive(Debug, Args)]
pub(crate) struct IdFlags {
    /// The session id.
    pub id: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `agentloop push <id> <item>`.
#[derive(Debug, Args)]
pub(crate) struct PushFlags {
    /// The session id.
    pub id: String,
    /// The item as JSON (e.g. '{"id": 1, "text": "hi"}'), or - to read it from stdin.
    pub item: String,
    /// Preempt the running turn at these safe points: after_model_call,
    /// after_tool_calls or any.
    #[arg(long, value_name = "SAFE_POINT")]
    pub preempt: Option<String>,
    /// The idempotency key (default: one made for this invocation); a retry with the
    /// same key never delivers the item twice.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// How long to keep retrying, with the same key, while the server cannot be
    /// reached (restarting) or answers 503 not_live (the session is being recovered);
    /// 0s tries once.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    pub retry_for: Duration,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `agentloop stop <id>`.
#[derive(Debug, Args)]
pub(crate) struct StopFlags {
    /// The session id.
    pub id: String,
    /// graceful (default), at, immediate, drain, bare or idle.
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// The cancel's timeout (graceful, at), e.g. 5s.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// For --mode at: after_model_call, after_tool_calls or any.
    #[arg(long, value_name = "SAFE_POINT")]
    pub at: Option<String>,
    /// For --mode idle: exit once idle this long, e.g. 30s.
    #[arg(long, value_name = "DURATION")]
    pub idle_for: Option<String>,
    /// A business reason, kept in the exit state and the record.
    #[arg(long)]
    pub cause: Option<String>,
    /// Do not save the session at exit.
    #[arg(long)]
    pub skip_checkpoint: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `agentloop resume <id> <answer>`.
#[derive(Debug, Args)]
pub(crate) struct ResumeFlags {
    /// The session id.
    pub id: String,
    /// The answer as JSON (an item), or - to read it from stdin.
    pub answer: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `agentloop timer <id> <item> (--in D | --at-ms MS | --every D | --cron EXPR)`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["in_", "at_ms", "every", "cron"])))]
pub(crate) struct TimerFlags {
    /// The session id.
    pub id: String,
    /// The item to push, as JSON (e.g. '{"id": 1, "text": "check the build"}'), or -
    /// to read it from stdin.
    pub item: String,
    /// Due after this long, e.g. 10m (at most ten years).
    #[arg(long = "in", value_name = "DURATION")]
    pub in_: Option<String>,
    /// Due at this time, in ms since the Unix epoch.
    #[arg(long, value_name = "MS")]
    pub at_ms: Option<u64>,
    /// Recurring: every DURATION (e.g. 5m), on a grid from now.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub every: Option<Duration>,
    /// Recurring: a cron expression, in UTC (five fields, or six with seconds first;
    /// @hourly…), e.g. "0 9 * * 1-5".
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `agentloop cancel-timer <id> <n>`.
#[derive(Debug, Args)]
pub(crate) struct CancelTimerFlags {
    /// The session id.
    pub id: String,
    /// The timer's number.
    pub timer: u64,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `agentloop watch <id>`.
#[derive(Debug, Args)]
pub(crate) struct WatchFlags {
    /// The session id.
    pub id: String,
    /// Reconnections in a row without an event before giving up.
    #[arg(long, default_value_t = 10)]
    pub reconnects: u32,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `--data-dir`, shared by the `sessions` commands.
#[derive(Debug, Args)]
pub(crate) struct DataDir {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./agentloop-data")]
    pub data_dir: PathBuf,
}

/// `agentloop sessions …`.
#[derive(Debug, Subcommand)]
pub(crate) enum SessionsCmd {
    /// List the stored records (status, items, owner, age); corrupt ones are listed too.
    List {
        #[command(flatten)]
        dir: DataDir,
        /// Only these statuses: running, stopped, interrupted, completed, canceled,
        /// failed or corrupt (comma-separated, or the flag repeated).
        #[arg(long, value_name = "STATUS", value_delimiter = ',', value_parser = status_word)]
        status: Vec<StatusWord>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Ask a running server instead of reading the data directory.
        #[command(flatten)]
        remote: Remote,
        /// Read a PostgreSQL store (a cluster's) instead of the data directory; the
        /// OWNER column names each session's node.
        #[arg(
            long,
            value_name = "URL",
            env = "AGENTLOOP_POSTGRES",
            hide_env_values = true,
            conflicts_with = "server"
        )]
        postgres: Option<String>,
    },
    /// Show one record: its items, state and question as JSON whatever their type.
    Show {
        /// The session id.
        id: String,
        #[command(flatten)]
        dir: DataDir,
        /// The agentloop.toml whose [redact] fields are masked (default ./agentloop.toml
        /// when it exists); --raw is not redacted.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Every stored entry undecoded, with what each part reads as: for a record
        /// that does not decode.
        #[arg(long)]
        raw: bool,
        /// Ask a running server instead (its redacted view, and what the live session
        /// does), printed as JSON.
        #[command(flatten)]
        remote: Remote,
    },
    /// The session's kept turn-end checkpoints (turn, time, size).
    History {
        /// The session id.
        id: String,
        #[command(flatten)]
        dir: DataDir,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The session's events kept in the store (S20a): number, time, kind and JSON,
    /// oldest first (what a reconnecting client after `--after` would be sent).
    Events {
        /// The session id.
        id: String,
        #[command(flatten)]
        dir: DataDir,
        /// Only the events numbered after this one.
        #[arg(long, value_name = "N", default_value_t = 0)]
        after: u64,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The session's durable timers and schedules (S39): number, next due time,
    /// schedule, fires so far and item, by number.
    Timers {
        /// The session id.
        id: String,
        #[command(flatten)]
        dir: DataDir,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove the session's record, its checkpoint history and its kept events.
    Delete {
        /// The session id.
        id: String,
        #[command(flatten)]
        dir: DataDir,
    },
    /// What starting this build with these agent versions would do to every stored
    /// session (S40): resume it on its own version (pinned), migrate it to the newest
    /// (the migration runs on a copy and is checked), or refuse it (its record kept),
    /// and why. Nothing is written; the start does the same.
    Migrate {
        #[command(flatten)]
        dir: DataDir,
        /// Read a PostgreSQL store (a cluster's) instead of the data directory.
        #[arg(
            long,
            value_name = "URL",
            env = "AGENTLOOP_POSTGRES",
            hide_env_values = true
        )]
        postgres: Option<String>,
        #[command(flatten)]
        versions: SimVersions,
        /// Report only: required (sessions are migrated by the start that resumes
        /// them, never by this command).
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Every session (record and history) as JSON lines on stdout, to move them to
    /// another directory or engine.
    Export {
        #[command(flatten)]
        dir: DataDir,
    },
    /// Store the sessions of JSON lines read from stdin (an export) in the data
    /// directory; a session it already holds is refused and kept.
    Import {
        #[command(flatten)]
        dir: DataDir,
        /// The engine of a new directory (default sled; an existing one keeps its own).
        #[arg(long, value_enum)]
        engine: Option<EngineArg>,
        /// What the import's writes survive: power (the default) or crash.
        #[arg(long, value_enum)]
        durability: Option<DurabilityArg>,
    },
}

/// A `--status` word: a status, or `corrupt` (records that do not decode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusWord {
    Status(agentloop::store::StatusKind),
    Corrupt,
}

fn status_word(word: &str) -> Result<StatusWord, String> {
    use agentloop::store::StatusKind::*;
    Ok(StatusWord::Status(
        match word.trim().to_ascii_lowercase().as_str() {
            "running" => Running,
            "stopped" => Stopped,
            "interrupted" => Interrupted,
            "completed" => Completed,
            "canceled" | "cancelled" => Canceled,
            "failed" => Failed,
            "corrupt" => return Ok(StatusWord::Corrupt),
            _ => {
                return Err(format!(
                    "unknown status `{word}`; use running, stopped, interrupted, completed, canceled, failed or corrupt"
                ))
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("agentloop").chain(line.split_whitespace()))
    }

    #[test]
    fn the_declaration_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_and_refuses() {
        let Cmd::Run(r) = parse("run --sessions 3 --push 2ms --model-ms 7")
            .unwrap()
            .command
        else {
            panic!("not run")
        };
        assert_eq!(r.sessions, 3);
        assert_eq!(RunFlags::millis(r.push, r.push_ms, 50), 2);
        assert_eq!(RunFlags::millis(r.model, r.model_ms, 40), 7);
        assert_eq!(RunFlags::millis(r.tool, r.tool_ms, 20), 20);
        let Cmd::Sessions(SessionsCmd::List { status, .. }) =
            parse("sessions list --status running,corrupt")
                .unwrap()
                .command
        else {
            panic!("not list")
        };
        assert_eq!(
            status,
            vec![
                StatusWord::Status(agentloop::store::StatusKind::Running),
                StatusWord::Corrupt
            ]
        );
        for bad in [
            "run --bogus",
            "run extra",
            "run --push banana",
            "run --push 2ms --push-ms 2",
            "run --items-per-session 0",
            "sessions",
            "sessions lsit",
            "sessions show",
            "sessions list --status sleepy",
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
    }
}
