//! Durable timers and schedules (DESIGN S39): what a user arms
//! ([`RuntimeHandle::wake_at`](crate::runtime::RuntimeHandle::wake_at),
//! [`RuntimeHandle::schedule`](crate::runtime::RuntimeHandle::schedule)), lists and cancels, and
//! the inbox of the task that fires them (`crate::runtime_handle::timer_service`, beside
//! the runtime handle it pushes through): at its time a timer's item is pushed into
//! its session, and the write that accepts the item removes the timer (or moves a
//! recurring one to its next slot), so it fires once, across restarts too.
//!
//! This module owns the user's vocabulary (a [`Schedule`], a [`Timer`], a
//! [`TimerError`]) and when a recurring timer is due next (cron expressions are parsed
//! by `croner`: see docs/semantics.md, S39). It never touches a store engine (the store
//! keeps timers: `agentloop_core::table::timers`) and never decides what a session does
//! with an item.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::store::{Repeat, StoreError, StoredTimer};

/// How a schedule recurs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Every period, from the first due time (which is one period after it is armed):
    /// it keeps its phase across restarts.
    Every(Duration),
    /// At the times a cron expression names, in UTC: five fields (minute, hour, day of
    /// month, month, day of week), six with seconds first, or an alias such as
    /// `@hourly`. Parsed by `croner`.
    Cron(String),
}

impl Schedule {
    /// A cron schedule, checked now: an invalid expression is refused with why.
    pub fn cron(expr: &str) -> Result<Self, TimerError> {
        parse_cron(expr)?;
        Ok(Schedule::Cron(expr.to_string()))
    }

    /// The schedule as stored, checked.
    pub(crate) fn repeat(&self) -> Result<Repeat, TimerError> {
        match self {
            Schedule::Every(d) if d.as_millis() == 0 => Err(TimerError::Period),
            Schedule::Every(d) => Ok(Repeat::Every {
                ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            }),
            Schedule::Cron(expr) => {
                parse_cron(expr)?;
                Ok(Repeat::Cron { expr: expr.clone() })
            }
        }
    }
}

/// What a session's durable timers may hold (S34a, issue 52; `[limits]`
/// `session_timers`, `timer_bytes`, `timer_period`): without them 300 timers of 900 KB
/// and four reads of the session took a server's memory, and an `every 1ms` schedule
/// kept two thirds of a core busy after every restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerBounds {
    /// Timers and schedules one session holds at once; one more is refused
    /// ([`TimerError::TooMany`]).
    pub per_session: usize,
    /// The largest item a timer carries, encoded as the session's items are
    /// ([`TimerError::ItemTooLarge`]).
    pub item_bytes: usize,
    /// The shortest period of an `every` schedule ([`TimerError::PeriodTooShort`]); a
    /// cron expression that comes due more often than this is refused too.
    pub min_period: Duration,
}

impl TimerBounds {
    /// No bounds (an embedded runtime whose callers are trusted).
    pub const UNBOUNDED: TimerBounds = TimerBounds {
        per_session: usize::MAX,
        item_bytes: usize::MAX,
        min_period: Duration::from_millis(1),
    };

    /// Checks a timer about to be armed: its item's size and, for a schedule, its
    /// period (for a cron expression: the gap between its next two times after
    /// `now_ms`).
    pub(crate) fn check(&self, timer: &StoredTimer, now_ms: u64) -> Result<(), TimerError> {
        if timer.item.len() > self.item_bytes {
            return Err(TimerError::ItemTooLarge {
                bytes: timer.item.len(),
                max: self.item_bytes,
            });
        }
        let min_ms = u64::try_from(self.min_period.as_millis()).unwrap_or(u64::MAX);
        let period_ms = match &timer.repeat {
            None => return Ok(()),
            Some(Repeat::Every { ms }) => *ms,
            Some(Repeat::Cron { expr }) => {
                let first = cron_after(expr, now_ms)?;
                match cron_after(expr, first) {
                    Ok(second) => second.saturating_sub(first),
                    Err(_) => return Ok(()),
                }
            }
        };
        if period_ms < min_ms {
            return Err(TimerError::PeriodTooShort {
                period: Duration::from_millis(period_ms),
                min: self.min_period,
            });
        }
        Ok(())
    }
}

impl Default for TimerBounds {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

/// A session's timer, as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct Timer<I> {
    /// Its number within its session (what cancels it).
    pub id: u64,
    /// When it is due next.
    pub due: SystemTime,
    /// The item it pushes; `None` when the stored item no longer decodes as this
    /// runtime's item type (the timer is kept: cancel it, or deploy a type that reads it).
    pub item: Option<I>,
    /// How it recurs (`None`: once).
    pub schedule: Option<Schedule>,
    /// How many times it fired.
    pub fired: u64,
    /// When it was armed.
    pub armed: SystemTime,
}

impl<I: serde::de::DeserializeOwned> Timer<I> {
    pub(crate) fn from_stored(session: &str, id: u64, t: StoredTimer) -> Self {
        Timer {
            id,
            due: at(t.due_ms),
            item: crate::store::codec::decode_item(session, &t.item).ok(),
            schedule: t.repeat.map(|r| match r {
                Repeat::Every { ms } => Schedule::Every(Duration::from_millis(ms)),
                Repeat::Cron { expr } => Schedule::Cron(expr),
            }),
            fired: t.fired,
            armed: at(t.armed_ms),
        }
    }
}

/// Why a timer could not be armed, listed or canceled.
#[derive(Debug, thiserror::Error)]
pub enum TimerError {
    /// The runtime has no checkpoint store.
    #[error("durable timers need a checkpoint store: build the runtime with a data directory or a store")]
    NoStore,
    /// The session is neither live here nor stored.
    #[error("session `{session}` is neither running here nor stored: a timer pushes into a session; spawn it persistent (SessionSpec::persistent) first, then arm the timer")]
    NoRecord {
        /// The session.
        session: String,
    },
    /// A cron expression that does not parse.
    #[error("the cron expression `{expr}` is not valid ({reason}): give five fields (minute hour day-of-month month day-of-week, in UTC), six with seconds first, or an alias such as @hourly; for example `0 9 * * 1-5`")]
    Cron {
        /// The expression as given.
        expr: String,
        /// What `croner` found wrong.
        reason: String,
    },
    /// A cron expression that never comes due.
    #[error("the cron expression `{expr}` names no time after now: give one that recurs")]
    CronNever {
        /// The expression.
        expr: String,
    },
    /// The session could not be written first (not persistent, exiting, or its store
    /// failed).
    #[error("the session cannot keep a timer: {0}")]
    Session(String),
    /// A zero period.
    #[error("a schedule's period must be at least 1 ms")]
    Period,
    /// The session holds as many timers as it may (S34a).
    #[error("session `{session}` already holds {max} timers, its bound ([limits] session_timers): cancel some (or let them fire) before arming more, or raise the bound")]
    TooMany {
        /// The session.
        session: String,
        /// The bound.
        max: usize,
    },
    /// The timer's item is larger than a timer may carry (S34a).
    #[error("the timer's item is {bytes} bytes encoded, over the bound of {max} ([limits] timer_bytes): send a smaller item (a reference to the data, not the data), or raise the bound")]
    ItemTooLarge {
        /// The item's encoded size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// A schedule that comes due more often than the bound allows (S34a).
    #[error("the schedule comes due every {}, more often than the bound of every {} ([limits] timer_period): give a longer period, or raise the bound", humantime::format_duration(*period), humantime::format_duration(*min))]
    PeriodTooShort {
        /// The schedule's period.
        period: Duration,
        /// The shortest allowed.
        min: Duration,
    },
    /// The item cannot be stored.
    #[error("the timer's item cannot be stored: {0}")]
    Item(String),
    /// The store refused or failed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for TimerError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoRecord { session } => TimerError::NoRecord { session },
            StoreError::TooManyTimers { session, max } => TimerError::TooMany { session, max },
            e => TimerError::Store(e),
        }
    }
}

fn parse_cron(expr: &str) -> Result<croner::Cron, TimerError> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| TimerError::Cron {
            expr: expr.to_string(),
            reason: e.to_string(),
        })
}

/// A timer to store, due at `due_ms`: `item` encoded as the session's items are.
pub(crate) fn stored<I: serde::Serialize + serde::de::DeserializeOwned>(
    item: &I,
    due_ms: u64,
    repeat: Option<Repeat>,
    now_ms: u64,
) -> Result<StoredTimer, TimerError> {
    let item =
        crate::store::codec::encode_item(item).map_err(|e| TimerError::Item(e.to_string()))?;
    Ok(StoredTimer {
        due_ms,
        item,
        repeat,
        armed_ms: now_ms,
        fired: 0,
    })
}

/// Where the service is told of arms and cancels.
pub(crate) type Notify = tokio::sync::mpsc::UnboundedSender<Command>;

/// What the service is told.
#[derive(Debug)]
pub(crate) enum Command {
    /// A timer was armed (or moved): fire it at its due time.
    Arm(crate::store::TimerRef),
    /// A timer was canceled.
    Disarm { session: String, id: u64 },
}

/// The wall clock in ms, advanced by tokio's clock from the start (a paused clock in a
/// test moves it), never behind the system's.
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    wall_ms: u64,
    start: tokio::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            wall_ms: ms_of(SystemTime::now()),
            start: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_ms
            .saturating_add(elapsed)
            .max(ms_of(SystemTime::now()))
    }

    /// The tokio instant at which wall time `ms` is reached.
    pub(crate) fn instant_of(&self, ms: u64) -> tokio::time::Instant {
        let now = self.now_ms();
        tokio::time::Instant::now() + Duration::from_millis(ms.saturating_sub(now))
    }
}

/// Where a session's turns arm durable timers: its store, and the runtime's timer
/// service when there is one (without one, a timer is stored and fired by the next
/// runtime that starts on the store).
pub(crate) struct TimerLink<I> {
    pub(crate) store: std::sync::Arc<dyn crate::store::CheckpointStore<I>>,
    pub(crate) service: Option<Notify>,
    /// What a timer may hold (S34a).
    pub(crate) bounds: TimerBounds,
}

impl<I: 'static> TimerLink<I> {
    /// Arms `timer` for `session`, durably, and tells the service; its number.
    /// Refused before anything is written when it is over a bound.
    pub(crate) async fn arm(&self, session: &str, timer: StoredTimer) -> Result<u64, TimerError> {
        self.bounds.check(&timer, timer.armed_ms)?;
        let due_ms = timer.due_ms;
        let n = self
            .store
            .arm_timer(session, timer, self.bounds.per_session)
            .await?;
        if let Some(service) = &self.service {
            let _ = service.send(Command::Arm(crate::store::TimerRef {
                due_ms,
                session: session.to_string(),
                id: n,
            }));
        }
        Ok(n)
    }
}

/// Milliseconds since the Unix epoch as a time.
pub(crate) fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// A time as milliseconds since the Unix epoch (0 before it).
pub(crate) fn ms_of(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The first due time of a schedule armed at `now_ms`.
pub(crate) fn first_due(repeat: &Repeat, now_ms: u64) -> Result<u64, TimerError> {
    match repeat {
        Repeat::Every { ms } => Ok(now_ms.saturating_add((*ms).max(1))),
        Repeat::Cron { expr } => cron_after(expr, now_ms),
    }
}

/// When a recurring timer whose slot was `slot_ms` is due next, fired at `now_ms`: one
/// fire however many slots a downtime missed (S39), the next slot after `now_ms`
/// (`Every` keeps its grid). `None` when it never comes due again.
pub(crate) fn next_due(repeat: &Repeat, slot_ms: u64, now_ms: u64) -> Option<u64> {
    match repeat {
        Repeat::Every { ms } => Some(
            agentloop_core::timers::fire(
                agentloop_core::timers::Every::Millis(*ms),
                slot_ms,
                now_ms.max(slot_ms),
            )
            .next_ms,
        ),
        Repeat::Cron { expr } => cron_after(expr, now_ms.max(slot_ms)).ok(),
    }
}

/// The first time after `after_ms` a cron expression names.
fn cron_after(expr: &str, after_ms: u64) -> Result<u64, TimerError> {
    let cron = parse_cron(expr)?;
    let after = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
        i64::try_from(after_ms).unwrap_or(i64::MAX),
    )
    .ok_or_else(|| TimerError::CronNever {
        expr: expr.to_string(),
    })?;
    let next = cron
        .find_next_occurrence(&after, false)
        .map_err(|_| TimerError::CronNever {
            expr: expr.to_string(),
        })?;
    u64::try_from(next.timestamp_millis()).map_err(|_| TimerError::CronNever {
        expr: expr.to_string(),
    })
}

impl FromStr for Schedule {
    type Err = TimerError;

    /// `every 30s` / `every 5m` / `every 2h` / `every 1d` / `every 250ms`, or a cron
    /// expression (what the CLI and the HTTP front accept).
    fn from_str(s: &str) -> Result<Self, TimerError> {
        let s = s.trim();
        if let Some(period) = s.strip_prefix("every ") {
            let period = period.trim();
            let split = period
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(period.len());
            let (n, unit) = period.split_at(split);
            let n: u64 = n.parse().map_err(|_| TimerError::Period)?;
            let ms = match unit.trim() {
                "ms" => n,
                "s" => n.saturating_mul(1_000),
                "m" => n.saturating_mul(60_000),
                "h" => n.saturating_mul(3_600_000),
                "d" => n.saturating_mul(86_400_000),
                other => {
                    return Err(TimerError::Cron {
                        expr: s.to_string(),
                        reason: format!("unknown unit `{other}` (ms, s, m, h or d)"),
                    })
                }
            };
            if ms == 0 {
                return Err(TimerError::Period);
            }
            return Ok(Schedule::Every(Duration::from_millis(ms)));
        }
        Schedule::cron(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_errors_say_what_is_wrong_and_what_to_give() {
        let e = Schedule::cron("61 * * * *").unwrap_err().to_string();
        assert!(e.contains("`61 * * * *` is not valid"), "{e}");
        assert!(e.contains("five fields"), "{e}");
        let e = Schedule::cron("not cron").unwrap_err().to_string();
        assert!(e.contains("not valid"), "{e}");
        assert!(Schedule::cron("0 9 * * 1-5").is_ok());
        assert!(
            Schedule::cron("*/10 * * * * *").is_ok(),
            "six fields, seconds first"
        );
        assert!(Schedule::cron("@hourly").is_ok());
    }

    #[test]
    fn schedules_parse_from_text() {
        assert_eq!(
            "every 5m".parse::<Schedule>().unwrap(),
            Schedule::Every(Duration::from_secs(300))
        );
        assert_eq!(
            "every 250ms".parse::<Schedule>().unwrap(),
            Schedule::Every(Duration::from_millis(250))
        );
        assert!(matches!(
            "every 0s".parse::<Schedule>(),
            Err(TimerError::Period)
        ));
        assert!("every 3 fortnights".parse::<Schedule>().is_err());
        assert_eq!(
            "0 9 * * *".parse::<Schedule>().unwrap(),
            Schedule::Cron("0 9 * * *".into())
        );
    }

    #[test]
    fn a_cron_schedule_comes_due_on_its_times_and_once_after_a_downtime() {
        let hourly = Repeat::Cron {
            expr: "15 * * * *".into(),
        };
        let hour = 3_600_000;
        // Armed at 00:00: first due at 00:15.
        assert_eq!(first_due(&hourly, 0).unwrap(), 15 * 60_000);
        // Fired at 05:20 for the 00:15 slot (a downtime): next at 06:15, once.
        assert_eq!(
            next_due(&hourly, 15 * 60_000, 5 * hour + 20 * 60_000),
            Some(6 * hour + 15 * 60_000)
        );
        let every = Repeat::Every { ms: hour };
        assert_eq!(
            next_due(&every, 15 * 60_000, 5 * hour + 20 * 60_000),
            Some(6 * hour + 15 * 60_000)
        );
        // On time: the next slot.
        assert_eq!(next_due(&every, hour, hour), Some(2 * hour));
    }
}
