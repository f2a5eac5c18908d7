//! Shared code of the agentloop fuzz targets (see `docs/fuzzing.md`).
//!
//! * [`check_bytes`] is the whole `decode_record` target: one input is read as a
//!   stored record in format 2 (its entries framed as below), as a bare header envelope,
//!   as a bare item payload (typed, and untyped as JSON) and as a bare agent state, and
//!   the S15/S15a/S32 properties are asserted: every error is `Corrupt` naming the
//!   session (or, for a bare payload, a `PayloadError`); whatever decodes encodes again,
//!   decodes back to the same value, and encodes the same way a second time.
//! * [`seeds`] builds the seed corpus (valid records, headers, items and states); the
//!   `gen_seeds` example writes it to `seeds/decode_record/`.
//!
//! Framing of a record (the fuzzer mutates it like any bytes): a sequence of entries,
//! each `kind: u8 | length: u16 LE | bytes`, kind 0 the header envelope, 1 an item entry
//! whose first 8 bytes are its entry number (big-endian) followed by the item payload,
//! 2 the state. A frame cut short ends the sequence.
//!
//! Keeping the properties here (not in the `fuzz_targets/` file) lets `cargo test` in
//! this crate replay the seeds and any saved crash input on a stable toolchain.

use agentloop::store::codec::{decode_header, decode_state, encode_header, encode_state, payload};
use agentloop::store::{ItemChange, Payload, StateChange, Stored, WriteCondition};
use agentloop::{store::SessionRecord, store::SessionStatus, StoreError};
use agentloop_core::table::{self, header_key, item_key, state_key};
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

/// Splits a framed record into its stored entries (keys as the store writes them).
pub fn unframe(data: &[u8]) -> Vec<(Vec<u8>, Payload)> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 3 {
        let kind = rest[0];
        let len = u16::from_le_bytes([rest[1], rest[2]]) as usize;
        let Some(body) = rest.get(3..3 + len) else {
            break;
        };
        rest = &rest[3 + len..];
        match kind % 3 {
            0 => out.push((header_key(SESSION), Payload::from(body))),
            1 if body.len() >= 8 => {
                let mut seq = [0u8; 8];
                seq.copy_from_slice(&body[..8]);
                out.push((
                    item_key(SESSION, u64::from_be_bytes(seq)),
                    Payload::from(&body[8..]),
                ));
            }
            1 => {}
            _ => out.push((state_key(SESSION), Payload::from(body))),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// Frames a whole record as the store would write it.
pub fn frame(rec: &SessionRecord<SimItem>) -> Vec<u8> {
    let w = rec
        .to_write(WriteCondition::Always)
        .expect("a seed record encodes");
    let mut out = Vec::new();
    let mut put = |kind: u8, body: &[u8]| {
        out.push(kind);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(body);
    };
    put(0, &encode_header(&w.header).expect("a seed header encodes"));
    for c in &w.items {
        if let ItemChange::Put(seq, bytes) = c {
            let mut body = seq.to_be_bytes().to_vec();
            body.extend_from_slice(bytes);
            put(1, &body);
        }
    }
    if let StateChange::Put(bytes) = &w.state {
        put(2, bytes);
    }
    out
}

/// The record property: assemble and decode the entries; on success the record is
/// written again (re-numbered, re-encoded), read back equal, and written the same way
/// twice.
pub fn check_record(data: &[u8]) {
    let assembled = match table::assemble(SESSION, unframe(data)) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => return assert_corrupt(&e, "assemble"),
    };
    let rec = match Stored::Current(assembled).decode::<SimItem>() {
        Ok(loaded) => loaded.into_record(),
        Err(e) => return assert_corrupt(&e, "decode"),
    };
    assert_eq!(
        rec.session_id, SESSION,
        "decoded a record of another session"
    );
    let again = frame(&rec);
    let back = match table::assemble(SESSION, unframe(&again)) {
        Ok(Some(r)) => Stored::Current(r)
            .decode::<SimItem>()
            .unwrap_or_else(|e| panic!("a re-written record does not decode: {e}"))
            .into_record(),
        other => panic!("a re-written record does not assemble: {other:?}"),
    };
    assert_eq!(back, rec, "record round trip changed the record");
    assert_eq!(
        frame(&back),
        again,
        "writing is not stable after one round trip"
    );
    // The cut turn's state is itself an encoded value (S15): check it the same way.
    if let Some(state) = &rec.state {
        check_state(state);
    }
}

/// The header property: decode; on success re-encode, decode again, compare.
pub fn check_header(data: &[u8]) {
    let h = match decode_header(SESSION, data) {
        Ok(h) => h,
        Err(e) => return assert_corrupt(&e, "decode_header"),
    };
    let again = encode_header(&h).expect("a header that decoded encodes again");
    let back = decode_header(SESSION, &again).expect("a re-encoded header decodes");
    assert_eq!(back, h, "header round trip changed the header");
    assert_eq!(
        encode_header(&back).unwrap(),
        again,
        "header encoding is not stable"
    );
}

/// The item property: a payload decodes as a `SimItem` or fails with a
/// `PayloadError`; any payload reads as JSON or fails the same way; a decoded item
/// round-trips.
pub fn check_item(data: &[u8]) {
    let _ = payload::to_json(data).map(|j| j.to_string());
    let item: SimItem = match payload::decode(data) {
        Ok(i) => i,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let again = payload::encode_checked(&item).expect("a decoded item is storable");
    let back: SimItem = payload::decode(&again).expect("a re-encoded item decodes");
    assert_eq!(back, item, "item round trip changed the item");
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
    let back: SimState = match decode_state(SESSION, &again) {
        Ok(back) => back,
        Err(e) => panic!("a re-encoded state does not decode: {e}"),
    };
    assert_eq!(back, st, "state round trip changed the state");
    assert_eq!(
        encode_state(SESSION, &back).unwrap(),
        again,
        "state encoding is not stable"
    );
}

/// One fuzz input: checked as a framed record, a header, an item and a state.
pub fn check_bytes(data: &[u8]) {
    check_record(data);
    check_header(data);
    check_item(data);
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

    // Integers at the MessagePack size steps (127/128, 255/256, u16, u32, u64) and
    // multi-byte UTF-8 text.
    let mut r = record(SessionStatus::Running, u64::MAX);
    r.owner = Some("ïnstance-ß-😀".into());
    r.heartbeat_ms = 127;
    r.created_at_ms = 128;
    r.updated_at_ms = u64::from(u32::MAX) + 1;
    r.version = u64::from(u16::MAX);
    r.unhandled_items = vec![
        SimItem::new(0, ""),
        SimItem::new(255, "é"),
        SimItem::new(256, "日本語"),
        SimItem::new(u64::MAX, "\u{0}\u{7f}"),
    ];
    r.stop_cause = Some(String::new());
    r.last_error = Some(String::new());
    recs.push(("varint-boundaries-unicode", r));

    let mut r = record(SessionStatus::Interrupted, 42);
    r.interrupted_items = items(100..108, "batch item ");
    r.unhandled_items = items(108..140, "backlog ");
    let st = sim_state(42, (100..108).collect(), 3, 1024);
    r.state = Some(encode_state(SESSION, &st).expect("seed state encodes"));
    recs.push(("interrupted-large-state", r));

    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, (name, rec)) in recs.into_iter().enumerate() {
        out.push((format!("record-{:02}-{name}", i + 1), frame(&rec)));
        if i % 3 == 0 {
            let w = rec
                .to_write(WriteCondition::Always)
                .expect("seed record encodes");
            out.push((
                format!("header-{:02}-{name}", i + 1),
                encode_header(&w.header).expect("seed header encodes"),
            ));
        }
    }
    for (name, item) in [
        ("item-01-plain", SimItem::new(7, "hello")),
        ("item-02-unicode", SimItem::new(u64::MAX, "日本語 😀")),
    ] {
        out.push((name.to_string(), payload::encode_checked(&item).unwrap()));
    }
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

    /// Every seed passes the target's properties, and decodes as what it is.
    #[test]
    fn seeds_pass_the_properties() {
        for (name, bytes) in seeds() {
            check_bytes(&bytes);
            if name.starts_with("record-") {
                let r = table::assemble(SESSION, unframe(&bytes))
                    .expect(&name)
                    .expect(&name);
                Stored::Current(r).decode::<SimItem>().expect(&name);
            } else if name.starts_with("header-") {
                decode_header(SESSION, &bytes).expect(&name);
            } else if name.starts_with("item-") {
                payload::decode::<SimItem>(&bytes).expect(&name);
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
