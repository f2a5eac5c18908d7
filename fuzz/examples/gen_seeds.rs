//! Writes the seed corpus of the `decode_record` fuzz target to
//! `seeds/decode_record/` (or to the directory given as the first argument).
//!
//! ```text
//! cd fuzz && cargo run --example gen_seeds
//! ```

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds/decode_record"));
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in agentloop_fuzz::seeds() {
        let path = dir.join(&name);
        std::fs::write(&path, &bytes)?;
        println!("{:>6} bytes  {}", bytes.len(), path.display());
    }
    Ok(())
}
