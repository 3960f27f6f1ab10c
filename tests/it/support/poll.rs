//! The pause between two looks at a state no event announces (an index built in the background, a NATS leader, another process's log): the tests' only sleep, and not their synchronisation, which is the condition each caller checks under its deadline.

use std::time::Duration;

/// Short next to every deadline, long enough not to spin a core the other tests need.
const POLL: Duration = Duration::from_millis(20);

/// Waits a moment before the caller looks again.
pub async fn pause() {
    tokio::time::sleep(POLL).await;
}

/// `pause` for the tests that run outside a runtime.
pub fn pause_blocking() {
    std::thread::sleep(POLL);
}
