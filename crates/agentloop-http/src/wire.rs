//! The JSON names the HTTP front gives the runtime's vocabulary (issue 17): statuses,
//! safe points, preempt acknowledgements, turn ends, exit reasons and checkpoint
//! outcomes, as stable snake_case tags (`{"kind": "canceled", ...}`) instead of Rust
//! `Debug` text, so clients can match on them across releases. Parsing of the request
//! options (safe points) lives here too. Nothing here touches a session.

use serde_json::{json, Value};

use agentloop::{
    cancel::CancelInfo, cancel::CancelMode, store::SessionStatus, PreemptAck, SafePoint, TurnEnd,
};
use agentloop::{exit::CheckpointOutcome, ExitReason};

/// A status's name: `running`, `stopped`, `interrupted`, `completed`, `canceled`,
/// `failed`.
pub(crate) fn status(s: &SessionStatus) -> &'static str {
    match s {
        SessionStatus::Running => "running",
        SessionStatus::Stopped => "stopped",
        SessionStatus::Interrupted => "interrupted",
        SessionStatus::Completed => "completed",
        SessionStatus::Canceled => "canceled",
        SessionStatus::Failed(_) => "failed",
    }
}

/// A safe-point set's name: `after_model_call`, `after_tool_calls`, `any`, `none`.
pub(crate) fn safe_point(p: SafePoint) -> &'static str {
    match p.bits() {
        0 => "none",
        0b01 => "after_model_call",
        0b10 => "after_tool_calls",
        _ => "any",
    }
}

/// Reads a safe-point name (see [`safe_point`]); `none` is refused (no cancel target).
pub(crate) fn parse_safe_point(s: &str) -> Result<SafePoint, String> {
    match s {
        "after_model_call" => Ok(SafePoint::AfterModelCall),
        "after_tool_calls" => Ok(SafePoint::AfterToolCalls),
        "any" => Ok(SafePoint::AnySafePoint),
        other => Err(format!(
            "safe point `{other}`: use after_model_call, after_tool_calls or any"
        )),
    }
}

/// A cancel mode: `"immediate"` or `{"at": <safe point>}`.
pub(crate) fn cancel_mode(m: CancelMode) -> Value {
    match m {
        CancelMode::Immediate => json!("immediate"),
        CancelMode::At(p) => json!({ "at": safe_point(p) }),
    }
}

/// How a cancel ended a turn.
pub(crate) fn cancel_info(c: &CancelInfo) -> Value {
    json!({
        "mode": cancel_mode(c.mode),
        "at": c.at.map(safe_point),
        "escalated": c.escalated,
        "timed_out": c.timed_out,
        "agent_error": c.agent_error,
    })
}

/// A push's preempt acknowledgement: `{"kind": "not_requested" | "no_target" |
/// "submitted" | "target_ended", "turn"?}`.
pub(crate) fn preempt_ack(ack: PreemptAck) -> Value {
    match ack {
        PreemptAck::NotRequested => json!({ "kind": "not_requested" }),
        PreemptAck::NoTarget => json!({ "kind": "no_target" }),
        PreemptAck::Submitted { turn } => json!({ "kind": "submitted", "turn": turn }),
        PreemptAck::TargetEnded { turn } => json!({ "kind": "target_ended", "turn": turn }),
        PreemptAck::Scheduled { turn } => json!({ "kind": "scheduled", "turn": turn }),
        PreemptAck::Duplicate => json!({ "kind": "duplicate" }),
    }
}

/// How a turn ended: `{"kind": "completed" | "preempted" | "canceled" | "interrupted" |
/// "failed" | "plan_aborted", ...}`.
pub(crate) fn turn_end(t: &TurnEnd) -> Value {
    match t {
        TurnEnd::Completed => json!({ "kind": "completed" }),
        TurnEnd::Preempted(c) => json!({ "kind": "preempted", "cancel": cancel_info(c) }),
        TurnEnd::Canceled(c) => json!({ "kind": "canceled", "cancel": cancel_info(c) }),
        TurnEnd::Interrupted(i) => {
            json!({ "kind": "interrupted", "reason": i.reason, "question": i.question })
        }
        TurnEnd::Failed(e) => json!({ "kind": "failed", "error": e }),
        TurnEnd::PlanAborted(e) => json!({ "kind": "plan_aborted", "error": e }),
    }
}

/// Why a session ended: `{"kind": "completed" | "canceled" | "interrupted" | "failed" |
/// "shutdown", ...}`. `shutdown` tells a client the server is going away (reconnect
/// later), the others that the session finished.
pub(crate) fn exit_reason(r: &ExitReason) -> Value {
    match r {
        ExitReason::Completed => json!({ "kind": "completed" }),
        ExitReason::Canceled(c) => json!({ "kind": "canceled", "cancel": cancel_info(c) }),
        ExitReason::Interrupted(i) => {
            json!({ "kind": "interrupted", "reason": i.reason, "question": i.question })
        }
        ExitReason::Failed(e) => json!({ "kind": "failed", "error": e }),
        ExitReason::Shutdown => json!({ "kind": "shutdown" }),
        ExitReason::Asleep => json!({ "kind": "asleep" }),
    }
}

/// Whether the exit checkpoint was written: `{"kind": "not_attempted" | "saved" |
/// "failed" | "deleted", "error"?}`.
pub(crate) fn checkpoint(c: &CheckpointOutcome) -> Value {
    match c {
        CheckpointOutcome::NotAttempted => json!({ "kind": "not_attempted" }),
        CheckpointOutcome::Saved => json!({ "kind": "saved" }),
        CheckpointOutcome::Failed(e) => json!({ "kind": "failed", "error": e }),
        CheckpointOutcome::Deleted => json!({ "kind": "deleted" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_point_names_round_trip() {
        for p in [
            SafePoint::AfterModelCall,
            SafePoint::AfterToolCalls,
            SafePoint::AnySafePoint,
        ] {
            assert_eq!(parse_safe_point(safe_point(p)), Ok(p));
        }
        assert!(parse_safe_point("none").is_err());
        assert!(parse_safe_point("AnySafePoint").is_err());
    }

    #[test]
    fn names_are_tags_not_debug_text() {
        assert_eq!(
            exit_reason(&ExitReason::Shutdown),
            json!({"kind": "shutdown"})
        );
        assert_eq!(
            turn_end(&TurnEnd::Failed("boom".into())),
            json!({"kind": "failed", "error": "boom"})
        );
        assert_eq!(
            checkpoint(&CheckpointOutcome::Saved),
            json!({"kind": "saved"})
        );
        assert_eq!(status(&SessionStatus::Failed("x".into())), "failed");
        assert_eq!(
            preempt_ack(PreemptAck::Submitted { turn: 3 }),
            json!({"kind": "submitted", "turn": 3})
        );
    }
}
