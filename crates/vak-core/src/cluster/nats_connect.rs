//! How `--bus` reaches NATS: the servers of its URL (credentials taken out of it), the credentials (URL, flags, a creds file or an NKey seed), TLS, and the URL as shown, with its secret redacted.
//!
//! async-nats reads no credentials from a URL, so they are taken out here
//! and given to it as options; the servers it is handed carry no user info,
//! so nothing it logs (reconnects, discovered servers) can show a secret.
//! Every place vak shows the bus shows `BusTarget::shown` (or `redact`).

use crate::error::{Error, ErrorKind, Result};
use crate::provider::Secret;
use async_nats::{ConnectErrorKind, ConnectOptions, ServerAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What stands for a password or token wherever the bus URL is shown.
pub const REDACTED: &str = "***";

/// The credential and TLS flags of `vak serve` (`--bus-user`, …), as given.
#[derive(Clone, Debug, Default)]
pub struct BusFlags {
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub token: Option<Secret>,
    pub creds: Option<PathBuf>,
    pub nkey: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// How vak proves who it is to NATS.
#[derive(Debug)]
pub enum Credentials {
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A `.creds` file (a user JWT and its NKey seed).
    CredsFile(PathBuf),
    /// An NKey seed, read from its file.
    NKey(Secret),
}

impl Credentials {
    /// The name a startup line shows (never the secret).
    pub fn describe(&self) -> String {
        match self {
            Credentials::None => "no credentials".into(),
            Credentials::UserPassword { user, .. } => format!("user {user}"),
            Credentials::Token(_) => "a token".into(),
            Credentials::CredsFile(p) => format!("credentials file {}", p.display()),
            Credentials::NKey(_) => "an NKey".into(),
        }
    }
}

/// Where and how to connect: made once at startup from `--bus` and its flags.
#[derive(Debug)]
pub struct BusTarget {
    servers: Vec<ServerAddr>,
    shown: String,
    credentials: Credentials,
    tls_ca: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    /// Any TLS flag asks for TLS on every server (a `tls://` URL on its own).
    require_tls: bool,
}

/// `s` percent-decoded (a URL's user info is encoded).
fn decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// One server of `--bus` as shown: the password (or a token) replaced by
/// `***`. What does not parse as a URL keeps only what follows its last `@`.
fn redact_one(u: &str) -> String {
    let u = u.trim();
    match u.parse::<ServerAddr>() {
        Ok(addr) => {
            let mut url = addr.into_inner();
            if url.password().is_some() {
                let _ = url.set_password(Some(REDACTED));
            } else if !url.username().is_empty() {
                let _ = url.set_username(REDACTED);
            }
            let s = url.to_string();
            // A URL may gain a `/` path; it is not part of the address.
            s.strip_suffix('/').map(str::to_string).unwrap_or(s)
        }
        Err(_) => match u.rfind('@') {
            Some(at) => format!("{REDACTED}@{}", &u[at + 1..]),
            None => u.to_string(),
        },
    }
}

/// `--bus` as it may be shown: every server's password or token redacted.
pub fn redact(url: &str) -> String {
    url.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

/// A file holding a secret (a creds file, an NKey seed) must be its owner's
/// alone, as `--bus-secret-file`; read at startup.
fn read_private(flag: &str, path: &Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| Error::invalid(format!("{flag} {shown}: {e}")))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(Error::invalid(format!(
            "{flag} {shown}: other users may read it; make it owner-only (chmod 600)"
        )));
    }
    std::fs::read_to_string(path).map_err(|e| Error::invalid(format!("{flag} {shown}: {e}")))
}

fn readable(flag: &str, path: &Path) -> Result<()> {
    std::fs::metadata(path)
        .map(|_| ())
        .map_err(|e| Error::invalid(format!("{flag} {}: {e}", path.display())))
}

impl BusTarget {
    /// From `--bus` (one or several comma-separated URLs) and the flags.
    /// Credentials come from the URL or from flags, one kind of them only.
    pub fn new(url: &str, flags: &BusFlags) -> Result<BusTarget> {
        let shown = redact(url);
        let mut servers = Vec::new();
        // The user info of the URLs: every URL that carries one carries the same.
        let mut in_url: Option<(String, Option<String>)> = None;
        for u in url.split(',') {
            let u = u.trim();
            let mut addr = u
                .parse::<ServerAddr>()
                .map_err(|e| Error::invalid(format!("--bus {}: {e}", redact_one(u))))?
                .into_inner();
            if !addr.username().is_empty() || addr.password().is_some() {
                let info = (decoded(addr.username()), addr.password().map(decoded));
                if in_url.as_ref().is_some_and(|seen| *seen != info) {
                    return Err(Error::invalid(format!(
                        "--bus {shown}: its URLs carry different credentials; give one set (in every URL or in flags)"
                    )));
                }
                in_url = Some(info);
                let _ = addr.set_username("");
                let _ = addr.set_password(None);
            }
            servers.push(
                ServerAddr::from_url(addr)
                    .map_err(|e| Error::invalid(format!("--bus {}: {e}", redact_one(u))))?,
            );
        }
        let from_flags = [
            flags.user.is_some() || flags.password.is_some(),
            flags.token.is_some(),
            flags.creds.is_some(),
            flags.nkey.is_some(),
        ];
        if from_flags.iter().filter(|&&b| b).count() > 1 {
            return Err(Error::invalid(
                "give NATS one kind of credentials: --bus-user/--bus-password, --bus-token, --bus-creds or --bus-nkey",
            ));
        }
        if in_url.is_some() && from_flags.iter().any(|&b| b) {
            return Err(Error::invalid(format!(
                "--bus {shown} carries credentials and a --bus-user, --bus-password, --bus-token, --bus-creds or \
                 --bus-nkey flag (or its VAK_BUS_* variable) gives more: give them once"
            )));
        }
        let credentials = match (in_url, flags) {
            (Some((token, None)), _) => Credentials::Token(Secret::new(token)),
            (Some((user, Some(password))), _) => Credentials::UserPassword {
                user,
                password: Secret::new(password),
            },
            (None, f) if f.user.is_some() || f.password.is_some() => {
                match (&f.user, &f.password) {
                    (Some(user), Some(password)) => Credentials::UserPassword {
                        user: user.clone(),
                        password: password.clone(),
                    },
                    _ => return Err(Error::invalid(
                        "--bus-user and --bus-password (or VAK_BUS_USER and VAK_BUS_PASSWORD) go together",
                    )),
                }
            }
            (None, BusFlags { token: Some(t), .. }) => Credentials::Token(t.clone()),
            (None, BusFlags { creds: Some(p), .. }) => {
                // Checked now, so a bad file is a startup error naming the flag.
                read_private("--bus-creds", p)?;
                Credentials::CredsFile(p.clone())
            }
            (None, BusFlags { nkey: Some(p), .. }) => {
                let seed = read_private("--bus-nkey", p)?.trim().to_string();
                // A user seed is `SU…`; anything else is not what NATS takes from a client.
                if !seed.starts_with("SU") {
                    return Err(Error::invalid(format!(
                        "--bus-nkey {}: the file does not hold a user NKey seed (`SU…`, as `nk -gen user` writes)",
                        p.display()
                    )));
                }
                Credentials::NKey(Secret::new(seed))
            }
            (None, _) => Credentials::None,
        };
        let client_cert = match (&flags.tls_cert, &flags.tls_key) {
            (Some(c), Some(k)) => {
                readable("--bus-tls-cert", c)?;
                readable("--bus-tls-key", k)?;
                Some((c.clone(), k.clone()))
            }
            (None, None) => None,
            _ => return Err(Error::invalid("--bus-tls-cert and --bus-tls-key go together")),
        };
        if let Some(ca) = &flags.tls_ca {
            readable("--bus-tls-ca", ca)?;
        }
        Ok(BusTarget {
            servers,
            shown,
            credentials,
            tls_ca: flags.tls_ca.clone(),
            require_tls: flags.tls_ca.is_some() || client_cert.is_some(),
            client_cert,
        })
    }

    /// The URL as vak shows it (passwords and tokens redacted).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// How vak authenticates, as a startup line names it.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Whether every connection is TLS.
    pub fn tls(&self) -> bool {
        self.require_tls || self.servers.iter().all(|s| s.tls_required())
    }

    async fn options(&self) -> Result<ConnectOptions> {
        let mut o = ConnectOptions::new().connection_timeout(Duration::from_secs(10));
        o = match &self.credentials {
            Credentials::None => o,
            Credentials::UserPassword { user, password } => {
                o.user_and_password(user.clone(), password.expose().to_string())
            }
            Credentials::Token(t) => o.token(t.expose().to_string()),
            Credentials::CredsFile(p) => o.credentials_file(p).await.map_err(|e| {
                Error::invalid(format!(
                    "--bus-creds {}: not a NATS credentials file: {e}",
                    p.display()
                ))
            })?,
            Credentials::NKey(seed) => o.nkey(seed.expose().to_string()),
        };
        if let Some(ca) = &self.tls_ca {
            o = o.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.client_cert {
            o = o.add_client_certificate(cert.clone(), key.clone());
        }
        if self.require_tls {
            o = o.require_tls(true);
        }
        Ok(o)
    }

    /// Connects, or says why not: the server's reason (`authorization
    /// violation`, a TLS failure) and the URL with its secret redacted.
    pub async fn connect(&self) -> Result<async_nats::Client> {
        let options = self.options().await?;
        options.connect(self.servers.clone()).await.map_err(|e| {
            let failure = Failure::of(&e);
            let (kind, reason) = match failure {
                Failure::Authorization => (
                    ErrorKind::PermissionDenied,
                    match &self.credentials {
                        Credentials::None => format!(
                            "{e} (the server asks for credentials and none were given: put them in the \
                             --bus URL, or give --bus-user/--bus-password, --bus-token, --bus-creds or --bus-nkey)"
                        ),
                        c => format!(
                            "{e} (NATS refused {}: check --bus-user/--bus-password, --bus-token, --bus-creds or --bus-nkey)",
                            c.describe()
                        ),
                    },
                ),
                Failure::Tls => (
                    ErrorKind::Unavailable,
                    format!("TLS: {e} (check --bus-tls-ca, --bus-tls-cert and --bus-tls-key)"),
                ),
                Failure::Unreachable => (ErrorKind::Unavailable, e.to_string()),
            };
            Error::new(kind, format!("cannot connect to NATS at {}: {reason}", self.shown))
                .with_reason(failure.reason())
        })
    }
}

/// Why a connect failed, as a startup error names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// The server refused the credentials (or there were none).
    Authorization,
    /// The TLS handshake failed (an unknown CA, no client certificate).
    Tls,
    /// Anything else: no server answered, DNS, a timeout.
    Unreachable,
}

impl Failure {
    fn of(e: &async_nats::ConnectError) -> Failure {
        match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                Failure::Authorization
            }
            ConnectErrorKind::Tls => Failure::Tls,
            // async-nats passes a failed handshake on as an IO error around rustls' own.
            _ if rustls_within(e) => Failure::Tls,
            _ => Failure::Unreachable,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Failure::Authorization => "nats_authorization",
            Failure::Tls => "nats_tls",
            Failure::Unreachable => "nats_unreachable",
        }
    }
}

/// Whether a rustls error is in `e`'s chain (an `io::Error` hides the error
/// it wraps from `source()`, so each one is opened).
fn rustls_within(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(err) = at {
        if err.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            if rustls_within(inner) {
                return true;
            }
        }
        at = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_bus_url_never_carries_its_password_or_token() {
        assert_eq!(
            redact("nats://vak:s3cr%40t@127.0.0.1:4222"),
            "nats://vak:***@127.0.0.1:4222"
        );
        assert_eq!(redact("nats://tok-123@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("tls://u:p@a:1, nats://b:2"), "tls://u:***@a:1,nats://b:2");
        assert_eq!(redact("u:p@host:4222"), "nats://u:***@host:4222");
        assert_eq!(redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        // Not a URL: what precedes the last `@` is dropped whole.
        assert_eq!(redact("nats://u:p w@[bad"), "***@[bad");
    }

    #[test]
    fn credentials_come_from_the_url_or_flags_decoded_and_once() {
        let t = BusTarget::new(
            "nats://vak:s3cr%40t@127.0.0.1:4222,nats://vak:s3cr%40t@127.0.0.1:4223",
            &BusFlags::default(),
        )
        .unwrap();
        match t.credentials() {
            Credentials::UserPassword { user, password } => {
                assert_eq!((user.as_str(), password.expose()), ("vak", "s3cr@t"))
            }
            c => panic!("{c:?}"),
        }
        // The servers handed to async-nats carry no user info.
        assert!(t
            .servers
            .iter()
            .all(|s| !s.has_user_pass() && s.password().is_none()));
        assert_eq!(
            t.shown(),
            "nats://vak:***@127.0.0.1:4222,nats://vak:***@127.0.0.1:4223"
        );
        let t = BusTarget::new("nats://tok@h", &BusFlags::default()).unwrap();
        assert!(matches!(t.credentials(), Credentials::Token(s) if s.expose() == "tok"));

        let e = BusTarget::new("nats://a:b@h:1,nats://a:c@h:2", &BusFlags::default()).unwrap_err();
        assert!(
            e.message.contains("different credentials") && !e.message.contains(":b@"),
            "{e}"
        );
        let token = BusFlags {
            token: Some(Secret::new("t".into())),
            ..Default::default()
        };
        let e = BusTarget::new("nats://a:hunter2@h:1", &token).unwrap_err();
        assert!(
            e.message.contains("give them once") && !e.message.contains("hunter2"),
            "{e}"
        );
        let both = BusFlags {
            user: Some("u".into()),
            password: Some(Secret::new("p".into())),
            ..token.clone()
        };
        assert!(BusTarget::new("nats://h:1", &both)
            .unwrap_err()
            .message
            .contains("one kind"));
        let half = BusFlags {
            user: Some("u".into()),
            ..Default::default()
        };
        assert!(BusTarget::new("nats://h:1", &half)
            .unwrap_err()
            .message
            .contains("go together"));
        let e = BusTarget::new("nats://u:hunter2@[bad", &BusFlags::default()).unwrap_err();
        assert!(!e.message.contains("hunter2"), "{e}");
    }

    #[test]
    fn a_seed_file_must_be_private_and_hold_a_user_seed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed");
        std::fs::write(&path, "SUAPRIVATE\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let flags = BusFlags {
            nkey: Some(path.clone()),
            ..Default::default()
        };
        let e = BusTarget::new("nats://h:1", &flags).unwrap_err();
        assert!(
            e.message.contains("chmod 600") && !e.message.contains("SUAPRIVATE"),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            BusTarget::new("nats://h:1", &flags).unwrap().credentials(),
            Credentials::NKey(s) if s.expose() == "SUAPRIVATE"
        ));
        std::fs::write(&path, "UABCDEF").unwrap();
        let e = BusTarget::new("nats://h:1", &flags).unwrap_err();
        assert!(e.message.contains("user NKey seed"), "{e}");
    }
}
