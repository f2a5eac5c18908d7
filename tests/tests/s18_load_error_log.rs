//! S18: a record that fails to load is logged in the session's span. Alone in its own
//! test binary: tracing caches each log site's interest process-wide, and another test
//! hitting the same site on a thread without a subscriber can race with the scoped
//! subscriber this test installs.

use std::sync::Arc;

use agentloop::{store::SessionRecord, ExitReason, MemoryStore};
use agentloop_sim::{SimAgent, SimItem};
use agentloop_tests::*;

/// S18: the error that a record failed to load is logged in the session's span, so the
/// line names the session (the start's decision runs outside any message handler).
#[tokio::test(start_paused = true)]
async fn s18_a_record_that_fails_to_load_is_logged_with_the_session_id() {
    use std::io::Write;

    #[derive(Clone, Default)]
    struct Capture(Arc<parking_lot::Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        // INFO: the session's span is an INFO span.
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let store = Arc::new(MemoryStore::<SimItem>::new());
    let mut rec = SessionRecord::new("corrupt-logged", "sim", 4);
    rec.interrupted_items = vec![item(1)];
    rec.state = Some(vec![0xff, 0xff, 0xff]);
    store.insert(rec);
    let h = spawn_persistent("corrupt-logged", SimAgent::new(steps(1)), store.clone()).await;
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Failed(_)),
        "{:?}",
        exit.reason
    );
    let log = String::from_utf8(capture.0.lock().clone()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("loading the session record failed"))
        .unwrap_or_else(|| panic!("no line says the load failed:\n{log}"));
    assert!(line.contains("ERROR"), "{line}");
    // In the session's span (`session{id=… kind=…}`), like every other line of it.
    assert!(
        line.contains("session{id=corrupt-logged"),
        "the line is in the session's span: {line}"
    );
}
