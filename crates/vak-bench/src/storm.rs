//! The reconnect storm: idle SSE streams all opened at once on a fresh server, three storms in a row, and the server RSS each leaves 2 s after its last stream opened.
//!
//! The idle scenario opens its streams at most 128 at a time; a server
//! restarting under thousands of browsers gets them all in the same instant,
//! and what the allocator keeps of that handshake peak is what the machine
//! pays for as long as the streams stay open.

use crate::clients::{Mode, Shared};
use crate::control::Control;
use crate::machine;
use crate::scenarios::{self, Env, Transport};
use crate::server::{ServeOpts, Server};
use std::time::Duration;

/// Storms on one server.
pub(crate) const STORMS: usize = 3;

/// What the storms left.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Storm {
    /// Per storm: the server's VmRSS 2 s after its last stream opened, less
    /// its VmRSS before the first storm, per stream (KiB).
    pub kib_per_stream: [f64; STORMS],
    /// Per storm: VmHWM (the peak so far), less the VmRSS before the first storm, per stream.
    pub peak_kib_per_stream: [f64; STORMS],
    pub before_kib: u64,
}

/// `STORMS` storms of `streams` SSE streams of one session on one fresh
/// server; each storm's streams close before the next opens.
pub(crate) async fn storm(env: &Env, streams: usize) -> Result<Storm, String> {
    let server = Server::start(env, Transport::Sse, ServeOpts::default()).await?;
    let r = async {
        let sid = Control::connect(&server.target).await?.create_session().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before_kib = machine::rss_kib(server.pid).ok_or("no VmRSS")?;
        let mut out = Storm {
            before_kib,
            ..Storm::default()
        };
        let per_stream = |kib: u64| kib.saturating_sub(before_kib) as f64 / streams as f64;
        for i in 0..STORMS {
            let shared = Shared::storming(streams);
            let ids = vec![sid.clone(); streams];
            let handles = scenarios::open(
                env,
                Transport::Sse,
                &server.target,
                &ids,
                Mode::Idle,
                None,
                &shared,
            )
            .await?;
            shared.wait_opened(streams, Duration::from_secs(180)).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            out.kib_per_stream[i] = per_stream(machine::rss_kib(server.pid).ok_or("no VmRSS")?);
            out.peak_kib_per_stream[i] = per_stream(machine::hwm_kib(server.pid).unwrap_or(0));
            shared.cancel.cancel();
            let results = scenarios::collect(handles, &shared, Duration::from_secs(60)).await;
            scenarios::first_error(&results)?;
            // The server sees each client's end of stream at once and
            // drops the stream; this leaves it time to, and the allocator
            // its second of decay, before the next storm.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(out)
    }
    .await;
    server.stop().await;
    r
}
