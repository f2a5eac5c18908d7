//! Issue 13 (7): every rule number (S1…) cited in the rustdoc, the README, the examples
//! or docs/ is listed with its one-line meaning in docs/semantics.md's rule index, so a
//! reader who meets "S24" anywhere can look it up in the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository root")
        .to_path_buf()
}

/// Every file under `dir` whose name ends with `ext`.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.to_string_lossy().ends_with(ext) {
            out.push(path);
        }
    }
}

/// The rule numbers cited in `text`: `S` then one or two digits and an optional lower-
/// case letter, not inside a longer word.
fn cited(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'S' || (i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) {
            continue;
        }
        let digits = bytes[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 || digits > 2 {
            continue;
        }
        let mut end = i + 1 + digits;
        if end < bytes.len() && bytes[end].is_ascii_lowercase() {
            end += 1;
        }
        if end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            continue;
        }
        found.insert(text[i..end].to_string());
    }
    found
}

#[test]
fn every_cited_rule_is_in_the_index() {
    let root = repo();
    let semantics =
        std::fs::read_to_string(root.join("docs/semantics.md")).expect("docs/semantics.md");
    let index: BTreeSet<String> = semantics
        .lines()
        .filter_map(|l| l.strip_prefix("| S"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|n| format!("S{n}"))
        .collect();
    assert!(
        index.contains("S1") && index.contains("S32"),
        "the rule index is missing: {index:?}"
    );

    let mut sources = vec![root.join("README.md")];
    for dir in ["crates", "examples"] {
        files(&root.join(dir), ".rs", &mut sources);
    }
    files(&root.join("docs"), ".md", &mut sources);
    let mut missing = Vec::new();
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for rule in cited(&text) {
            if !index.contains(&rule) {
                missing.push(format!(
                    "{rule} (cited in {})",
                    path.strip_prefix(&root).unwrap_or(&path).display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "rules cited but not in docs/semantics.md's rule index: {missing:?}"
    );
}

#[test]
fn the_citation_scanner_finds_rule_numbers_only() {
    let found = cited("S1, S15a and S22–S24 (not SIGKILL, S100, BS3 or S3X)");
    let want: BTreeSet<String> = ["S1", "S15a", "S22", "S24"].map(String::from).into();
    assert_eq!(found, want);
}
