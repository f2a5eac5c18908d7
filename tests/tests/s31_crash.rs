//! S31: a child process running `sync` sessions is killed with SIGKILL at random
//! moments; after every kill each record decodes, and in the end every acknowledged
//! item has been delivered by an acknowledged completed turn: nothing acknowledged is
//! lost. (Deliveries may repeat: a turn that completed but whose end was not yet on
//! record when the process died runs again after the restart.)

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentloop::store::{Backend, Engine, StoreDurability};
use agentloop_sim::SimItem;
use agentloop_tests::TempDir;

const KILLS: u64 = 20;

struct Acks {
    pushed: BTreeSet<u64>,
    delivered: BTreeSet<u64>,
    lines: usize,
}

fn read_acks(out: impl std::io::Read, acks: &mut Acks) -> bool {
    let mut ready = false;
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        match words.next() {
            Some("push") => {
                let id = words
                    .nth(1)
                    .and_then(|w| w.parse().ok())
                    .expect("push line");
                acks.pushed.insert(id);
            }
            Some("turn") => {
                acks.delivered
                    .extend(words.skip(1).map(|w| w.parse::<u64>().expect("turn line")));
            }
            Some("ready") => ready = true,
            _ => {}
        }
        acks.lines += 1;
    }
    ready
}

/// A small deterministic generator, so a failure is reproducible.
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn s31_sigkill_at_random_moments_loses_no_acknowledged_item() {
    s31_on(Engine::Sled(StoreDurability::Crash));
}

/// Issue 15: the same on fjall at the `crash` level.
#[test]
fn s31_on_fjall_sigkill_at_random_moments_loses_no_acknowledged_item() {
    s31_on(Engine::Fjall(StoreDurability::Crash));
}

/// The child's engine flag.
fn engine_args(engine: Engine) -> &'static [&'static str] {
    match engine {
        Engine::Sled(_) => &[],
        Engine::Fjall(_) => &["--fjall"],
    }
}

fn s31_on(engine: Engine) {
    let started = Instant::now();
    let dir = TempDir::new("s31");
    let bin = env!("CARGO_BIN_EXE_crash_child");
    let mut acks = Acks {
        pushed: BTreeSet::new(),
        delivered: BTreeSet::new(),
        lines: 0,
    };
    let mut seed = 0x5eed_u64;
    for run in 0..KILLS {
        let mut child = Command::new(bin)
            .arg(dir.path())
            .arg(run.to_string())
            .args(engine_args(engine))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the child");
        let out = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut local = Acks {
                pushed: BTreeSet::new(),
                delivered: BTreeSet::new(),
                lines: 0,
            };
            let ready = read_acks(out, &mut local);
            (ready, local)
        });
        // Kill at a random moment: 30–330 ms into the run (startup and resume included).
        std::thread::sleep(Duration::from_millis(30 + next(&mut seed) % 300));
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reap");
        assert!(
            !status.success(),
            "run {run}: the child must die by the signal"
        );
        let (_ready, local) = reader.join().expect("reader");
        acks.pushed.extend(local.pushed);
        acks.delivered.extend(local.delivered);
        acks.lines += local.lines;

        // Every record decodes after the kill.
        // A kill before the first open leaves no database yet.
        if Backend::detect(dir.path()).is_none() {
            std::thread::sleep(Duration::from_millis(250));
            continue;
        }
        let backend = Backend::open(dir.path(), engine).expect("the data directory opens");
        for entry in backend.list(None).expect("list") {
            if let Err(e) = entry.record.and_then(|r| r.decode::<SimItem>()) {
                panic!(
                    "run {run}: record {} does not decode: {e}",
                    entry.session_id
                );
            }
        }
        drop(backend);
        // Let the dead instance's lease (200 ms) expire before the next run resumes.
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        acks.pushed.len() > 50,
        "the runs acknowledged too little to test anything: {} pushes",
        acks.pushed.len()
    );

    // A last run resumes every session and drains it.
    let out = Command::new(bin)
        .arg(dir.path())
        .arg(KILLS.to_string())
        .arg("--drain")
        .args(engine_args(engine))
        .stderr(Stdio::inherit())
        .output()
        .expect("run the drain");
    assert!(
        out.status.success(),
        "the drain run failed: {:?}",
        out.status
    );
    let mut last = Acks {
        pushed: BTreeSet::new(),
        delivered: BTreeSet::new(),
        lines: 0,
    };
    read_acks(&out.stdout[..], &mut last);
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));
    acks.delivered.extend(last.delivered);

    let lost: Vec<u64> = acks.pushed.difference(&acks.delivered).copied().collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged items were never delivered (first: {:?}); {} acked, {} delivered",
        lost.len(),
        &lost[..lost.len().min(10)],
        acks.pushed.len(),
        acks.delivered.len()
    );
    // Nothing is left behind: the drain deleted every record.
    let backend = Backend::open(dir.path(), engine).expect("open");
    assert!(backend.list(None).unwrap().is_empty());
    eprintln!(
        "S31 on {}: {KILLS} kills, {} acknowledged pushes, all delivered, in {:.1?}",
        engine.name(),
        acks.pushed.len(),
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "keep it under two minutes"
    );
}
