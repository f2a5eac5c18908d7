//! Reading records of format 1 (written before issue 12): one envelope per record whose
//! payload is the bincode 2.0.1 encoding (serde, standard config) of the whole
//! `SessionRecord`, the agent state inside it a bincode payload of its own. The only
//! bincode user (DESIGN §1: pinned, unmaintained, always decoded with a limit).
//!
//! bincode is not self-describing, so reading a format-1 record needs its item type.
//! Without it, only the fields before the first item can be read ([`prefix`]): id,
//! agent kind, agent config, status. That is enough to list and filter such records
//! and to change their status in place ([`with_status`], for a compare-and-swap). A
//! session that loads one converts it ([`crate::record::Stored::decode`]) and replaces
//! it with format 2 on its first write.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec::{open_envelope, FORMAT1, FORMAT1_STATE_MARK, MAGIC};
use crate::record::SessionRecord;
use crate::status::SessionStatus;
use crate::store_error::StoreError;

/// The largest format-1 payload decoded (64 MiB), as format 1 had it.
pub const RECORD_LIMIT: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<RECORD_LIMIT>()
}

/// The format-1 record as it was serialized (field order matters to bincode).
#[derive(Deserialize)]
struct V1Record<I> {
    session_id: String,
    agent_kind: String,
    agent_config: Vec<u8>,
    status: SessionStatus,
    turn_index: u64,
    unhandled_items: Vec<I>,
    interrupted_items: Vec<I>,
    state: Option<Vec<u8>>,
    stop_cause: Option<String>,
    last_error: Option<String>,
    owner: Option<String>,
    heartbeat_ms: u64,
    created_at_ms: u64,
    updated_at_ms: u64,
    version: u64,
}

/// The fields of a format-1 record before its first item.
#[derive(Serialize, Deserialize)]
pub struct Prefix {
    /// The session's id.
    pub session_id: String,
    /// The agent kind.
    pub agent_kind: String,
    /// The agent's configuration.
    pub agent_config: Vec<u8>,
    /// The status.
    pub status: SessionStatus,
}

fn payload<'b>(session: &str, bytes: &'b [u8]) -> Result<&'b [u8], StoreError> {
    let (version, body) = open_envelope(session, bytes, RECORD_LIMIT)?;
    if version != FORMAT1 {
        return Err(StoreError::Corrupt {
            session: session.to_string(),
            reason: format!(
                "a format-{version} envelope is stored where a format-1 record belongs"
            ),
        });
    }
    Ok(body)
}

/// Reads the fields before the first item, and how many payload bytes they take.
pub fn prefix(session: &str, bytes: &[u8]) -> Result<(Prefix, usize), StoreError> {
    let body = payload(session, bytes)?;
    let (p, used): (Prefix, usize) =
        bincode::serde::decode_from_slice(body, config()).map_err(|e| StoreError::Corrupt {
            session: session.to_string(),
            reason: format!("format-1 record does not decode: {e}"),
        })?;
    if p.session_id != session {
        return Err(StoreError::Corrupt {
            session: session.to_string(),
            reason: format!(
                "record names session `{}` but is stored under `{session}`",
                p.session_id
            ),
        });
    }
    Ok((p, used))
}

/// The same format-1 record with another status (the rest of its payload untouched).
pub fn with_status(
    session: &str,
    bytes: &[u8],
    status: SessionStatus,
) -> Result<Vec<u8>, StoreError> {
    let (mut p, used) = prefix(session, bytes)?;
    let body = payload(session, bytes)?;
    p.status = status;
    let mut new_body =
        bincode::serde::encode_to_vec(&p, config()).map_err(|e| StoreError::Encode {
            session: session.to_string(),
            reason: e.to_string(),
        })?;
    new_body.extend_from_slice(&body[used..]);
    let mut out = Vec::with_capacity(10 + new_body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT1.to_le_bytes());
    out.extend_from_slice(&(new_body.len() as u32).to_le_bytes());
    out.extend_from_slice(&new_body);
    Ok(out)
}

/// Decodes a whole format-1 record. Its state, if any, comes back marked with
/// [`FORMAT1_STATE_MARK`] so [`crate::codec::decode_state`] reads it as bincode.
pub fn decode_record<I: DeserializeOwned>(
    session: &str,
    bytes: &[u8],
) -> Result<SessionRecord<I>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    let body = payload(session, bytes)?;
    let (r, used): (V1Record<I>, usize) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| corrupt(format!("format-1 record does not decode: {e}")))?;
    if used != body.len() {
        return Err(corrupt(format!(
            "format-1 record has {} trailing bytes",
            body.len() - used
        )));
    }
    if r.session_id != session {
        return Err(corrupt(format!(
            "record names session `{}` but is stored under `{session}`",
            r.session_id
        )));
    }
    Ok(SessionRecord {
        session_id: r.session_id,
        agent_kind: r.agent_kind,
        agent_config: r.agent_config,
        status: r.status,
        turn_index: r.turn_index,
        unhandled_items: r.unhandled_items,
        interrupted_items: r.interrupted_items,
        state: r.state.map(|s| {
            let mut marked = FORMAT1_STATE_MARK.to_vec();
            marked.extend_from_slice(&s);
            marked
        }),
        stop_cause: r.stop_cause,
        last_error: r.last_error,
        owner: r.owner,
        heartbeat_ms: r.heartbeat_ms,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        version: r.version,
        lease_epoch: 0,
        last_event_seq: 0,
        interrupt: None,
        awaiting_answer: false,
        answer: None,
        settings: None,
        journal: None,
        state_carried: false,
        agent_version: crate::header::FIRST_VERSION,
    })
}

/// Decodes a format-1 agent state (bincode, without the mark).
pub fn decode_state<S: DeserializeOwned>(session: &str, bytes: &[u8]) -> Result<S, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| corrupt(format!("format-1 agent state does not decode: {e}")))?;
    if used != bytes.len() {
        return Err(corrupt(format!(
            "format-1 agent state has {} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(value)
}
