//! The idempotency keys a session keeps with its record (S34a): a push may carry a key
//! (and a fingerprint of what it carried); the session remembers the last
//! [`KEPT_KEYS`] keys it accepted, writes them in every record header (so a key is
//! durable exactly when its item is: the same write), and restores them on resume. A
//! retry after a restart with a key the session holds is answered as a duplicate and
//! delivers nothing; with the same key and another fingerprint it is refused.
//!
//! This file only keeps and judges keys: plain data, no I/O, no time. It must not
//! decide what a push does beyond that judgement.

use std::collections::VecDeque;

pub use agentloop_core::keys::{KeptKey, KEPT_KEYS};

/// What a key says about a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not kept: accept the push (and keep the key).
    New,
    /// Kept with the same fingerprint: a retry of an accepted push; deliver nothing.
    Again,
    /// Kept with another fingerprint: the key was reused for another push.
    Reused,
}

/// The keys one session keeps, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    kept: VecDeque<KeptKey>,
}

impl Keys {
    /// The keys a record kept.
    pub(crate) fn from_record(kept: &[KeptKey]) -> Self {
        let start = kept.len().saturating_sub(KEPT_KEYS);
        Keys {
            kept: kept[start..].iter().cloned().collect(),
        }
    }

    /// What `key` with `fingerprint` is.
    pub(crate) fn judge(&self, key: &str, fingerprint: u64) -> Seen {
        match self.kept.iter().rev().find(|k| k.key == key) {
            None => Seen::New,
            Some(k) if k.fingerprint == fingerprint => Seen::Again,
            Some(_) => Seen::Reused,
        }
    }

    /// Keeps an accepted push's key, dropping the oldest beyond [`KEPT_KEYS`].
    pub(crate) fn keep(&mut self, key: String, fingerprint: u64) {
        if self.kept.len() == KEPT_KEYS {
            self.kept.pop_front();
        }
        self.kept.push_back(KeptKey { key, fingerprint });
    }

    /// The keys for a record header, oldest first.
    pub(crate) fn to_record(&self) -> Vec<KeptKey> {
        self.kept.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_new_then_again_or_reused_and_the_oldest_go() {
        let mut k = Keys::default();
        assert_eq!(k.judge("a", 1), Seen::New);
        k.keep("a".into(), 1);
        assert_eq!(k.judge("a", 1), Seen::Again);
        assert_eq!(k.judge("a", 2), Seen::Reused);
        for i in 0..KEPT_KEYS {
            k.keep(format!("k{i}"), i as u64);
        }
        assert_eq!(k.judge("a", 1), Seen::New, "the oldest key went");
        assert_eq!(k.judge("k0", 0), Seen::Again);
        let back = Keys::from_record(&k.to_record());
        assert_eq!(back, k, "a record keeps them all, in order");
    }
}
