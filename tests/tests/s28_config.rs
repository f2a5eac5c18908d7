//! S28 / S32: the configuration file. Defaults, human-readable durations, and every
//! out-of-range or malformed value refused with a message that names its key.

use std::time::Duration;

use agentloop::config::{ConfigError, RuntimeConfig};
use agentloop::Durability;
use agentloop_tests::TempDir;

#[test]
fn s28_defaults_are_30s_5s_5s_cooperative() {
    let c = RuntimeConfig::from_toml_str("").unwrap();
    assert_eq!(c, RuntimeConfig::default());
    assert_eq!(c.shutdown.strategy, "cooperative");
    assert_eq!(c.shutdown.grace, Duration::from_secs(30));
    assert_eq!(c.shutdown.cleanup, Duration::from_secs(5));
    assert_eq!(c.shutdown.force_timeout, Duration::from_secs(5));
    assert_eq!(c.store.data_dir, std::path::PathBuf::from("agentloop-data"));
    assert_eq!(c.store.flush, Durability::Sync);
    assert_eq!(c.supervisor.restart_budget.max_restarts, 3);
}

#[test]
fn s28_every_table_is_read() {
    let c = RuntimeConfig::from_toml_str(
        r#"
        [shutdown]
        strategy = "drain"
        grace = "1m30s"
        cleanup = "750ms"
        force_timeout = "2s"
        [store]
        data_dir = "/var/lib/agentloop"
        flush = "exit"
        [supervisor]
        max_restarts = 5
        restart_window = "2m"
        heartbeat = "5s"
        lease_timeout = "20s"
        "#,
    )
    .unwrap();
    assert_eq!(c.shutdown.strategy, "drain");
    assert_eq!(c.shutdown.grace, Duration::from_secs(90));
    assert_eq!(c.shutdown.cleanup, Duration::from_millis(750));
    assert_eq!(c.shutdown.force_timeout, Duration::from_secs(2));
    assert_eq!(
        c.store.data_dir,
        std::path::PathBuf::from("/var/lib/agentloop")
    );
    assert_eq!(c.store.flush, Durability::Exit);
    assert_eq!(c.supervisor.restart_budget.max_restarts, 5);
    assert_eq!(c.supervisor.restart_budget.window, Duration::from_secs(120));
    assert_eq!(c.supervisor.heartbeat, Duration::from_secs(5));
    assert_eq!(c.supervisor.lease_timeout, Duration::from_secs(20));
}

fn refused(text: &str, key: &str) {
    let err = RuntimeConfig::from_toml_str(text).expect_err(text);
    let msg = err.to_string();
    assert!(
        msg.contains(key),
        "{text:?}: the message must name `{key}`: {msg}"
    );
}

#[test]
fn s28_out_of_range_values_are_refused_naming_the_key() {
    for (text, key) in [
        ("[shutdown]\ngrace = \"0s\"", "shutdown.grace"),
        ("[shutdown]\ngrace = \"-5s\"", "shutdown.grace"),
        ("[shutdown]\ngrace = \"301s\"", "shutdown.grace"),
        ("[shutdown]\ngrace = \"soon\"", "shutdown.grace"),
        ("[shutdown]\ncleanup = \"0ms\"", "shutdown.cleanup"),
        ("[shutdown]\ncleanup = \"61s\"", "shutdown.cleanup"),
        ("[shutdown]\ncleanup = \"-1s\"", "shutdown.cleanup"),
        (
            "[shutdown]\nforce_timeout = \"0s\"",
            "shutdown.force_timeout",
        ),
        (
            "[shutdown]\nforce_timeout = \"10m\"",
            "shutdown.force_timeout",
        ),
        ("[shutdown]\nstrategy = \"\"", "shutdown.strategy"),
        ("[store]\ndata_dir = \"\"", "store.data_dir"),
        ("[store]\nflush = \"sometimes\"", "store.flush"),
        ("[supervisor]\nmax_restarts = -1", "supervisor.max_restarts"),
        (
            "[supervisor]\nrestart_window = \"0s\"",
            "supervisor.restart_window",
        ),
        ("[supervisor]\nheartbeat = \"0s\"", "supervisor.heartbeat"),
        ("[supervisor]\nheartbeat = \"2m\"", "supervisor.heartbeat"),
        (
            "[supervisor]\nlease_timeout = \"1s\"",
            "supervisor.lease_timeout",
        ),
    ] {
        refused(text, key);
    }
    // Issue 13 (3): each turn end durable.
    let c = RuntimeConfig::from_toml_str("[store]\nflush = \"turn\"").unwrap();
    assert_eq!(c.store.flush, Durability::Turn);
    let msg = RuntimeConfig::from_toml_str("[store]\nflush = \"sometimes\"")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("\"turn\""),
        "the message lists every level: {msg}"
    );
    // The allowed range is part of the message.
    let err = RuntimeConfig::from_toml_str("[shutdown]\ngrace = \"301s\"").unwrap_err();
    assert!(matches!(
        err,
        ConfigError::OutOfRange {
            key: "shutdown.grace",
            ..
        }
    ));
    assert!(err.to_string().contains("at most 300s"), "{err}");
}

#[test]
fn s28_malformed_files_are_refused_naming_the_key() {
    // Unknown keys and wrong types are parse errors that name the key.
    refused("[shutdown]\ngrase = \"30s\"", "grase");
    refused("[shutdown]\ngrace = 30", "grace");
    refused("[shutdwn]\n", "shutdwn");
    refused("this is not toml", "invalid configuration");
}

#[test]
fn s28_files_are_read_and_a_missing_explicit_file_is_an_error() {
    let dir = TempDir::new("s28-config");
    let path = dir.path().join("agentloop.toml");
    std::fs::write(&path, "[shutdown]\ngrace = \"10s\"\n").unwrap();
    let c = RuntimeConfig::load(Some(&path)).unwrap();
    assert_eq!(c.shutdown.grace, Duration::from_secs(10));
    std::fs::write(&path, "[shutdown]\ngrace = \"0s\"\n").unwrap();
    assert!(RuntimeConfig::load(Some(&path)).is_err());
    let missing = dir.path().join("nope.toml");
    let err = RuntimeConfig::load(Some(&missing)).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(err.to_string().contains("nope.toml"), "{err}");
}

/// Issue 15, S15b: `[store] engine` and `durability` choose the embedded engine and
/// what an acknowledged write survives; sled is the default engine and `power` the
/// default level of every engine.
#[test]
fn s28_store_engine_and_durability() {
    use agentloop::store::{Engine, StoreDurability};
    let engine = |text: &str| RuntimeConfig::from_toml_str(text).unwrap().store.engine;
    assert_eq!(engine(""), Engine::Sled(StoreDurability::Power));
    assert_eq!(RuntimeConfig::default().store.engine, engine(""));
    assert_eq!(
        engine("[store]\nengine = \"sled\""),
        Engine::Sled(StoreDurability::Power)
    );
    assert_eq!(
        engine("[store]\ndurability = \"crash\""),
        Engine::Sled(StoreDurability::Crash)
    );
    assert_eq!(
        engine("[store]\nengine = \"fjall\""),
        Engine::Fjall(StoreDurability::Power)
    );
    assert_eq!(
        engine("[store]\nengine = \"fjall\"\ndurability = \"crash\""),
        Engine::Fjall(StoreDurability::Crash)
    );
    assert_eq!(
        engine("[store]\nengine = \"fjall\"\ndurability = \"power\""),
        Engine::Fjall(StoreDurability::Power)
    );
    for (text, key, says) in [
        ("[store]\nengine = \"rocks\"", "store.engine", "\"fjall\""),
        (
            "[store]\nengine = \"fjall\"\ndurability = \"always\"",
            "store.durability",
            "\"power\"",
        ),
        (
            "[store]\ndurability = \"fsync\"",
            "store.durability",
            "\"crash\"",
        ),
    ] {
        let msg = RuntimeConfig::from_toml_str(text).unwrap_err().to_string();
        assert!(msg.contains(key) && msg.contains(says), "{text:?}: {msg}");
    }
}

/// Issue 16 (1): durations are humantime's; a malformed one says it is not a duration
/// and names the key, and an error read from a file names the file.
#[test]
fn s28_malformed_durations_say_so_and_errors_name_the_file() {
    for bad in ["banana", "5", "10S", "5 parsecs"] {
        let text = format!("[shutdown]\ngrace = \"{bad}\"");
        let err = RuntimeConfig::from_toml_str(&text).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::NotADuration {
                    key: "shutdown.grace",
                    ..
                }
            ),
            "{bad}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("`shutdown.grace`")
                && msg.contains("is not a duration")
                && msg.contains("\"30s\""),
            "{bad}: {msg}"
        );
    }
    // humantime's forms are read.
    let c = RuntimeConfig::from_toml_str("[shutdown]\ngrace = \"1m 30s\"\ncleanup = \"1500ms\"")
        .unwrap();
    assert_eq!(c.shutdown.grace, Duration::from_secs(90));
    assert_eq!(c.shutdown.cleanup, Duration::from_millis(1500));
    // From a file: the file is named, for a malformed duration and for a range error.
    let dir = TempDir::new("s28-file-errors");
    for (text, says) in [
        ("[shutdown]\ngrace = \"banana\"\n", "is not a duration"),
        ("[shutdown]\ngrace = \"301s\"\n", "is out of range"),
    ] {
        let path = dir.path().join("agentloop.toml");
        std::fs::write(&path, text).unwrap();
        let msg = RuntimeConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains(says)
                && msg.contains("shutdown.grace"),
            "{msg}"
        );
    }
}
