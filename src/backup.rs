//! `vak backup export DIR` and `vak backup import DIR`: a home copied out to a directory and back while no server runs on it (a running server's home is refused, naming the server: ask it through `POST /backup/export|import` instead).

use clap::{Args, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use vak_core::error::{Error, ErrorKind, Result};
use vak_core::home::{self, HomeLock, LockError};
use vak_core::host::backup::{self, Action, Conflict};

/// `vak backup`.
#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub command: BackupCommand,
}

#[derive(Subcommand, Debug)]
pub enum BackupCommand {
    /// Write a backup of a stopped home to DIR (new or empty), with a manifest of sha256s.
    Export {
        /// A new or empty directory outside the home.
        dir: PathBuf,
        /// Copy the encrypted key store and the key file that opens it too.
        #[arg(long)]
        include_secrets: bool,
        /// The data home (default ~/.local/share/vak).
        #[arg(long, env = "VAK_HOME")]
        home: Option<PathBuf>,
    },
    /// Verify the backup in DIR and bring it into a stopped home.
    Import {
        /// The backup's directory (outside the home), holding manifest.json.
        dir: PathBuf,
        /// What to do with a session id the home already has.
        #[arg(long, value_enum, default_value_t = ConflictArg::Skip)]
        conflict: ConflictArg,
        /// The data home (default ~/.local/share/vak).
        #[arg(long, env = "VAK_HOME")]
        home: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ConflictArg {
    Skip,
    Overwrite,
    Rename,
}

/// Runs `vak backup`; what it did goes to stdout.
pub async fn run(args: BackupArgs) -> Result<i32> {
    tokio::task::spawn_blocking(move || run_blocking(args))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
}

fn run_blocking(args: BackupArgs) -> Result<i32> {
    match args.command {
        BackupCommand::Export {
            dir,
            include_secrets,
            home,
        } => {
            let home = home::resolve(home)?;
            if !home.is_dir() {
                return Err(Error::not_found(format!("no home at {}", home.display())));
            }
            let _lock = lock(&home, "export")?;
            let e = backup::export(&home, &dir_arg(&dir)?, include_secrets)?;
            println!(
                "exported {} sessions, {} files, {} bytes to {}",
                e.sessions,
                e.files,
                e.bytes,
                e.dest_dir.display()
            );
            println!("manifest: {}", e.manifest.display());
        }
        BackupCommand::Import { dir, conflict, home } => {
            let home = home::resolve(home)?;
            let _lock = lock(&home, "import")?;
            let conflict = match conflict {
                ConflictArg::Skip => Conflict::Skip,
                ConflictArg::Overwrite => Conflict::Overwrite,
                ConflictArg::Rename => Conflict::Rename,
            };
            let got = backup::import_offline(&home, &dir_arg(&dir)?, conflict)?;
            for s in &got.sessions {
                match s.action {
                    Action::Imported => println!("imported    {}", s.session_id),
                    Action::Skipped => println!("skipped     {} (the home has it)", s.session_id),
                    Action::Overwritten => println!("overwritten {}", s.session_id),
                    Action::Renamed => println!("renamed     {} -> {}", s.session_id, s.imported_as),
                }
            }
            for f in &got.restored {
                println!("restored    {f}");
            }
            for f in &got.kept {
                println!("kept        {f} (the home has its own)");
            }
        }
    }
    Ok(0)
}

/// DIR as the core takes it: absolute (a relative one is taken from the
/// current directory, as a person typing it means).
fn dir_arg(dir: &Path) -> Result<String> {
    let dir = std::path::absolute(dir).map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?;
    dir.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("{} is not UTF-8", dir.display())))
}

/// The home's lock for the command's life: refused while a server runs on it.
fn lock(home: &Path, what: &str) -> Result<HomeLock> {
    match HomeLock::acquire(home) {
        Ok(lock) => Ok(lock),
        Err(LockError::Owned { pid, url }) => {
            let who = match (pid, url) {
                (Some(pid), Some(url)) => format!(" (pid {pid}, {url})"),
                (Some(pid), None) => format!(" (pid {pid})"),
                _ => String::new(),
            };
            Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "a server is running on the home {}{who}: stop it first, or ask it: POST /backup/{what}",
                    home.display()
                ),
            ))
        }
        Err(LockError::Io(e)) => Err(e),
    }
}
