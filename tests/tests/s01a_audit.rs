//! S1a: `begin_step` puts a step on record before it runs, so work cut short by a forced
//! cancel is still visible to cost audits.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use agentloop::{ExitReason, StopOptions};
use agentloop_sim::{Notice, Script, SimAgent, SimStep};
use agentloop_tests::*;
use parking_lot::Mutex;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn s1a_a_step_killed_mid_flight_is_on_record() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (tx, mut probe) = probe();
    let script = Script {
        steps: vec![SimStep::ModelCall {
            latency: Duration::from_secs(30),
            input_tokens: 4321,
        }],
    };
    let h = spawn("audit", SimAgent::new(script).with_probe(tx)).await;
    h.push(item(1)).await.unwrap();
    probe
        .until("step 0", |n| {
            matches!(n, Notice::StepBegin { turn: 0, step: 0 })
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await; // the model call is in flight
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Canceled(_)));
    let log = String::from_utf8(capture.0.lock().clone()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("step begins"))
        .unwrap_or_else(|| panic!("no audit line in:\n{log}"));
    assert!(line.contains("ModelCall"), "{line}");
    assert!(line.contains("4321"), "{line}");
    assert!(
        line.contains("session=audit") || line.contains("audit"),
        "{line}"
    );
}
