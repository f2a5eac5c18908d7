//! Encoding of agent state for records (DESIGN S15). The only module that uses bincode.
//!
//! bincode `=2.0.1` is unmaintained (RUSTSEC-2025-0141) and pinned; keeping it behind
//! these functions means the format can be migrated in one place. Decoding always runs
//! with a size limit and never panics: bad bytes become `StoreError::Corrupt`.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::StoreError;

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
