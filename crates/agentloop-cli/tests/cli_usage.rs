//! Issue 16 (1): the command line as users meet it (clap): `--version`, a help page per
//! command, suggestions for typos, usage errors that exit 2 with one line saying what
//! was wrong, durations in flags as humantime's.

use std::process::{Command, Output};

fn agentloop(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .output()
        .expect("run the agentloop binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn version_and_help_pages() {
    let v = agentloop(&["--version"]);
    assert_eq!(v.status.code(), Some(0));
    assert_eq!(
        text(&v.stdout).trim(),
        format!("agentloop {}", env!("CARGO_PKG_VERSION"))
    );
    let help = agentloop(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let h = text(&help.stdout);
    assert!(
        h.contains("run ") && h.contains("Run simulated agent sessions"),
        "{h}"
    );
    assert!(h.contains("sessions") && h.contains("Inspect, delete, export and import"));
    // Each command has its own page.
    let pages: Vec<String> = [
        &["run", "--help"][..],
        &["sessions", "--help"],
        &["sessions", "list", "--help"],
        &["sessions", "show", "--help"],
        &["sessions", "import", "--help"],
    ]
    .iter()
    .map(|a| {
        let out = agentloop(a);
        assert_eq!(out.status.code(), Some(0), "{a:?}");
        text(&out.stdout)
    })
    .collect();
    for (i, p) in pages.iter().enumerate() {
        for q in &pages[i + 1..] {
            assert_ne!(p, q, "two commands print the same help");
        }
    }
    assert!(pages[0].contains("--push <DURATION>") && pages[0].contains("--engine"));
    assert!(pages[3].contains("<ID>") && pages[3].contains("--raw"));
}

/// A usage error: exit 2, the first line says what was wrong, nothing on stdout.
fn usage_error(args: &[&str], says: &str) {
    let out = agentloop(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: ") && first.contains(says),
        "{args:?}: the first line should say {says:?}:\n{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn usage_errors_say_what_was_wrong() {
    usage_error(&["run", "--bogus"], "unexpected argument '--bogus'");
    usage_error(&["run", "extra"], "unexpected argument 'extra'");
    usage_error(&["run", "--push", "banana"], "`banana` is not a duration");
    usage_error(
        &["run", "--push", "5ms", "--push-ms", "5"],
        "cannot be used with",
    );
    usage_error(&["run", "--sessions", "many"], "invalid value 'many'");
    usage_error(&["run", "--engine", "rocks"], "invalid value 'rocks'");
    usage_error(&["sessions", "lsit"], "unrecognized subcommand 'lsit'");
    usage_error(
        &["sessions", "import", "--durability", "power"],
        "--durability is a fjall setting",
    );
    // A typo gets a suggestion.
    let err = text(&agentloop(&["sessions", "lsit"]).stderr);
    assert!(err.contains("similar subcommand exists: 'list'"), "{err}");
}
