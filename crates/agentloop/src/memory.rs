//! The process's memory budget (S34a, issue 52): one bound on what the whole process
//! holds, beside the per-session and per-request bounds, which do not add up to one
//! (20 sessions at their 64 MiB each, 1 000 sessions' replay buffers, 2 000 pushes of
//! 1 MiB into a session that stores nothing: each took a server past 4 GB).
//!
//! What is charged is the process's live heap: every allocation, whatever holds it
//! (items, replay buffers, kept-event pages, timers, model responses, the stores'
//! caches), counted by [`CountingAlloc`] when the binary installs it as its global
//! allocator (`agentloop` does), or the resident set read from `/proc/self/statm`
//! where it does not. A door that takes new work asks [`MemoryBudget::check`] before it
//! accepts anything; over the budget it refuses (HTTP 503 `over_memory` with
//! `Retry-After`) and nothing already accepted is dropped: sessions finish their turns,
//! stops, cancels and reads go on, and the memory they free lets work in again.
//!
//! This file measures and judges; it refuses nothing itself and never logs.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Live heap bytes, counted by [`CountingAlloc`] (0 where it is not installed).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A global allocator that counts the live heap for the memory budget: wrap the
/// allocator the binary uses.
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: agentloop::memory::CountingAlloc<std::alloc::System> =
///     agentloop::memory::CountingAlloc::new(std::alloc::System);
/// ```
///
/// One relaxed atomic add per allocation and free.
#[derive(Debug)]
pub struct CountingAlloc<A>(A);

impl<A> CountingAlloc<A> {
    /// Counts what `inner` allocates.
    pub const fn new(inner: A) -> Self {
        CountingAlloc(inner)
    }
}

// SAFETY: every call is forwarded to the wrapped allocator with the same arguments;
// the counter is bookkeeping only.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as given.
        unsafe { self.0.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as given.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

/// The live heap in bytes when [`CountingAlloc`] counts it.
pub fn live_heap() -> Option<usize> {
    match LIVE.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// What the process holds now: the live heap where [`CountingAlloc`] counts it, else
/// the resident set (Linux; 0 where neither can be read).
pub fn used() -> usize {
    live_heap().or_else(resident).unwrap_or(0)
}

/// The resident set in bytes, from `/proc/self/statm`.
fn resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(4096))
}

/// One bound on the memory the whole process holds (`[limits] memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes the process may hold before new work is refused.
    pub limit: usize,
}

/// The process holds more than its budget: new work is refused until it frees some.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the server holds {} of memory, over its budget of {} ([limits] memory): nothing new is accepted until the sessions it runs free some; retry later, or raise the budget", human(*used), human(*limit))]
pub struct OverBudget {
    /// What the process holds.
    pub used: usize,
    /// The budget.
    pub limit: usize,
}

fn human(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    match bytes {
        b if b >= 10 * 1024 * MIB => format!("{} GiB", b / (1024 * MIB)),
        b if b >= MIB => format!("{} MiB", b / MIB),
        b => format!("{b} bytes"),
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        MemoryBudget { limit }
    }

    /// The default: half of the least of the machine's memory, the cgroup's memory
    /// limit and the address-space limit (`ulimit -v`), whichever can be read; `None`
    /// where none can (no budget).
    pub fn auto() -> Option<Self> {
        let limits = [mem_total(), cgroup_limit(), address_space_limit()];
        limits
            .into_iter()
            .flatten()
            .min()
            .map(|least| MemoryBudget::new(least / 2))
    }

    /// `Ok` while the process holds at most the budget.
    pub fn check(&self) -> Result<(), OverBudget> {
        self.check_used(used())
    }

    /// The judgement for a process that holds `used` bytes.
    pub fn check_used(&self, used: usize) -> Result<(), OverBudget> {
        match used > self.limit {
            true => Err(OverBudget {
                used,
                limit: self.limit,
            }),
            false => Ok(()),
        }
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The cgroup's memory limit (v2 `memory.max`, or v1 `memory.limit_in_bytes`).
fn cgroup_limit() -> Option<usize> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse::<usize>().ok())
    // v1 says "no limit" with a huge number.
    .filter(|n| *n < (1usize << 60))
}

/// The address-space limit (`ulimit -v`, RLIMIT_AS) of `/proc/self/limits`.
fn address_space_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    // "Max address space  <soft> <hard> bytes"
    let soft = line
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refuses_above_its_limit_and_says_what_to_do() {
        let b = MemoryBudget::new(100 << 20);
        assert!(b.check_used(100 << 20).is_ok());
        let e = b.check_used(300 << 20).unwrap_err();
        assert_eq!(
            e,
            OverBudget {
                used: 300 << 20,
                limit: 100 << 20
            }
        );
        let text = e.to_string();
        assert!(text.contains("300 MiB"), "{text}");
        assert!(text.contains("[limits] memory"), "{text}");
    }

    #[test]
    fn the_default_is_half_of_what_the_machine_allows() {
        // This machine reports its memory: the default is at most half of it.
        let total = mem_total().expect("/proc/meminfo");
        let auto = MemoryBudget::auto().expect("a default");
        assert!(auto.limit <= total / 2, "{auto:?} of {total}");
        assert!(auto.limit > 0);
        assert!(used() > 0, "the process holds something");
    }
}
