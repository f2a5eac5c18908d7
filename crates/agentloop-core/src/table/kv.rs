//! The ordered key-value table every engine offers the record layer ([`Table`]): point
//! reads and writes, prefix and range scans, and the format-1 side table. The key
//! layout (`super`) and the checkpoint history build on it; it knows neither.

use crate::header::Payload;
use crate::store_error::StoreError;

/// An ordered key-value table a backend offers (sled's tree with the writes of the
/// wave being applied on top, or the memory store's map). Writes are buffered by the
/// backend and made atomic by it.
pub trait Table {
    /// A value.
    fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError>;
    /// Stores a value.
    fn put(&mut self, key: Vec<u8>, value: Payload);
    /// Removes a value.
    fn remove(&mut self, key: Vec<u8>);
    /// Every key that starts with `prefix`, in order.
    fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Every `(key, value)` that starts with `prefix`, in order.
    fn entries_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError>;
    /// Every `(key, value)` from `from` to `to` (both included), in order; both keys
    /// share a session's item prefix. The default filters that prefix's entries; an
    /// engine with ordered ranges reads only the range.
    fn entries_in_range(
        &self,
        from: &[u8],
        to: &[u8],
    ) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        Ok(self
            .entries_with_prefix(&from[..common])?
            .into_iter()
            .filter(|(k, _)| k.as_slice() >= from && k.as_slice() <= to)
            .collect())
    }
    /// Every key from `from` to `to` (both included), in order; both keys share a
    /// prefix. The default filters that prefix's keys; an engine with ordered ranges
    /// reads only the range.
    fn keys_in_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        Ok(self
            .keys_with_prefix(&from[..common])?
            .into_iter()
            .filter(|k| k.as_slice() >= from && k.as_slice() <= to)
            .collect())
    }
    /// The first key at or after `from`, if any: where a page of records starts
    /// (`super::list_page` seeks one session at a time, so a page reads what it lists
    /// and nothing before or between). An engine answers from its ordered index.
    fn first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// A format-1 record's bytes.
    fn format1_get(&self, _id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    /// The first session id after `after` (from the start when `None`) that has a
    /// format-1 record, if any. The default, for a table without format-1 records,
    /// answers none (as [`Table::format1_get`] does).
    fn format1_next_after(&self, _after: Option<&str>) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// Stores a format-1 record's bytes (a status change in place).
    fn format1_put(&mut self, _id: &str, _bytes: Vec<u8>) {}
    /// Removes a format-1 record.
    fn format1_remove(&mut self, _id: &str) {}
}

/// A [`Table`] over a map, for the table modules' unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use std::collections::BTreeMap;

    use super::Table;
    use crate::header::Payload;
    use crate::store_error::StoreError;

    /// Every key and value in one ordered map.
    #[derive(Default)]
    pub(crate) struct MapTable(pub(crate) BTreeMap<Vec<u8>, Payload>);

    impl Table for MapTable {
        fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
            Ok(self.0.get(key).cloned())
        }
        fn put(&mut self, key: Vec<u8>, value: Payload) {
            self.0.insert(key, value);
        }
        fn remove(&mut self, key: Vec<u8>) {
            self.0.remove(&key);
        }
        fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
            Ok(self
                .0
                .keys()
                .filter(|k| k.starts_with(prefix))
                .cloned()
                .collect())
        }
        fn first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(self
                .0
                .range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded))
                .next()
                .map(|(k, _)| k.clone()))
        }
        fn entries_with_prefix(
            &self,
            prefix: &[u8],
        ) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
            Ok(self
                .0
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }
    }
}
