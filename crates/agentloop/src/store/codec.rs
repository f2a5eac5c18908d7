//! Encoding of records and agent state (DESIGN S15). The only module that uses bincode.
//!
//! bincode `=2.0.1` is unmaintained (RUSTSEC-2025-0141) and pinned; keeping it behind
//! these functions means the format can be migrated in one place. A stored record is an
//! envelope:
//!
//! ```text
//! magic "ALCK" (4 bytes) | format version (u16 LE) | payload length (u32 LE) | payload
//! ```
//!
//! where the payload is the bincode (serde, standard config) encoding of the record.
//! Decoding checks the magic, the version and the length before touching the payload,
//! always runs with a size limit, and never panics: bad bytes become
//! `StoreError::Corrupt` naming the session and what is wrong.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::{SessionRecord, StoreError};

/// The first bytes of every stored record.
pub const MAGIC: [u8; 4] = *b"ALCK";
/// The record format this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// The largest record payload decoded, in bytes (64 MiB).
pub const RECORD_LIMIT: usize = 64 << 20;
const HEADER: usize = 4 + 2 + 4;

fn record_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<RECORD_LIMIT>()
}

/// Records whose payload is at most this big always decode within [`RECORD_LIMIT`];
/// bigger ones are decoded once when they are encoded, to prove it.
///
/// Invariant: bincode's decoding limit counts the bytes a value *claims* while it is
/// decoded, not the bytes it was stored in: every integer claims its full width (8
/// bytes for a `u64`, even when its varint took 1), strings and byte strings their
/// length. No stored byte claims more than 16 (a `u128` or `i128` in a 1-byte varint;
/// 8 for a `u64`), so a payload of `RECORD_LIMIT / 16` bytes cannot exceed the limit;
/// beyond that only a trial decode can tell (found while fuzzing the decoder: a 10 MB
/// record of 5 million small items saved, then failed to load as `Corrupt`).
pub const ALWAYS_DECODABLE: usize = RECORD_LIMIT / 16;

/// Encodes a record into its envelope. A record that could not be decoded again
/// (over the decoding limit) is refused here, so it never replaces a good one (S15,
/// S18).
pub fn encode_record<I: Serialize + DeserializeOwned>(
    record: &SessionRecord<I>,
) -> Result<Vec<u8>, StoreError> {
    let payload =
        bincode::serde::encode_to_vec(record, record_config()).map_err(|e| StoreError::Encode {
            session: record.session_id.clone(),
            reason: e.to_string(),
        })?;
    // bincode's limit only bounds decoding: refuse here what could not be read back, so
    // an oversized record never replaces a good one (S18).
    if payload.len() > RECORD_LIMIT {
        return Err(StoreError::Encode {
            session: record.session_id.clone(),
            reason: format!(
                "record is {} bytes; the limit is {RECORD_LIMIT}: keep agent state and item \
                 backlogs smaller",
                payload.len()
            ),
        });
    }
    if payload.len() > ALWAYS_DECODABLE {
        if let Err(e) =
            bincode::serde::decode_from_slice::<SessionRecord<I>, _>(&payload, record_config())
        {
            return Err(StoreError::Encode {
                session: record.session_id.clone(),
                reason: format!(
                    "record is {} bytes but would not decode within the {RECORD_LIMIT}-byte \
                     decoding limit ({e}): keep agent state and item backlogs smaller",
                    payload.len()
                ),
            });
        }
    }
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes a record envelope. `session` names the key the bytes were read under (for
/// the error; the record's own id is checked against it).
pub fn decode_record<I: DeserializeOwned>(
    session: &str,
    bytes: &[u8],
) -> Result<SessionRecord<I>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    if bytes.len() < HEADER {
        return Err(corrupt(format!(
            "record is {} bytes, shorter than its {HEADER}-byte header (truncated)",
            bytes.len()
        )));
    }
    if bytes[..4] != MAGIC {
        return Err(corrupt(format!(
            "bad magic bytes {:02x?} (expected {:02x?}): not an agentloop record",
            &bytes[..4],
            MAGIC
        )));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION {
        // A newer build's record is not garbage: say so before the advice to delete.
        let newer = if version > FORMAT_VERSION {
            " (a newer agentloop wrote it: read it with that version rather than deleting it)"
        } else {
            ""
        };
        return Err(corrupt(format!(
            "unknown format version {version}; this build reads version {FORMAT_VERSION}{newer}"
        )));
    }
    let len = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
    if len > RECORD_LIMIT {
        return Err(corrupt(format!(
            "payload length {len} exceeds the {RECORD_LIMIT}-byte limit"
        )));
    }
    let payload = &bytes[HEADER..];
    if payload.len() != len {
        return Err(corrupt(format!(
            "payload is {} bytes but the header says {len} (truncated or padded)",
            payload.len()
        )));
    }
    let (record, used): (SessionRecord<I>, usize) =
        bincode::serde::decode_from_slice(payload, record_config())
            .map_err(|e| corrupt(format!("payload does not decode: {e}")))?;
    if used != len {
        return Err(corrupt(format!(
            "payload has {} trailing bytes",
            len - used
        )));
    }
    if record.session_id != session {
        return Err(corrupt(format!(
            "record names session `{}` but is stored under `{session}`",
            record.session_id
        )));
    }
    Ok(record)
}

/// The largest agent state decoded, in bytes (64 MiB).
pub const STATE_LIMIT: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<STATE_LIMIT>()
}

/// Encodes an agent state.
pub fn encode_state<S: Serialize>(session: &str, state: &S) -> Result<Vec<u8>, StoreError> {
    bincode::serde::encode_to_vec(state, config()).map_err(|e| StoreError::Encode {
        session: session.to_string(),
        reason: e.to_string(),
    })
}

/// Decodes an agent state; trailing bytes, truncation and garbage are `Corrupt`.
pub fn decode_state<S: DeserializeOwned>(session: &str, bytes: &[u8]) -> Result<S, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| corrupt(format!("agent state does not decode: {e}")))?;
    if used != bytes.len() {
        return Err(corrupt(format!(
            "agent state has {} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SessionStatus;
    use proptest::prelude::*;

    fn status() -> impl Strategy<Value = SessionStatus> {
        prop_oneof![
            Just(SessionStatus::Running),
            Just(SessionStatus::Stopped),
            Just(SessionStatus::Interrupted),
            Just(SessionStatus::Completed),
            Just(SessionStatus::Canceled),
            ".{0,20}".prop_map(SessionStatus::Failed),
        ]
    }

    fn record() -> impl Strategy<Value = SessionRecord<(u64, String)>> {
        let items = || proptest::collection::vec((any::<u64>(), ".{0,12}"), 0..6);
        (
            "[a-z0-9-]{1,20}",
            status(),
            any::<u64>(),
            items(),
            items(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            proptest::option::of(".{0,16}"),
            proptest::option::of("[a-z0-9]{1,8}"),
            (any::<u64>(), any::<u64>(), any::<u64>()),
        )
            .prop_map(
                |(id, status, turn, unhandled, interrupted, state, cause, owner, (t, hb, v))| {
                    SessionRecord {
                        session_id: id,
                        agent_kind: "sim".into(),
                        agent_config: vec![1, 2],
                        status,
                        turn_index: turn,
                        unhandled_items: unhandled,
                        interrupted_items: interrupted,
                        state,
                        stop_cause: cause,
                        last_error: None,
                        owner,
                        heartbeat_ms: hb,
                        created_at_ms: t,
                        updated_at_ms: t,
                        version: v,
                    }
                },
            )
    }

    proptest! {
        /// S15: every record round-trips through the envelope.
        #[test]
        fn s15_record_round_trips(rec in record()) {
            let bytes = encode_record(&rec).unwrap();
            let back: SessionRecord<(u64, String)> = decode_record(&rec.session_id, &bytes).unwrap();
            prop_assert_eq!(back, rec);
        }

        /// S15/S32: every truncation of a valid record is Corrupt, never a panic.
        #[test]
        fn s15_every_truncation_is_corrupt(rec in record()) {
            let bytes = encode_record(&rec).unwrap();
            for cut in 0..bytes.len() {
                let r = decode_record::<(u64, String)>(&rec.session_id, &bytes[..cut]);
                let corrupt = matches!(r, Err(StoreError::Corrupt { .. }));
                prop_assert!(corrupt, "cut {}", cut);
            }
        }

        /// S15/S32: random garbage is Corrupt, never a panic (with or without a valid
        /// header in front of it).
        #[test]
        fn s15_garbage_is_corrupt(mut junk in proptest::collection::vec(any::<u8>(), 0..200), with_header in any::<bool>()) {
            if with_header {
                let mut framed = MAGIC.to_vec();
                framed.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
                framed.extend_from_slice(&(junk.len() as u32).to_le_bytes());
                framed.append(&mut junk);
                junk = framed;
            }
            let r = decode_record::<(u64, String)>("s", &junk);
            prop_assert!(r.is_err());
            let corrupt = matches!(r, Err(StoreError::Corrupt { .. }));
            prop_assert!(corrupt);
        }
    }

    #[test]
    fn s15_unknown_version_names_the_version() {
        let rec = SessionRecord::<u64>::new("v", "sim", 1);
        let mut bytes = encode_record(&rec).unwrap();
        bytes[4..6].copy_from_slice(&7u16.to_le_bytes());
        let e = decode_record::<u64>("v", &bytes).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("unknown format version 7"), "{msg}");
        assert!(msg.contains("`v`"), "names the session: {msg}");
    }

    #[test]
    fn s15_bad_magic_and_huge_length_are_corrupt() {
        let rec = SessionRecord::<u64>::new("m", "sim", 1);
        let mut bytes = encode_record(&rec).unwrap();
        bytes[0] = b'X';
        assert!(decode_record::<u64>("m", &bytes)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut bytes = encode_record(&rec).unwrap();
        bytes[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_record::<u64>("m", &bytes),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn s15_an_oversized_record_is_refused_at_encode() {
        let mut rec = SessionRecord::<u64>::new("big", "sim", 1);
        rec.state = Some(vec![0u8; RECORD_LIMIT + 1]);
        let e = encode_record(&rec).unwrap_err();
        assert!(matches!(e, StoreError::Encode { .. }), "{e}");
    }

    /// Found while fuzzing (docs/fuzzing.md): millions of small items stored in ~10 MB
    /// claim more than the 64 MiB decoding limit (8 bytes per integer). Such a record
    /// used to save and then load as `Corrupt`; it is now refused when encoded, and
    /// whatever `encode_record` returns decodes.
    #[test]
    fn s15_a_record_that_would_not_decode_is_refused_at_encode() {
        let mut rec = SessionRecord::<u64>::new("many", "sim", 1);
        rec.unhandled_items = vec![1u64; 9_000_000]; // 9 MB stored, 72 MB claimed
        let e = encode_record(&rec).unwrap_err();
        match &e {
            StoreError::Encode { session, reason } => {
                assert_eq!(session, "many");
                assert!(reason.contains("would not decode"), "{reason}");
            }
            other => panic!("expected Encode, got {other}"),
        }
        // u128 items claim 16 bytes each: 4.5 MB stored, 72 MB claimed.
        let mut rec = SessionRecord::<u128>::new("wide", "sim", 1);
        rec.unhandled_items = vec![1u128; 4_500_000];
        let e = encode_record(&rec).unwrap_err();
        assert!(matches!(e, StoreError::Encode { .. }), "{e}");
        // Past the always-decodable size but within the limit: written and read back.
        let mut rec = SessionRecord::<u64>::new("big-ok", "sim", 1);
        rec.state = Some(vec![7u8; ALWAYS_DECODABLE + 1]);
        let bytes = encode_record(&rec).expect("decodable, so encodable");
        let back = decode_record::<u64>("big-ok", &bytes).expect("round trip");
        assert_eq!(back.state.map(|s| s.len()), Some(ALWAYS_DECODABLE + 1));
    }

    #[test]
    fn s15_a_record_under_the_wrong_key_is_corrupt() {
        let rec = SessionRecord::<u64>::new("a", "sim", 1);
        let bytes = encode_record(&rec).unwrap();
        assert!(decode_record::<u64>("b", &bytes)
            .unwrap_err()
            .to_string()
            .contains("stored under"));
    }

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct St {
        step: u32,
        notes: Vec<String>,
    }

    #[test]
    fn state_round_trips() {
        let s = St {
            step: 3,
            notes: vec!["a".into(), "bb".into()],
        };
        let bytes = encode_state("s1", &s).unwrap();
        assert_eq!(decode_state::<St>("s1", &bytes).unwrap(), s);
    }

    #[test]
    fn truncated_and_garbage_state_is_corrupt_not_a_panic() {
        let bytes = encode_state(
            "s1",
            &St {
                step: 3,
                notes: vec!["hello".into()],
            },
        )
        .unwrap();
        for cut in 0..bytes.len() {
            let e = decode_state::<St>("s1", &bytes[..cut]).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
        // A huge announced length must hit the limit, not allocate.
        let e = decode_state::<Vec<u8>>(
            "s1",
            &[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        )
        .unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }));
    }
}
