//! Issue 16 (1): the command line as users meet it (clap): `--version`, a help page per
//! command, suggestions for typos, usage errors that exit 2 with one line saying what
//! was wrong, durations in flags as humantime's.

mod common;

use std::process::Command;

use common::{agentloop, text};

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
    // S15b: an unknown level is refused at start, with the levels there are.
    for args in [
        &["run", "--durability", "fsync"][..],
        &["serve", "--durability", "fsync"][..],
        &["sessions", "import", "--durability", "fsync"][..],
    ] {
        usage_error(args, "invalid value 'fsync' for '--durability");
        let err = text(&agentloop(args).stderr);
        assert!(err.contains("[possible values: power, crash]"), "{err}");
    }
    // A typo gets a suggestion.
    let err = text(&agentloop(&["sessions", "lsit"]).stderr);
    assert!(err.contains("similar subcommand exists: 'list'"), "{err}");
}

/// Issue 16 (2): a data directory that is a file, or one held by another process, is
/// said for what it is; the holder is named by its pid.
#[test]
fn data_directory_problems_are_named_for_what_they_are() {
    let root = std::env::temp_dir().join(format!(
        "agentloop-cli-usage-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let out = agentloop(&[
        "run",
        "--sessions",
        "1",
        "--data-dir",
        file.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not a directory (it is a file)") && !err.contains("another process"),
        "{err}"
    );

    // A read-only directory: permission denied, said so.
    let ro = root.join("read-only");
    std::fs::create_dir(&ro).unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o555);
    std::fs::set_permissions(&ro, perm).unwrap();
    let out = agentloop(&["run", "--sessions", "1", "--data-dir", ro.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("permission denied")
            && err.contains("write access")
            && !err.contains("another process"),
        "{err}"
    );

    // A running job holds the directory: the offline command names its pid.
    let data = root.join("data");
    let mut job = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args([
            "run",
            "--sessions",
            "1",
            "--items-per-session",
            "100000",
            "--push-ms",
            "5",
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(job.stdout.take().unwrap()));
    loop {
        let line = lines.next().expect("the job printed ready").unwrap();
        if line.starts_with("agentloop: ready:") {
            break;
        }
    }
    let out = agentloop(&["sessions", "list", "--data-dir", data.to_str().unwrap()]);
    let err = text(&out.stderr);
    let _ = job.kill();
    let _ = job.wait();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is in use") && err.contains(&format!("(pid {})", job.id())),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
