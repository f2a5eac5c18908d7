//! Cancel types and the cancel merge algebra (DESIGN S1–S3), from `agentloop-core`.
//!
//! The vocabulary of cancellation (the [`SafePoint`] bit set, [`CancelMode`],
//! [`CancelRequest`], the merged [`CancelState`], the [`CancelInfo`] of a cut turn and the
//! [`Canceled`] error a safe point returns) is plain data and arithmetic and lives in
//! `agentloop_core::cancel`, with its property tests; this module names it for the
//! runtime. A [`CancelState`]'s deadline is a `std::time::Instant`: the runtime passes
//! tokio's clock in as one (`tokio::time::Instant::into_std`).

pub use agentloop_core::cancel::{
    CancelInfo, CancelMode, CancelRequest, CancelState, Canceled, SafePoint,
};
