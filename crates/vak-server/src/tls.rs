//! TLS material: PEM certificate and key files, or a self-signed development certificate kept in the home, turned into a rustls config that offers h2 and http/1.1.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vak_core::error::{Error, Result};

pub struct Tls {
    pub config: Arc<rustls::ServerConfig>,
    /// SHA-256 of the leaf certificate, colon-separated hex.
    pub fingerprint: String,
    /// Where the certificate is (clients of a self-signed server trust this file).
    pub cert_path: PathBuf,
}

/// Loads `--tls-cert` and `--tls-key`; every failure is one clear sentence.
pub fn load(cert_path: &Path, key_path: &Path) -> Result<Tls> {
    let read = |p: &Path, what: &str| {
        std::fs::read(p)
            .map_err(|e| Error::invalid(format!("cannot read the TLS {what} {}: {e}", p.display())))
    };
    let cert_pem = read(cert_path, "certificate")?;
    let key_pem = read(key_path, "key")?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| {
            Error::invalid(format!(
                "the TLS certificate {} is not valid PEM: {e}",
                cert_path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::invalid(format!(
            "no certificate found in {}",
            cert_path.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| Error::invalid(format!("no usable private key in {}: {e}", key_path.display())))?;
    let fingerprint = fingerprint(&certs[0]);
    let config = server_config(certs, key).map_err(|e| {
        Error::invalid(format!(
            "the TLS key {} does not fit the certificate {}: {e}",
            key_path.display(),
            cert_path.display()
        ))
    })?;
    Ok(Tls {
        config,
        fingerprint,
        cert_path: cert_path.to_path_buf(),
    })
}

/// A development certificate for localhost, 127.0.0.1 and ::1: made once
/// under `home/tls/` (key mode 0600) and reused on every later start.
pub fn self_signed(home: &Path) -> Result<Tls> {
    let dir = home.join("tls");
    let cert_path = dir.join("dev-cert.pem");
    let key_path = dir.join("dev-key.pem");
    if !(cert_path.exists() && key_path.exists()) {
        vak_core::home::create_private_dir(&dir)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
        let names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        let made = rcgen::generate_simple_self_signed(names)
            .map_err(|e| Error::internal(format!("cannot make a self-signed certificate: {e}")))?;
        write_private(&key_path, made.key_pair.serialize_pem().as_bytes())?;
        // Public, but everything vak makes in the home is owner-only.
        write_private(&cert_path, made.cert.pem().as_bytes())?;
    }
    load(&cert_path, &key_path)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", path.display())))?;
    f.write_all(bytes)?;
    Ok(())
}

fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> std::result::Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    // One port for everything: gRPC needs h2; gRPC-web, REST and SSE also speak http/1.1.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}
