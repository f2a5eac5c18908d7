//! Encoding of what a store holds (DESIGN S15, S15a): the header envelope, item and
//! agent-state payloads, and the reading of format-1 records. The only place that
//! knows byte layouts; the only user of bincode (in `legacy.rs`, to read format 1).
//!
//! A header is stored in an envelope:
//!
//! ```text
//! magic "ALCK" (4 bytes) | format version (u16 LE) | payload length (u32 LE) | payload
//! ```
//!
//! whose payload is the header as MessagePack with fields by name. In format 3 and 4
//! (this build's, [`head`]; 4 adds the journal of durable steps) the envelope is followed by the record's layout and its inline
//! items and state, so a record is usually one key; format 2 has nothing after it, and
//! every item and the state are entries of their own. Items and the agent state are
//! bare MessagePack payloads ([`payload`]); the header's format version covers them. Decoding checks the magic, the version and the length
//! before touching the payload, runs every payload through the structural check of
//! [`check`] (bounded allocation, see there), and never panics: bad bytes become
//! `StoreError::Corrupt` naming the session and what is wrong.

pub mod check;
pub mod head;
pub mod legacy;
pub mod payload;
mod record;
pub use record::{decode_journal, encode_journal_entry};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::header::RecordHeader;
use crate::store_error::StoreError;

pub use payload::{PayloadError, PayloadStage, PAYLOAD_LIMIT};

/// The first bytes of every stored header (and of every format-1 record).
pub const MAGIC: [u8; 4] = *b"ALCK";
/// The newest record format this build writes and reads (format 4: a head with its
/// layout and a journal of durable steps, [`head`]; a record without journal entries is
/// still written in format 3, which this build also reads).
pub const FORMAT_VERSION: u16 = head::FORMAT4;
/// The format before it (a header and one entry per item): read, converted on write.
pub const FORMAT2: u16 = 2;
/// The previous format (one bincode envelope per record): read, converted on write.
pub const FORMAT1: u16 = 1;
/// The largest header payload, in bytes (16 MiB).
pub const HEADER_LIMIT: usize = 16 << 20;
/// The envelope's size: magic, version, length.
pub const ENVELOPE: usize = 4 + 2 + 4;

/// Wraps a payload in the envelope.
fn envelope(version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Checks an envelope and returns its version, its payload and what follows it (only
/// a format-3 head has anything after its payload). `limit` bounds the payload.
pub fn split_envelope<'b>(
    session: &str,
    bytes: &'b [u8],
    limit: usize,
) -> Result<(u16, &'b [u8], &'b [u8]), StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    if bytes.len() < ENVELOPE {
        return Err(corrupt(format!(
            "record header is {} bytes, shorter than its {ENVELOPE}-byte envelope (truncated)",
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
    if version != FORMAT_VERSION
        && version != head::FORMAT3
        && version != FORMAT2
        && version != FORMAT1
    {
        // A newer build's record is not garbage: say so before the advice to delete.
        let newer = if version > FORMAT_VERSION {
            " (a newer agentloop wrote it: read it with that version rather than deleting it)"
        } else {
            ""
        };
        return Err(corrupt(format!(
            "unknown format version {version}; this build reads version {FORMAT_VERSION} \
             and {} (and converts versions {FORMAT2} and {FORMAT1}){newer}",
            head::FORMAT3
        )));
    }
    let len = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
    if len > limit {
        return Err(corrupt(format!(
            "payload length {len} exceeds the {limit}-byte limit"
        )));
    }
    let rest = &bytes[ENVELOPE..];
    if rest.len() < len {
        return Err(corrupt(format!(
            "payload is {} bytes but the envelope says {len} (truncated or padded)",
            rest.len()
        )));
    }
    let (payload, tail) = rest.split_at(len);
    Ok((version, payload, tail))
}

/// Checks an envelope that holds nothing after its payload (format 1 and 2) and returns
/// its version and payload. `limit` bounds the payload.
pub fn open_envelope<'b>(
    session: &str,
    bytes: &'b [u8],
    limit: usize,
) -> Result<(u16, &'b [u8]), StoreError> {
    let (version, payload, tail) = split_envelope(session, bytes, limit)?;
    if !tail.is_empty() && version < head::FORMAT3 {
        return Err(StoreError::Corrupt {
            session: session.to_string(),
            reason: format!(
                "payload is {} bytes but the envelope says {} (truncated or padded)",
                payload.len() + tail.len(),
                payload.len()
            ),
        });
    }
    Ok((version, payload))
}

/// Encodes a header into a format-3 head that holds nothing else (no inline payload,
/// no loose entries): a checkpoint snapshot's header, a record's size.
pub fn encode_header(header: &RecordHeader) -> Result<Vec<u8>, StoreError> {
    head::encode(header, head::Layout::default(), &[], None)
}

/// Encodes a header as format 2 wrote it (for tests and fixtures of records written by
/// earlier builds; this build never stores one).
#[doc(hidden)]
pub fn encode_format2_header(header: &RecordHeader) -> Result<Vec<u8>, StoreError> {
    let payload = payload::encode(header).map_err(|e| StoreError::Encode {
        session: header.session_id.clone(),
        reason: e.to_string(),
    })?;
    Ok(envelope(FORMAT2, &payload))
}

/// Decodes the header of a head (format 3 or 2) stored under `session` (the header's
/// own id must match).
pub fn decode_header(session: &str, bytes: &[u8]) -> Result<RecordHeader, StoreError> {
    head::decode(session, bytes).map(|h| h.header)
}

/// The first bytes of an agent state read from a format-1 record: what follows is
/// bincode, not MessagePack. Unambiguous: one MessagePack value that starts with `A`
/// (the integer 65) is one byte long.
pub const FORMAT1_STATE_MARK: [u8; 4] = *b"ALS1";

/// Encodes an agent state, checked (it must read back, see [`payload::encode_checked`]).
pub fn encode_state<S: Serialize + DeserializeOwned>(
    session: &str,
    state: &S,
) -> Result<Vec<u8>, StoreError> {
    payload::encode_checked(state).map_err(|e| StoreError::Encode {
        session: session.to_string(),
        reason: e.to_string(),
    })
}

/// Decodes an agent state (format 2, or format 1 marked by [`FORMAT1_STATE_MARK`]);
/// truncation, garbage and trailing bytes are `Corrupt`.
pub fn decode_state<S: DeserializeOwned>(session: &str, bytes: &[u8]) -> Result<S, StoreError> {
    if bytes.len() > FORMAT1_STATE_MARK.len() && bytes[..4] == FORMAT1_STATE_MARK {
        return legacy::decode_state(session, &bytes[4..]);
    }
    payload::decode(bytes).map_err(|e| StoreError::Corrupt {
        session: session.to_string(),
        reason: format!("agent state: {e}"),
    })
}

/// Encodes an item, checked (it must read back, see [`payload::encode_checked`]).
pub fn encode_item<I: Serialize + DeserializeOwned>(item: &I) -> Result<Vec<u8>, PayloadError> {
    payload::encode_checked(item)
}

/// Decodes one item stored for `session` (an entry, or an interrupt's answer); garbage
/// is `Corrupt`.
pub fn decode_item<I: DeserializeOwned>(session: &str, bytes: &[u8]) -> Result<I, StoreError> {
    payload::decode(bytes).map_err(|e| StoreError::Corrupt {
        session: session.to_string(),
        reason: format!("item: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::SessionStatus;
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

    fn header() -> impl Strategy<Value = RecordHeader> {
        (
            "[a-z0-9-]{1,20}",
            status(),
            any::<u64>(),
            proptest::collection::vec(any::<u64>(), 0..6),
            proptest::collection::vec(any::<u64>(), 0..6),
            proptest::option::of(".{0,16}"),
            proptest::option::of("[a-z0-9]{1,8}"),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            proptest::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(
                |(id, status, turn, cut, front, cause, owner, (t, hb, v, epoch), cfg)| {
                    RecordHeader {
                        session_id: id,
                        agent_kind: "sim".into(),
                        agent_config: cfg,
                        status,
                        turn_index: turn,
                        cut,
                        front,
                        next_seq: turn / 2,
                        stop_cause: cause,
                        last_error: None,
                        owner,
                        heartbeat_ms: hb,
                        created_at_ms: t,
                        updated_at_ms: t,
                        version: v,
                        lease_epoch: epoch,
                        last_event_seq: v / 3,
                        interrupt: (v % 2 == 1).then(|| {
                            crate::interrupt::InterruptInfo::asking(
                                "approve?",
                                serde_json::json!({ "tool": "rm", "args": [v, -1, 2.5, null] }),
                            )
                        }),
                        awaiting_answer: v % 2 == 1,
                        answer: (v % 3 == 0).then(|| serde_bytes::ByteBuf::from(vec![0x92, 1, 2])),
                        settings: (v % 5 != 0).then(|| crate::settings::SessionSettings {
                            durability: crate::durability::Durability::Turn,
                            history: (turn % 7) as usize,
                            replay: (v % 300) as usize,
                            restart: crate::settings::RestartPolicy::Transient,
                            poll_interval_ms: (hb % 2 == 0).then_some(hb % 10_000),
                            events: (hb % 3 == 0).then(|| crate::event_log::Retention {
                                count: hb % 500 + 1,
                                max_age_ms: (hb % 2 == 0).then_some(hb),
                            }),
                            idle_after_ms: None,
                        }),
                        idempotency_keys: (0..(v % 4))
                            .map(|i| crate::keys::KeptKey {
                                key: format!("key-{i}-{hb}"),
                                fingerprint: hb.wrapping_mul(i + 1),
                                unanswered: (i + hb) % 2 == 1,
                            })
                            .collect(),
                        journal: (v % 3 == 1).then_some(crate::steps::JournalMark {
                            turn,
                            covered: (hb % 50) as u32,
                        }),
                        asleep: false,
                        state_carried: v % 2 == 0,
                        agent_version: 1 + (v % 3) as u32,
                    }
                },
            )
    }

    proptest! {
        /// S15: every header round-trips through the envelope.
        #[test]
        fn s15_header_round_trips(h in header()) {
            let bytes = encode_header(&h).unwrap();
            prop_assert_eq!(decode_header(&h.session_id, &bytes).unwrap(), h);
        }

        /// S15/S32: every truncation of a valid header is Corrupt, never a panic.
        #[test]
        fn s15_every_truncation_is_corrupt(h in header()) {
            let bytes = encode_header(&h).unwrap();
            for cut in 0..bytes.len() {
                let r = decode_header(&h.session_id, &bytes[..cut]);
                let corrupt = matches!(r, Err(StoreError::Corrupt { .. }));
                prop_assert!(corrupt, "cut {}", cut);
            }
        }

        /// S15/S32: random bytes (with or without a valid envelope) are Corrupt.
        #[test]
        fn s15_garbage_is_corrupt(mut junk in proptest::collection::vec(any::<u8>(), 0..200), framed in any::<bool>()) {
            if framed {
                junk = envelope(FORMAT_VERSION, &junk);
            }
            let r = decode_header("s", &junk);
            let corrupt = matches!(r, Err(StoreError::Corrupt { .. }));
            prop_assert!(corrupt);
        }
    }

    #[test]
    fn s15_a_header_without_newer_fields_reads_them_as_defaults() {
        // An older (or foreign) writer's header with only some fields: the rest default.
        let partial = rmp_serde::to_vec_named(&serde_json::json!({
            "session_id": "old",
            "agent_kind": "sim",
            "status": "Interrupted",
            "turn_index": 4,
            "a_field_from_the_future": [1, 2, 3],
        }))
        .unwrap();
        let h = decode_header("old", &envelope(FORMAT2, &partial)).unwrap();
        assert_eq!(h.status, SessionStatus::Interrupted);
        assert_eq!(h.turn_index, 4);
        assert_eq!((h.lease_epoch, h.version, h.next_seq), (0, 0, 0));
        assert!(h.cut.is_empty() && h.front.is_empty());
    }

    #[test]
    fn s15_unknown_version_names_the_version_and_newer_is_not_garbage() {
        let h = RecordHeader {
            session_id: "v".into(),
            ..RecordHeader::default()
        };
        let mut bytes = encode_header(&h).unwrap();
        bytes[4..6].copy_from_slice(&7u16.to_le_bytes());
        let msg = decode_header("v", &bytes).unwrap_err().to_string();
        assert!(msg.contains("unknown format version 7"), "{msg}");
        assert!(msg.contains("a newer agentloop wrote it"), "{msg}");
        assert!(msg.contains("`v`"), "names the session: {msg}");
    }

    #[test]
    fn s15_a_header_under_the_wrong_key_is_corrupt() {
        let h = RecordHeader {
            session_id: "a".into(),
            ..RecordHeader::default()
        };
        let bytes = encode_header(&h).unwrap();
        let msg = decode_header("b", &bytes).unwrap_err().to_string();
        assert!(msg.contains("stored under"), "{msg}");
    }

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct St {
        step: u32,
        notes: Vec<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        extra: Option<serde_json::Value>,
    }

    #[test]
    fn state_round_trips_and_damage_is_corrupt() {
        let s = St {
            step: 3,
            notes: vec!["a".into(), "bb".into()],
            extra: None,
        };
        let bytes = encode_state("s1", &s).unwrap();
        assert_eq!(decode_state::<St>("s1", &bytes).unwrap(), s);
        for cut in 0..bytes.len() {
            let e = decode_state::<St>("s1", &bytes[..cut]).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
        // A huge announced length is refused before anything is allocated.
        let e = decode_state::<Vec<u8>>("s1", &[0xc6, 0x7f, 0xff, 0xff, 0xff]).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }));
    }
}
