//! The cluster secret of `--bus-secret-file` and what it keys: provider keys sealed in VAK_CONFIG, and the signature of every route, mode and rules value there, so a replica obeys only values written by a holder of the secret.
//!
//! **Signed values.** With a secret, vak stores `route`, `mode` and
//! `rules.<workspace key>` as an envelope, `{"v":<document>,"sig":"<base64>"}`:
//! the document is the JSON it stored before (so its shape is unchanged),
//! `sig` the HMAC-SHA256 (standard base64, padded) of
//! `vak VAK_CONFIG v1`, a zero byte, the KV key, a zero byte, and the
//! document's exact bytes as they stand in the envelope. The key name is
//! signed so a value cannot be moved to another key (one workspace's rules
//! to another's). A value that is not such an envelope, or whose signature
//! does not match, is refused: never applied, logged (warn) with its key.
//! Without a secret, documents are stored bare, as before, and an envelope
//! is read for its document unchecked (nothing to check it with).

use crate::error::{Error, Result};
use crate::provider::{ProviderKind, Secret};
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::path::Path;

/// The shortest cluster secret accepted, in bytes.
pub const MIN_SECRET: usize = 32;

const SEAL_MAGIC: &[u8] = b"VAKBK1";
const HKDF_SALT: &[u8] = b"vak cluster secret v1";
const HKDF_INFO: &[u8] = b"vak provider keys in VAK_CONFIG";
/// Its own label, so the signing key is not the sealing key.
const HKDF_INFO_MAC: &[u8] = b"vak signed values in VAK_CONFIG";
/// What every signature starts with (a version, so a later format cannot be
/// mistaken for this one).
const MAC_DOMAIN: &[u8] = b"vak VAK_CONFIG v1";

/// Why a value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsigned {
    /// Not an envelope: written bare (by a replica without the secret, one
    /// from before signing, or by hand).
    Missing,
    /// An envelope whose signature does not match (another secret, or forged).
    Wrong,
}

impl Unsigned {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unsigned::Missing => "unsigned",
            Unsigned::Wrong => "signed with another secret or forged",
        }
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    v: &'a RawValue,
    sig: String,
}

fn mac_input(key: &str, doc: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(MAC_DOMAIN.len() + key.len() + doc.len() + 2);
    m.extend_from_slice(MAC_DOMAIN);
    m.push(0);
    m.extend_from_slice(key.as_bytes());
    m.push(0);
    m.extend_from_slice(doc);
    m
}

/// `doc` (one JSON value) in its envelope, signed for `key`.
pub(crate) fn signed(cipher: &Cipher, key: &str, doc: &[u8]) -> Vec<u8> {
    let tag = hmac::sign(&cipher.mac, &mac_input(key, doc));
    let sig = base64::engine::general_purpose::STANDARD.encode(tag.as_ref());
    let mut out = Vec::with_capacity(doc.len() + sig.len() + 16);
    out.extend_from_slice(b"{\"v\":");
    out.extend_from_slice(doc);
    out.extend_from_slice(b",\"sig\":\"");
    out.extend_from_slice(sig.as_bytes());
    out.extend_from_slice(b"\"}");
    out
}

/// The document of the value `bytes` of `key`: checked against its
/// signature when there is a secret, taken as is without one.
pub(crate) fn document<'a>(
    cipher: Option<&Cipher>,
    key: &str,
    bytes: &'a [u8],
) -> std::result::Result<&'a [u8], Unsigned> {
    let envelope = serde_json::from_slice::<Envelope<'a>>(bytes).ok();
    let Some(cipher) = cipher else {
        return Ok(envelope.map_or(bytes, |e| e.v.get().as_bytes()));
    };
    let e = envelope.ok_or(Unsigned::Missing)?;
    let doc = e.v.get().as_bytes();
    let tag = base64::engine::general_purpose::STANDARD
        .decode(e.sig.as_bytes())
        .map_err(|_| Unsigned::Wrong)?;
    hmac::verify(&cipher.mac, &mac_input(key, doc), &tag).map_err(|_| Unsigned::Wrong)?;
    Ok(doc)
}

/// What the cluster secret every replica is given (`--bus-secret-file`)
/// keys, each derived from it with HKDF-SHA256 under its own label: the
/// AEAD provider keys travel and rest under (ChaCha20-Poly1305, as the key
/// store in the home), and the HMAC-SHA256 that signs the values replicas
/// obey (route, mode, rules).
pub struct Cipher {
    aead: LessSafeKey,
    mac: hmac::Key,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(..)")
    }
}

impl Cipher {
    /// From the secret's bytes (surrounding whitespace aside): at least
    /// `MIN_SECRET` of them.
    pub fn new(secret: &[u8]) -> Result<Cipher> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_SECRET {
            return Err(Error::invalid(format!(
                "the cluster secret is {} bytes; it needs at least {MIN_SECRET} (e.g. `openssl rand -hex 32`)",
                secret.len()
            )));
        }
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, HKDF_SALT).extract(secret);
        let underived = |_| Error::internal("cannot derive the keys of the cluster secret");
        let aead = prk.expand(&[HKDF_INFO], &CHACHA20_POLY1305).map_err(underived)?;
        let mac = prk
            .expand(&[HKDF_INFO_MAC], hmac::HMAC_SHA256)
            .map_err(underived)?;
        Ok(Cipher {
            aead: LessSafeKey::new(UnboundKey::from(aead)),
            mac: hmac::Key::from(mac),
        })
    }

    /// Reads the secret from `path` (startup: blocking), a file only its
    /// owner may read.
    pub fn from_file(path: &Path) -> Result<Cipher> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let meta =
            std::fs::metadata(path).map_err(|e| Error::invalid(format!("--bus-secret-file {shown}: {e}")))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(Error::invalid(format!(
                "--bus-secret-file {shown}: other users may read it; make it owner-only (chmod 600)"
            )));
        }
        let bytes =
            std::fs::read(path).map_err(|e| Error::invalid(format!("--bus-secret-file {shown}: {e}")))?;
        Cipher::new(&bytes).map_err(|e| Error::invalid(format!("--bus-secret-file {shown}: {}", e.message)))
    }

    /// `VAKBK1`, a random nonce, then the sealed key; the provider's name is
    /// the associated data, so a value moved to another provider's key does
    /// not open.
    pub(crate) fn seal(&self, kind: ProviderKind, key: &Secret) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::internal("no randomness to seal a key"))?;
        let mut buf = key.expose().as_bytes().to_vec();
        self.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(kind.as_str().as_bytes()),
                &mut buf,
            )
            .map_err(|_| Error::internal("cannot seal a key"))?;
        let mut out = Vec::with_capacity(SEAL_MAGIC.len() + NONCE_LEN + buf.len());
        out.extend_from_slice(SEAL_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        Ok(out)
    }

    pub(crate) fn open(&self, kind: ProviderKind, bytes: &[u8]) -> Option<Secret> {
        let rest = bytes.strip_prefix(SEAL_MAGIC)?;
        if rest.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = self
            .aead
            .open_in_place(nonce, Aad::from(kind.as_str().as_bytes()), &mut buf)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok().map(Secret::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_key_opens_only_with_the_same_secret_and_provider_and_never_shows_itself() {
        let key = Secret::new("sk-sealed-0123456789abcdef-MARKER".into());
        let cipher = Cipher::new(&[7u8; 40]).unwrap();
        let sealed = cipher.seal(ProviderKind::OpenAi, &key).unwrap();
        assert!(sealed.starts_with(SEAL_MAGIC));
        let plain = key.expose().as_bytes();
        assert!(!sealed.windows(plain.len()).any(|w| w == plain));
        assert_eq!(
            cipher.open(ProviderKind::OpenAi, &sealed).unwrap().expose(),
            key.expose()
        );
        // Another nonce each time; another provider or secret does not open it.
        assert_ne!(cipher.seal(ProviderKind::OpenAi, &key).unwrap(), sealed);
        assert!(cipher.open(ProviderKind::Anthropic, &sealed).is_none());
        assert!(Cipher::new(&[8u8; 40])
            .unwrap()
            .open(ProviderKind::OpenAi, &sealed)
            .is_none());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(cipher.open(ProviderKind::OpenAi, &tampered).is_none());
        // Surrounding whitespace (a file's newline) is not part of the secret.
        let mut padded = vec![b' '];
        padded.extend_from_slice(&[7u8; 40]);
        padded.push(b'\n');
        assert!(Cipher::new(&padded)
            .unwrap()
            .open(ProviderKind::OpenAi, &sealed)
            .is_some());
    }

    #[test]
    fn a_short_or_shared_secret_file_is_refused_with_a_clear_message() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "too short\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Cipher::from_file(&path).unwrap_err();
        assert!(e.message.contains("at least 32"), "{e}");
        std::fs::write(&path, "x".repeat(64)).unwrap();
        assert!(Cipher::from_file(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Cipher::from_file(&path).unwrap_err();
        assert!(e.message.contains("chmod 600"), "{e}");
        let e = Cipher::from_file(&dir.path().join("missing")).unwrap_err();
        assert!(e.message.contains("--bus-secret-file"), "{e}");
    }
    #[test]
    fn a_signed_value_reads_back_only_with_its_secret_and_key_and_unsigned_is_refused() {
        let a = Cipher::new(&[7u8; 40]).unwrap();
        let doc = br#"{"version":1,"workspace":"/w","rules":[]}"#;
        let v = signed(&a, "rules.k1", doc);
        // The stored value is an envelope around the unchanged document.
        let parsed: serde_json::Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(parsed["v"]["workspace"], "/w");
        assert!(parsed["sig"].is_string());
        assert_eq!(document(Some(&a), "rules.k1", &v), Ok(&doc[..]));
        // Moved to another key, another secret, tampered, or bare: refused.
        assert_eq!(document(Some(&a), "rules.k2", &v), Err(Unsigned::Wrong));
        let b = Cipher::new(&[8u8; 40]).unwrap();
        assert_eq!(document(Some(&b), "rules.k1", &v), Err(Unsigned::Wrong));
        let tampered = String::from_utf8(v.clone()).unwrap().replace("/w", "/x");
        assert_eq!(
            document(Some(&a), "rules.k1", tampered.as_bytes()),
            Err(Unsigned::Wrong)
        );
        assert_eq!(document(Some(&a), "rules.k1", doc), Err(Unsigned::Missing));
        let no_sig = br#"{"v":{"a":1},"sig":"not base64!"}"#;
        assert_eq!(document(Some(&a), "rules.k1", no_sig), Err(Unsigned::Wrong));
        // Without a secret: bare as before, an envelope read for its document.
        assert_eq!(document(None, "rules.k1", doc), Ok(&doc[..]));
        assert_eq!(document(None, "rules.k1", &v), Ok(&doc[..]));
        // The signing key is not the sealing key's bytes reused: a seal
        // still opens, and signatures differ per secret.
        assert_ne!(signed(&a, "rules.k1", doc), signed(&b, "rules.k1", doc));
    }
}
