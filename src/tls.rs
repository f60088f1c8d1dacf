//! TLS for the gRPC listener: server certificate, optional client-certificate verification
//! (mTLS) with an optional required subject alternative name, and reloading of all three
//! files without a restart.
//!
//! The files are polled rather than watched: Kubernetes updates a mounted Secret by swapping
//! a symlink, which file watchers see inconsistently, while reading three small files every
//! [`RELOAD_INTERVAL`] is cheap and always right. A change takes effect for new connections
//! only; a reload that fails (a half-written file, a key that does not match) keeps the
//! previous configuration and logs a warning.
//!
//! Key material never reaches a log line or an error message: PEM parse errors are reduced
//! to their kind (the parser would quote the offending line), and only paths are named.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use sha2::{Digest, Sha256};

/// How often the certificate files are re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The ALPN protocol gRPC clients (tonic, Envoy) ask for and require.
const ALPN_H2: &[u8] = b"h2";

/// Where the gRPC server's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that sign client certificates; when set, every client must
    /// present a certificate signed by one of them (mTLS).
    pub client_ca: Option<PathBuf>,
    /// A DNS name or IP address the client certificate must be valid for (checked against
    /// its subject alternative names, as a server name would be); only with `client_ca`.
    pub client_san: Option<String>,
}

/// Why TLS material could not be loaded. Names paths, never contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

impl TlsError {
    fn new(message: impl Into<String>) -> TlsError {
        TlsError(message.into())
    }
}

/// Reads a file for `what` (a flag name), with an error that names only the path.
///
/// # Errors
/// The file cannot be read.
pub fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|error| TlsError::new(format!("cannot read {what} {}: {error}", path.display())))
}

/// The certificates of a PEM file (`what` names it in errors).
///
/// # Errors
/// Malformed PEM, or no certificate in it.
pub fn parse_certs(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(what, &error))?;
    if certs.is_empty() {
        return Err(TlsError::new(format!("{what}: no PEM certificate found")));
    }
    Ok(certs)
}

/// The private key of a PEM file (`what` names it in errors).
///
/// # Errors
/// Malformed PEM, or no private key in it.
pub fn parse_key(what: &str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|error| match error {
        pem::Error::NoItemsFound => TlsError::new(format!("{what}: no PEM private key found")),
        other => pem_error(what, &other),
    })
}

/// A PEM error without the parser's quotes of the input, which may be key material.
fn pem_error(what: &str, error: &pem::Error) -> TlsError {
    let kind = match error {
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line",
        pem::Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed",
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64",
        pem::Error::NoItemsFound => "nothing usable found",
        pem::Error::SectionTooLarge => "a PEM section is too large",
        _ => "not valid PEM",
    };
    TlsError::new(format!("{what}: {kind}"))
}

/// The bytes of the three files, as last read; their digest tells a change.
struct Snapshot {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Snapshot {
    fn read(files: &TlsFiles) -> Result<Snapshot, TlsError> {
        Ok(Snapshot {
            cert: read_file("--grpc-tls-cert", &files.cert)?,
            key: read_file("--grpc-tls-key", &files.key)?,
            client_ca: files
                .client_ca
                .as_deref()
                .map(|path| read_file("--grpc-tls-client-ca", path))
                .transpose()?,
        })
    }

    fn digest(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        for part in [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()] {
            let part = part.map_or(&[][..], Vec::as_slice);
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        hash.finalize().into()
    }

    fn server_config(&self, client_san: Option<&str>) -> Result<ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = parse_certs("--grpc-tls-cert", &self.cert)?;
        let key = parse_key("--grpc-tls-key", &self.key)?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::new(format!("TLS setup: {error}")))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let mut roots = RootCertStore::empty();
                for cert in parse_certs("--grpc-tls-client-ca", pem)? {
                    roots
                        .add(cert)
                        .map_err(|error| TlsError::new(format!("--grpc-tls-client-ca: {error}")))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|error| TlsError::new(format!("--grpc-tls-client-ca: {error}")))?;
                let verifier: Arc<dyn ClientCertVerifier> = match client_san {
                    Some(san) => Arc::new(SanVerifier::new(verifier, san)?),
                    None => verifier,
                };
                builder.with_client_cert_verifier(verifier)
            }
        };
        // rustls' own message for a mismatched pair names no key bytes.
        let mut config = builder.with_single_cert(certs, key).map_err(|error| {
            TlsError::new(format!(
                "--grpc-tls-cert / --grpc-tls-key do not make a usable pair: {error}"
            ))
        })?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }
}

/// Accepts TLS connections with the current configuration, which a background task
/// replaces when the files change.
pub struct ReloadingAcceptor {
    files: TlsFiles,
    current: ArcSwap<ServerConfig>,
    digest: parking_lot::Mutex<[u8; 32]>,
}

impl fmt::Debug for ReloadingAcceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingAcceptor")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingAcceptor {
    /// Loads the files once.
    ///
    /// # Errors
    /// A file cannot be read or parsed, or the certificate and key do not match.
    pub fn load(files: TlsFiles) -> Result<Arc<ReloadingAcceptor>, TlsError> {
        if files.client_san.is_some() && files.client_ca.is_none() {
            return Err(TlsError::new(
                "a required client SAN needs a client CA (--grpc-tls-client-ca)",
            ));
        }
        let snapshot = Snapshot::read(&files)?;
        let config = snapshot.server_config(files.client_san.as_deref())?;
        Ok(Arc::new(ReloadingAcceptor {
            digest: parking_lot::Mutex::new(snapshot.digest()),
            current: ArcSwap::from_pointee(config),
            files,
        }))
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Re-reads the files; swaps in a new configuration when they changed and load.
    /// Returns whether a new configuration was installed.
    ///
    /// # Errors
    /// The changed files do not load; the previous configuration stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let snapshot = Snapshot::read(&self.files)?;
        let digest = snapshot.digest();
        if *self.digest.lock() == digest {
            return Ok(false);
        }
        let config = snapshot.server_config(self.files.client_san.as_deref())?;
        self.current.store(Arc::new(config));
        *self.digest.lock() = digest;
        Ok(true)
    }

    /// Polls the files every `interval` for as long as it runs; logs every change and every
    /// failure to load one (once per distinct failure).
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error: Option<TlsError> = None;
        loop {
            ticker.tick().await;
            let me = Arc::clone(&self);
            let result = tokio::task::spawn_blocking(move || me.reload())
                .await
                .unwrap_or_else(|error| Err(TlsError::new(format!("reload task: {error}"))));
            match result {
                Ok(true) => {
                    tracing::info!("gRPC TLS certificate files changed: new connections use them");
                    last_error = None;
                }
                Ok(false) => last_error = None,
                Err(error) => {
                    if last_error.as_ref() != Some(&error) {
                        tracing::warn!(
                            "gRPC TLS certificate files changed but do not load; \
                             keeping the previous ones: {error}"
                        );
                    }
                    last_error = Some(error);
                }
            }
        }
    }
}

/// Client-certificate verification that also requires a subject alternative name.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl SanVerifier {
    fn new(inner: Arc<dyn ClientCertVerifier>, san: &str) -> Result<SanVerifier, TlsError> {
        let san = ServerName::try_from(san.to_owned()).map_err(|_| {
            TlsError::new(format!(
                "required client SAN `{san}` is neither a DNS name nor an IP address"
            ))
        })?;
        Ok(SanVerifier { inner, san })
    }
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.san)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAKE_KEY: &str =
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw!!\n-----END PRIVATE KEY-----\n";

    #[test]
    fn key_errors_never_quote_the_file() {
        for pem in [
            FAKE_KEY,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n",
            "-----BEGIN PRIVATE KEY c2VjcmV0LWtleS1ieXRlcw==\n",
        ] {
            let error = parse_key("--grpc-tls-key", pem.as_bytes()).unwrap_err();
            let text = error.to_string();
            assert!(!text.contains("c2VjcmV0"), "{text}");
            assert!(text.starts_with("--grpc-tls-key: "), "{text}");
        }
        let error = parse_key("k", b"nothing here").unwrap_err();
        assert_eq!(error.to_string(), "k: no PEM private key found");
    }

    #[test]
    fn a_san_without_a_client_ca_is_refused() {
        let files = TlsFiles {
            cert: "c".into(),
            key: "k".into(),
            client_ca: None,
            client_san: Some("client.example".into()),
        };
        assert!(ReloadingAcceptor::load(files).is_err());
    }
}
