//! TLS with rustls (the `ring` provider throughout): termination on the proxy listener, and the
//! client configuration for https upstreams (system roots or a configured CA, optional client
//! certificate for mTLS).
//!
//! The listener's certificate sits behind a resolver that SIGHUP can swap: new handshakes get the
//! new certificate, established connections keep theirs, and a new pair that fails to load leaves
//! the old one in place.

use crate::poison::RwLockExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or held nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// rustls refused the material (a key that does not match, an unsupported algorithm).
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

fn pem_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Reads a PEM certificate chain (at least one certificate).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(pem_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error(path, e))
}

/// A certificate and its key, checked to belong together.
pub fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    let key = load_key(key)?;
    let certified = CertifiedKey::from_der(chain, key, &provider::default_provider())?;
    Ok(Arc::new(certified))
}

/// The listener's certificate, swappable while connections run.
#[derive(Debug)]
pub struct ReloadableCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

// === impl ReloadableCert ===

impl ReloadableCert {
    /// Loads the pair once; start-up fails if it does not load.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(ReloadableCert {
            current: RwLock::new(certified_key(cert, key)?),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        })
    }

    /// Reads the files again; on failure the current certificate stays and the error is returned.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = certified_key(&self.cert, &self.key)?;
        *self.current.write_or_recover() = fresh;
        Ok(())
    }
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read_or_recover().clone())
    }
}

/// The listener's TLS configuration: ALPN h2 and http/1.1, the certificate from `resolver`.
pub fn server_config(resolver: Arc<ReloadableCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// How many roots the system trust store holds that rustls can use (0 in an image without
/// ca-certificates): the proxy warns at startup when an https upstream meets none.
pub fn system_root_count() -> usize {
    let mut roots = RootCertStore::empty();
    let (added, _ignored) =
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    added
}

/// A client configuration that trusts no certificate: for a client that may be handed an
/// https connector but only ever speaks plain http (the probe on an http:// URL).
pub fn client_config_without_roots() -> Result<ClientConfig, TlsError> {
    Ok(client_builder(RootCertStore::empty())?.with_no_client_auth())
}

/// rustls' client builder with our crypto provider and protocol versions, trusting `roots`.
fn client_builder(
    roots: RootCertStore,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>, TlsError> {
    Ok(
        ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots),
    )
}

/// The client configuration for https upstreams: `ca` when given, else the system's roots; a
/// client certificate when both `client_cert` and `client_key` are given.
pub fn client_config(
    ca: Option<&Path>,
    client_cert: Option<(&Path, &Path)>,
) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in load_certs(path)? {
                roots.add(cert).map_err(|e| pem_error(path, e))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                // A system root rustls cannot parse is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    let builder = client_builder(roots)?;
    let config = match client_cert {
        Some((cert, key)) => builder.with_client_auth_cert(load_certs(cert)?, load_key(key)?)?,
        None => builder.with_no_client_auth(),
    };
    Ok(config)
}
