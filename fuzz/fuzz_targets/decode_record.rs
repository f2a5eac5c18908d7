//! Fuzz target `decode_record` (DESIGN S15/S32): arbitrary bytes go to
//! `decode_record::<SimItem>` and `decode_state::<SimState>`. Any panic, any error other
//! than `StoreError::Corrupt` for the session, any round-trip difference, and (with
//! `-malloc_limit_mb=64`, see docs/fuzzing.md) any single allocation of RECORD_LIMIT or
//! more is a finding. The properties live in `agentloop_fuzz::check_bytes`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agentloop_fuzz::check_bytes(data);
});
