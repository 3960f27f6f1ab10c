//! The key store: provider API keys kept in the home encrypted at rest (`secrets/keys.enc`, ChaCha20-Poly1305 under a random master key in `secrets/master.key`), never in plaintext in any file.
//!
//! There is no OS keychain on a headless Linux server (the Secret Service
//! needs a D-Bus session), so this is the fallback the spec allows and the
//! only store this version has. Both files are 0600 in a 0700 directory and
//! are replaced atomically (temporary file, then rename). The master key
//! sits beside the ciphertext: the encryption keeps keys out of backups,
//! greps and editors that open the home, not from someone who can read the
//! user's files.
//!
//! Reads are served from memory (loaded once when the server starts); every
//! change rewrites the file on a blocking thread, from the store's owner
//! task (`file_owner.rs`): one change at a time, no lock held across the write.

use crate::error::{Error, Result};
use crate::file_owner::FileOwner;
use crate::provider::{ProviderKind, Secret};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The longest key accepted (real keys are under 256 bytes).
pub(crate) const MAX_KEY_BYTES: usize = 4096;

const MAGIC: &[u8] = b"VAKKEYS1";
const AAD: &[u8] = b"vak key store v1";

/// The store of one home.
pub(crate) struct SecretStore {
    keys: Keys,
    /// The one writer of `keys.enc`: every change runs on its task, in turn.
    file: FileOwner<KeyFile>,
}

type Keys = Arc<Mutex<BTreeMap<&'static str, Secret>>>;

/// What the key file's owner holds: the folder, and the live map it
/// replaces once a change is on disk.
struct KeyFile {
    dir: PathBuf,
    keys: Keys,
}

/// `sha256:` and the first 8 hex digits of the key's SHA-256: enough to tell
/// keys apart on a screen, useless for recovering one.
pub(crate) fn fingerprint(key: &Secret) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.expose().as_bytes());
    let hex: String = d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Why a key is refused; never echoes it.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("the key is empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(format!(
            "the key is longer than {MAX_KEY_BYTES} bytes"
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::invalid("the key contains control characters"));
    }
    if key.trim() != key {
        return Err(Error::invalid("the key has leading or trailing whitespace"));
    }
    Ok(())
}

impl SecretStore {
    /// Loads `<home>/secrets/keys.enc` if there is one (at startup: this reads files).
    pub(crate) fn open(home: &Path) -> Result<SecretStore> {
        let dir = home.join("secrets");
        let keys = match std::fs::read(dir.join("keys.enc")) {
            Ok(bytes) => decrypt(&dir, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(Error::internal(format!(
                    "cannot read {}: {e}",
                    dir.join("keys.enc").display()
                )))
            }
        };
        let keys = Arc::new(Mutex::new(keys));
        Ok(SecretStore {
            keys: keys.clone(),
            file: FileOwner::new("the key store", KeyFile { dir, keys }),
        })
    }

    pub(crate) fn get(&self, kind: ProviderKind) -> Option<Secret> {
        self.lock().get(kind.as_str()).cloned()
    }

    /// Stores (or replaces) the key of `kind`; durable when this returns.
    pub(crate) async fn put(&self, kind: ProviderKind, key: Secret) -> Result<()> {
        self.change(move |m| {
            m.insert(kind.as_str(), key);
        })
        .await
        .map(|_| ())
    }

    /// Removes the key of `kind`; whether there was one.
    pub(crate) async fn delete(&self, kind: ProviderKind) -> Result<bool> {
        self.change(move |m| {
            m.remove(kind.as_str());
        })
        .await
    }

    /// Has the file's owner apply `f` (see `KeyFile::change`); whether anything changed.
    async fn change(
        &self,
        f: impl FnOnce(&mut BTreeMap<&'static str, Secret>) + Send + 'static,
    ) -> Result<bool> {
        self.file.change(|file| Box::pin(file.change(f))).await?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Secret>> {
        lock(&self.keys)
    }
}

fn lock(keys: &Keys) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Secret>> {
    keys.lock().unwrap_or_else(|p| p.into_inner())
}

impl KeyFile {
    /// Applies `f` to a copy of the keys, writes the copy, then makes it the
    /// live map; whether anything changed. Runs on the owner's task: no
    /// other change starts until this one is written or failed.
    async fn change(&mut self, f: impl FnOnce(&mut BTreeMap<&'static str, Secret>)) -> Result<bool> {
        let mut next = lock(&self.keys).clone();
        let before = next.clone();
        f(&mut next);
        if next == before {
            return Ok(false);
        }
        let dir = self.dir.clone();
        let plain: BTreeMap<&str, String> = next.iter().map(|(k, v)| (*k, v.expose().to_string())).collect();
        tokio::task::spawn_blocking(move || write(&dir, &plain))
            .await
            .map_err(|e| Error::internal(format!("the key store writer failed: {e}")))??;
        *lock(&self.keys) = next;
        Ok(true)
    }
}

fn key_of(dir: &Path, create: bool) -> Result<LessSafeKey> {
    let path = dir.join("master.key");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            let mut b = vec![0u8; 32];
            SystemRandom::new()
                .fill(&mut b)
                .map_err(|_| Error::internal("no randomness for the key store's master key"))?;
            crate::home::write_private_file(dir, "master.key", &b)?;
            b
        }
        Err(e) => return Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
    };
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
        .map_err(|_| Error::internal(format!("{} is not a 32-byte key", path.display())))?;
    Ok(LessSafeKey::new(unbound))
}

fn decrypt(dir: &Path, bytes: &[u8]) -> Result<BTreeMap<&'static str, Secret>> {
    let path = dir.join("keys.enc");
    let bad = |why: &str| {
        Error::internal(format!(
            "cannot read the key store {}: {why}; move it aside to start without stored keys",
            path.display()
        ))
    };
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("not a vak key store"))?;
    if rest.len() < NONCE_LEN {
        return Err(bad("truncated"));
    }
    let key = key_of(dir, false)?;
    let (nonce, sealed) = rest.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| bad("bad nonce"))?;
    let mut buf = sealed.to_vec();
    let plain = key
        .open_in_place(nonce, Aad::from(AAD), &mut buf)
        .map_err(|_| bad("it does not decrypt with master.key"))?;
    let map: BTreeMap<String, String> = serde_json::from_slice(plain).map_err(|_| bad("malformed"))?;
    // Names this version does not know are dropped (with the next write).
    Ok(map
        .into_iter()
        .filter_map(|(k, v)| ProviderKind::parse(&k).map(|kind| (kind.as_str(), Secret::new(v))))
        .collect())
}

fn write(dir: &Path, keys: &BTreeMap<&str, String>) -> Result<()> {
    crate::home::create_private_dir(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    let key = key_of(dir, true)?;
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| Error::internal("no randomness for the key store"))?;
    let mut buf = serde_json::to_vec(keys).map_err(|e| Error::internal(e.to_string()))?;
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(AAD), &mut buf)
        .map_err(|_| Error::internal("cannot encrypt the key store"))?;
    let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + buf.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&buf);
    crate::home::write_private_file(dir, "keys.enc", &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_survive_a_reopen_and_never_sit_in_plaintext() {
        let home = tempfile::tempdir().unwrap();
        let store = SecretStore::open(home.path()).unwrap();
        let key = "sk-test-0123456789abcdef-PLAINTEXT-MARKER";
        store
            .put(ProviderKind::OpenAi, Secret::new(key.into()))
            .await
            .unwrap();
        let again = SecretStore::open(home.path()).unwrap();
        assert_eq!(again.get(ProviderKind::OpenAi).unwrap().expose(), key);
        assert!(again.get(ProviderKind::Anthropic).is_none());
        for name in ["keys.enc", "master.key"] {
            let p = home.path().join("secrets").join(name);
            let bytes = std::fs::read(&p).unwrap();
            assert!(!bytes.windows(key.len()).any(|w| w == key.as_bytes()), "{name}");
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
        }
        assert!(again.delete(ProviderKind::OpenAi).await.unwrap());
        assert!(!again.delete(ProviderKind::OpenAi).await.unwrap());
        assert!(SecretStore::open(home.path())
            .unwrap()
            .get(ProviderKind::OpenAi)
            .is_none());
    }

    #[test]
    fn a_tampered_store_is_refused_with_a_clear_message() {
        let home = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let store = SecretStore::open(home.path()).unwrap();
        rt.block_on(store.put(ProviderKind::Anthropic, Secret::new("k".into())))
            .unwrap();
        let p = home.path().join("secrets/keys.enc");
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, bytes).unwrap();
        let e = SecretStore::open(home.path()).err().unwrap();
        assert!(e.message.contains("does not decrypt"), "{e}");
    }

    #[test]
    fn keys_are_validated_without_echoing_them() {
        assert!(validate_key("sk-abc").is_ok());
        for bad in ["", " sk", "sk\n", "s\u{7}k"] {
            let e = validate_key(bad).unwrap_err();
            assert!(
                !bad.trim().is_empty() || e.message.contains("empty") || e.message.contains("whitespace")
            );
        }
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
        let f = fingerprint(&Secret::new("sk-abc".into()));
        assert!(f.starts_with("sha256:") && f.len() == 15, "{f}");
    }
}
