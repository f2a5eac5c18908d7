//! Session ids (DESIGN S32): what a usable id is. The vocabulary every layer shares
//! (handles, the supervisor, stores, the CLI); it knows nothing else.

/// The longest session id, in bytes.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// A session id that cannot be used (S32).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionIdError {
    /// The id is empty.
    #[error("session id is empty; use 1 to 128 bytes without control characters")]
    Empty,
    /// The id is too long.
    #[error("session id is {len} bytes long; the limit is 128 bytes")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// The id holds a control character.
    #[error("session id contains a control character at byte {at}; use printable characters only")]
    ControlCharacter {
        /// Byte offset of the first one.
        at: usize,
    },
}

/// Checks a session id: 1–128 bytes, no control characters. Stores rely on the last
/// rule: `0x00` ends the id in their keys.
pub fn validate_session_id(id: &str) -> Result<(), SessionIdError> {
    if id.is_empty() {
        return Err(SessionIdError::Empty);
    }
    if id.len() > MAX_SESSION_ID_LEN {
        return Err(SessionIdError::TooLong { len: id.len() });
    }
    if let Some((at, _)) = id.char_indices().find(|(_, c)| c.is_control()) {
        return Err(SessionIdError::ControlCharacter { at });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s32_session_ids_are_validated() {
        assert_eq!(validate_session_id(""), Err(SessionIdError::Empty));
        assert_eq!(
            validate_session_id(&"x".repeat(129)),
            Err(SessionIdError::TooLong { len: 129 })
        );
        assert!(validate_session_id(&"x".repeat(128)).is_ok());
        assert_eq!(
            validate_session_id("ab\ncd"),
            Err(SessionIdError::ControlCharacter { at: 2 })
        );
        assert_eq!(
            validate_session_id("a\0b"),
            Err(SessionIdError::ControlCharacter { at: 1 })
        );
        assert!(validate_session_id("user-42/chat").is_ok());
    }
}
