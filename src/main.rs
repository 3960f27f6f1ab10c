//! The `vak` binary: parses the command line and runs it; errors end the process with one line and exit code 1, `vak term` chooses its own exit code.

use clap::Parser;
use vak::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "vak=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vak: error: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => vak::cli::serve(args).await.map(|()| 0),
            Command::Term(args) => vak::term::run(args).await,
        }
    });
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
