//! The `vak` binary: parses the command line and runs it; errors end the process with one line and exit code 1.

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
            Command::Serve(args) => vak::cli::serve(args).await,
        }
    });
    if let Err(e) = result {
        eprintln!("vak: error: {e}");
        std::process::exit(1);
    }
}
