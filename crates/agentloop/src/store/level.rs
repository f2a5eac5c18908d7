//! What an acknowledged write survives: the store's durability level (DESIGN S15b).
//!
//! This file owns the level's vocabulary only: its names, parsing and the words the
//! start line, `--help` and errors use. Each engine decides how it gives a level (sled:
//! `sled/`, fjall: `fjall.rs`, PostgreSQL: `agentloop-postgres`); nothing here
//! touches an engine.
//!
//! The level is the store's, not a record's: every write a store acknowledges survives
//! what its level says. It is distinct from a session's [`Durability`](crate::session::Durability)
//! mode (`exit`, `turn`, `sync`: *when* a session writes its record).

use std::fmt;

/// What an acknowledged write survives (S15b). `Power` is the default everywhere: in
/// the library, `agentloop run` and `agentloop serve` (acknowledged means durable, as
/// Temporal, Restate and DBOS mean it).
///
/// | engine | `power` (default) | `crash` |
/// |---|---|---|
/// | sled | flush, then an fsync of its data file (and of new blob files and directory entries) | flush alone (`sync_file_range`): a power cut loses up to sled's flush interval, 500 ms |
/// | fjall | `persist(SyncAll)`: the journal is fsynced | `persist(Buffer)`: a power cut loses what the kernel had not written back (up to ~30 s by default) |
/// | PostgreSQL | `synchronous_commit = on`, on a server with `fsync = on` | `synchronous_commit = off`: a server crash or power cut loses up to 3 × `wal_writer_delay` |
///
/// docs/operations.md ("Durability levels") has the losses the power-cut test measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreDurability {
    /// An acknowledged write survives a process crash (SIGKILL), not a power loss or an
    /// OS crash: the engine's write reaches the operating system, not the disk. Faster;
    /// an explicit choice.
    Crash,
    /// An acknowledged write survives a power loss: the engine's write is made durable
    /// with an fsync before it is acknowledged. The default.
    #[default]
    Power,
}

/// Every level, in the order `--help` and errors list them.
pub const STORE_DURABILITIES: [StoreDurability; 2] =
    [StoreDurability::Power, StoreDurability::Crash];

impl StoreDurability {
    /// Parses `"power"` or `"crash"` (the `[store] durability` key, `--durability`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "crash" => Some(StoreDurability::Crash),
            "power" => Some(StoreDurability::Power),
            _ => None,
        }
    }

    /// Parses a level name, or says which names there are.
    pub fn parse_or_explain(s: &str) -> Result<Self, UnknownDurability> {
        Self::parse(s).ok_or_else(|| UnknownDurability {
            name: s.to_string(),
        })
    }

    /// The configuration name: `"power"` or `"crash"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StoreDurability::Crash => "crash",
            StoreDurability::Power => "power",
        }
    }

    /// What an acknowledged write survives, in a few words (for the start line).
    pub fn survives(&self) -> &'static str {
        match self {
            StoreDurability::Crash => "survives a process crash, not a power loss",
            StoreDurability::Power => "survives a power loss",
        }
    }
}

impl fmt::Display for StoreDurability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A durability name that is not a level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability level `{name}`: write \"power\" (an acknowledged write survives a power loss; the default) or \"crash\" (it survives a process crash only; faster)")]
pub struct UnknownDurability {
    /// The name given.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_is_the_default_and_names_round_trip() {
        assert_eq!(StoreDurability::default(), StoreDurability::Power);
        for level in STORE_DURABILITIES {
            assert_eq!(StoreDurability::parse(level.as_str()), Some(level));
            assert_eq!(level.to_string(), level.as_str());
        }
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_levels_there_are() {
        let e = StoreDurability::parse_or_explain("fsync").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("`fsync`"), "{text}");
        assert!(
            text.contains("\"power\"") && text.contains("\"crash\""),
            "{text}"
        );
        assert_eq!(
            StoreDurability::parse("Power"),
            None,
            "names are lower case"
        );
    }
}
