//! Item and agent-state payloads: MessagePack with structs written as maps (DESIGN
//! S15a; the measurement behind the choice is in docs/benchmarks.md, "Payload
//! encoding").
//!
//! MessagePack is self-describing, so every serde shape round-trips (tagged and
//! untagged enums, `serde_json::Value`, `flatten`, `skip_serializing_if`), which
//! bincode could not do. Writing structs as maps (`to_vec_named`) matters: the array
//! form breaks `skip_serializing_if` exactly as bincode did.
//!
//! [`encode_checked`] is what the runtime calls before it acknowledges anything: it
//! encodes, decodes those bytes, and re-encodes the decoded value; the value is refused
//! when any step fails or when the re-encoding differs (compared as MessagePack values,
//! map entries in any order, so hash maps and sets pass). A refusal is a
//! [`PayloadError`] naming the type, the field path (`serde_path_to_error`) and serde's
//! reason. [`decode`] runs the structural check of `check.rs` first, so a short input
//! cannot make serde reserve much memory.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::check::{check, CheckError};

/// The largest payload (one item, or one agent state) written or read: 64 MiB.
pub const PAYLOAD_LIMIT: usize = 64 << 20;

/// Which step refused a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadStage {
    /// serde could not encode it.
    Encode,
    /// Its bytes did not decode back into its type.
    Decode,
    /// It decoded, but re-encoding the decoded value gave a different value.
    RoundTrip,
    /// It is larger than [`PAYLOAD_LIMIT`].
    TooLarge,
    /// The stored bytes are not one well-formed MessagePack value.
    Malformed,
}

/// A value that cannot be stored, or stored bytes that cannot be read as a type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadError {
    /// The Rust type (`std::any::type_name`).
    pub type_name: &'static str,
    /// The field path where it failed (`.messages[2].args`); empty for the whole value.
    pub path: String,
    /// Which step failed.
    pub stage: PayloadStage,
    /// serde's (or the check's) reason.
    pub reason: String,
}

impl PayloadError {
    fn hint(&self) -> &'static str {
        // serde reports a u128 it could not buffer either by name or, inside an
        // untagged enum, only as "did not match any variant".
        let wide = self.reason.contains("u128")
            || self.reason.contains("i128")
            || self.reason.contains("untagged enum");
        match self.stage {
            _ if wide => {
                "every variant of an untagged enum must read back as itself, and serde cannot \
                 buffer u128/i128 inside untagged, internally tagged or flattened types: use a \
                 u64/i64 or a string there"
            }
            PayloadStage::Encode => "fix the type's Serialize implementation",
            PayloadStage::Decode | PayloadStage::RoundTrip => {
                "make the type's Serialize and Deserialize agree: a value must read back as \
                 it was written"
            }
            PayloadStage::TooLarge => "keep items and agent state smaller",
            PayloadStage::Malformed => "the bytes are damaged",
        }
    }
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match self.stage {
            PayloadStage::Encode => "does not encode",
            PayloadStage::Decode => "does not decode back",
            PayloadStage::RoundTrip => "does not read back as written",
            PayloadStage::TooLarge => "is too large",
            PayloadStage::Malformed => "is not well-formed MessagePack",
        };
        write!(f, "a value of type `{}` {step}", self.type_name)?;
        if !self.path.is_empty() {
            write!(f, " at `{}`", self.path)?;
        }
        write!(f, ": {}; {}", self.reason, self.hint())
    }
}

impl std::error::Error for PayloadError {}

fn error<T: ?Sized>(stage: PayloadStage, path: String, reason: impl fmt::Display) -> PayloadError {
    PayloadError {
        type_name: std::any::type_name::<T>(),
        path: tidy_path(path),
        stage,
        reason: reason.to_string(),
    }
}

/// serde_path_to_error prints `?` for positions it cannot name and `.` for the root.
fn tidy_path(path: String) -> String {
    if path == "." {
        String::new()
    } else if path.starts_with('.') || path.starts_with('[') || path.is_empty() {
        path
    } else {
        format!(".{path}")
    }
}

/// Encodes a value without the round-trip check (for values already checked, or
/// written only to be read by the same type right away). Fails with the field path.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, PayloadError> {
    let bytes = match rmp_serde::to_vec_named(value) {
        Ok(b) => b,
        Err(e) => {
            // Again, tracking the path, to say where (only on failure: it costs).
            let mut sink = Vec::new();
            let mut ser = rmp_serde::Serializer::new(&mut sink).with_struct_map();
            return Err(match serde_path_to_error::serialize(value, &mut ser) {
                Err(pe) => error::<T>(PayloadStage::Encode, pe.path().to_string(), pe.inner()),
                Ok(()) => error::<T>(PayloadStage::Encode, String::new(), e),
            });
        }
    };
    if bytes.len() > PAYLOAD_LIMIT {
        return Err(error::<T>(
            PayloadStage::TooLarge,
            String::new(),
            format!(
                "{} bytes encoded; the limit is {PAYLOAD_LIMIT}",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

/// Decodes stored bytes as `T` (structural check first, see `check.rs`).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PayloadError> {
    if bytes.len() > PAYLOAD_LIMIT {
        return Err(error::<T>(
            PayloadStage::TooLarge,
            String::new(),
            format!("{} bytes stored; the limit is {PAYLOAD_LIMIT}", bytes.len()),
        ));
    }
    check(bytes).map_err(|e: CheckError| error::<T>(PayloadStage::Malformed, String::new(), e))?;
    match rmp_serde::from_slice::<T>(bytes) {
        Ok(v) => Ok(v),
        Err(e) => {
            let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
            Err(match serde_path_to_error::deserialize::<_, T>(&mut de) {
                Err(pe) => error::<T>(PayloadStage::Decode, pe.path().to_string(), pe.inner()),
                Ok(_) => error::<T>(PayloadStage::Decode, String::new(), e),
            })
        }
    }
}

/// Encodes a value and proves it reads back (see the module docs): the bytes returned
/// are what gets stored, and decoding them gives the value.
pub fn encode_checked<T: Serialize + DeserializeOwned>(value: &T) -> Result<Vec<u8>, PayloadError> {
    let bytes = encode(value)?;
    let back: T = decode(&bytes)?;
    let again = encode(&back).map_err(|e| PayloadError {
        stage: PayloadStage::RoundTrip,
        reason: format!("the decoded value does not encode again: {}", e.reason),
        ..e
    })?;
    if again != bytes {
        if let Some((path, why)) = differs(&bytes, &again) {
            return Err(error::<T>(PayloadStage::RoundTrip, path, why));
        }
    }
    Ok(bytes)
}

/// Where two encodings hold different values, if they do. Maps are compared whatever
/// the order of their entries, and arrays whatever the order of their elements when
/// they differ only by it (a `HashSet` writes its elements in a per-instance order).
fn differs(a: &[u8], b: &[u8]) -> Option<(String, String)> {
    let (Ok(va), Ok(vb)) = (
        rmpv::decode::read_value(&mut &a[..]),
        rmpv::decode::read_value(&mut &b[..]),
    ) else {
        return Some((
            String::new(),
            "the two encodings do not both read as values".into(),
        ));
    };
    let (ca, cb) = (canonical(&va, false), canonical(&vb, false));
    if bytes_of(&ca) == bytes_of(&cb) {
        return None;
    }
    if bytes_of(&canonical(&va, true)) == bytes_of(&canonical(&vb, true)) {
        return None;
    }
    Some(first_difference(&ca, &cb, String::new()))
}

fn bytes_of(v: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, v);
    out
}

/// Map entries sorted by their key's encoding; with `sets`, array elements sorted too.
fn canonical(v: &rmpv::Value, sets: bool) -> rmpv::Value {
    use rmpv::Value;
    match v {
        Value::Map(entries) => {
            let mut e: Vec<(Value, Value)> = entries
                .iter()
                .map(|(k, v)| (canonical(k, sets), canonical(v, sets)))
                .collect();
            e.sort_by_cached_key(|(k, _)| bytes_of(k));
            Value::Map(e)
        }
        Value::Array(items) => {
            let mut a: Vec<Value> = items.iter().map(|x| canonical(x, sets)).collect();
            if sets {
                a.sort_by_cached_key(bytes_of);
            }
            Value::Array(a)
        }
        other => other.clone(),
    }
}

fn kind(v: &rmpv::Value) -> &'static str {
    use rmpv::Value;
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension value",
    }
}

fn key_path(k: &rmpv::Value) -> String {
    match k.as_str() {
        Some(s) => format!(".{s}"),
        None => format!("[{k}]"),
    }
}

fn first_difference(a: &rmpv::Value, b: &rmpv::Value, path: String) -> (String, String) {
    use rmpv::Value;
    match (a, b) {
        (Value::Map(ma), Value::Map(mb)) => {
            for (k, va) in ma {
                match mb.iter().find(|(kb, _)| bytes_of(kb) == bytes_of(k)) {
                    Some((_, vb)) if bytes_of(va) != bytes_of(vb) => {
                        return first_difference(va, vb, format!("{path}{}", key_path(k)));
                    }
                    None => {
                        return (
                            format!("{path}{}", key_path(k)),
                            "the field is written but not read back".into(),
                        )
                    }
                    _ => {}
                }
            }
            for (k, _) in mb {
                if !ma.iter().any(|(ka, _)| bytes_of(ka) == bytes_of(k)) {
                    return (
                        format!("{path}{}", key_path(k)),
                        "the field appears only when the value is written again".into(),
                    );
                }
            }
            (path, "the maps differ".into())
        }
        (Value::Array(xa), Value::Array(xb)) if xa.len() == xb.len() => {
            for (i, (va, vb)) in xa.iter().zip(xb).enumerate() {
                if bytes_of(va) != bytes_of(vb) {
                    return first_difference(va, vb, format!("{path}[{i}]"));
                }
            }
            (path, "the arrays differ".into())
        }
        _ => (
            path,
            format!(
                "written as {} ({a}), read back as {} ({b})",
                kind(a),
                kind(b)
            ),
        ),
    }
}

/// A stored payload as JSON, whatever type wrote it (inspection: `agentloop sessions
/// show`, and anything that shows records to people). MessagePack maps with string
/// keys become objects; other keys are written as their JSON text (`{"1": …}`); bytes
/// become `{"$bytes": "<hex>"}`, extension values `{"$ext": type, "$bytes": "<hex>"}`,
/// floats that JSON cannot hold (NaN, infinities) strings. Runs the structural check
/// first, like [`decode`].
pub fn to_json(bytes: &[u8]) -> Result<serde_json::Value, PayloadError> {
    check(bytes)
        .map_err(|e| error::<serde_json::Value>(PayloadStage::Malformed, String::new(), e))?;
    let v = rmpv::decode::read_value(&mut &bytes[..])
        .map_err(|e| error::<serde_json::Value>(PayloadStage::Malformed, String::new(), e))?;
    Ok(json_of(&v))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_of(v: &rmpv::Value) -> serde_json::Value {
    use rmpv::Value;
    use serde_json::Value as J;
    let float = |f: f64| {
        serde_json::Number::from_f64(f).map_or_else(|| J::String(f.to_string()), J::Number)
    };
    match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => J::from(u),
            (None, Some(s)) => J::from(s),
            (None, None) => J::String(i.to_string()),
        },
        Value::F32(f) => float(f64::from(*f)),
        Value::F64(f) => float(*f),
        Value::String(s) => J::String(match s.as_str() {
            Some(t) => t.to_string(),
            None => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        }),
        Value::Binary(b) => serde_json::json!({ "$bytes": hex(b) }),
        Value::Array(a) => J::Array(a.iter().map(json_of).collect()),
        Value::Map(m) => J::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match k.as_str() {
                        Some(s) => s.to_string(),
                        None => json_of(k).to_string(),
                    };
                    (key, json_of(v))
                })
                .collect(),
        ),
        Value::Ext(t, b) => serde_json::json!({ "$ext": t, "$bytes": hex(b) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::{BTreeMap, HashMap, HashSet};

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    #[serde(tag = "role")]
    enum Msg {
        User {
            content: String,
        },
        Tool {
            args: serde_json::Value,
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<String>,
        },
        Wide {
            n: u128,
        },
    }

    #[test]
    fn tagged_enums_and_json_round_trip() {
        for m in [
            Msg::User {
                content: "hi".into(),
            },
            Msg::Tool {
                args: serde_json::json!({"a": [1, 2.5, null]}),
                id: None,
            },
        ] {
            let b = encode_checked(&m).unwrap();
            assert_eq!(decode::<Msg>(&b).unwrap(), m);
        }
    }

    #[test]
    fn u128_in_an_internally_tagged_enum_is_refused_with_type_and_hint() {
        let e = encode_checked(&Msg::Wide { n: 7 }).unwrap_err();
        assert_eq!(e.stage, PayloadStage::Decode, "{e}");
        assert!(e.type_name.ends_with("Msg"), "{e}");
        let text = e.to_string();
        assert!(text.contains("u128"), "{text}");
        assert!(text.contains("use a u64/i64 or a string"), "{text}");
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    enum Loose {
        Text(String),
        Wide(u128),
    }

    #[test]
    fn a_value_that_decodes_as_another_is_refused_at_its_path() {
        // u128 is written as 16 raw bytes; the untagged enum reads them back as a string.
        let e = encode_checked(&Loose::Wide(5)).unwrap_err();
        assert_eq!(e.stage, PayloadStage::RoundTrip, "{e}");
        assert!(e.reason.contains("bytes"), "{e}");
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Lossy {
        kept: u8,
        #[serde(skip_deserializing)]
        lost: u8,
    }

    #[test]
    fn a_field_that_is_not_read_back_is_named() {
        let e = encode_checked(&Lossy { kept: 1, lost: 2 }).unwrap_err();
        assert_eq!(e.stage, PayloadStage::RoundTrip);
        assert_eq!(e.path, ".lost", "{e}");
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Unordered {
        map: HashMap<(u8, u8), String>,
        set: HashSet<String>,
        tree: BTreeMap<u32, String>,
    }

    #[test]
    fn hash_maps_and_sets_pass_whatever_their_order() {
        let v = Unordered {
            map: (0..40u8).map(|i| ((i, i + 1), format!("v{i}"))).collect(),
            set: (0..40).map(|i| format!("s{i}")).collect(),
            tree: [(1, "a".to_string())].into(),
        };
        let b = encode_checked(&v).unwrap();
        assert_eq!(decode::<Unordered>(&b).unwrap(), v);
    }

    struct Refuses;
    impl Serialize for Refuses {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("not today"))
        }
    }
    #[derive(Serialize)]
    struct Outer {
        inner: Vec<Refuses>,
    }

    #[test]
    fn an_encode_failure_names_the_field() {
        let e = encode(&Outer {
            inner: vec![Refuses],
        })
        .unwrap_err();
        assert_eq!(e.stage, PayloadStage::Encode);
        assert_eq!(e.path, ".inner[0]", "{e}");
        assert!(e.reason.contains("not today"));
    }

    #[test]
    fn any_payload_reads_as_json_without_its_type() {
        let m = Msg::Tool {
            args: serde_json::json!({"city": "Paris", "days": [1, 2]}),
            id: Some("call-1".into()),
        };
        let j = to_json(&encode(&m).unwrap()).unwrap();
        assert_eq!(
            j,
            serde_json::json!({"role": "Tool", "args": {"city": "Paris", "days": [1, 2]}, "id": "call-1"})
        );
        let tree: BTreeMap<u32, Vec<u8>> = [(7, vec![])].into();
        assert_eq!(
            to_json(&encode(&tree).unwrap()).unwrap(),
            serde_json::json!({"7": []})
        );
        let b = serde_bytes::ByteBuf::from(vec![0xab, 0x01]);
        assert_eq!(
            to_json(&encode(&b).unwrap()).unwrap(),
            serde_json::json!({"$bytes": "ab01"})
        );
        assert!(to_json(&[0xdd, 0, 0, 0, 9]).is_err());
    }

    /// docs/operations.md, "Binary fields": a plain `Vec<u8>` costs up to two bytes per
    /// byte; `serde_bytes` stores it byte for byte, and still reads the sequence form
    /// records written before the change hold.
    #[test]
    fn serde_bytes_fields_are_compact_and_read_old_records() {
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Plain {
            blob: Vec<u8>,
        }
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Compact {
            #[serde(with = "serde_bytes")]
            blob: Vec<u8>,
        }
        let blob = vec![0xA5u8; 4096];
        let old = encode_checked(&Plain { blob: blob.clone() }).unwrap();
        let new = encode_checked(&Compact { blob: blob.clone() }).unwrap();
        assert!(old.len() > 2 * 4096, "{}", old.len());
        assert!(new.len() < 4096 + 16, "{}", new.len());
        assert_eq!(decode::<Compact>(&old).unwrap(), Compact { blob });
    }

    #[test]
    fn malformed_and_short_bytes_are_refused_without_serde() {
        let e = decode::<Vec<u64>>(&[0xdd, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(e.stage, PayloadStage::Malformed);
        let e = decode::<String>(&[]).unwrap_err();
        assert_eq!(e.stage, PayloadStage::Malformed);
        let e = decode::<String>(&encode(&5u8).unwrap()).unwrap_err();
        assert_eq!(e.stage, PayloadStage::Decode);
    }
}
