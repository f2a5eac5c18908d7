//! Files an operator names on the command line or in the configuration (a
//! configuration file, a certificate, a key, a token file, a model API key file) read
//! with a size bound (issue 52, S34a): a wrong path (`/dev/zero`, a log, a disk image)
//! is refused with the file and the flag named instead of growing the process until it
//! aborts. None of these files is near the bound; it is not configurable, since the
//! files that would set it are the ones it bounds.
//!
//! This file only reads; what a file must hold is its reader's business.

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// The largest operator file read, in bytes (1 MiB).
pub const MAX_OPERATOR_FILE: u64 = 1 << 20;

/// An operator file that could not be read; the message names the file, what it was
/// given as, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum OperatorFileError {
    /// It could not be opened or read.
    #[error("cannot read {what} {path}: {source}; check the path and its permissions")]
    Io {
        /// The file.
        path: PathBuf,
        /// What it was given as (`the token file (--token-file)`...).
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// It is larger than [`MAX_OPERATOR_FILE`] (or endless, like `/dev/zero`).
    #[error(
        "{what} {path} is larger than {max} bytes (or endless): it is not the file meant \
         here; pass the right file"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// What it was given as.
        what: &'static str,
        /// The bound.
        max: u64,
    },
}

/// The bytes of `path`, at most [`MAX_OPERATOR_FILE`]; `what` names the file's role and
/// its flag or key in errors (`"the token file (--token-file)"`).
pub fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, OperatorFileError> {
    read_at_most(path, what, MAX_OPERATOR_FILE)
}

/// [`read`] as UTF-8 text.
pub fn read_text(path: &Path, what: &'static str) -> Result<String, OperatorFileError> {
    let bytes = read(path, what)?;
    String::from_utf8(bytes).map_err(|_| OperatorFileError::Io {
        path: path.to_path_buf(),
        what,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text"),
    })
}

fn read_at_most(path: &Path, what: &'static str, max: u64) -> Result<Vec<u8>, OperatorFileError> {
    let io = |source| OperatorFileError::Io {
        path: path.to_path_buf(),
        what,
        source,
    };
    let too_large = || OperatorFileError::TooLarge {
        path: path.to_path_buf(),
        what,
        max,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // A regular file says its size; a device or a pipe is read up to the bound.
    if file.metadata().is_ok_and(|m| m.is_file() && m.len() > max) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_or_large_file_is_refused_naming_it_and_its_flag() {
        #[cfg(unix)]
        {
            let e = read(Path::new("/dev/zero"), "the token file (--token-file)").unwrap_err();
            let m = e.to_string();
            assert!(m.contains("/dev/zero") && m.contains("--token-file"), "{m}");
            assert!(matches!(e, OperatorFileError::TooLarge { .. }));
        }
        let dir = std::env::temp_dir().join(format!("operator-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; 2048]).unwrap();
        let e = read_at_most(&big, "the config (--config)", 1024).unwrap_err();
        assert!(e.to_string().contains("larger than 1024 bytes"), "{e}");
        assert_eq!(read_at_most(&big, "x", 4096).unwrap().len(), 2048);
        let e = read(&dir.join("missing"), "the TLS key (--tls-key)").unwrap_err();
        assert!(e.to_string().contains("--tls-key"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
