//! Unit tests of `config`.

use super::*;

#[test]
fn limits_parse_with_defaults_and_refuse_what_is_out_of_range() {
    let c = RuntimeConfig::from_toml_str("").unwrap();
    assert_eq!(c.limits, LimitsConfig::default());
    let c = RuntimeConfig::from_toml_str(
        "[limits]\nsim_rounds = 5\nsim_step = \"2s\"\nreplay = 64\nduration = \"1h\"\n\
         sessions = 7\nsession_items = 8\nsession_bytes = 9\nsession_timers = 10\n\
         timer_bytes = 11\ntimer_period = \"5s\"\nmemory = 12\nreplay_rate = 13\n",
    )
    .unwrap();
    assert_eq!(
        c.limits,
        LimitsConfig {
            sim_rounds: 5,
            sim_step: Duration::from_secs(2),
            replay: 64,
            duration: Duration::from_secs(3600),
            sessions: 7,
            session_items: 8,
            session_bytes: 9,
            session_timers: 10,
            timer_bytes: 11,
            timer_period: Duration::from_secs(5),
            memory: Some(12),
            replay_rate: 13,
        }
    );
    for bad in [
        "[limits]\nsim_rounds = 0",
        "[limits]\nreplay = -1",
        "[limits]\nsessions = 0",
        "[limits]\nsession_timers = 0",
        "[limits]\nmemory = 0",
        "[limits]\ntimer_period = \"0s\"",
        "[limits]\nsession_items = -3",
        "[limits]\nsim_step = \"25h\"",
        "[limits]\nduration = \"0s\"",
        "[limits]\nunknown = 1",
    ] {
        let e = RuntimeConfig::from_toml_str(bad).expect_err(bad);
        assert!(
            e.to_string().contains("limits") || e.to_string().contains("unknown"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn durations_parse() {
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("1m 30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("10S"), None);
    assert_eq!(parse_duration("-5s"), None);
    assert_eq!(parse_duration("5"), None);
    assert_eq!(parse_duration("s"), None);
    assert_eq!(parse_duration("5 parsecs"), None);
    assert_eq!(parse_duration(""), None);
}

/// S39: `[supervisor] idle_after` is read, bounded, and off unless set.
#[test]
fn idle_after_is_read_bounded_and_off_unless_set() {
    let c = RuntimeConfig::from_toml_str("").expect("empty");
    assert_eq!(c.supervisor.idle_after, None);
    let c = RuntimeConfig::from_toml_str("[supervisor]\nidle_after = \"10m\"\n").expect("10m");
    assert_eq!(
        c.supervisor.idle_after,
        Some(std::time::Duration::from_secs(600))
    );
    for bad in ["0s", "500ms", "31days", "-1s"] {
        let e = RuntimeConfig::from_toml_str(&format!("[supervisor]\nidle_after = \"{bad}\"\n"))
            .expect_err(bad)
            .to_string();
        assert!(
            e.contains("supervisor.idle_after") && e.contains("at least 1s"),
            "{bad}: {e}"
        );
    }
}

/// S43: `[http] tls_cert`/`tls_key` and `[cluster] tls_cert`/`tls_key`/`ca` are read;
/// a half-given pair (or trio) is refused naming the table.
#[test]
fn tls_files_are_read_whole_or_refused() {
    let c = RuntimeConfig::from_toml_str(
        "[http]\ntls_cert = \"front.pem\"\ntls_key = \"front-key.pem\"\n\
         [cluster]\ntls_cert = \"n1.pem\"\ntls_key = \"n1-key.pem\"\nca = \"ca.pem\"\n",
    )
    .unwrap();
    assert_eq!(c.http.tls_cert.as_deref(), Some(Path::new("front.pem")));
    assert_eq!(c.http.tls_key.as_deref(), Some(Path::new("front-key.pem")));
    assert_eq!(
        c.cluster,
        ClusterConfig {
            tls_cert: Some("n1.pem".into()),
            tls_key: Some("n1-key.pem".into()),
            ca: Some("ca.pem".into()),
        }
    );
    let none = RuntimeConfig::from_toml_str("").unwrap();
    assert_eq!(none.cluster, ClusterConfig::default());
    assert!(none.http.tls_cert.is_none());
    for (bad, names) in [
        ("[http]\ntls_cert = \"a.pem\"", "http.tls_cert"),
        ("[cluster]\nca = \"ca.pem\"", "cluster.tls_cert"),
        (
            "[cluster]\ntls_cert = \"a\"\ntls_key = \"b\"",
            "cluster.tls_cert",
        ),
        ("[cluster]\ncookie = \"no\"", "unknown"),
    ] {
        let e = RuntimeConfig::from_toml_str(bad)
            .expect_err(bad)
            .to_string();
        assert!(e.contains(names), "{bad}: {e}");
    }
}
