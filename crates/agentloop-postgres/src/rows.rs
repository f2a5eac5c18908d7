//! One session's rows inside a transaction: what was read from PostgreSQL, with the
//! changes the store's table code makes on top, so that code (`agentloop_core::table`,
//! the same that runs on memory, sled and fjall) decides every write here too. This
//! file only keeps rows and their changes; it never talks to the database.

use std::collections::BTreeMap;
use std::ops::Bound;

use agentloop_core::header::Payload;
use agentloop_core::store_error::StoreError;
use agentloop_core::table::Table;

/// A session's rows as read, and what the batch changed.
///
/// Invariant: a key in `rows` holds `None` only for a checkpoint-history snapshot whose
/// value was not read (a write needs only their keys, to keep the newest N); reading
/// such a value is refused, never answered with something else.
#[derive(Default)]
pub(crate) struct SessionRows {
    rows: BTreeMap<Vec<u8>, Option<Payload>>,
    /// Changes since the rows were read: `Some` puts, `None` deletes.
    changed: BTreeMap<Vec<u8>, Option<Payload>>,
}

impl SessionRows {
    /// Adds a row as read (`None`: a history value left unread).
    pub(crate) fn insert_read(&mut self, key: Vec<u8>, value: Option<Payload>) {
        self.rows.insert(key, value);
    }

    /// Takes the changes made since the rows were read (and keeps them as read).
    pub(crate) fn take_changes(&mut self) -> BTreeMap<Vec<u8>, Option<Payload>> {
        std::mem::take(&mut self.changed)
    }

    fn unread(key: &[u8]) -> StoreError {
        StoreError::Database {
            operation: "read",
            session: String::new(),
            message: format!(
                "the value of {:02x?} was not read in this transaction (a bug in the \
                 PostgreSQL store: please report it)",
                &key[..key.len().min(32)]
            ),
        }
    }

    fn range<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Option<Payload>)> + 'a {
        self.rows
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }
}

impl Table for SessionRows {
    fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        match self.rows.get(key) {
            None => Ok(None),
            Some(Some(v)) => Ok(Some(v.clone())),
            Some(None) => Err(Self::unread(key)),
        }
    }

    fn put(&mut self, key: Vec<u8>, value: Payload) {
        self.rows.insert(key.clone(), Some(value.clone()));
        self.changed.insert(key, Some(value));
    }

    fn remove(&mut self, key: Vec<u8>) {
        self.rows.remove(&key);
        self.changed.insert(key, None);
    }

    fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.range(prefix).map(|(k, _)| k.clone()).collect())
    }

    fn first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .rows
            .range::<[u8], _>((Bound::Included(from), Bound::Unbounded))
            .next()
            .map(|(k, _)| k.clone()))
    }

    fn keys_in_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self
            .rows
            .range::<[u8], _>((Bound::Included(from), Bound::Included(to)))
            .map(|(k, _)| k.clone())
            .collect())
    }

    fn entries_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.range(prefix)
            .map(|(k, v)| match v {
                Some(v) => Ok((k.clone(), v.clone())),
                None => Err(Self::unread(k)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(b: &[u8]) -> Payload {
        Payload::from(b.to_vec())
    }

    #[test]
    fn changes_are_kept_in_order_and_a_put_after_a_remove_wins() {
        let mut r = SessionRows::default();
        r.insert_read(b"a\0h".to_vec(), Some(p(b"1")));
        r.insert_read(b"\x01a\0x".to_vec(), None);
        r.put(b"a\0i1".to_vec(), p(b"x"));
        r.remove(b"a\0h".to_vec());
        r.put(b"a\0h".to_vec(), p(b"2"));
        assert_eq!(r.get(b"a\0h").unwrap(), Some(p(b"2")));
        assert_eq!(
            r.keys_with_prefix(b"a\0").unwrap(),
            vec![b"a\0h".to_vec(), b"a\0i1".to_vec()]
        );
        let changes = r.take_changes();
        assert_eq!(changes.len(), 2);
        assert_eq!(changes.get(&b"a\0h"[..]), Some(&Some(p(b"2"))));
        assert!(r.take_changes().is_empty());
    }

    #[test]
    fn an_unread_history_value_is_refused_not_invented() {
        let mut r = SessionRows::default();
        r.insert_read(b"\x01a\0t".to_vec(), None);
        assert_eq!(r.keys_with_prefix(b"\x01a\0").unwrap().len(), 1);
        assert!(r.get(b"\x01a\0t").is_err());
        assert!(r.entries_with_prefix(b"\x01a\0").is_err());
    }
}
