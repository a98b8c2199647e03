//! Mutual TLS for QUIC between Levee nodes.
//!
//! Guarantees:
//! - the server refuses every client that does not present a certificate chaining to the
//!   cluster CA (the certificates in the CA file, and nothing else: no system roots);
//! - the client trusts only the cluster CA, checks that the server's certificate names the
//!   node id it dialled, and presents this node's certificate;
//! - TLS 1.3 only (QUIC requires it), ALPN [`ALPN`], the `ring` crypto provider.
//!
//! The QUIC transport parameters (keep-alive, idle timeout, stream and window limits) are the
//! same on both sides; see [`transport_parameters`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;

/// The ALPN protocol id of Levee's node-to-node protocol.
pub const ALPN: &[u8] = b"levee/1";

/// How often an idle connection is kept alive; also how quickly a lost peer is noticed
/// together with [`IDLE_TIMEOUT`]. Longer than the gossip's idle heartbeat period
/// (`suspect_after / 5`, 200 ms by default; a QUIC keep-alive is timed from the last packet
/// received, which on an idle link is about a period old), so that it adds no PING and no
/// acknowledgement of it to a link that carries heartbeats.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_millis(500);
/// A connection that has heard nothing from its peer for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// Streams of each direction a peer may have open at once.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Bytes a peer may have in flight on one connection before it must wait for the reader.
pub const CONNECTION_RECEIVE_WINDOW: u32 = 16 << 20;

/// Where a node's TLS material lives, in PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate(s). Peers are trusted if and only if they chain to one.
    pub ca: PathBuf,
    /// This node's certificate chain, leaf first.
    pub cert: PathBuf,
    /// This node's private key (PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// The layout [`crate::certs`] writes: `ca.pem`, `<node_id>.pem` and `<node_id>.key` in one
    /// directory.
    pub fn in_dir(dir: &Path, node_id: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join(crate::certs::CA_CERT_FILE),
            cert: dir.join(format!("{node_id}.pem")),
            key: dir.join(format!("{node_id}.key")),
        }
    }
}

/// Why a TLS configuration could not be built. Nothing was started.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A PEM file holds no certificate.
    #[error("{}: no certificate in the file", .0.display())]
    NoCertificate(PathBuf),
    /// rustls refused the material (a CA certificate it cannot parse, a key that does not
    /// match, …).
    #[error("{context}: {source}")]
    Rustls {
        /// What was being done.
        context: String,
        /// The error.
        source: rustls::Error,
    },
    /// The client-certificate verifier could not be built.
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The TLS configuration has no cipher suite QUIC can use for its initial packets.
    #[error("TLS configuration unusable for QUIC: {0}")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
    /// This node's certificate does not name its node id, so peers could not verify it.
    #[error("{}: certificate is not valid for node id {node_id:?}: {reason}", path.display())]
    WrongIdentity {
        /// The certificate file.
        path: PathBuf,
        /// The node id.
        node_id: String,
        /// What is wrong.
        reason: String,
    },
}

/// The QUIC server configuration: TLS 1.3 that requires a client certificate signed by the
/// cluster CA, and Levee's transport parameters.
pub fn server_config(files: &TlsFiles) -> Result<quinn::ServerConfig, TlsError> {
    let provider = provider();
    let roots = Arc::new(load_roots(&files.ca)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone()).build()?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls {
            context: "TLS 1.3 with the ring provider".into(),
            source,
        })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_chain(&files.cert)?, load_key(&files.key)?)
        .map_err(|source| TlsError::Rustls {
            context: format!("{} with {}", files.cert.display(), files.key.display()),
            source,
        })?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    config.transport_config(Arc::new(transport_parameters()));
    Ok(config)
}

/// The QUIC client configuration: trusts only the cluster CA and authenticates with this
/// node's certificate. Connect with the peer's node id as the server name.
pub fn client_config(files: &TlsFiles) -> Result<quinn::ClientConfig, TlsError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls {
            context: "TLS 1.3 with the ring provider".into(),
            source,
        })?
        .with_root_certificates(load_roots(&files.ca)?)
        .with_client_auth_cert(load_chain(&files.cert)?, load_key(&files.key)?)
        .map_err(|source| TlsError::Rustls {
            context: format!("{} with {}", files.cert.display(), files.key.display()),
            source,
        })?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    config.transport_config(Arc::new(transport_parameters()));
    Ok(config)
}

/// Checks that this node's certificate names `node_id`, so that peers dialling `node_id`
/// accept it and its `Hello` matches its certificate.
pub fn check_identity(files: &TlsFiles, node_id: &str) -> Result<(), TlsError> {
    let chain = load_chain(&files.cert)?;
    let wrong = |reason: String| TlsError::WrongIdentity {
        path: files.cert.clone(),
        node_id: node_id.to_owned(),
        reason,
    };
    certificate_names(&chain[0], node_id).map_err(wrong)
}

/// Whether `cert` (already verified against the CA) is valid for the DNS name `node_id`.
pub(crate) fn certificate_names(cert: &CertificateDer<'_>, node_id: &str) -> Result<(), String> {
    let name = ServerName::try_from(node_id).map_err(|e| format!("not a DNS name: {e}"))?;
    let parsed = rustls::server::ParsedCertificate::try_from(cert).map_err(|e| e.to_string())?;
    rustls::client::verify_server_name(&parsed, &name).map_err(|e| e.to_string())
}

/// The round-trip time assumed before one is measured.
pub const INITIAL_RTT: std::time::Duration = std::time::Duration::from_millis(50);

/// Ack-eliciting packets a peer may receive from this node before it must acknowledge them
/// at once (QUIC's acknowledgement frequency extension; RFC 9000's default is 1: every
/// second packet).
pub const ACK_ELICITING_THRESHOLD: u32 = 16;
/// Longest a peer may hold back an acknowledgement of this node's packets below
/// [`ACK_ELICITING_THRESHOLD`]: the `max_ack_delay` QUIC assumes anyway (quinn's default),
/// so the probe timeout is what it was. Longer than a gossip interval, so an acknowledgement
/// nearly always rides on the peer's next frame (a shorter delay makes a link that carries
/// only gossip acknowledge each batch by timer).
pub const MAX_ACK_DELAY: std::time::Duration = std::time::Duration::from_millis(25);

/// Levee's QUIC transport parameters, the same for both sides of a connection.
///
/// Acknowledgements: frames go both ways all the time (forwarded checks and their answers,
/// every gossip interval's batch), so acknowledgements ride on them. Without the
/// acknowledgement frequency extension a peer also sent an ACK-only datagram for every second
/// packet: on a region of two nodes with half the checks forwarded, a quarter of the UDP
/// datagrams, each a system call and a wake-up at both ends (docs/benchmarks.md, "Figure 9
/// on 2026-12-01"). Out-of-order packets are still acknowledged at once (the extension's
/// reordering threshold, 2), so loss is detected as quickly; a lone packet is acknowledged
/// within [`MAX_ACK_DELAY`].
pub fn transport_parameters() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(KEEP_ALIVE_INTERVAL));
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(
        IDLE_TIMEOUT.as_millis() as u32,
    ))));
    t.max_concurrent_uni_streams(quinn::VarInt::from_u32(MAX_CONCURRENT_STREAMS));
    t.max_concurrent_bidi_streams(quinn::VarInt::from_u32(MAX_CONCURRENT_STREAMS));
    t.receive_window(quinn::VarInt::from_u32(CONNECTION_RECEIVE_WINDOW));
    // Before the first round trip is measured, assume a short one: a handshake whose first
    // packet was lost (the peer's socket was not bound yet) is retried within ~150 ms
    // instead of ~1 s, which would otherwise outlast `suspect_after` and make a freshly
    // started peer flap unreachable. Once measured, the real RTT takes over.
    t.initial_rtt(INITIAL_RTT);
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.ack_eliciting_threshold(quinn::VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .max_ack_delay(Some(MAX_ACK_DELAY));
    t.ack_frequency_config(Some(ack));
    t
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

fn load_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(chain)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error(path, e))
}

/// A root store holding the cluster CA certificate(s) and nothing else.
fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_chain(path)? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            context: format!("{}: CA certificate", path.display()),
            source,
        })?;
    }
    Ok(roots)
}
