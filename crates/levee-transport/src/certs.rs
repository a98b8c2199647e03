//! A development certificate authority for a Levee cluster.
//!
//! [`init_ca`] creates the cluster CA (`ca.pem`, `ca.key`); [`issue`] signs one node's
//! certificate with it (`<node_id>.pem`, `<node_id>.key`). Every key is ECDSA P-256.
//!
//! Guarantees:
//! - an existing file is never overwritten: the call fails naming it, before anything is
//!   written when the name is already taken, and no half-written pair is left behind by a
//!   refused call;
//! - private keys are created with mode `0600` (on Unix) and never exist with wider
//!   permissions;
//! - a node certificate names its node id as a DNS subject alternative name (the name peers
//!   verify when they connect to it, and the name a node's `Hello` must match), plus
//!   `localhost` and `127.0.0.1` for local clusters, and may be used both as a TLS server and
//!   as a TLS client (extended key usages `serverAuth` and `clientAuth`).
//!
//! The certificates are valid from 1975 to 4096: they are meant for development clusters and
//! tests. Production clusters should issue node certificates from their own PKI; the
//! transport only needs a CA file, a certificate chain and a key in PEM.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

/// The common name of the CA made by [`init_ca`].
pub const CA_COMMON_NAME: &str = "levee cluster CA";
/// The file name of the CA certificate in a CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The file name of the CA private key in a CA directory.
pub const CA_KEY_FILE: &str = "ca.key";

/// Why a certificate could not be generated or written. When this is returned for an
/// existing file, nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The output file already exists; Levee never overwrites keys or certificates.
    #[error("{} already exists; refusing to overwrite it", .0.display())]
    Exists(PathBuf),
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The node id cannot be used as a DNS name (it becomes the certificate's name and the
    /// file name).
    #[error("node id {0:?} is not a valid DNS name (letters, digits, '-' and '.')")]
    InvalidNodeId(String),
    /// The CA files could not be read as a CA certificate and key.
    #[error("cannot use the CA in {}: {reason}", dir.display())]
    BadCa {
        /// The CA directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Key generation or signing failed.
    #[error("cannot generate the certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Creates a self-signed cluster CA in `out_dir` (created if missing): `ca.pem` and `ca.key`.
///
/// Fails with [`CertError::Exists`] if either file is already there.
pub fn init_ca(out_dir: &Path) -> Result<(), CertError> {
    let cert_path = out_dir.join(CA_CERT_FILE);
    let key_path = out_dir.join(CA_KEY_FILE);
    refuse_existing(&[&cert_path, &key_path])?;

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    // Node certificates are signed directly by the CA: no intermediates.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;

    create_dir(out_dir)?;
    write_pair(&cert_path, &cert.pem(), &key_path, &key.serialize_pem())
}

/// Issues a certificate for `node_id`, signed by the CA in `ca_dir`, into `out_dir` (created
/// if missing): `<node_id>.pem` and `<node_id>.key`.
///
/// The certificate's subject alternative names are DNS `node_id`, DNS `localhost` and IP
/// `127.0.0.1`; its extended key usages are `serverAuth` and `clientAuth`. Fails with
/// [`CertError::Exists`] if either file is already there.
pub fn issue(ca_dir: &Path, node_id: &str, out_dir: &Path) -> Result<(), CertError> {
    if rustls_pki_types::DnsName::try_from(node_id).is_err()
        || node_id.parse::<std::net::IpAddr>().is_ok()
    {
        return Err(CertError::InvalidNodeId(node_id.to_owned()));
    }
    let cert_path = out_dir.join(format!("{node_id}.pem"));
    let key_path = out_dir.join(format!("{node_id}.key"));
    refuse_existing(&[&cert_path, &key_path])?;

    let ca_cert_pem = read_to_string(&ca_dir.join(CA_CERT_FILE))?;
    let ca_key_pem = read_to_string(&ca_dir.join(CA_KEY_FILE))?;
    let bad_ca = |reason: String| CertError::BadCa {
        dir: ca_dir.to_owned(),
        reason,
    };
    let ca_key =
        KeyPair::from_pem(&ca_key_pem).map_err(|e| bad_ca(format!("{CA_KEY_FILE}: {e}")))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key)
        .map_err(|e| bad_ca(format!("{CA_CERT_FILE}: {e}")))?;

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::new(vec![
        node_id.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ])?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, node_id);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer)?;

    create_dir(out_dir)?;
    write_pair(&cert_path, &cert.pem(), &key_path, &key.serialize_pem())
}

fn refuse_existing(paths: &[&Path]) -> Result<(), CertError> {
    for path in paths {
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Err(CertError::Exists(path.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(CertError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_owned(),
        source,
    })
}

fn read_to_string(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Writes the key first (so a certificate never exists without its key), then the
/// certificate; if the certificate cannot be created the key is removed again.
fn write_pair(
    cert_path: &Path,
    cert_pem: &str,
    key_path: &Path,
    key_pem: &str,
) -> Result<(), CertError> {
    write_new(key_path, key_pem, 0o600)?;
    if let Err(e) = write_new(cert_path, cert_pem, 0o644) {
        let _ = std::fs::remove_file(key_path);
        return Err(e);
    }
    Ok(())
}

/// Creates `path` (failing if it exists) with `mode` from the start, and writes `contents`.
fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), CertError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            CertError::Exists(path.to_owned())
        } else {
            CertError::Io {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| CertError::Io {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_overwrite_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        let err = init_ca(dir.path()).unwrap_err();
        assert!(
            matches!(&err, CertError::Exists(p) if p.ends_with(CA_CERT_FILE)),
            "{err}"
        );
        assert!(err.to_string().contains("ca.pem"), "{err}");

        issue(dir.path(), "eu-1", dir.path()).unwrap();
        let err = issue(dir.path(), "eu-1", dir.path()).unwrap_err();
        assert!(err.to_string().contains("eu-1.pem"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn keys_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        issue(dir.path(), "eu-1", dir.path()).unwrap();
        for key in ["ca.key", "eu-1.key"] {
            let mode = std::fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
    }

    #[test]
    fn a_node_id_that_is_not_a_dns_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        for bad in ["../x", "a b", "", "127.0.0.1"] {
            assert!(
                matches!(
                    issue(dir.path(), bad, dir.path()),
                    Err(CertError::InvalidNodeId(_))
                ),
                "{bad}"
            );
        }
    }
}
