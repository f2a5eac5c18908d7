//! The main job under a crash loop (DESIGN S16a, S31, S10), on sled and on fjall (issue
//! 15): the real `agentloop run` binary, `[store] flush = "sync"`, is killed with SIGKILL at random moments, 50 times
//! on one data directory; each new run resumes what the killed one left `Running`
//! (its lease expired) and starts new sessions. After every kill each record decodes,
//! no item is in two records, and every acknowledged push is delivered or on record;
//! each run resumes exactly what the previous kill left and logs no error (a resumed
//! session refusing its record, S19, would). A last run resumes everything and
//! finishes by itself, leaving no record. Over the whole audit log
//! (`--item-log`):
//!
//! (a) every acknowledged item is delivered (a completed turn's `turn` line) or still
//!     on record at the end (there is no record at the end);
//! (b) every id delivered or on record was pushed (nothing invented);
//! (c) within one run (one process lifetime) no id is delivered twice;
//! (d) an id delivered in two runs was first delivered in a run that was SIGKILLed, in
//!     the tail of its session's turns there: once a turn's end was not durable at the
//!     kill, neither was any later one's (writes are ordered), so every acknowledged
//!     item of those later turns comes back too (at-least-once across a kill, exactly
//!     once otherwise);
//! (e) the last, clean run delivers nothing twice.
//!
//! `AGENTLOOP_CRASH_SEED=<n>` replays a run's kill moments (the seed is printed).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use agentloop::store::{Backend, SessionStatus};
use agentloop_sim::SimItem;
use common::{Job, TempDir};

const ITERATIONS: usize = 50;
const DEFAULT_SEED: u64 = 0x0c0f_fee5_eed5;
/// `[supervisor] lease_timeout` below; a killed run's sessions are resumable after it.
const LEASE: Duration = Duration::from_millis(200);

/// A small deterministic generator (PCG-style LCG), so a failure is reproducible.
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

/// Appends a line of the test's own to the item log (the test owns the file between
/// runs). A line a SIGKILL cut in the middle of its write has no newline: it is
/// terminated and flagged `#torn` so the reader drops it.
fn mark(log: &Path, line: &str) -> bool {
    let text = std::fs::read(log).unwrap_or_default();
    let torn = !text.is_empty() && text.last() != Some(&b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the item log");
    let mut out = String::new();
    if torn {
        out.push_str("\n#torn\n");
    }
    out.push_str(line);
    out.push('\n');
    f.write_all(out.as_bytes()).expect("write the item log");
    torn
}

/// One process lifetime's lines.
#[derive(Default)]
struct Run {
    name: String,
    /// Turn lines in log order: the ids of each completed turn.
    turns: Vec<Vec<u64>>,
}

/// The whole log.
#[derive(Default)]
struct Log {
    runs: Vec<Run>,
    /// id → (session, run) of its `pushing` line.
    pushed: HashMap<u64, (String, usize)>,
    acked: HashSet<u64>,
    torn: usize,
}

impl Log {
    fn read(path: &Path) -> Log {
        let text = std::fs::read_to_string(path).expect("read the item log");
        let mut log = Log::default();
        let mut lines: Vec<&str> = Vec::new();
        for line in text.split_inclusive('\n') {
            match line.strip_suffix('\n') {
                Some("#torn") => {
                    lines.pop().expect("a torn line before #torn");
                    log.torn += 1;
                }
                Some(l) => lines.push(l),
                // A torn last line (the run that wrote it was just killed).
                None => {}
            }
        }
        for (n, line) in lines.iter().enumerate() {
            let words: Vec<&str> = line.split(' ').collect();
            let id_of = |w: &str| -> u64 { w.parse().unwrap_or_else(|_| malformed(n, line)) };
            if words[0] == "run" {
                log.runs.push(Run {
                    name: line.to_string(),
                    turns: Vec::new(),
                });
                continue;
            }
            let r = log
                .runs
                .len()
                .checked_sub(1)
                .unwrap_or_else(|| malformed(n, line));
            match (words[0], words.len()) {
                ("pushing", 3) => {
                    let (session, id) = (words[1].to_string(), id_of(words[2]));
                    if let Some(first) = log.pushed.insert(id, (session.clone(), r)) {
                        panic!(
                            "item id {id} pushed twice: first {first:?}, then by {session} in {}: \
                             ids must be unique across runs",
                            log.runs[r].name
                        );
                    }
                }
                ("acked", 3) => {
                    let (session, id) = (words[1], id_of(words[2]));
                    match log.pushed.get(&id) {
                        Some((s, pr)) if s == session && *pr == r => {}
                        other => panic!(
                            "acked {session} {id} in {} without its pushing line in that run \
                             ({other:?})",
                            log.runs[r].name
                        ),
                    }
                    log.acked.insert(id);
                }
                ("turn", 2..) => {
                    let ids = words[1..].iter().map(|w| id_of(w)).collect();
                    log.runs[r].turns.push(ids);
                }
                _ => malformed(n, line),
            }
        }
        log
    }

    /// Every id in some turn line.
    fn delivered(&self) -> HashSet<u64> {
        self.runs
            .iter()
            .flat_map(|r| r.turns.iter().flatten().copied())
            .collect()
    }
}

fn malformed<T>(n: usize, line: &str) -> T {
    panic!(
        "item log line {} (torn lines dropped): malformed: {line:?}",
        n + 1
    )
}

/// What the store holds after a kill: every record decodes; no item is in two records.
struct Stored {
    /// Records `Running` or `Interrupted` (what the next run resumes).
    resumable: usize,
    /// Of those, `Running` ones: their process died (the next run recovers them).
    crashed: usize,
    /// Item ids on record (unhandled and interrupted).
    items: HashSet<u64>,
}

/// The first line of a run that resumes what `stored` holds.
fn resumed_line_for(stored: &Stored) -> String {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    format!(
        "agentloop: resumed {} session{} carrying {} item{} ({} interrupted by a shutdown, {} recovered after their process died)",
        stored.resumable,
        plural(stored.resumable),
        stored.items.len(),
        plural(stored.items.len()),
        stored.resumable - stored.crashed,
        stored.crashed,
    )
}

fn check_store(data: &Path, when: &str) -> Stored {
    // The engine that wrote the directory (a kill during the first start may leave
    // none: nothing is stored then).
    let Some(engine) = Backend::detect(data) else {
        return Stored {
            resumable: 0,
            crashed: 0,
            items: HashSet::new(),
        };
    };
    let backend = Backend::open(data, engine).expect("the data directory opens");
    let mut stored = Stored {
        resumable: 0,
        crashed: 0,
        items: HashSet::new(),
    };
    for entry in backend.list(None).expect("list the records") {
        let rec = match entry
            .record
            .and_then(|r| r.decode::<SimItem>())
            .map(|r| r.into_record())
        {
            Ok(r) => r,
            Err(e) => panic!("{when}: record {} does not decode: {e}", entry.session_id),
        };
        match rec.status {
            SessionStatus::Running => {
                stored.resumable += 1;
                stored.crashed += 1;
            }
            SessionStatus::Interrupted => stored.resumable += 1,
            other => panic!(
                "{when}: record {} is {other:?}; the main job leaves only resumable records",
                rec.session_id
            ),
        }
        for item in rec.unhandled_items.iter().chain(&rec.interrupted_items) {
            assert!(
                stored.items.insert(item.id),
                "{when}: item {} is on record twice (second time in {})",
                item.id,
                rec.session_id
            );
        }
    }
    stored
}

#[test]
fn sigkill_loop_loses_no_acknowledged_item_and_no_record_breaks() {
    crash_loop("sled");
}

/// Issue 15: the same loop on fjall at the `crash` level (a group commit is written to
/// the operating system before it is acknowledged, so a SIGKILL loses none).
#[test]
fn sigkill_loop_on_fjall_loses_no_acknowledged_item_and_no_record_breaks() {
    crash_loop("fjall");
}

fn crash_loop(engine: &str) {
    let began = Instant::now();
    let seed0 = std::env::var("AGENTLOOP_CRASH_SEED")
        .ok()
        .map(|s| {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            }
            .expect("AGENTLOOP_CRASH_SEED is a number (decimal or 0x-hex)")
        })
        .unwrap_or(DEFAULT_SEED);
    eprintln!(
        "crash loop on {engine}: seed {seed0:#x} (AGENTLOOP_CRASH_SEED={seed0:#x} replays it)"
    );
    let mut seed = seed0;

    let dir = TempDir::new(&format!("crash-loop-{engine}"));
    let root = dir.0.clone();
    let data = root.join("data");
    let config = root.join("agentloop.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nflush = \"sync\"\nengine = \"{engine}\"\n\n[supervisor]\nheartbeat = \"50ms\"\nlease_timeout = \"200ms\"\n"
        ),
    )
    .unwrap();
    let log_path = root.join("items.log");
    let (config_arg, log_arg) = (
        config.to_str().unwrap().to_string(),
        log_path.to_str().unwrap().to_string(),
    );
    let common_args = ["--config", &config_arg, "--item-log", &log_arg];

    let mut kills_in_startup = 0; // before "ready:"
    let mut kills_after_resume = 0; // after "ready:" of a run that resumed sessions
    let mut resumed_total = 0;
    let mut stored = Stored {
        resumable: 0,
        crashed: 0,
        items: HashSet::new(),
    };
    let mut ever_on_record: HashSet<u64> = HashSet::new();
    for n in 0..ITERATIONS {
        mark(&log_path, &format!("run {n}"));
        let stderr = std::fs::File::create(root.join(format!("stderr-{n}.log"))).unwrap();
        let mut args = common_args.to_vec();
        args.extend([
            "--sessions",
            "3",
            "--items-per-session",
            "1000",
            "--push-ms",
            "2",
            "--rounds",
            "2",
            "--model-ms",
            "2",
            "--tool-ms",
            "1",
        ]);
        let job = Job::start_with_stderr(&root, &args, stderr);
        // 40–400 ms: the short end lands in the start (sled open, resume), the rest in
        // the middle of pushes, safe-point writes and turn ends.
        let delay = Duration::from_millis(40 + next(&mut seed) % 361);
        std::thread::sleep(delay);
        let (status, out) = job.kill();
        let stderr = std::fs::read_to_string(root.join(format!("stderr-{n}.log"))).unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "run {n}: it must die by the SIGKILL ({status:?}); stdout:\n{out}\nstderr:\n{stderr}"
        );
        // What the run resumed is what the previous kill left (when it got that far).
        let resumed_line = out.lines().find(|l| l.starts_with("agentloop: resumed "));
        if let Some(line) = resumed_line {
            assert_eq!(
                line,
                resumed_line_for(&stored),
                "run {n} resumes every record the previous kill left"
            );
        }
        let resumed = resumed_line.map_or(0, |_| stored.resumable);
        // No session failed: a resumed one that refused its record (S19) logs an error.
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
        assert!(
            errors.is_empty(),
            "run {n}: errors in the log:\n{}",
            errors.join("\n")
        );
        let ready = out.lines().any(|l| l.starts_with("agentloop: ready:"));
        if !ready {
            kills_in_startup += 1;
        } else if resumed > 0 {
            kills_after_resume += 1;
        }
        resumed_total += resumed;
        assert!(
            !out.contains("not resumed"),
            "run {n}: every record of a dead run is resumable after the lease:\n{out}"
        );

        // After the kill: every record decodes, and every acknowledged item is
        // delivered or on record (S16a).
        let when = format!("after kill {n} at {delay:?}");
        stored = check_store(&data, &when);
        ever_on_record.extend(&stored.items);
        let log = Log::read(&log_path);
        let delivered = log.delivered();
        let lost: Vec<u64> = log
            .acked
            .iter()
            .filter(|id| !delivered.contains(id) && !stored.items.contains(id))
            .copied()
            .collect();
        assert!(
            lost.is_empty(),
            "{when}: {} acknowledged items are neither delivered nor on record: {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        );
        // Let the dead run's lease expire, so the next run resumes its sessions.
        std::thread::sleep(LEASE + Duration::from_millis(100));
    }

    // The last run resumes everything and finishes by itself.
    mark(&log_path, "run final");
    let stderr = std::fs::File::create(root.join("stderr-final.log")).unwrap();
    let mut args = common_args.to_vec();
    args.extend(["--sessions", "0"]);
    let mut job = Job::start_with_stderr(&root, &args, stderr);
    let line = job.wait_for("agentloop: resumed");
    assert_eq!(
        line,
        resumed_line_for(&stored),
        "the last run resumes every record the last kill left"
    );
    let (status, out) = job.finish();
    let stderr = std::fs::read_to_string(root.join("stderr-final.log")).unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "the last run exits 0:\n{out}\nstderr:\n{stderr}"
    );
    assert!(
        out.contains("every session delivered its items"),
        "the last run ends by itself:\n{out}"
    );
    assert!(
        !stderr.contains("ERROR"),
        "errors in the last run's log:\n{stderr}"
    );
    let end = check_store(&data, "after the last run");
    assert_eq!(
        (end.resumable, end.items.len()),
        (0, 0),
        "the last run leaves no record"
    );

    // The invariant over the whole log.
    let log = Log::read(&log_path);
    assert_eq!(log.runs.len(), ITERATIONS + 1);
    let last = log.runs.len() - 1;
    // Per id, the runs that delivered it, in order.
    let mut deliveries: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (r, run) in log.runs.iter().enumerate() {
        let mut seen = HashSet::new();
        for ids in &run.turns {
            for &id in ids {
                // (c) and (e): exactly once within one process lifetime.
                assert!(
                    seen.insert(id),
                    "item {id} delivered twice within {}",
                    run.name
                );
                deliveries.entry(id).or_default().push(r);
            }
        }
    }
    // (b) nothing invented.
    for id in deliveries.keys().chain(&ever_on_record) {
        assert!(
            log.pushed.contains_key(id),
            "item {id} was delivered or on record but never pushed"
        );
    }
    // (a) nothing acknowledged lost (nothing is on record any more).
    let lost: Vec<u64> = log
        .acked
        .iter()
        .filter(|id| !deliveries.contains_key(id))
        .copied()
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged items were never delivered: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    // (d) duplicates only across a kill, only for a tail of a session's turns there.
    let redelivered: BTreeSet<(u64, usize)> = deliveries
        .iter()
        .flat_map(|(&id, runs)| runs[..runs.len() - 1].iter().map(move |&r| (id, r)))
        .collect();
    for &(id, r) in &redelivered {
        assert!(
            r != last,
            "item {id} was delivered by the clean last run and again later"
        );
    }
    let mut redelivered_turns = 0;
    for (r, run) in log.runs.iter().enumerate() {
        // The session's turns in this run, in order.
        let mut by_session: BTreeMap<&str, Vec<&Vec<u64>>> = BTreeMap::new();
        for ids in &run.turns {
            let session = &log.pushed[&ids[0]].0;
            for id in ids {
                assert_eq!(
                    &log.pushed[id].0, session,
                    "a turn in {} holds items of two sessions: {ids:?}",
                    run.name
                );
            }
            by_session.entry(session).or_default().push(ids);
        }
        for (session, turns) in by_session {
            let Some(first) = turns
                .iter()
                .position(|ids| ids.iter().any(|id| redelivered.contains(&(*id, r))))
            else {
                continue;
            };
            redelivered_turns += turns.len() - first;
            for ids in &turns[first..] {
                for id in ids.iter() {
                    assert!(
                        !log.acked.contains(id) || redelivered.contains(&(*id, r)),
                        "{}: session {session}: item {id} (acknowledged) of a turn after a \
                         redelivered one was not redelivered: the turn ends reached the store \
                         out of order",
                        run.name
                    );
                }
            }
        }
    }

    let acked = log.acked.len();
    let delivered = deliveries.len();
    let duplicates = deliveries.values().filter(|runs| runs.len() > 1).count();
    let elapsed = began.elapsed();
    eprintln!(
        "crash loop: {ITERATIONS} kills ({kills_in_startup} in startup, {kills_after_resume} after a resume; {resumed_total} sessions resumed), {acked} acked, {delivered} delivered, {duplicates} duplicates (across a kill; {redelivered_turns} turns), {} torn log lines, {} resumed by the last run, in {elapsed:.1?} (seed {seed0:#x})",
        log.torn, stored.resumable
    );
    assert!(
        acked > 500,
        "too little was acknowledged to mean anything: {acked}"
    );
    assert!(
        kills_after_resume >= 5,
        "too few kills landed after a resume: {kills_after_resume}"
    );
    assert!(
        elapsed < Duration::from_secs(150),
        "keep the crash loop near two minutes: {elapsed:?}"
    );
}
