//! What the tests of this one binary must not share: the machine with another heavy test, and process-wide state (rlimits, the environment).
//!
//! Each `tests/*.rs` used to be its own binary, and cargo runs binaries one after
//! another, so a test only ever ran beside tests of its own file. Now every test
//! shares one process and its test threads with all the others.

use std::process::Command;
use tokio::sync::{Mutex, MutexGuard};

/// One heavy test at a time in the whole binary.
static HEAVY: Mutex<()> = Mutex::const_new(());

/// Held for the whole of a heavy test: one that keeps both cores busy (the resync
/// trials, the real model, a 3-node NATS cluster with its replicas) or measures
/// memory, and whose deadlines assume a machine not also running another such
/// test. Light tests still run beside it. A tokio mutex: it is held across awaits,
/// works across the tests' separate runtimes, and a failed test does not poison it.
pub async fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().await
}

/// `heavy` for a test outside a runtime (docs.rs's `make` runs, which may build).
pub fn heavy_blocking() -> MutexGuard<'static, ()> {
    HEAVY.blocking_lock()
}

/// The environment variable that tells a re-run test it is in its own process.
const OWN_PROCESS: &str = "VAK_IT_OWN_PROCESS";

/// For a test that changes what is process-wide (a file-size rlimit, the
/// environment commands inherit): true when this process is its own, so the
/// caller runs its body; otherwise runs `name` (`module::test`) alone in a fresh
/// process of this binary, asserts that it passed, and returns false.
pub fn own_process(name: &str) -> bool {
    if std::env::var(OWN_PROCESS).as_deref() == Ok(name) {
        return true;
    }
    let out = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args([name, "--exact", "--test-threads=1"])
        .env(OWN_PROCESS, name)
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in its own process ({}):\n{stdout}\n{stderr}",
        out.status
    );
    false
}
