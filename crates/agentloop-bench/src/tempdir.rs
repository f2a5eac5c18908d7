//! A temporary directory for a figure's sled data, removed at the end (and on a panic,
//! by `Drop`).

use std::path::{Path, PathBuf};

/// A fresh directory under the system temp dir.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A directory named after the figure and `tag`.
    pub fn new(figure: &str, tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "agentloop-{figure}-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("creating a benchmark temp dir");
        TempDir(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
