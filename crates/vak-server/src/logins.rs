//! Browser logins that outlive a restart: a bounded table of cookie id, session key and expiry, kept in the home as hashes (the file alone logs no one in) and rewritten whole, atomically, on every login and logout.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use vak_core::file_owner::FileOwner;

/// Compares in time that depends only on the lengths, never on where the bytes differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Browser logins a server keeps at once; the oldest go first.
pub(crate) const MAX_LOGINS: usize = 10_000;
/// The store's file in the home.
pub(crate) const FILE: &str = "logins.json";

/// One login, as kept: hashes of what the browser holds.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Entry {
    /// SHA-256 of the session key (hex).
    key: String,
    /// Unix seconds.
    expires: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    /// SHA-256 of the token the logins were granted by: another token (a
    /// `--token` changed, a rotated home token) ends them all.
    token: String,
    /// SHA-256 of the cookie id (hex) -> its entry.
    logins: HashMap<String, Entry>,
}

pub(crate) struct Logins {
    table: Arc<Mutex<HashMap<String, Entry>>>,
    /// The one writer of `<home>/logins.json` (None keeps logins in memory
    /// only). Each rewrite copies the table when it runs, in turn, so the
    /// last change is always the last written (a logout is never
    /// overwritten by an older login's table).
    file: Option<FileOwner<Store>>,
}

/// What the owner of the logins file holds.
struct Store {
    path: PathBuf,
    token: String,
    table: Arc<Mutex<HashMap<String, Entry>>>,
}

fn sha256_hex(s: &str) -> String {
    vak_core::host::files::sha256_hex(s.as_bytes())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Logins {
    /// The logins kept at `path` for `token` (at startup: a blocking read of
    /// a small file). A missing file, another token's or one that does not
    /// parse starts empty; the last is logged.
    pub(crate) fn load(path: Option<PathBuf>, token: &str) -> Arc<Logins> {
        let token = sha256_hex(token);
        let mut table = HashMap::new();
        if let Some(p) = &path {
            match std::fs::read(p) {
                Ok(bytes) => match serde_json::from_slice::<Stored>(&bytes) {
                    Ok(s) if s.token == token => {
                        let t = now();
                        table = s
                            .logins
                            .into_iter()
                            .filter(|(_, e)| e.expires > t)
                            .take(MAX_LOGINS)
                            .collect();
                    }
                    Ok(_) => tracing::info!(
                        "{}: granted by another token; every browser logs in again",
                        p.display()
                    ),
                    Err(e) => tracing::warn!("{}: {e}; every browser logs in again", p.display()),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot read {}: {e}; every browser logs in again", p.display()),
            }
        }
        let table = Arc::new(Mutex::new(table));
        let file = path.map(|path| {
            FileOwner::new(
                "the logins file",
                Store {
                    path,
                    token,
                    table: table.clone(),
                },
            )
        });
        Arc::new(Logins { table, file })
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        lock(&self.table)
    }

    /// Whether `id` is a live login whose key is `key`.
    pub(crate) fn check(&self, id: &str, key: &str) -> bool {
        let (id, key) = (sha256_hex(id), sha256_hex(key.trim()));
        let t = now();
        // Hashes compared in constant time; the map is walked whole.
        self.table().iter().any(|(k, e)| {
            constant_time_eq(k.as_bytes(), id.as_bytes()) & constant_time_eq(e.key.as_bytes(), key.as_bytes())
                && e.expires > t
        })
    }

    /// A new login living `ttl`: its cookie id and session key. Kept before
    /// it is answered.
    pub(crate) async fn add(&self, ttl: Duration) -> (String, String) {
        let random = || {
            format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            )
        };
        let (id, key) = (random(), random());
        {
            let mut table = self.table();
            let t = now();
            table.retain(|_, e| e.expires > t);
            if table.len() >= MAX_LOGINS {
                if let Some(oldest) = table
                    .iter()
                    .min_by_key(|(_, e)| e.expires)
                    .map(|(k, _)| k.clone())
                {
                    table.remove(&oldest);
                }
            }
            table.insert(
                sha256_hex(&id),
                Entry {
                    key: sha256_hex(&key),
                    expires: t + ttl.as_secs(),
                },
            );
        }
        self.persist().await;
        (id, key)
    }

    /// Ends the login of cookie `id` (here and in the store).
    pub(crate) async fn remove(&self, id: &str) {
        if self.table().remove(&sha256_hex(id)).is_some() {
            self.persist().await;
        }
    }

    /// Has the store rewritten by its owner, from the table as it is when
    /// the rewrite runs. A failure is logged: the logins still work until
    /// the server stops.
    async fn persist(&self) {
        let Some(file) = &self.file else {
            return;
        };
        if let Err(e) = file.change(|store| Box::pin(store.write())).await {
            tracing::warn!("{e}; logins made now end when the server stops");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Rewrites the file from the table as it is now, off the runtime (on
    /// the owner's task: one rewrite at a time).
    async fn write(&mut self) {
        let stored = Stored {
            token: self.token.clone(),
            logins: lock(&self.table).clone(),
        };
        let bytes = match serde_json::to_vec(&stored) {
            Ok(b) => b,
            Err(e) => return tracing::warn!("cannot encode the logins: {e}"),
        };
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || {
            let dir = path.parent().map(PathBuf::from).unwrap_or_default();
            vak_core::home::write_private_file(&dir, FILE, &bytes)
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("{e}; logins made now end when the server stops"),
            Err(e) => tracing::warn!("the logins' writer failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn logins_outlive_a_restart_as_hashes_and_end_with_a_logout_or_another_token() {
        let home = tempfile::tempdir().unwrap();
        let path = Some(home.path().join(FILE));
        let a = Logins::load(path.clone(), "tok");
        let (id, key) = a.add(Duration::from_secs(60)).await;
        let (gone, gone_key) = a.add(Duration::from_secs(60)).await;
        a.remove(&gone).await;
        assert!(a.check(&id, &key) && !a.check(&id, &gone_key) && !a.check(&gone, &gone_key));

        let text = std::fs::read_to_string(home.path().join(FILE)).unwrap();
        assert!(
            !text.contains(&id) && !text.contains(&key),
            "only hashes are kept: {text}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.path().join(FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);

        let b = Logins::load(path.clone(), "tok");
        assert!(b.check(&id, &key), "kept across a restart");
        assert!(!b.check(&gone, &gone_key), "a logout stays a logout");
        assert!(!b.check(&id, "another key"));
        let c = Logins::load(path.clone(), "another token");
        assert!(!c.check(&id, &key), "another token ends every login");
        std::fs::write(home.path().join(FILE), "{not json").unwrap();
        assert!(
            !Logins::load(path, "tok").check(&id, &key),
            "a damaged store starts empty"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_logins_and_logouts_are_all_in_the_store() {
        let home = tempfile::tempdir().unwrap();
        let path = Some(home.path().join(FILE));
        let a = Logins::load(path.clone(), "tok");
        let adds: Vec<_> = (0..40)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.add(Duration::from_secs(60)).await })
            })
            .collect();
        let mut all = Vec::new();
        for t in adds {
            all.push(t.await.unwrap());
        }
        let (kept, gone) = all.split_at(20);
        let removes: Vec<_> = gone
            .iter()
            .map(|(id, _)| {
                let (a, id) = (a.clone(), id.clone());
                tokio::spawn(async move { a.remove(&id).await })
            })
            .collect();
        for t in removes {
            t.await.unwrap();
        }
        let b = Logins::load(path, "tok");
        assert!(
            kept.iter().all(|(id, key)| b.check(id, key)),
            "every login is kept"
        );
        assert!(
            !gone.iter().any(|(id, key)| b.check(id, key)),
            "every logout stays a logout"
        );
    }
}
