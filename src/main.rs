//! The `vak` binary: parses the command line and runs it. Errors end the process with one line: exit code 2 when the home is owned by another running server, 1 otherwise; `vak term` chooses its own exit code.

use clap::Parser;
use vak::cli::{Cli, Command, LogFormat};

/// jemalloc, not glibc's malloc: glibc kept what a burst had used (five
/// cycles of 200 stalled readers on `/burst 200000 200`, each closed and its
/// session unloaded, left RSS at 661, 1009, 1068, 976, 1142 MiB; jemalloc
/// 39 to 47 MiB; BENCHMARKS.md, issue 26).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation: a background thread
/// gives dirty pages back to the system after about a second unused
/// (`dirty_decay_ms`), at once rather than through lazily freed ("muzzy")
/// pages that still count in RSS (`muzzy_decay_ms:0`). `_RJEM_MALLOC_CONF`
/// in the environment overrides them.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() {
    // A write past a file-size limit (`ulimit -f`) must fail with EFBIG like
    // any other storage error, not kill the server with SIGXFSZ.
    // SAFETY: setting a signal's disposition to ignore, before any thread starts.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        // Before anything else, so a signal during startup stops it cleanly.
        vak::cli::early_signals();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vak: error: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    // Inside the runtime: the OTLP exporter's channel and batch task live there.
    let tracing = {
        let _inside = runtime.enter();
        let (format, otlp) = match &cli.command {
            Command::Serve(args) => (
                args.log_format,
                // An empty value is unset, never the exporter's default address.
                args.otlp_endpoint.as_deref().filter(|e| !e.trim().is_empty()),
            ),
            _ => (LogFormat::Text, None),
        };
        match vak::otlp::init(format, otlp) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("vak: error: {e}");
                std::process::exit(1);
            }
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => match vak::cli::serve(args).await {
                Ok(()) => Ok(0),
                // The only conflict `vak serve` reports at startup: the home is owned.
                Err(e) if e.kind == vak::ErrorKind::Conflict => {
                    eprintln!("vak: error: {e}");
                    Ok(2)
                }
                Err(e) => Err(e),
            },
            Command::Term(args) => vak::term::run(args).await,
            Command::Token(args) => vak::open::token(args).map(|()| 0),
            Command::Open(args) => vak::open::open(args).await.map(|()| 0),
            Command::Doctor(args) => vak::doctor::run(args).await,
            Command::Backup(args) => vak::backup::run(args).await,
        }
    });
    // The server has stopped: the spans of its last runs are exported
    // before the process ends (the runtime's workers still run the exporter).
    tracing.shutdown();
    match result {
        Ok(0) => {}
        // `vak term`'s way of saying how a run ended (failed, cancelled).
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("vak: error: {e}");
            std::process::exit(1);
        }
    }
}
