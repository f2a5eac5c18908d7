//! Human approval (S4): an agent asks before it acts. The turn ends with a question;
//! the persistent session's record keeps it, marked as awaiting an answer, and nothing
//! resumes it by itself, not even a restarted runtime. A person answers later, here
//! after a restart, with `Runtime::resume_with_answer`: the answer and this process's
//! claim are written in one durable write, and the resumed turn reads the answer in
//! `Turn::answer` beside its saved state (LangGraph's `interrupt` / `Command(resume=…)`).
//!
//! Run: `cargo run --example human_approval`

use agentloop::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What clients push: a request, or a person's decision.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Message {
    /// Ask the assistant to send an email.
    SendEmail { to: String, body: String },
    /// A person's answer to the assistant's question.
    Decision { approve: bool },
}

/// An assistant that never sends an email without a person's approval.
struct Assistant;

impl Agent for Assistant {
    type Item = Message;
    type Event = String;
    /// The draft waiting for approval.
    type State = Option<(String, String)>;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<Self::State>, AgentError> {
        if let (Some(Some((to, body))), Some(answer)) = (turn.resume.clone(), turn.answer) {
            match answer {
                Message::Decision { approve: true } => {
                    cx.emit(format!("sent to {to}: {body:?}")).await
                }
                _ => {
                    cx.emit(format!("not sent to {to}: the person declined"))
                        .await
                }
            }
            return Ok(TurnOutcome::Completed);
        }
        for item in turn.items {
            if let Message::SendEmail { to, body } = item {
                cx.emit(format!("drafted an email to {to}")).await;
                return cx.ask(
                    "approval required",
                    json!({ "action": "send_email", "to": to, "body": body }),
                    Some((to, body)),
                );
            }
        }
        Ok(TurnOutcome::Completed)
    }
}

/// A runtime on `dir` with the assistant registered.
async fn start(dir: &std::path::Path) -> Result<Runtime<Message, String>, agentloop::RuntimeError> {
    let (rt, _) = Runtime::<Message, String>::builder()
        .data_dir(dir)
        .register_agent("assistant", |_config: &[u8]| Ok(Assistant))
        .start()
        .await?;
    Ok(rt)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("agentloop-human-approval-{}", std::process::id()));

    println!("first run: the assistant asks");
    let rt = start(&dir).await?;
    let session = rt
        .supervisor()
        .spawn(SessionSpec::new("mail-7", "assistant").persistent(true))
        .await?;
    let mut events = session.subscribe();
    session
        .push(Message::SendEmail {
            to: "ops@example.com".into(),
            body: "the deploy is done".into(),
        })
        .await?;
    while let Some(event) = events.next().await {
        if let SessionEvent::Agent { event, .. } = event {
            println!("  {event}");
        }
    }
    let exit = session.wait().await;
    if let ExitReason::Interrupted(info) = &exit.reason {
        println!(
            "  the session waits for an answer: {} {}",
            info.reason, info.question
        );
    }
    let view = rt.view("mail-7").await?.ok_or("the record is missing")?;
    println!(
        "  stored record: status {}, awaiting an answer: {}",
        view.status,
        view.interrupt.as_ref().is_some_and(|i| i.awaiting_answer)
    );
    rt.shutdown().await?;

    println!("second run: the runtime does not resume it by itself; a person answers");
    let rt = start(&dir).await?;
    let (session, mut events) = rt
        .resume_with_answer("mail-7", Message::Decision { approve: true })
        .await?;
    while let Some(event) = events.next().await {
        match event {
            SessionEvent::Agent { event, .. } => println!("  {event}"),
            SessionEvent::TurnEnded { .. } => break,
            _ => {}
        }
    }
    session.stop(StopOptions::graceful()).await?;
    let exit = session.wait().await;
    println!("  the session ended {:?}", exit.reason);
    rt.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
