//! Durable timers in the table (S39): how a session's timers are keyed, armed,
//! listed, canceled, fired and removed. Every engine runs this code over its own table
//! (like the record and the kept events), so they share one semantics; what a timer
//! does when it is due (a push into its session) is the runtime's, and when it is due
//! is `crate::timers`'s.
//!
//! Two keys per timer, apart from the record (no record load or listing reads them):
//!
//! ```text
//! 0x03 <due_ms: u64 BE> <id> 0x00 <timer: u64 BE>   (no value)  the due-time index
//! 0x04 <id> 0x00 <timer: u64 BE>                    the timer    one session's timers
//! ```
//!
//! A node reads the due-time index once at start (keys only, earliest first: one scan,
//! not a scan of every record); a session's timers are listed, canceled and fired by
//! their own prefix. A timer's number is one more than the highest its session holds,
//! taken in the write that arms it.

use super::Table;
use crate::header::Payload;
use crate::store_error::StoreError;
use crate::timers::TimerRef;

/// The first byte of a due-time index key.
pub const DUE_MARK: u8 = 0x03;
/// The first byte of a session's timer key.
pub const TIMERS_MARK: u8 = 0x04;

pub use crate::timers::{StoredTimer, TimerChange};

/// The prefix of `id`'s timer keys.
pub fn timers_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 11);
    k.push(TIMERS_MARK);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

/// The key of `id`'s timer `timer`.
pub fn timer_key(id: &str, timer: u64) -> Vec<u8> {
    let mut k = timers_prefix(id);
    k.extend_from_slice(&timer.to_be_bytes());
    k
}

/// The due-time index key of `id`'s timer `timer`, due at `due_ms`.
pub fn due_key(due_ms: u64, id: &str, timer: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 18);
    k.push(DUE_MARK);
    k.extend_from_slice(&due_ms.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k.extend_from_slice(&timer.to_be_bytes());
    k
}

/// Reads a due-time index key back.
pub fn parse_due_key(key: &[u8]) -> Option<TimerRef> {
    let rest = key.strip_prefix(&[DUE_MARK])?;
    let (due, rest) = rest.split_at_checked(8)?;
    let (id, timer) = rest.split_at_checked(rest.len().checked_sub(9)?)?;
    let timer = timer.strip_prefix(&[0])?;
    Some(TimerRef {
        due_ms: u64::from_be_bytes(due.try_into().ok()?),
        session: std::str::from_utf8(id).ok()?.to_string(),
        id: u64::from_be_bytes(timer.try_into().ok()?),
    })
}

fn timer_number(key: &[u8], prefix_len: usize) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(prefix_len..)?.try_into().ok()?)).filter(|n| *n != LAST_GIVEN)
}

/// The number of the entry, among a session's timer keys, that holds the last number
/// given (big-endian): numbers are never given twice while the session's timers exist,
/// so a number a client kept never names a newer timer. Not a timer.
const LAST_GIVEN: u64 = u64::MAX;

fn corrupt(id: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        session: id.to_string(),
        reason,
    }
}

fn encode(id: &str, timer: &StoredTimer) -> Result<Payload, StoreError> {
    rmp_serde::to_vec_named(timer)
        .map(Payload::from)
        .map_err(|e| corrupt(id, format!("a timer cannot be encoded: {e}")))
}

fn decode(id: &str, bytes: &[u8]) -> Result<StoredTimer, StoreError> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        corrupt(
            id,
            format!("a stored timer cannot be decoded ({e}); cancel it by number, or delete the session"),
        )
    })
}

/// Arms a timer of `id` and returns its number (one more than any given before: never
/// reused while the session's timers exist), unless the session holds `max` timers
/// already ([`StoreError::TooManyTimers`], nothing written: S34a, issue 52).
/// The session need not be stored yet (a live session writes its record later); the
/// runtime checks that it exists.
pub fn arm(
    t: &mut impl Table,
    id: &str,
    timer: StoredTimer,
    max: usize,
) -> Result<u64, StoreError> {
    super::check_id(id)?;
    let prefix = timers_prefix(id);
    let keys = t.keys_with_prefix(&prefix)?;
    let held = keys
        .iter()
        .filter(|k| timer_number(k, prefix.len()).is_some())
        .count();
    if held >= max {
        return Err(StoreError::TooManyTimers {
            session: id.to_string(),
            max,
        });
    }
    let highest = keys
        .iter()
        .rev()
        .find_map(|k| timer_number(k, prefix.len()))
        .unwrap_or(0);
    let given = t
        .get(&timer_key(id, LAST_GIVEN))?
        .and_then(|b| b.as_ref().try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(0);
    let number = highest.max(given) + 1;
    if number == LAST_GIVEN {
        return Err(corrupt(
            id,
            "the session has given every timer number".into(),
        ));
    }
    t.put(due_key(timer.due_ms, id, number), Payload::from(Vec::new()));
    t.put(timer_key(id, number), encode(id, &timer)?);
    t.put(
        timer_key(id, LAST_GIVEN),
        Payload::from(number.to_be_bytes().to_vec()),
    );
    Ok(number)
}

/// `id`'s timer `timer`, if stored.
pub fn get(t: &impl Table, id: &str, timer: u64) -> Result<Option<StoredTimer>, StoreError> {
    super::check_id(id)?;
    if timer == LAST_GIVEN {
        return Ok(None);
    }
    t.get(&timer_key(id, timer))?
        .map(|b| decode(id, &b))
        .transpose()
}

/// `id`'s timers, by number.
pub fn list(t: &impl Table, id: &str) -> Result<Vec<(u64, StoredTimer)>, StoreError> {
    super::check_id(id)?;
    let prefix = timers_prefix(id);
    t.entries_with_prefix(&prefix)?
        .into_iter()
        .filter_map(|(k, v)| timer_number(&k, prefix.len()).map(|n| (n, v)))
        .map(|(n, v)| decode(id, &v).map(|timer| (n, timer)))
        .collect()
}

/// Cancels `id`'s timer `timer`; whether it was stored.
pub fn cancel(t: &mut impl Table, id: &str, timer: u64) -> Result<bool, StoreError> {
    let Some(stored) = get(t, id, timer)? else {
        return Ok(false);
    };
    t.remove(due_key(stored.due_ms, id, timer));
    t.remove(timer_key(id, timer));
    Ok(true)
}

/// Applies the timer changes of a record write of `id` (the record's part already
/// applied, in the same batch).
pub fn apply(t: &mut impl Table, id: &str, changes: Vec<TimerChange>) -> Result<(), StoreError> {
    for change in changes {
        match change {
            TimerChange::Arm(timer) => {
                // Bounded where it is asked for (`arm_timer`); a change riding a record
                // write was checked when it was made.
                arm(t, id, timer, usize::MAX)?;
            }
            TimerChange::Fired {
                timer,
                due_ms,
                next_due_ms,
            } => {
                let Some(mut stored) = get(t, id, timer)? else {
                    continue;
                };
                // Only the due time it fired for: a timer moved since keeps its place.
                if stored.due_ms != due_ms {
                    continue;
                }
                t.remove(due_key(due_ms, id, timer));
                match next_due_ms {
                    Some(next) if stored.repeat.is_some() => {
                        stored.due_ms = next;
                        stored.fired += 1;
                        t.put(due_key(next, id, timer), Payload::from(Vec::new()));
                        t.put(timer_key(id, timer), encode(id, &stored)?);
                    }
                    _ => t.remove(timer_key(id, timer)),
                }
            }
            TimerChange::RemoveAll => {
                remove_all(t, id)?;
            }
        }
    }
    Ok(())
}

/// Removes every timer of `id`; how many there were.
pub fn remove_all(t: &mut impl Table, id: &str) -> Result<usize, StoreError> {
    let timers = list(t, id)?;
    for (n, timer) in &timers {
        t.remove(due_key(timer.due_ms, id, *n));
        t.remove(timer_key(id, *n));
    }
    t.remove(timer_key(id, LAST_GIVEN));
    Ok(timers.len())
}

/// Every armed timer of every session, earliest first (keys only: the due-time index).
pub fn due_index(t: &impl Table) -> Result<Vec<TimerRef>, StoreError> {
    Ok(t.keys_with_prefix(&[DUE_MARK])?
        .iter()
        .filter_map(|k| parse_due_key(k))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::kv::tests_support::MapTable;
    use crate::timers::Repeat;

    fn timer(due_ms: u64, repeat: Option<Repeat>) -> StoredTimer {
        StoredTimer {
            due_ms,
            item: b"wake".to_vec(),
            repeat,
            armed_ms: 1,
            fired: 0,
        }
    }

    #[test]
    fn keys_round_trip_and_the_index_sorts_by_due_time() {
        let k = due_key(42, "s-1", 7);
        assert_eq!(
            parse_due_key(&k),
            Some(TimerRef {
                due_ms: 42,
                session: "s-1".into(),
                id: 7
            })
        );
        assert!(due_key(41, "zzz", 9) < due_key(42, "a", 1));
        assert!(parse_due_key(&timer_key("s", 1)).is_none());
    }

    #[test]
    fn timers_are_armed_numbered_listed_canceled_and_indexed() {
        let mut t = MapTable::default();
        assert_eq!(arm(&mut t, "a", timer(30, None), 2).unwrap(), 1);
        assert_eq!(arm(&mut t, "a", timer(10, None), 2).unwrap(), 2);
        assert_eq!(arm(&mut t, "b", timer(20, None), 2).unwrap(), 1);
        // S34a (issue 52): at its bound a session's arm is refused, nothing written.
        assert_eq!(
            arm(&mut t, "a", timer(40, None), 2),
            Err(StoreError::TooManyTimers {
                session: "a".into(),
                max: 2
            })
        );
        let due: Vec<(u64, String, u64)> = due_index(&t)
            .unwrap()
            .into_iter()
            .map(|r| (r.due_ms, r.session, r.id))
            .collect();
        assert_eq!(
            due,
            vec![
                (10, "a".into(), 2),
                (20, "b".into(), 1),
                (30, "a".into(), 1)
            ]
        );
        assert_eq!(list(&t, "a").unwrap().len(), 2);
        assert!(cancel(&mut t, "a", 2).unwrap());
        assert!(!cancel(&mut t, "a", 2).unwrap());
        assert_eq!(due_index(&t).unwrap().len(), 2);
        // A number is never given twice, even once its timer is gone (a client that
        // kept #2 must not cancel a newer timer by it).
        assert_eq!(arm(&mut t, "a", timer(5, None), 2).unwrap(), 3);
        assert!(
            get(&t, "a", u64::MAX).unwrap().is_none(),
            "the counter is no timer"
        );
        assert!(!cancel(&mut t, "a", u64::MAX).unwrap());
        assert_eq!(remove_all(&mut t, "a").unwrap(), 2);
        assert!(list(&t, "a").unwrap().is_empty());
        assert_eq!(
            arm(&mut t, "a", timer(5, None), 2).unwrap(),
            1,
            "a deleted session starts again"
        );
        assert_eq!(remove_all(&mut t, "a").unwrap(), 1);
        assert_eq!(due_index(&t).unwrap().len(), 1, "b's timer stays");
    }

    #[test]
    fn a_fire_removes_a_one_off_timer_and_moves_a_recurring_one() {
        let mut t = MapTable::default();
        let once = arm(&mut t, "a", timer(10, None), 2).unwrap();
        let every = arm(&mut t, "a", timer(10, Some(Repeat::Every { ms: 100 })), 2).unwrap();
        let fired = |timer, next| TimerChange::Fired {
            timer,
            due_ms: 10,
            next_due_ms: next,
        };
        apply(
            &mut t,
            "a",
            vec![fired(once, None), fired(every, Some(110))],
        )
        .unwrap();
        let left = list(&t, "a").unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(
            (left[0].0, left[0].1.due_ms, left[0].1.fired),
            (every, 110, 1)
        );
        let due = due_index(&t).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].due_ms, due[0].id), (110, every));
        // Fired again for the old due time (a duplicate): nothing changes.
        apply(&mut t, "a", vec![fired(every, Some(210))]).unwrap();
        assert_eq!(get(&t, "a", every).unwrap().unwrap().due_ms, 110);
        // A timer canceled after it fired: nothing to change.
        apply(&mut t, "a", vec![fired(once, None)]).unwrap();
        // Armed by a record write.
        apply(&mut t, "a", vec![TimerChange::Arm(timer(5, None))]).unwrap();
        assert_eq!(due_index(&t).unwrap()[0].due_ms, 5);
    }

    #[test]
    fn a_final_record_removes_every_timer_of_its_session_only() {
        let mut t = MapTable::default();
        arm(&mut t, "a", timer(10, None), 8).unwrap();
        arm(&mut t, "a", timer(20, Some(Repeat::Every { ms: 100 })), 8).unwrap();
        arm(&mut t, "b", timer(30, None), 8).unwrap();
        apply(&mut t, "a", vec![TimerChange::RemoveAll]).unwrap();
        assert!(list(&t, "a").unwrap().is_empty());
        let due = due_index(&t).unwrap();
        assert_eq!(due.len(), 1, "only b's timer is due: {due:?}");
        assert_eq!(due[0].session, "b");
    }
}
