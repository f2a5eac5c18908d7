//! Shared code of the agentloop fuzz targets (see `docs/fuzzing.md`).
//!
//! * [`check_bytes`] is the whole `decode_record` target: it feeds one input to
//!   `decode_record::<SimItem>` and to `decode_state::<SimState>` and asserts the S15/S32
//!   properties (errors are `Corrupt` naming the session; whatever decodes re-encodes and
//!   decodes back to the same value, and the encoding is stable after one round).
//! * [`seeds`] builds the seed corpus (valid records and states); the `gen_seeds` example
//!   writes it to `seeds/decode_record/`.
//!
//! Keeping the properties here (not in the `fuzz_targets/` file) lets `cargo test` in
//! this crate replay the seeds and any saved crash input on a stable toolchain.

use agentloop::store::codec::{
    decode_record, decode_state, encode_record, encode_state, STATE_LIMIT,
};
use agentloop::{SessionRecord, SessionStatus, StoreError};
use agentloop_sim::{SimItem, SimState};

/// The key every input is decoded under. The seeds are records of this session, so the
/// fuzzer starts from records that pass the "stored under the right key" check and
/// mutating the id explores the mismatch path.
pub const SESSION: &str = "fuzz-session";

/// Asserts that `err` is the S15 corrupt-record error for [`SESSION`].
fn assert_corrupt(err: &StoreError, what: &str) {
    match err {
        StoreError::Corrupt { session, reason } => {
            assert_eq!(session, SESSION, "{what}: Corrupt names the wrong session");
            assert!(!reason.is_empty(), "{what}: Corrupt without a reason");
            // The message is what operators see; building it must not panic either.
            let _ = err.to_string();
        }
        other => panic!("{what}: a bad input must be StoreError::Corrupt, got {other:?}"),
    }
}

/// The record property: decode; on success re-encode, decode again, compare.
pub fn check_record(data: &[u8]) {
    let rec = match decode_record::<SimItem>(SESSION, data) {
        Ok(rec) => rec,
        Err(e) => return assert_corrupt(&e, "decode_record"),
    };
    assert_eq!(
        rec.session_id, SESSION,
        "decoded a record of another session"
    );
    let again = match encode_record(&rec) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a record that decoded does not re-encode: {e}"),
    };
    // Canonical encoding is never longer than any encoding the decoder accepts, so a
    // record that was readable is always writable again (no S18 dead end).
    assert!(
        again.len() <= data.len(),
        "re-encoding grew the record from {} to {} bytes",
        data.len(),
        again.len()
    );
    let back = match decode_record::<SimItem>(SESSION, &again) {
        Ok(back) => back,
        Err(e) => panic!("a re-encoded record does not decode: {e}"),
    };
    assert_eq!(back, rec, "record round trip changed the record");
    let third = encode_record(&back).expect("encoded once, encodes again");
    assert_eq!(third, again, "encoding is not stable after one round trip");

    // The cut turn's state is itself an encoded value (S15): check it the same way.
    if let Some(state) = &rec.state {
        check_state(state);
    }
}

/// The state property: decode as the simulated agent's state; on success round-trip.
pub fn check_state(data: &[u8]) {
    let st = match decode_state::<SimState>(SESSION, data) {
        Ok(st) => st,
        Err(e) => return assert_corrupt(&e, "decode_state"),
    };
    let again = match encode_state(SESSION, &st) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a state that decoded does not re-encode: {e}"),
    };
    assert!(
        again.len() <= data.len(),
        "re-encoding grew the state from {} to {} bytes",
        data.len(),
        again.len()
    );
    assert!(again.len() <= STATE_LIMIT);
    let back: SimState = match decode_state(SESSION, &again) {
        Ok(back) => back,
        Err(e) => panic!("a re-encoded state does not decode: {e}"),
    };
    assert_eq!(back, st, "state round trip changed the state");
}

/// One fuzz input: checked as a record envelope and as a bare agent state.
pub fn check_bytes(data: &[u8]) {
    check_record(data);
    check_state(data);
}

fn items(ids: std::ops::Range<u64>, text: &str) -> Vec<SimItem> {
    ids.map(|id| SimItem::new(id, format!("{text}{id}")))
        .collect()
}

fn record(status: SessionStatus, turn_index: u64) -> SessionRecord<SimItem> {
    // Fixed times, so regenerating the seeds gives the same bytes.
    let mut rec = SessionRecord::new(SESSION, "sim", turn_index);
    rec.status = status;
    rec.heartbeat_ms = 1_795_000_000_000;
    rec.created_at_ms = 1_794_000_000_000;
    rec.updated_at_ms = 1_795_000_000_000;
    rec.version = turn_index.wrapping_add(1);
    rec
}

fn sim_state(turn: u64, items: Vec<u64>, steps_done: usize, payload: usize) -> SimState {
    SimState {
        turn,
        items,
        steps_done,
        payload: (0..payload).map(|i| (i % 251) as u8).collect(),
    }
}

/// The seed corpus: `(file name, bytes)`. Records cover every status, empty and full
/// backlogs, mid-turn state, stop cause and last error, owner and agent config, and
/// integers at the varint size boundaries; two bare states seed `decode_state`.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut recs: Vec<(&str, SessionRecord<SimItem>)> = Vec::new();

    recs.push(("empty-stopped", record(SessionStatus::Stopped, 0)));

    let mut r = record(SessionStatus::Running, 3);
    r.owner = Some("instance-a1".into());
    r.agent_config = b"{\"script\":\"model,tools:2\"}".to_vec();
    r.unhandled_items = items(10..13, "queued ");
    recs.push(("running-owner-unhandled", r));

    let mut r = record(SessionStatus::Stopped, 7);
    r.unhandled_items = items(20..24, "later ");
    r.stop_cause = Some("user asked to pause".into());
    recs.push(("stopped-unhandled-stop-cause", r));

    let mut r = record(SessionStatus::Interrupted, 5);
    r.interrupted_items = items(30..32, "cut ");
    r.unhandled_items = items(32..35, "waiting ");
    let st = sim_state(5, vec![30, 31], 2, 24);
    r.state = Some(encode_state(SESSION, &st).expect("seed state encodes"));
    r.stop_cause = Some("shutdown".into());
    recs.push(("interrupted-mid-turn-state", r));

    let mut r = record(SessionStatus::Interrupted, 9);
    r.interrupted_items = items(40..41, "");
    recs.push(("interrupted-items-no-state", r));

    let mut r = record(SessionStatus::Completed, 12);
    r.stop_cause = Some("done".into());
    recs.push(("completed-stop-cause", r));

    let mut r = record(SessionStatus::Canceled, 4);
    r.unhandled_items = items(50..52, "dropped ");
    r.stop_cause = Some("canceled by operator".into());
    recs.push(("canceled-unhandled", r));

    let mut r = record(
        SessionStatus::Failed("tool `search` failed 3 times".into()),
        6,
    );
    r.last_error = Some("agent error: tool `search`: timeout after 30s".into());
    r.interrupted_items = items(60..61, "bad ");
    recs.push(("failed-last-error", r));

    // Integers at the bincode varint boundaries (250/251, u16, u32, u64) and
    // multi-byte UTF-8 text.
    let mut r = record(SessionStatus::Running, u64::MAX);
    r.owner = Some("ïnstance-ß-😀".into());
    r.heartbeat_ms = 250;
    r.created_at_ms = 251;
    r.updated_at_ms = u64::from(u32::MAX) + 1;
    r.version = u64::from(u16::MAX);
    r.unhandled_items = vec![
        SimItem::new(0, ""),
        SimItem::new(250, "é"),
        SimItem::new(251, "日本語"),
        SimItem::new(u64::MAX, "\u{0}\u{7f}"),
    ];
    r.state = Some(Vec::new());
    r.stop_cause = Some(String::new());
    r.last_error = Some(String::new());
    recs.push(("varint-boundaries-unicode", r));

    let mut r = record(SessionStatus::Interrupted, 42);
    r.interrupted_items = items(100..108, "batch item ");
    r.unhandled_items = items(108..140, "backlog ");
    let st = sim_state(42, (100..108).collect(), 3, 1024);
    r.state = Some(encode_state(SESSION, &st).expect("seed state encodes"));
    recs.push(("interrupted-large-state", r));

    let mut out: Vec<(String, Vec<u8>)> = recs
        .into_iter()
        .enumerate()
        .map(|(i, (name, rec))| {
            let bytes = encode_record(&rec).expect("seed record encodes");
            (format!("record-{:02}-{name}", i + 1), bytes)
        })
        .collect();
    for (name, st) in [
        ("state-01-first-step", sim_state(0, vec![], 0, 0)),
        ("state-02-mid-turn", sim_state(7, vec![1, 2, 300], 4, 16)),
    ] {
        out.push((
            name.to_string(),
            encode_state(SESSION, &st).expect("seed state encodes"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed passes the target's properties, and every record seed decodes.
    #[test]
    fn seeds_pass_the_properties() {
        for (name, bytes) in seeds() {
            check_bytes(&bytes);
            if name.starts_with("record-") {
                decode_record::<SimItem>(SESSION, &bytes).expect(&name);
            } else {
                decode_state::<SimState>(SESSION, &bytes).expect(&name);
            }
        }
    }

    /// The committed seed files are what `gen_seeds` writes today.
    #[test]
    fn committed_seeds_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/decode_record");
        for (name, bytes) in seeds() {
            let on_disk = std::fs::read(dir.join(&name))
                .unwrap_or_else(|e| panic!("{name}: {e}; run `cargo run --example gen_seeds`"));
            assert_eq!(
                on_disk, bytes,
                "{name} is stale; run `cargo run --example gen_seeds`"
            );
        }
    }

    /// Replays every file in `artifacts/decode_record/` (crash inputs libFuzzer saved),
    /// if any, so a fix can be checked without the nightly toolchain.
    #[test]
    fn saved_artifacts_pass() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/decode_record");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                check_bytes(&bytes);
            }
        }
    }
}
