//! The idempotency keys a session keeps with its record (S34a): a push may carry a key
//! (and a fingerprint of what it carried); the session remembers the keys it accepted,
//! writes them in every record header (so a key is durable exactly when its item is:
//! the same write), and restores them on resume. A retry after a restart with a key the
//! session holds is answered as a duplicate and delivers nothing; with the same key and
//! another fingerprint it is refused.
//!
//! Which keys are kept: every key whose push was not answered yet (a `sync` push is
//! answered after the write holding it, so a crash between the two loses the answer,
//! and the client retries), up to [`UNANSWERED_KEYS`], and the last [`KEPT_KEYS`] keys
//! of answered pushes. A key becomes answered when its push is (in this incarnation:
//! when the write holding it completes, or at acceptance when nothing waits for a
//! write), or when a retry with it is answered as a duplicate; a record says so from
//! its next write on. So a client that lost the answers to any number of pushes up to
//! that bound can retry them all, in any order, and none is delivered twice: a retry
//! never makes room by dropping another lost push's key.
//!
//! This file only keeps and judges keys: plain data, no I/O, no time. It must not
//! decide what a push does beyond that judgement.

use std::collections::VecDeque;

pub use agentloop_core::keys::{KeptKey, KEPT_KEYS, UNANSWERED_KEYS};

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

/// One kept key and, while its push waits for a write of this incarnation, that
/// write's number.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Kept {
    key: KeptKey,
    /// The write whose completion answers the push (`None`: answered, or unanswered
    /// by a previous incarnation: only a retry answers it now).
    write: Option<u64>,
}

/// The keys one session keeps, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    kept: VecDeque<Kept>,
    /// How many kept keys are answered.
    answered: usize,
    /// How many kept keys wait for a write of this incarnation.
    waiting: usize,
}

impl Keys {
    /// The keys a record kept: its unanswered ones and its last [`KEPT_KEYS`]
    /// answered ones (within the bounds, should a record hold more).
    pub(crate) fn from_record(kept: &[KeptKey]) -> Self {
        let mut keys = Keys::default();
        for k in kept {
            keys.answered += usize::from(!k.unanswered);
            keys.kept.push_back(Kept {
                key: k.clone(),
                write: None,
            });
        }
        keys.trim();
        keys
    }

    /// What `key` with `fingerprint` is.
    pub(crate) fn judge(&self, key: &str, fingerprint: u64) -> Seen {
        match self.kept.iter().rev().find(|k| k.key.key == key) {
            None => Seen::New,
            Some(k) if k.key.fingerprint == fingerprint => Seen::Again,
            Some(_) => Seen::Reused,
        }
    }

    /// Keeps an accepted push's key: unanswered until write `write` completes, or
    /// answered (`None`: the push is answered now). Returns how many unanswered keys
    /// went to make room (beyond [`UNANSWERED_KEYS`]): a retry of those pushes would
    /// deliver them again, so the caller logs it.
    pub(crate) fn keep(&mut self, key: String, fingerprint: u64, write: Option<u64>) -> usize {
        self.kept.push_back(Kept {
            key: KeptKey {
                key,
                fingerprint,
                unanswered: write.is_some(),
            },
            write,
        });
        match write {
            Some(_) => self.waiting += 1,
            None => self.answered += 1,
        }
        self.trim()
    }

    /// Write `write` completed (whatever its result): the pushes it and the earlier
    /// writes held are answered now.
    pub(crate) fn written(&mut self, write: u64) {
        if self.waiting == 0 {
            return;
        }
        let mut marked = 0;
        for k in self.kept.iter_mut() {
            if k.write.is_some_and(|w| w <= write) {
                k.write = None;
                k.key.unanswered = false;
                marked += 1;
            }
        }
        self.waiting -= marked;
        self.answered += marked;
        self.trim();
    }

    /// A retry with `key` is answered (a duplicate): its push counts as answered.
    pub(crate) fn retried(&mut self, key: &str) {
        if let Some(k) = self.kept.iter_mut().rev().find(|k| k.key.key == key) {
            if k.key.unanswered {
                if k.write.take().is_some() {
                    self.waiting -= 1;
                }
                k.key.unanswered = false;
                self.answered += 1;
                self.trim();
            }
        }
    }

    /// How many kept keys are unanswered.
    pub(crate) fn unanswered(&self) -> usize {
        self.kept.len() - self.answered
    }

    /// Drops the oldest answered keys beyond [`KEPT_KEYS`] and the oldest unanswered
    /// ones beyond [`UNANSWERED_KEYS`]; returns how many unanswered ones went.
    fn trim(&mut self) -> usize {
        let mut answered_over = self.answered.saturating_sub(KEPT_KEYS);
        let mut unanswered_over = self.unanswered().saturating_sub(UNANSWERED_KEYS);
        let dropped = unanswered_over;
        if answered_over == 0 && unanswered_over == 0 {
            return 0;
        }
        self.kept.retain(|k| {
            let over = if k.key.unanswered {
                &mut unanswered_over
            } else {
                &mut answered_over
            };
            if *over == 0 {
                return true;
            }
            *over -= 1;
            false
        });
        let waiting = self.kept.iter().filter(|k| k.write.is_some()).count();
        self.answered = self.kept.iter().filter(|k| !k.key.unanswered).count();
        self.waiting = waiting;
        dropped
    }

    /// The keys for a record header, oldest first.
    pub(crate) fn to_record(&self) -> Vec<KeptKey> {
        self.kept.iter().map(|k| k.key.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_new_then_again_or_reused_and_the_oldest_answered_go() {
        let mut k = Keys::default();
        assert_eq!(k.judge("a", 1), Seen::New);
        k.keep("a".into(), 1, None);
        assert_eq!(k.judge("a", 1), Seen::Again);
        assert_eq!(k.judge("a", 2), Seen::Reused);
        for i in 0..KEPT_KEYS {
            assert_eq!(k.keep(format!("k{i}"), i as u64, None), 0);
        }
        assert_eq!(k.judge("a", 1), Seen::New, "the oldest answered key went");
        assert_eq!(k.judge("k0", 0), Seen::Again);
        assert_eq!(k.to_record().len(), KEPT_KEYS);
        let back = Keys::from_record(&k.to_record());
        assert_eq!(back, k, "a record keeps them all, in order");
    }

    /// The finding (issue 52): more than [`KEPT_KEYS`] pushes whose answers were lost,
    /// retried oldest first after a restart, are each a duplicate.
    #[test]
    fn unanswered_keys_outlive_the_window_until_a_retry_answers_them() {
        let lost = KEPT_KEYS + 10;
        let mut k = Keys::default();
        // Older answered keys, then pushes whose writes were issued and never answered.
        for i in 0..KEPT_KEYS {
            k.keep(format!("old{i}"), 0, None);
        }
        for i in 0..lost {
            assert_eq!(k.keep(format!("k{i}"), i as u64, Some(i as u64 + 1)), 0);
        }
        assert_eq!(k.unanswered(), lost);
        assert_eq!(
            k.judge("old0", 0),
            Seen::Again,
            "nothing was answered since"
        );
        let record = k.to_record();
        assert_eq!(record.iter().filter(|r| r.unanswered).count(), lost);
        // A restart: the record's keys, retried oldest first.
        let mut back = Keys::from_record(&record);
        assert_eq!(back.unanswered(), lost);
        for i in 0..lost {
            assert_eq!(
                back.judge(&format!("k{i}"), i as u64),
                Seen::Again,
                "retry {i}"
            );
            back.retried(&format!("k{i}"));
        }
        // Answered now: the window holds the last KEPT_KEYS of them again.
        assert_eq!(back.unanswered(), 0);
        assert_eq!(back.to_record().len(), KEPT_KEYS);
        assert_eq!(back.judge("k9", 9), Seen::New);
        assert_eq!(back.judge("k10", 10), Seen::Again);
        // A new push's write after a restart never answers a previous incarnation's
        // unanswered key.
        let mut again = Keys::from_record(&record);
        again.keep("new".into(), 7, Some(1));
        again.written(u64::MAX - 1);
        assert_eq!(again.unanswered(), lost);
        assert_eq!(again.judge("new", 7), Seen::Again);
    }

    #[test]
    fn a_completed_write_answers_its_keys_and_the_earlier_ones() {
        let mut k = Keys::default();
        k.keep("a".into(), 1, Some(3));
        k.keep("b".into(), 2, Some(4));
        k.keep("c".into(), 3, Some(5));
        k.written(4);
        let flags: Vec<bool> = k.to_record().iter().map(|r| r.unanswered).collect();
        assert_eq!(flags, [false, false, true]);
        // A retry of a push still waiting for its write answers it too.
        k.retried("c");
        assert_eq!(k.unanswered(), 0);
        k.written(5);
        assert_eq!(k.unanswered(), 0);
        // Answered keys fill the window from the oldest: the unanswered one stays.
        k.keep("d".into(), 4, Some(6));
        for i in 0..KEPT_KEYS {
            k.keep(format!("k{i}"), 0, None);
        }
        assert_eq!(k.judge("a", 1), Seen::New);
        assert_eq!(k.judge("d", 4), Seen::Again);
        assert_eq!(k.to_record().len(), KEPT_KEYS + 1);
    }

    #[test]
    fn unanswered_keys_are_bounded_and_the_oldest_go_first() {
        let mut k = Keys::default();
        for i in 0..UNANSWERED_KEYS {
            assert_eq!(k.keep(format!("k{i}"), 0, Some(i as u64 + 1)), 0);
        }
        assert_eq!(k.keep("last".into(), 0, Some(u64::MAX)), 1, "one went");
        assert_eq!(k.judge("k0", 0), Seen::New);
        assert_eq!(k.judge("k1", 0), Seen::Again);
        assert_eq!(k.unanswered(), UNANSWERED_KEYS);
        k.written(u64::MAX);
        assert_eq!(k.unanswered(), 0);
        assert_eq!(k.to_record().len(), KEPT_KEYS);
        assert_eq!(k.judge("last", 0), Seen::Again);
        // A record written with more than the bounds is read within them.
        let mut many: Vec<KeptKey> = (0..UNANSWERED_KEYS + 5)
            .map(|i| KeptKey {
                key: format!("u{i}"),
                fingerprint: 0,
                unanswered: true,
            })
            .collect();
        many.extend((0..KEPT_KEYS + 5).map(|i| KeptKey {
            key: format!("a{i}"),
            fingerprint: 0,
            unanswered: false,
        }));
        let back = Keys::from_record(&many);
        assert_eq!(back.unanswered(), UNANSWERED_KEYS);
        assert_eq!(back.to_record().len(), UNANSWERED_KEYS + KEPT_KEYS);
        assert_eq!(back.judge("u4", 0), Seen::New);
        assert_eq!(back.judge("u5", 0), Seen::Again);
        assert_eq!(back.judge("a4", 0), Seen::New);
        assert_eq!(back.judge("a5", 0), Seen::Again);
    }
}
