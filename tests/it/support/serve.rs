//! `vak serve` as a child process, started one way by every test that needs the real binary: its flags, environment, home, workspace and token, and its URL read from the `listening on` line in one place (`Vak::listening`).

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;
use tokio::process::Command;

use super::process::Vak;
use super::{TestServer, DEADLINE, TOKEN};

/// Environment a developer's shell may hold that would change what `vak serve`
/// does: removed from every child (a test that wants one sets it with `env`).
const SCRUBBED: &[&str] = &[
    "RUST_LOG",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// Where a child's home or workspace is.
enum Place {
    /// A fresh temporary directory (a home owner-only), kept as long as the child's `Served`/`Spawned`.
    Fresh,
    At(PathBuf),
    /// No flag: the child finds it itself (VAK_HOME, the current directory).
    Unset,
}

/// A `vak serve` command line to start: by default `--listen 127.0.0.1:0
/// --token TOKEN` with a fresh home and workspace, and no VAK_* (nor RUST_LOG or
/// provider keys) inherited from whoever runs the tests.
pub struct Serve {
    bin: OsString,
    prelude: Option<String>,
    listen: String,
    token: Option<String>,
    home: Place,
    workspace: Place,
    args: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    current_dir: Option<PathBuf>,
    deadline: Duration,
}

impl Default for Serve {
    fn default() -> Serve {
        Serve::new()
    }
}

impl Serve {
    pub fn new() -> Serve {
        Serve {
            bin: env!("CARGO_BIN_EXE_vak").into(),
            prelude: None,
            listen: "127.0.0.1:0".into(),
            token: Some(TOKEN.into()),
            home: Place::Fresh,
            workspace: Place::Fresh,
            args: Vec::new(),
            env: Vec::new(),
            current_dir: None,
            deadline: DEADLINE,
        }
    }

    /// Another `vak` binary (an older build a test is checked against).
    pub fn bin(mut self, bin: impl Into<OsString>) -> Serve {
        self.bin = bin.into();
        self
    }

    /// Runs it through `sh -c 'PRELUDE; exec vak serve …'` (a `ulimit`, a `umask`).
    pub fn prelude(mut self, prelude: &str) -> Serve {
        self.prelude = Some(prelude.into());
        self
    }

    pub fn listen(mut self, addr: &str) -> Serve {
        self.listen = addr.into();
        self
    }

    pub fn token(mut self, token: &str) -> Serve {
        self.token = Some(token.into());
        self
    }

    /// No `--token` flag: the home's kept token, VAK_TOKEN, or a generated one.
    pub fn no_token(mut self) -> Serve {
        self.token = None;
        self
    }

    pub fn home(mut self, home: impl AsRef<Path>) -> Serve {
        self.home = Place::At(home.as_ref().to_path_buf());
        self
    }

    /// No `--home` flag (VAK_HOME or the default).
    pub fn no_home(mut self) -> Serve {
        self.home = Place::Unset;
        self
    }

    pub fn workspace(mut self, workspace: impl AsRef<Path>) -> Serve {
        self.workspace = Place::At(workspace.as_ref().to_path_buf());
        self
    }

    /// No `--workspace` flag (the current directory).
    pub fn no_workspace(mut self) -> Serve {
        self.workspace = Place::Unset;
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Serve {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Serve
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Serve {
        self.env
            .push((key.as_ref().to_os_string(), Some(value.as_ref().to_os_string())));
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Serve {
        self.env.push((key.as_ref().to_os_string(), None));
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Serve {
        self.current_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// How long `start` waits for the `listening on` line (DEADLINE by default).
    pub fn startup_deadline(mut self, deadline: Duration) -> Serve {
        self.deadline = deadline;
        self
    }

    /// The command, and the fresh directories it names (dropped with the child).
    fn command(self) -> (Command, Dirs) {
        let mut dirs = Dirs::default();
        let mut place = |p: Place, mode: Option<u32>| match p {
            Place::Fresh => {
                let d = tempfile::tempdir().unwrap();
                let path = d.path().to_path_buf();
                if let Some(mode) = mode {
                    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                        .unwrap();
                }
                dirs.fresh.push(d);
                Some(path)
            }
            Place::At(p) => Some(p),
            Place::Unset => None,
        };
        // A fresh home is owner-only, as the server wants it (it warns otherwise).
        dirs.home = place(self.home, Some(0o700));
        dirs.workspace = place(self.workspace, None);
        let mut cmd = match &self.prelude {
            None => Command::new(&self.bin),
            Some(prelude) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("{prelude} && exec \"$0\" \"$@\""))
                    .arg(&self.bin);
                sh
            }
        };
        cmd.args(["serve", "--listen", &self.listen]);
        if let Some(token) = &self.token {
            cmd.args(["--token", token]);
        }
        if let Some(home) = &dirs.home {
            cmd.arg("--home").arg(home);
        }
        if let Some(ws) = &dirs.workspace {
            cmd.arg("--workspace").arg(ws);
        }
        cmd.args(&self.args);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("VAK_") {
                cmd.env_remove(key);
            }
        }
        for key in SCRUBBED {
            cmd.env_remove(key);
        }
        for (key, value) in &self.env {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        if let Some(dir) = &self.current_dir {
            cmd.current_dir(dir);
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        dirs.deadline = self.deadline;
        (cmd, dirs)
    }

    /// Starts it without waiting for the `listening on` line (a signal during
    /// startup, a startup that must fail with the child's log read after).
    pub fn spawn(self) -> Spawned {
        let (cmd, dirs) = self.command();
        Spawned {
            vak: Vak::spawn(cmd),
            dirs,
        }
    }

    /// Starts it and waits for its `listening on` line.
    pub async fn start(self) -> Served {
        self.spawn().listening().await
    }

    /// Runs it to its exit (a startup that must fail), within the deadline.
    pub async fn output(self) -> Output {
        let (mut cmd, dirs) = self.command();
        let out = tokio::time::timeout(dirs.deadline, cmd.output())
            .await
            .expect("vak exits within the deadline")
            .expect("vak runs");
        drop(dirs);
        out
    }
}

/// The fresh directories of a child (removed when this drops), and how long it may take to start.
#[derive(Default)]
pub struct Dirs {
    home: Option<PathBuf>,
    workspace: Option<PathBuf>,
    fresh: Vec<tempfile::TempDir>,
    deadline: Duration,
}

/// A started child that has not yet said where it listens.
pub struct Spawned {
    pub vak: Vak,
    dirs: Dirs,
}

impl Spawned {
    /// Waits for the `listening on` line.
    pub async fn listening(mut self) -> Served {
        let url = self.vak.listening(self.dirs.deadline).await;
        let addr = url
            .split_once("://")
            .map(|(_, rest)| rest.trim_end_matches('/'))
            .and_then(|hostport| hostport.parse().ok())
            .unwrap_or_else(|| panic!("a loopback URL: {url}"));
        Served {
            vak: self.vak,
            url,
            addr,
            dirs: self.dirs,
        }
    }
}

/// A `vak serve` child that listens: killed when dropped, with its fresh
/// directories removed after it.
pub struct Served {
    pub vak: Vak,
    /// What the `listening on` line announced (`http://127.0.0.1:PORT`, or https).
    pub url: String,
    pub addr: SocketAddr,
    /// Kept while the child runs (a `Replica` takes them with its `vak`).
    pub dirs: Dirs,
}

impl Dirs {
    /// The child's `--home`.
    pub fn home(&self) -> &Path {
        self.home.as_deref().expect("started with --home")
    }

    /// The child's `--workspace`.
    pub fn workspace(&self) -> &Path {
        self.workspace.as_deref().expect("started with --workspace")
    }
}

impl Served {
    pub fn home(&self) -> &Path {
        self.dirs.home()
    }

    pub fn workspace(&self) -> &Path {
        self.dirs.workspace()
    }

    /// A client of its API (over plain HTTP) with the default token.
    pub fn api(&self) -> TestServer {
        TestServer::remote(&self.url)
    }
}
