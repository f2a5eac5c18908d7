//! The baselines' raw engines at a durability level (issue 51, S15b): what a program
//! that used sled directly would do to make the same bytes survive the same failure.
//! At `crash` that is sled's `flush`; at `power` it is `flush` followed by an fsync of
//! sled's data file, the same way agentloop's sled backend makes a group commit
//! power-safe. Raw fjall databases are opened here too. This module only wraps the
//! raw engines for the baselines; it never touches agentloop's store.

use std::fs::File;
use std::path::Path;

use agentloop::store::StoreDurability;

/// A raw sled database and, at `power`, its data file to fsync after each flush.
pub struct RawSled {
    /// The database.
    pub db: sled::Db,
    /// sled's data file (`DIR/db`), opened a second time; `None` at `crash`.
    data: Option<File>,
}

impl RawSled {
    /// Opens raw sled in `dir` for level `level`. Blocks.
    pub fn open(dir: &Path, level: StoreDurability) -> RawSled {
        let db = sled::open(dir).expect("opening raw sled");
        RawSled::wrap(db, dir, level)
    }

    /// Wraps a database already open in `dir` for level `level`.
    pub fn wrap(db: sled::Db, dir: &Path, level: StoreDurability) -> RawSled {
        let data = match level {
            StoreDurability::Crash => None,
            StoreDurability::Power => {
                Some(File::open(dir.join("db")).expect("opening raw sled's data file"))
            }
        };
        RawSled { db, data }
    }

    /// Makes every write so far durable at the level: `flush`, then at `power` an
    /// fsync of the data file. Blocks.
    pub fn flush(&self) {
        self.db.flush().expect("a raw sled flush");
        if let Some(data) = &self.data {
            data.sync_data().expect("a raw sled fsync");
        }
    }

    /// What [`RawSled::flush`] does, in words for the tables.
    pub fn flush_words(level: StoreDurability) -> &'static str {
        match level {
            StoreDurability::Crash => "flush",
            StoreDurability::Power => "flush + fsync",
        }
    }
}

/// Opens a raw fjall database in `dir` with one keyspace named `keyspace`. Blocks.
pub fn open_fjall(dir: &Path, keyspace: &str) -> (fjall::Database, fjall::Keyspace) {
    let db = fjall::Database::builder(dir)
        .open()
        .expect("opening the raw fjall db");
    let ks = db
        .keyspace(keyspace, fjall::KeyspaceCreateOptions::default)
        .expect("the raw fjall keyspace");
    (db, ks)
}
