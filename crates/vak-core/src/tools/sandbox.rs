//! The sandbox every command the agent runs goes into: Landlock for the file system, seccomp for the network, both applied in the child between fork and exec.
//!
//! In `workspace-write` a command reads everything but vak's home, and
//! writes only its session's workspace, a private temporary directory made
//! for it (`TMPDIR`), the roots `[sandbox] writable_roots` names and a few
//! devices (`/dev/null`, `/dev/zero`, `/dev/full`, `/dev/tty`); in
//! `read-only` it writes only those devices. With `[sandbox] network = false`
//! (the default) it cannot make a socket other than a Unix one (seccomp,
//! errno EPERM; io_uring, which could make one behind seccomp's back, is
//! refused too), nor connect or bind TCP where Landlock can say so (ABI 4+).
//! Where the kernel has Landlock scopes (ABI 6+) it cannot signal a process
//! outside its sandbox (vak itself) nor reach an abstract Unix socket.
//!
//! Landlock only ever grants: a rule on a folder covers everything beneath
//! it. So "everything but the home" is granted as the siblings along the
//! path from `/` down to the home: `/`'s entries but the one that leads to
//! the home, that entry's entries but the next, and so on (symbolic links
//! skipped: what they point at is covered, or not, where it really is). A
//! listing of one of those ancestors (`ls /`) is therefore refused too.
//!
//! The rules are built in the parent, on a blocking thread, for every
//! command (the workspace, the temporary directory and the folders beside
//! the home may change); the child only restricts itself with the finished
//! ruleset and installs the compiled seccomp program, which allocates
//! nothing, as code between fork and exec must.

use crate::error::{Error, Result};
use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The oldest Landlock ABI vak sandboxes with: 3 (Linux 6.2) is the first
/// that handles truncation, without which any readable file could be
/// emptied.
pub const MIN_LANDLOCK_ABI: i32 = 3;
/// The rights vak asks for; an older kernel's Landlock handles what it knows.
const TARGET_ABI: ABI = ABI::V6;
/// The most rules one command's ruleset may hold (a folder beside the home
/// with more entries than this makes the command fail, clearly).
const MAX_RULES: usize = 20_000;

/// Environment variables no command the agent runs inherits: the
/// providers' keys, the server's token and the bus's secrets (the
/// terminal's shell withholds them too). `[sandbox] scrub_env` adds more.
pub const WITHHELD_ENV: &[&str] = &[
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "VAK_TOKEN",
    "VAK_BUS_PASSWORD",
    "VAK_BUS_TOKEN",
];

/// How much of the machine a command may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Writes the session's workspace, a private temporary directory and
    /// the configured roots; reads all but vak's home.
    WorkspaceWrite,
    /// Writes nothing (but `/dev/null` and the like); reads all but vak's home.
    ReadOnly,
    /// No sandbox: the server user's full rights (an explicit choice).
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::Off => "off",
        }
    }
}

/// `--sandbox` and `[sandbox]` of config.toml.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// Whether commands may use the network (loopback included).
    pub network: bool,
    /// Absolute folders commands may write besides the workspace (in
    /// `workspace-write` only).
    pub writable_roots: Vec<PathBuf>,
    /// Environment variables withheld besides `WITHHELD_ENV`.
    pub scrub_env: Vec<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            mode: SandboxMode::WorkspaceWrite,
            network: false,
            writable_roots: Vec::new(),
            scrub_env: Vec::new(),
        }
    }
}

/// What a client is told of the sandbox in force (`GET /host`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxFacts {
    pub mode: SandboxMode,
    pub network: bool,
    /// The kernel's Landlock ABI (0 with the sandbox off).
    pub landlock_abi: i32,
    pub writable_roots: Vec<PathBuf>,
}

/// The sandbox of one server, checked against the kernel at startup.
pub struct Sandbox {
    cfg: SandboxConfig,
    /// Folders no command may read (vak's home), canonical.
    hidden: Vec<PathBuf>,
    landlock_abi: i32,
    /// The compiled seccomp program when the network is off.
    seccomp: Option<Arc<seccompiler::BpfProgram>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("cfg", &self.cfg)
            .field("hidden", &self.hidden)
            .field("landlock_abi", &self.landlock_abi)
            .finish()
    }
}

/// A command made ready to run sandboxed; keep it until the command is
/// spawned (the ruleset) and has ended (its temporary directory, removed
/// on drop).
#[derive(Default)]
pub struct Prepared {
    _ruleset: Option<OwnedFd>,
    tmp: Option<PathBuf>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            // Small and private; a command's leftovers go with it.
            let _ = std::fs::remove_dir_all(tmp);
        }
    }
}

impl Sandbox {
    /// No sandbox.
    pub fn off() -> Sandbox {
        Sandbox {
            cfg: SandboxConfig {
                mode: SandboxMode::Off,
                ..SandboxConfig::default()
            },
            hidden: Vec::new(),
            landlock_abi: 0,
            seccomp: None,
        }
    }

    /// The sandbox `cfg` asks for, hiding `home`; an error naming what the
    /// kernel lacks when it cannot be had (never a silent downgrade).
    /// Blocking: runs one probe command.
    pub fn new(cfg: &SandboxConfig, home: &Path) -> Result<Sandbox> {
        if cfg.mode == SandboxMode::Off {
            return Ok(Sandbox {
                cfg: cfg.clone(),
                ..Sandbox::off()
            });
        }
        for root in &cfg.writable_roots {
            if !root.is_absolute() || !root.is_dir() {
                return Err(Error::invalid(format!(
                    "[sandbox] writable_roots: {} is not an absolute path to a folder",
                    root.display()
                )));
            }
        }
        let abi = kernel_abi();
        require_landlock(abi, cfg.mode)?;
        let seccomp = if cfg.network {
            None
        } else {
            Some(Arc::new(network_filter().map_err(|e| {
                Error::invalid(format!(
                    "the sandbox cannot turn the network off: {e}; set [sandbox] network = true, or run with --sandbox off"
                ))
            })?))
        };
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let sandbox = Sandbox {
            cfg: SandboxConfig {
                writable_roots: cfg.writable_roots.iter().map(|p| canonical(p)).collect(),
                ..cfg.clone()
            },
            hidden: vec![canonical(home)],
            landlock_abi: abi,
            seccomp,
        };
        sandbox.probe()?;
        Ok(sandbox)
    }

    /// Runs `true` in the sandbox once, so a kernel or container that
    /// refuses part of it fails the start, not every command.
    fn probe(&self) -> Result<()> {
        let dir = std::env::temp_dir();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg("exit 0").current_dir(&dir);
        let fail = |why: String| {
            Error::invalid(format!(
                "the sandbox --sandbox {} does not work here: {why}; run with --sandbox off to run the agent's commands with the server user's full rights",
                self.cfg.mode.as_str()
            ))
        };
        let _prepared = self.prepare(&mut cmd, &dir).map_err(fail)?;
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(fail(format!("a probe command ended with {s}"))),
            Err(e) => Err(fail(format!("a probe command could not start: {e}"))),
        }
    }

    pub fn mode(&self) -> SandboxMode {
        self.cfg.mode
    }

    pub fn facts(&self) -> SandboxFacts {
        SandboxFacts {
            mode: self.cfg.mode,
            network: self.cfg.mode == SandboxMode::Off || self.cfg.network,
            landlock_abi: self.landlock_abi,
            writable_roots: self.cfg.writable_roots.clone(),
        }
    }

    /// Readies `cmd` to run in `workspace` in this sandbox: the withheld
    /// variables removed, `TMPDIR` a new private directory, and the
    /// restrictions applied in the child before exec. Blocking (it makes
    /// the directory and opens every folder a rule names): call it off the
    /// runtime. The error says why the command cannot run.
    pub fn prepare(
        &self,
        cmd: &mut std::process::Command,
        workspace: &Path,
    ) -> std::result::Result<Prepared, String> {
        for k in WITHHELD_ENV {
            cmd.env_remove(k);
        }
        for k in &self.cfg.scrub_env {
            cmd.env_remove(k);
        }
        if self.cfg.mode == SandboxMode::Off {
            return Ok(Prepared::default());
        }
        let mut prepared = Prepared::default();
        if self.cfg.mode == SandboxMode::WorkspaceWrite {
            let tmp =
                private_tmp().map_err(|e| format!("[sandbox: cannot make a temporary directory: {e}]"))?;
            cmd.env("TMPDIR", &tmp);
            prepared.tmp = Some(tmp);
        }
        let ruleset = self
            .ruleset(workspace, prepared.tmp.as_deref())
            .map_err(|e| format!("[sandbox: cannot build the sandbox: {e}]"))?;
        let fd = ruleset.as_raw_fd();
        prepared._ruleset = Some(ruleset);
        let seccomp = self.seccomp.clone();
        let restrict = move || -> std::io::Result<()> {
            // Between fork and exec: system calls only, nothing allocated.
            // SAFETY: plain system calls on a descriptor the parent keeps
            // open until the child has exec'd.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(program) = &seccomp {
                seccompiler::apply_filter(program).map_err(|e| match e {
                    seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
                    _ => std::io::Error::from_raw_os_error(libc::EINVAL),
                })?;
            }
            Ok(())
        };
        use std::os::unix::process::CommandExt;
        // SAFETY: `restrict` makes system calls only (see above).
        unsafe { cmd.pre_exec(restrict) };
        Ok(prepared)
    }

    /// The Landlock ruleset of one command.
    fn ruleset(&self, workspace: &Path, tmp: Option<&Path>) -> std::result::Result<OwnedFd, String> {
        let all = AccessFs::from_all(TARGET_ABI);
        let read = AccessFs::from_read(TARGET_ABI);
        let err = |e: landlock::RulesetError| e.to_string();
        // Best effort (the default): an older kernel handles the rights it
        // knows; `new` refused one older than MIN_LANDLOCK_ABI.
        let mut ruleset = Ruleset::default().handle_access(all).map_err(err)?;
        if !self.cfg.network {
            ruleset = ruleset
                .handle_access(AccessNet::from_all(TARGET_ABI))
                .map_err(err)?;
        }
        let mut created = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(err)?
            .create()
            .map_err(err)?;
        let mut grants: Vec<(PathBuf, landlock::BitFlags<AccessFs>)> = Vec::new();
        let mut budget = MAX_RULES;
        for p in beside(Path::new("/"), &self.hidden, &mut budget)? {
            grants.push((p, read));
        }
        if self.cfg.mode == SandboxMode::WorkspaceWrite {
            let ws = std::fs::canonicalize(workspace).map_err(|e| format!("the workspace: {e}"))?;
            let roots = std::iter::once(ws)
                .chain(tmp.map(Path::to_path_buf))
                .chain(self.cfg.writable_roots.iter().cloned());
            for root in roots {
                for p in beside(&root, &self.hidden, &mut budget)? {
                    grants.push((p, all));
                }
            }
        }
        for dev in ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"] {
            grants.push((PathBuf::from(dev), AccessFs::from_file(TARGET_ABI)));
        }
        for (path, access) in grants {
            let Some((fd, is_dir)) = open_path(&path) else {
                continue;
            };
            // A rule on a file takes only the rights a file can have.
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(TARGET_ABI)
            };
            created = created.add_rule(PathBeneath::new(fd, access)).map_err(err)?;
        }
        Option::<OwnedFd>::from(created).ok_or_else(|| "Landlock made no ruleset".to_string())
    }

    /// A note for a failed command's output when the sandbox is the likely
    /// cause (it can only be told from what the command printed).
    pub fn explain(&self, output: &str) -> Option<&'static str> {
        if self.cfg.mode == SandboxMode::Off {
            return None;
        }
        let denied =
            |line: &str| line.contains("Permission denied") || line.contains("Read-only file system");
        for line in output.lines() {
            if denied(line) && self.hidden.iter().any(|h| line.contains(&*h.to_string_lossy())) {
                return Some("[sandbox: vak's home is not readable]");
            }
        }
        if output.lines().any(denied) {
            return Some(match self.cfg.mode {
                SandboxMode::ReadOnly => "[sandbox: read-only: every write is denied]",
                _ => "[sandbox: write outside the workspace denied]",
            });
        }
        // EPERM alone is many things (chmod, kill); it is the sandbox's
        // network rule only where the output is about a socket.
        let network = ["Couldn't connect", "Network is unreachable"];
        let socket_eperm = output.contains("Operation not permitted")
            && (output.contains("socket") || output.contains("connect"));
        if !self.cfg.network
            && (socket_eperm || output.lines().any(|l| network.iter().any(|n| l.contains(n))))
        {
            return Some("[sandbox: network access denied]");
        }
        None
    }
}

/// An error naming what the kernel lacks when its Landlock ABI `abi`
/// cannot give the sandbox `mode`.
fn require_landlock(abi: i32, mode: SandboxMode) -> Result<()> {
    if abi >= MIN_LANDLOCK_ABI {
        return Ok(());
    }
    let what = if abi <= 0 {
        "this kernel has no Landlock (it needs Linux 6.2 or later with landlock in the lsm= list)".to_string()
    } else {
        format!(
            "this kernel's Landlock is ABI {abi}, and vak needs ABI {MIN_LANDLOCK_ABI} (Linux 6.2) or later"
        )
    };
    Err(Error::invalid(format!(
        "the sandbox --sandbox {} cannot be had: {what}; run with --sandbox off to run the agent's commands with the server user's full rights",
        mode.as_str()
    )))
}

/// The kernel's Landlock ABI version; 0 or less without Landlock.
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: asks for the version only; no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0)
}

/// The folders and files to grant so that all of `root` is covered but the
/// `hidden` folders beneath it: `root` itself when none is, else its
/// entries, each the same way (symbolic links skipped).
fn beside(root: &Path, hidden: &[PathBuf], budget: &mut usize) -> std::result::Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        if hidden.contains(&p) {
            continue;
        }
        if !hidden.iter().any(|h| h.starts_with(&p)) {
            if *budget == 0 {
                return Err(format!(
                    "more than {MAX_RULES} rules (too many entries beside vak's home)"
                ));
            }
            *budget -= 1;
            out.push(p);
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| !t.is_symlink()) {
                todo.push(e.path());
            }
        }
    }
    Ok(out)
}

/// `path` opened for a rule without following a final symbolic link, and
/// whether it is a folder; None when it is gone or is a link.
fn open_path(path: &Path) -> Option<(OwnedFd, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if meta.file_type().is_symlink() {
        return None;
    }
    Some((OwnedFd::from(file), meta.is_dir()))
}

/// A new owner-only directory under the system's temporary directory.
fn private_tmp() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("vak-sandbox-{}", uuid::Uuid::new_v4().simple()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// The seccomp program of a command without network: `socket` and
/// `socketpair` of any family but `AF_UNIX`, and `io_uring_setup`, fail
/// with EPERM; everything else is allowed.
fn network_filter() -> std::result::Result<seccompiler::BpfProgram, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|_| format!("seccomp filters are not supported on {}", std::env::consts::ARCH))?;
    let e = |e: seccompiler::BackendError| e.to_string();
    let not_unix = || -> std::result::Result<Vec<SeccompRule>, String> {
        let c = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::AF_UNIX as u64)
            .map_err(e)?;
        Ok(vec![SeccompRule::new(vec![c]).map_err(e)?])
    };
    let rules = [
        (libc::SYS_socket, not_unix()?),
        (libc::SYS_socketpair, not_unix()?),
        (libc::SYS_io_uring_setup, Vec::new()),
    ]
    .into_iter()
    .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(e)?;
    filter.try_into().map_err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beside_grants_everything_but_the_hidden_folder_and_skips_links() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in ["a/home/secrets", "a/b", "c"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("a/f.txt"), "x").unwrap();
        std::os::unix::fs::symlink(r.join("a/home"), r.join("a/link-to-home")).unwrap();
        let hidden = vec![r.join("a/home")];
        let mut budget = MAX_RULES;
        let mut got = beside(r, &hidden, &mut budget).unwrap();
        got.sort();
        assert_eq!(got, vec![r.join("a/b"), r.join("a/f.txt"), r.join("c")]);
        // Nothing hidden beneath: the root itself, one rule.
        assert_eq!(
            beside(&r.join("c"), &hidden, &mut budget).unwrap(),
            vec![r.join("c")]
        );
        // The hidden folder itself: nothing.
        assert!(beside(&r.join("a/home"), &hidden, &mut budget)
            .unwrap()
            .is_empty());
        let mut tiny = 1;
        assert!(beside(r, &hidden, &mut tiny).unwrap_err().contains("more than"));
    }

    #[test]
    fn a_kernel_without_landlock_fails_the_start_naming_the_opt_out() {
        for abi in [-1, 0, 1, 2] {
            let e = require_landlock(abi, SandboxMode::WorkspaceWrite).unwrap_err();
            assert!(
                e.message.contains("--sandbox workspace-write cannot be had"),
                "{}",
                e.message
            );
            assert!(e.message.contains("run with --sandbox off"), "{}", e.message);
        }
        assert!(require_landlock(0, SandboxMode::ReadOnly)
            .unwrap_err()
            .message
            .contains("this kernel has no Landlock"));
        assert!(require_landlock(3, SandboxMode::WorkspaceWrite).is_ok());
        // And this machine's kernel gives it (CI runs here).
        assert!(kernel_abi() >= MIN_LANDLOCK_ABI, "Landlock ABI {}", kernel_abi());
    }

    #[test]
    fn a_note_names_what_the_sandbox_likely_refused() {
        let sb = |mode, network| Sandbox {
            cfg: SandboxConfig {
                mode,
                network,
                ..SandboxConfig::default()
            },
            hidden: vec![PathBuf::from("/h/vak")],
            landlock_abi: 6,
            seccomp: None,
        };
        let ww = sb(SandboxMode::WorkspaceWrite, false);
        assert_eq!(
            ww.explain("touch: cannot touch '/x': Permission denied"),
            Some("[sandbox: write outside the workspace denied]")
        );
        assert_eq!(
            ww.explain("cat: /h/vak/token: Permission denied"),
            Some("[sandbox: vak's home is not readable]")
        );
        assert_eq!(
            ww.explain("curl: (7) Couldn't connect to server"),
            Some("[sandbox: network access denied]")
        );
        assert_eq!(ww.explain("error: 3 tests failed"), None);
        assert_eq!(
            ww.explain("PermissionError: [Errno 1] Operation not permitted (socket.socket)"),
            Some("[sandbox: network access denied]")
        );
        assert_eq!(
            ww.explain("chmod: changing permissions of 'x': Operation not permitted"),
            None
        );
        assert_eq!(
            sb(SandboxMode::WorkspaceWrite, true).explain("Couldn't connect"),
            None
        );
        assert_eq!(
            sb(SandboxMode::ReadOnly, false).explain("sh: 1: cannot create b.txt: Permission denied"),
            Some("[sandbox: read-only: every write is denied]")
        );
        assert_eq!(sb(SandboxMode::Off, false).explain("Permission denied"), None);
    }
}
