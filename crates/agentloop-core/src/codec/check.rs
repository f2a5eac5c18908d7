//! The structural check every stored MessagePack payload passes before serde sees it
//! (DESIGN S15: decoding never allocates more than a set limit).
//!
//! It walks the bytes once, without allocating (an explicit stack of at most
//! [`MAX_DEPTH`] counters), and accepts exactly one well-formed value that fills the
//! input: every length and count fits in the bytes that follow it, every container
//! holds the number of values it declares, nesting stays within [`MAX_DEPTH`], and
//! nothing trails.
//!
//! Why this bounds memory (the invariant the decoder relies on): serde preallocates a
//! container from its declared count (at most 1 MiB, `size_hint::cautious`), so a short
//! input declaring huge counts at every nesting level could reserve a megabyte per
//! level. Once this check has passed, every declared count is a count of values really
//! present, every value takes at least one byte of its own, and each value is in one
//! container only: the counts of all containers together are fewer than the input's
//! bytes. So decoding reserves at most (input bytes × the size of the largest element
//! type) for containers, plus at most the input's bytes for strings and binaries.

/// The deepest nesting of arrays and maps accepted (serde_json's default limit).
pub const MAX_DEPTH: usize = 128;

/// Why a payload is not one well-formed MessagePack value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// The input ends inside a value (at this offset).
    Truncated {
        /// Where the missing bytes should start.
        at: usize,
    },
    /// Bytes follow the value.
    Trailing {
        /// Where the first trailing byte is.
        at: usize,
    },
    /// The reserved marker `0xc1`.
    Reserved {
        /// Its offset.
        at: usize,
    },
    /// A length or count larger than the bytes left.
    TooLong {
        /// The marker's offset.
        at: usize,
        /// The length or count it declares.
        declared: u64,
        /// The bytes left after its header.
        left: usize,
    },
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep {
        /// The offset of the container that went too deep.
        at: usize,
    },
    /// No bytes at all.
    Empty,
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckError::Truncated { at } => {
                write!(f, "truncated: a value needs bytes past offset {at}")
            }
            CheckError::Trailing { at } => {
                write!(f, "trailing bytes after the value, from offset {at}")
            }
            CheckError::Reserved { at } => {
                write!(f, "reserved MessagePack marker 0xc1 at offset {at}")
            }
            CheckError::TooLong { at, declared, left } => write!(
                f,
                "the length or count at offset {at} says {declared}, but only {left} bytes follow"
            ),
            CheckError::TooDeep { at } => {
                write!(f, "nested deeper than {MAX_DEPTH} levels at offset {at}")
            }
            CheckError::Empty => f.write_str("no bytes"),
        }
    }
}

/// What one marker announces.
enum Shape {
    /// A scalar whose body is this many bytes.
    Skip(u64),
    /// A container of this many values.
    Values(u64),
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Checks that `input` is exactly one well-formed MessagePack value (see the module
/// docs). Never allocates.
pub fn check(input: &[u8]) -> Result<(), CheckError> {
    if input.is_empty() {
        return Err(CheckError::Empty);
    }
    // remaining[d] = values still to read in the container at depth d; the root is a
    // container of one value.
    let mut remaining = [0u64; MAX_DEPTH + 1];
    let mut depth = 0usize;
    remaining[0] = 1;
    let mut pos = 0usize;
    loop {
        // Close finished containers.
        while remaining[depth] == 0 {
            if depth == 0 {
                return if pos == input.len() {
                    Ok(())
                } else {
                    Err(CheckError::Trailing { at: pos })
                };
            }
            depth -= 1;
        }
        remaining[depth] -= 1;
        let at = pos;
        let Some(&marker) = input.get(pos) else {
            return Err(CheckError::Truncated { at: pos });
        };
        pos += 1;
        // (header bytes after the marker, how to read the body)
        let (extra, shape): (usize, fn(u64) -> Shape) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, |_| Shape::Skip(0)),
            0x80..=0x8f => {
                let n = u64::from(marker & 0x0f) * 2;
                open(&mut remaining, &mut depth, at, n, input.len() - pos)?;
                continue;
            }
            0x90..=0x9f => {
                let n = u64::from(marker & 0x0f);
                open(&mut remaining, &mut depth, at, n, input.len() - pos)?;
                continue;
            }
            0xa0..=0xbf => {
                let n = u64::from(marker & 0x1f);
                skip(&mut pos, input.len(), at, n)?;
                continue;
            }
            0xc1 => return Err(CheckError::Reserved { at }),
            0xc4 | 0xd9 => (1, Shape::Skip),
            0xc5 | 0xda => (2, Shape::Skip),
            0xc6 | 0xdb => (4, Shape::Skip),
            // ext 8/16/32: length, then a type byte, then the body.
            0xc7 => (1, |n| Shape::Skip(n + 1)),
            0xc8 => (2, |n| Shape::Skip(n + 1)),
            0xc9 => (4, |n| Shape::Skip(n + 1)),
            0xca => (0, |_| Shape::Skip(4)),
            0xcb => (0, |_| Shape::Skip(8)),
            0xcc | 0xd0 => (0, |_| Shape::Skip(1)),
            0xcd | 0xd1 => (0, |_| Shape::Skip(2)),
            0xce | 0xd2 => (0, |_| Shape::Skip(4)),
            0xcf | 0xd3 => (0, |_| Shape::Skip(8)),
            // fixext 1/2/4/8/16: a type byte and the body.
            0xd4 => (0, |_| Shape::Skip(2)),
            0xd5 => (0, |_| Shape::Skip(3)),
            0xd6 => (0, |_| Shape::Skip(5)),
            0xd7 => (0, |_| Shape::Skip(9)),
            0xd8 => (0, |_| Shape::Skip(17)),
            0xdc => (2, Shape::Values),
            0xdd => (4, Shape::Values),
            0xde => (2, |n| Shape::Values(n.saturating_mul(2))),
            0xdf => (4, |n| Shape::Values(n.saturating_mul(2))),
        };
        let header = input
            .get(pos..pos + extra)
            .ok_or(CheckError::Truncated { at: pos })?;
        let n = be(header);
        pos += extra;
        match shape(n) {
            Shape::Skip(len) => skip(&mut pos, input.len(), at, len)?,
            Shape::Values(count) => open(&mut remaining, &mut depth, at, count, input.len() - pos)?,
        }
    }
}

/// Advances past a body of `len` bytes.
fn skip(pos: &mut usize, end: usize, at: usize, len: u64) -> Result<(), CheckError> {
    let left = end - *pos;
    if len > left as u64 {
        return Err(CheckError::TooLong {
            at,
            declared: len,
            left,
        });
    }
    *pos += len as usize;
    Ok(())
}

/// Opens a container of `count` values (each takes at least one of the `left` bytes).
fn open(
    remaining: &mut [u64; MAX_DEPTH + 1],
    depth: &mut usize,
    at: usize,
    count: u64,
    left: usize,
) -> Result<(), CheckError> {
    if count > left as u64 {
        return Err(CheckError::TooLong {
            at,
            declared: count,
            left,
        });
    }
    if count == 0 {
        return Ok(());
    }
    if *depth + 1 > MAX_DEPTH {
        return Err(CheckError::TooDeep { at });
    }
    *depth += 1;
    remaining[*depth] = count;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
        rmp_serde::to_vec_named(v).unwrap()
    }

    #[test]
    fn accepts_well_formed_values() {
        let big = "x".repeat(70_000);
        let cases: Vec<Vec<u8>> = vec![
            enc(&0u8),
            enc(&-1i64),
            enc(&u64::MAX),
            enc(&1.5f64),
            enc(&"hi"),
            enc(&big),
            enc(&vec![1u32; 20]),
            enc(&vec![vec![Some(1u8), None]; 70_000]),
            enc(&std::collections::BTreeMap::from([(1u8, "a"), (2, "b")])),
            enc(&serde_json::json!({"a": [1, {"b": null}], "c": true})),
            enc(&serde_bytes::ByteBuf::from(vec![7u8; 300])),
            enc(&()),
        ];
        for c in cases {
            assert_eq!(check(&c), Ok(()), "{c:02x?}");
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let v = enc(
            &serde_json::json!({"a": [1, 2.5, "str", {"b": [null, true]}], "c": "long text here"}),
        );
        for cut in 0..v.len() {
            assert!(check(&v[..cut]).is_err(), "cut {cut}");
        }
        let mut more = v.clone();
        more.push(0);
        assert_eq!(check(&more), Err(CheckError::Trailing { at: v.len() }));
    }

    #[test]
    fn declared_counts_past_the_input_are_refused_before_anything_is_read() {
        // array32 claiming 2^31 values, then nothing.
        assert!(matches!(
            check(&[0xdd, 0x80, 0, 0, 0, 1]),
            Err(CheckError::TooLong { at: 0, .. })
        ));
        // map16 of 3 pairs with 5 bytes left.
        assert!(matches!(
            check(&[0xde, 0, 3, 1, 1, 1, 1, 1]),
            Err(CheckError::TooLong { .. })
        ));
        // str32 longer than the input.
        assert!(matches!(
            check(&[0xdb, 0, 0, 1, 0, b'a']),
            Err(CheckError::TooLong { .. })
        ));
        // The amplification shape: nested arrays each claiming a huge count.
        let mut nested = Vec::new();
        for _ in 0..1000 {
            nested.extend_from_slice(&[0xdd, 0x7f, 0xff, 0xff, 0xff]);
        }
        assert!(check(&nested).is_err());
    }

    #[test]
    fn depth_is_bounded() {
        let mut ok = vec![0x91; MAX_DEPTH];
        ok.push(0xc0);
        assert_eq!(check(&ok), Ok(()));
        let mut deep = vec![0x91; MAX_DEPTH + 1];
        deep.push(0xc0);
        assert!(matches!(check(&deep), Err(CheckError::TooDeep { .. })));
        assert_eq!(check(&[0xc1]), Err(CheckError::Reserved { at: 0 }));
        assert_eq!(check(&[]), Err(CheckError::Empty));
    }
}
