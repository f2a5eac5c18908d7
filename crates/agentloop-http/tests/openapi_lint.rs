//! Issue 53: the checked-in OpenAPI document (`docs/openapi.json`, which `openapi.rs`
//! holds equal to the served one) passes Redocly's `recommended` ruleset, as a
//! third-party linter reads it: a `summary` per operation, `security` on every
//! operation (`[]` on the public routes), `servers`, valid OpenAPI 3.1.
//!
//! The linter is Redocly's CLI, pinned, installed with npm into the target directory
//! (`target/npm-tools/redocly-<version>`, one bundled package, a few seconds) by
//! `scripts/test-deps`, which the README's test command (`scripts/test`) runs first: the
//! test itself reaches no network. Without it (or without `node`) the test fails, never
//! skips, and says what to run.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned CLI (2.x installs here; 1.34.x does not).
const REDOCLY: &str = "@redocly/cli@2.77.0";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the CLI is installed: under the target directory, so `cargo clean` removes it.
fn tools_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace().join(t)
            }
        })
        .unwrap_or_else(|| workspace().join("target"));
    let version = REDOCLY.rsplit('@').next().unwrap_or("latest");
    target.join("npm-tools").join(format!("redocly-{version}"))
}

/// `program --version` runs.
fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The CLI's entry point, as `scripts/test-deps` installed it.
fn redocly() -> PathBuf {
    let dir = tools_dir();
    let bin = dir.join("node_modules/.bin/redocly");
    assert!(
        runs("node"),
        "the OpenAPI lint test runs Redocly's CLI on Node.js: install nodejs and npm \
         (e.g. `apt-get install nodejs npm`) and put them on PATH"
    );
    assert!(
        bin.exists(),
        "Redocly's CLI ({REDOCLY}) is not installed at {}: run `scripts/test-deps` (it \
         installs it there with npm; the README's `scripts/test` runs it first)",
        bin.display()
    );
    bin
}

/// `Validation failed with <n> errors` / `<n> warnings` in the CLI's summary line.
fn count(output: &str, what: &str) -> usize {
    output
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| w.starts_with(what))?;
            words.get(at.checked_sub(1)?)?.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn the_checked_in_document_passes_redoclys_recommended_rules() {
    let bin = redocly();
    let doc = workspace().join("docs/openapi.json");
    assert!(doc.exists(), "{} is missing", doc.display());
    let out = Command::new(&bin)
        .arg("lint")
        .arg(&doc)
        .args(["--extends=recommended", "--format=stylish"])
        // No config file of the working directory's, no network calls.
        .current_dir(tools_dir())
        .env("REDOCLY_TELEMETRY", "off")
        .env("REDOCLY_SUPPRESS_UPDATE_NOTICE", "true")
        .output()
        .expect("run redocly");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("redocly lint docs/openapi.json --extends=recommended:\n{text}");
    let errors = count(&text, "error");
    assert!(
        out.status.success() && errors == 0 && !text.contains("Validation failed"),
        "Redocly's recommended rules fail on docs/openapi.json ({errors} errors, exit {}):\n\
         {text}",
        out.status
    );
    assert!(
        text.contains("valid"),
        "the linter did not say it validated the document:\n{text}"
    );
}
