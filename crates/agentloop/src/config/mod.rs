//! Runtime configuration read from a TOML file, `agentloop.toml` by default (DESIGN
//! S28): `[shutdown]`, `[store]` and `[supervisor]`, with human-readable durations
//! (`"30s"`, `"500ms"`, `"2m"`, `"1m30s"`: the `humantime` crate's grammar).
//!
//! This module owns parsing and range checks: a value out of range is refused with a
//! [`ConfigError`] that names the key and the allowed range, a malformed duration says
//! it is not a duration, and either names the file it came from. It does not start
//! anything; the runtime builder and the CLI read the validated values. Which strategy
//! names exist is checked where strategies are registered (the runtime builder).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::session::Durability;
use crate::store::lease::{DEFAULT_HEARTBEAT, DEFAULT_LEASE_TIMEOUT};
use crate::store::Engine;
use crate::supervisor::RestartBudget;

mod values;
pub(crate) use values::check_lease;
pub use values::{check_idle_after, format_duration, parse_duration};
use values::{check_range, duration, engine, io_timeout, positive, BEAT, IDLE, LEASE};

/// The default configuration file name, looked up in the working directory.
pub const DEFAULT_CONFIG_FILE: &str = "agentloop.toml";

/// The default data directory of the sled store.
pub const DEFAULT_DATA_DIR: &str = "agentloop-data";

/// The longest grace period accepted.
pub const MAX_GRACE: Duration = Duration::from_secs(300);
/// The longest cleanup phase accepted.
pub const MAX_CLEANUP: Duration = Duration::from_secs(60);
/// The longest force timeout accepted.
pub const MAX_FORCE_TIMEOUT: Duration = Duration::from_secs(300);

/// A configuration that cannot be used. Every variant names the file or the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("invalid configuration{}: {message}", origin(.path))]
    Parse {
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// The parser's message (it names the line and the key).
        message: String,
    },
    /// A duration that does not parse (humantime's grammar: `"30s"`, `"500ms"`,
    /// `"1m30s"`, `"2h"`).
    #[error("invalid configuration: `{key}` = {value:?} is not a duration ({reason}); write a number with a unit, like \"30s\", \"500ms\" or \"1m30s\"")]
    NotADuration {
        /// The key, e.g. `shutdown.grace`.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What humantime said.
        reason: String,
    },
    /// A value in a configuration file is invalid: the file, and what is wrong.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong (never `Io`, `Parse` or `InFile`).
        source: Box<ConfigError>,
    },
    /// A value is out of its range.
    #[error("invalid configuration: `{key}` = {value:?} is out of range; allowed: {allowed}")]
    OutOfRange {
        /// The key, e.g. `shutdown.grace`.
        key: &'static str,
        /// The value as written.
        value: String,
        /// The allowed range, in words.
        allowed: &'static str,
    },
}

fn origin(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!(" in {}", p.display()),
        None => String::new(),
    }
}

/// The `[shutdown]` table (S27).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownConfig {
    /// The strategy's registered name: `cooperative` (default), `immediate`, `drain`,
    /// `migrate` (a cluster node: hand the sessions to the other nodes, issue 18),
    /// or one registered on the runtime.
    pub strategy: String,
    /// How long sessions get to stop gracefully (default 30 s, at most 300 s).
    pub grace: Duration,
    /// The whole cleanup phase's bound (default 5 s, at most 60 s).
    pub cleanup: Duration,
    /// How long forced sessions get before they are killed (default 5 s, at most 300 s).
    pub force_timeout: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            strategy: "cooperative".into(),
            grace: Duration::from_secs(30),
            cleanup: Duration::from_secs(5),
            force_timeout: Duration::from_secs(5),
        }
    }
}

impl ShutdownConfig {
    /// Checks every value's range (the same checks as the file's).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.strategy.trim().is_empty() {
            return Err(ConfigError::OutOfRange {
                key: "shutdown.strategy",
                value: self.strategy.clone(),
                allowed: "a registered strategy name: cooperative, immediate, drain, migrate (cluster nodes), or your own",
            });
        }
        check_range(
            "shutdown.grace",
            self.grace,
            MAX_GRACE,
            "more than 0s and at most 300s",
        )?;
        check_range(
            "shutdown.cleanup",
            self.cleanup,
            MAX_CLEANUP,
            "more than 0s and at most 60s",
        )?;
        check_range(
            "shutdown.force_timeout",
            self.force_timeout,
            MAX_FORCE_TIMEOUT,
            "more than 0s and at most 300s",
        )
    }
}

/// The `[store]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The data directory (default `./agentloop-data`).
    pub data_dir: PathBuf,
    /// When persistent sessions write their record (`flush = "sync"`, the default,
    /// `"turn"` or `"exit"`; S16a).
    pub flush: Durability,
    /// The embedded engine and what an acknowledged write survives (`engine = "sled"`,
    /// the default, or `"fjall"`; `durability = "power"`, the default, or `"crash"`;
    /// S15b, docs/operations.md, "Durability levels").
    pub engine: Engine,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            flush: Durability::Sync,
            engine: Engine::default(),
        }
    }
}

/// The `[supervisor]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// At most this many restarts of one session in `restart_window` (default 3 in 60 s).
    pub restart_budget: RestartBudget,
    /// The instance heartbeat interval (default 10 s).
    pub heartbeat: Duration,
    /// A `Running` record whose owner has not beaten for this long is recoverable
    /// (default 30 s).
    pub lease_timeout: Duration,
    /// How long a persistent session idles before it sleeps (S39; `idle_after`, off
    /// unless set; 1 s to 30 days).
    pub idle_after: Option<Duration>,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            restart_budget: RestartBudget::default(),
            heartbeat: DEFAULT_HEARTBEAT,
            lease_timeout: DEFAULT_LEASE_TIMEOUT,
            idle_after: None,
        }
    }
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `[shutdown]`.
    pub shutdown: ShutdownConfig,
    /// `[store]`.
    pub store: StoreConfig,
    /// `[supervisor]`.
    pub supervisor: SupervisorConfig,
    /// `[redact]`.
    pub redact: RedactConfig,
    /// `[http]`: read by `agentloop serve` (the runtime itself does not serve).
    pub http: HttpConfig,
    /// `[limits]`: bounds on what clients may ask for (S34a).
    pub limits: LimitsConfig,
    /// `[cluster]`: read by `agentloop serve` for a cluster node (the runtime itself
    /// does not join nodes).
    pub cluster: ClusterConfig,
}

/// The `[cluster]` table (S43), for `agentloop serve`'s node: mutual TLS between nodes.
/// The flags `--cluster-tls-cert`, `--cluster-tls-key` and `--cluster-ca` override it;
/// all three or none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's certificate chain (PEM), from the cluster's CA.
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA (PEM): every node's certificate must chain to it.
    pub ca: Option<PathBuf>,
}

/// The `[limits]` table (S34a, issue 29): bounds on quantities a client controls,
/// checked before anything is accepted. Every key is optional.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitsConfig {
    /// The most model-call/tool rounds a simulated agent's configuration may ask for
    /// (`sim_rounds`, default 1 000): its script is built at spawn.
    pub sim_rounds: usize,
    /// The longest simulated model call or tool round (`sim_step`, default 10 min).
    pub sim_step: Duration,
    /// The largest replay buffer a session spawned over HTTP may ask for
    /// (`replay`, default 10 000 events).
    pub replay: usize,
    /// The longest duration a request may carry: a stop's or a preempt's timeout, a
    /// preempt's delay, an idle stop (`duration`, default 24 h).
    pub duration: Duration,
    /// Live sessions a runtime runs at once (`sessions`, default 100 000): a spawn
    /// over it is refused (HTTP 429 `too_many_sessions`).
    pub sessions: usize,
    /// Items a session holds, waiting or in a turn (`session_items`, default 10 000):
    /// a push over it is refused (HTTP 429 `session_full`).
    pub session_items: usize,
    /// Stored bytes of the items a persistent session holds (`session_bytes`, default
    /// 64 MiB): a push that would pass it is refused (HTTP 429 `session_full`).
    pub session_bytes: usize,
    /// Durable timers and schedules one session holds (`session_timers`, default 256):
    /// one more is refused (HTTP 429 `too_many_timers`).
    pub session_timers: usize,
    /// The largest item a durable timer carries, encoded (`timer_bytes`, default
    /// 64 KiB): a larger one is refused (HTTP 413 `too_large`).
    pub timer_bytes: usize,
    /// The shortest period of a schedule (`timer_period`, default 1 s): a shorter one
    /// is refused (HTTP 400 `bad_request`).
    pub timer_period: Duration,
    /// The memory the whole process may hold before new work is refused (`memory`,
    /// bytes; unset: half of what the machine, its cgroup or `ulimit -v` allows):
    /// over it, spawns, pushes, timers and new event streams get HTTP 503
    /// `over_memory` with `Retry-After` (issue 52).
    pub memory: Option<usize>,
    /// The pace of every replay from the store together, in events a second
    /// (`replay_rate`, default 100 000; issue 52): clients catching up from the start
    /// share it, and the rest of the machine keeps what is left.
    pub replay_rate: u64,
}

impl LimitsConfig {
    /// The process's memory budget these limits set (`memory`, or the default).
    pub fn memory_budget(&self) -> Option<crate::memory::MemoryBudget> {
        self.memory
            .map(crate::memory::MemoryBudget::new)
            .or_else(crate::memory::MemoryBudget::auto)
    }

    /// The supervisor's bounds these limits set.
    pub fn session_limits(&self) -> crate::supervisor::SessionLimits {
        crate::supervisor::SessionLimits {
            max_sessions: self.sessions,
            buffer: crate::session::BufferBound {
                items: self.session_items,
                bytes: self.session_bytes,
            },
            timers: crate::timers::TimerBounds {
                per_session: self.session_timers,
                item_bytes: self.timer_bytes,
                min_period: self.timer_period,
            },
        }
    }
}

/// `[limits] sessions` by default.
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// `[limits] session_items` by default.
pub const DEFAULT_SESSION_ITEMS: usize = 10_000;
/// `[limits] session_bytes` by default.
pub const DEFAULT_SESSION_BYTES: usize = 64 << 20;

/// `[limits] session_timers` by default.
pub const DEFAULT_SESSION_TIMERS: usize = 256;
/// `[limits] timer_bytes` by default.
pub const DEFAULT_TIMER_BYTES: usize = 64 << 10;
/// `[limits] timer_period` by default.
pub const DEFAULT_TIMER_PERIOD: Duration = Duration::from_secs(1);

/// `[limits] replay_rate` by default.
pub const DEFAULT_REPLAY_RATE: u64 = 100_000;

/// `[limits] sim_rounds` by default.
pub const DEFAULT_SIM_ROUNDS: usize = 1_000;
/// `[limits] sim_step` by default.
pub const DEFAULT_SIM_STEP: Duration = Duration::from_secs(600);
/// `[limits] replay` by default.
pub const DEFAULT_MAX_REPLAY: usize = 10_000;
/// `[limits] duration` by default.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            sim_rounds: DEFAULT_SIM_ROUNDS,
            sim_step: DEFAULT_SIM_STEP,
            replay: DEFAULT_MAX_REPLAY,
            duration: DEFAULT_MAX_DURATION,
            sessions: DEFAULT_MAX_SESSIONS,
            session_items: DEFAULT_SESSION_ITEMS,
            session_bytes: DEFAULT_SESSION_BYTES,
            session_timers: DEFAULT_SESSION_TIMERS,
            timer_bytes: DEFAULT_TIMER_BYTES,
            timer_period: DEFAULT_TIMER_PERIOD,
            memory: None,
            replay_rate: DEFAULT_REPLAY_RATE,
        }
    }
}

/// The `[http]` table, for `agentloop serve` (issue 17). Every key is optional; unset
/// bounds take the HTTP front's defaults.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct HttpConfig {
    /// Where to listen, e.g. `"127.0.0.1:7420"`.
    pub listen: Option<String>,
    /// The bearer token clients must send (the `AGENTLOOP_TOKEN` environment variable
    /// overrides it). Without one the server listens on loopback only.
    pub token: Option<String>,
    /// The largest request body, in bytes.
    pub body_limit: Option<usize>,
    /// Requests in flight at once.
    pub max_requests: Option<usize>,
    /// Event streams open at once.
    pub max_event_streams: Option<usize>,
    /// Origins allowed to call from browser pages served elsewhere (CORS); none by
    /// default.
    pub cors_origins: Vec<String>,
    /// Connections served at once (S34a).
    pub max_connections: Option<usize>,
    /// Connections one peer (an IPv4 address, an IPv6 /64) may hold at once (issue 52).
    pub max_connections_per_peer: Option<usize>,
    /// How long a connection may stay open with no request in flight (issue 52).
    pub idle_timeout: Option<Duration>,
    /// How long a connection may write nothing once the shutdown began (issue 52).
    pub shutdown_write_timeout: Option<Duration>,
    /// The largest request head (request line and headers), in bytes (issue 52).
    pub max_header_bytes: Option<usize>,
    /// How long a request's headers may take to arrive (S34a).
    pub header_read_timeout: Option<Duration>,
    /// How long a whole request body may take to arrive (S34a).
    pub body_read_timeout: Option<Duration>,
    /// How long a write to a client may make no progress before its connection is
    /// closed (S20, S34a: an event stream nobody reads).
    pub write_timeout: Option<Duration>,
    /// Log every request at INFO (method, path, status, latency; S34a). Off by
    /// default.
    pub access_log: bool,
    /// Serve HTTPS with this certificate chain (PEM, S43); with `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("body_limit", &self.body_limit)
            .field("max_requests", &self.max_requests)
            .field("max_event_streams", &self.max_event_streams)
            .field("cors_origins", &self.cors_origins)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_peer", &self.max_connections_per_peer)
            .field("idle_timeout", &self.idle_timeout)
            .field("shutdown_write_timeout", &self.shutdown_write_timeout)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("access_log", &self.access_log)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .finish()
    }
}

/// The `[redact]` table: what clients never see (issue 13, 5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedactConfig {
    /// Object fields whose values every client view masks (`fields = ["api_key"]`),
    /// at any depth of items, states, questions and agent events. The runtime and
    /// `agentloop sessions show` apply it; the stored records keep them.
    pub fields: Vec<String>,
}

impl RedactConfig {
    /// The redaction this table asks for.
    pub fn redaction(&self) -> crate::view::Redaction {
        crate::view::Redaction::fields(self.fields.iter().cloned())
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    shutdown: RawShutdown,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    supervisor: RawSupervisor,
    #[serde(default)]
    redact: RawRedact,
    #[serde(default)]
    http: RawHttp,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    cluster: RawCluster,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    ca: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    sim_rounds: Option<i64>,
    sim_step: Option<String>,
    replay: Option<i64>,
    duration: Option<String>,
    sessions: Option<i64>,
    session_items: Option<i64>,
    session_bytes: Option<i64>,
    session_timers: Option<i64>,
    timer_bytes: Option<i64>,
    timer_period: Option<String>,
    memory: Option<i64>,
    replay_rate: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Option<String>,
    token: Option<String>,
    body_limit: Option<i64>,
    max_requests: Option<i64>,
    max_event_streams: Option<i64>,
    cors_origins: Option<Vec<String>>,
    max_connections: Option<i64>,
    max_connections_per_peer: Option<i64>,
    idle_timeout: Option<String>,
    shutdown_write_timeout: Option<String>,
    max_header_bytes: Option<i64>,
    header_read_timeout: Option<String>,
    body_read_timeout: Option<String>,
    write_timeout: Option<String>,
    access_log: Option<bool>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRedact {
    fields: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawShutdown {
    strategy: Option<String>,
    grace: Option<String>,
    cleanup: Option<String>,
    force_timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStore {
    data_dir: Option<String>,
    flush: Option<String>,
    engine: Option<String>,
    durability: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSupervisor {
    max_restarts: Option<i64>,
    restart_window: Option<String>,
    heartbeat: Option<String>,
    lease_timeout: Option<String>,
    idle_after: Option<String>,
}

impl RuntimeConfig {
    /// Parses and validates a configuration text.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, None)
    }

    /// Reads and validates a configuration file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        // With a size bound (issue 52: `--config /dev/zero` made the start abort).
        let text = crate::operator_file::read_text(
            path,
            "the configuration file (--config, or ./agentloop.toml)",
        )
        .map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Self::parse(&text, Some(path.to_path_buf())).map_err(|e| match e {
            // These name the file already.
            e @ (ConfigError::Io { .. }
            | ConfigError::Parse { .. }
            | ConfigError::InFile { .. }) => e,
            e => ConfigError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        })
    }

    /// Reads `path` when given (it must exist), else `agentloop.toml` in the working
    /// directory when it exists, else the defaults.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            Some(p) => Self::from_file(p),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                Self::from_file(DEFAULT_CONFIG_FILE)
            }
            None => Ok(Self::default()),
        }
    }

    fn parse(text: &str, path: Option<PathBuf>) -> Result<Self, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path,
            message: e.to_string().trim_end().to_string(),
        })?;
        let mut c = RuntimeConfig::default();
        let h = raw.http;
        if let Some(t) = &h.token {
            if t.trim().is_empty() {
                return Err(ConfigError::OutOfRange {
                    key: "http.token",
                    value: "\"\"".into(),
                    allowed: "a non-empty secret (or leave the key out for loopback-only serving)",
                });
            }
        }
        c.http = HttpConfig {
            listen: h.listen,
            token: h.token,
            body_limit: positive("http.body_limit", h.body_limit)?,
            max_requests: positive("http.max_requests", h.max_requests)?,
            max_event_streams: positive("http.max_event_streams", h.max_event_streams)?,
            cors_origins: h.cors_origins.unwrap_or_default(),
            max_connections: positive("http.max_connections", h.max_connections)?,
            max_connections_per_peer: positive(
                "http.max_connections_per_peer",
                h.max_connections_per_peer,
            )?,
            idle_timeout: io_timeout("http.idle_timeout", h.idle_timeout)?,
            shutdown_write_timeout: io_timeout(
                "http.shutdown_write_timeout",
                h.shutdown_write_timeout,
            )?,
            max_header_bytes: positive("http.max_header_bytes", h.max_header_bytes)?,
            header_read_timeout: io_timeout("http.header_read_timeout", h.header_read_timeout)?,
            body_read_timeout: io_timeout("http.body_read_timeout", h.body_read_timeout)?,
            write_timeout: io_timeout("http.write_timeout", h.write_timeout)?,
            access_log: h.access_log.unwrap_or(false),
            tls_cert: h.tls_cert,
            tls_key: h.tls_key,
        };
        if c.http.tls_cert.is_some() != c.http.tls_key.is_some() {
            return Err(ConfigError::OutOfRange {
                key: "http.tls_cert",
                value: "one of tls_cert and tls_key".into(),
                allowed: "both [http] tls_cert and tls_key (HTTPS), or neither",
            });
        }
        let k = raw.cluster;
        c.cluster = ClusterConfig {
            tls_cert: k.tls_cert,
            tls_key: k.tls_key,
            ca: k.ca,
        };
        let given = [&c.cluster.tls_cert, &c.cluster.tls_key, &c.cluster.ca]
            .iter()
            .filter(|v| v.is_some())
            .count();
        if given != 0 && given != 3 {
            return Err(ConfigError::OutOfRange {
                key: "cluster.tls_cert",
                value: format!("{given} of tls_cert, tls_key and ca"),
                allowed:
                    "all three of [cluster] tls_cert, tls_key and ca (TLS between nodes), or none",
            });
        }
        let l = raw.limits;
        if let Some(n) = positive("limits.sim_rounds", l.sim_rounds)? {
            c.limits.sim_rounds = n;
        }
        if let Some(n) = positive("limits.replay", l.replay)? {
            c.limits.replay = n;
        }
        if let Some(n) = positive("limits.sessions", l.sessions)? {
            c.limits.sessions = n;
        }
        if let Some(n) = positive("limits.session_items", l.session_items)? {
            c.limits.session_items = n;
        }
        if let Some(n) = positive("limits.session_bytes", l.session_bytes)? {
            c.limits.session_bytes = n;
        }
        if let Some(n) = positive("limits.session_timers", l.session_timers)? {
            c.limits.session_timers = n;
        }
        if let Some(n) = positive("limits.timer_bytes", l.timer_bytes)? {
            c.limits.timer_bytes = n;
        }
        if let Some(n) = positive("limits.memory", l.memory)? {
            c.limits.memory = Some(n);
        }
        if let Some(n) = positive("limits.replay_rate", l.replay_rate)? {
            c.limits.replay_rate = n as u64;
        }
        if let Some(v) = l.timer_period {
            let allowed = "a duration above 0 and at most 24h";
            let d = duration("limits.timer_period", &v, allowed)?;
            check_range(
                "limits.timer_period",
                d,
                Duration::from_secs(24 * 3600),
                allowed,
            )?;
            c.limits.timer_period = d;
        }
        if let Some(v) = l.sim_step {
            let allowed = "a duration above 0 and at most 24h";
            let d = duration("limits.sim_step", &v, allowed)?;
            check_range(
                "limits.sim_step",
                d,
                Duration::from_secs(24 * 3600),
                allowed,
            )?;
            c.limits.sim_step = d;
        }
        if let Some(v) = l.duration {
            let allowed = "a duration above 0 and at most 365 days";
            let d = duration("limits.duration", &v, allowed)?;
            check_range(
                "limits.duration",
                d,
                Duration::from_secs(365 * 24 * 3600),
                allowed,
            )?;
            c.limits.duration = d;
        }
        if let Some(fields) = raw.redact.fields {
            if let Some(bad) = fields.iter().find(|f| f.is_empty()) {
                return Err(ConfigError::OutOfRange {
                    key: "redact.fields",
                    value: format!("{bad:?}"),
                    allowed: "a list of non-empty field names",
                });
            }
            c.redact.fields = fields;
        }
        if let Some(s) = raw.shutdown.strategy {
            c.shutdown.strategy = s;
        }
        if let Some(v) = raw.shutdown.grace {
            c.shutdown.grace = duration("shutdown.grace", &v, "more than 0s and at most 300s")?;
        }
        if let Some(v) = raw.shutdown.cleanup {
            c.shutdown.cleanup = duration("shutdown.cleanup", &v, "more than 0s and at most 60s")?;
        }
        if let Some(v) = raw.shutdown.force_timeout {
            c.shutdown.force_timeout = duration(
                "shutdown.force_timeout",
                &v,
                "more than 0s and at most 300s",
            )?;
        }
        c.shutdown.validate()?;
        if let Some(d) = raw.store.data_dir {
            if d.trim().is_empty() {
                return Err(ConfigError::OutOfRange {
                    key: "store.data_dir",
                    value: d,
                    allowed: "a non-empty directory path",
                });
            }
            c.store.data_dir = PathBuf::from(d);
        }
        if let Some(f) = raw.store.flush {
            c.store.flush = match f.as_str() {
                "sync" => Durability::Sync,
                "turn" => Durability::Turn,
                "exit" => Durability::Exit,
                _ => {
                    return Err(ConfigError::OutOfRange {
                        key: "store.flush",
                        value: f,
                        allowed: "\"sync\" (write on every accepted item, safe point and turn end), \"turn\" (write at every turn end) or \"exit\" (write at exit only)",
                    })
                }
            };
        }
        c.store.engine = engine(raw.store.engine, raw.store.durability)?;
        let s = raw.supervisor;
        if let Some(n) = s.max_restarts {
            if !(0..=1000).contains(&n) {
                return Err(ConfigError::OutOfRange {
                    key: "supervisor.max_restarts",
                    value: n.to_string(),
                    allowed: "a whole number from 0 to 1000",
                });
            }
            c.supervisor.restart_budget.max_restarts = n as u32;
        }
        const WINDOW: &str = "more than 0s and at most 1h";
        if let Some(v) = s.restart_window {
            let d = duration("supervisor.restart_window", &v, WINDOW)?;
            check_range(
                "supervisor.restart_window",
                d,
                Duration::from_secs(3600),
                WINDOW,
            )?;
            c.supervisor.restart_budget.window = d;
        }
        if let Some(v) = s.heartbeat {
            let d = duration("supervisor.heartbeat", &v, BEAT)?;
            check_range("supervisor.heartbeat", d, Duration::from_secs(60), BEAT)?;
            c.supervisor.heartbeat = d;
        }
        if let Some(v) = s.lease_timeout {
            c.supervisor.lease_timeout = duration("supervisor.lease_timeout", &v, LEASE)?;
        }
        check_lease(c.supervisor.heartbeat, c.supervisor.lease_timeout)?;
        if let Some(v) = s.idle_after {
            let d = duration("supervisor.idle_after", &v, IDLE)?;
            c.supervisor.idle_after = Some(check_idle_after(d)?);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
