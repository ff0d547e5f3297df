//! Certificates for TLS tests, made with rcgen: a CA, server certificates for `localhost` and
//! 127.0.0.1, client certificates with a CN and SAN URIs. PEM files in a directory removed
//! when the [`Pki`] is dropped.
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA and the directory its files go to.
pub struct Pki {
    pub dir: PathBuf,
    /// The CA's certificate (PEM): what clients trust and `--tls-client-ca` names.
    pub ca: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Removes `dir` when dropped (not a sibling's).
    owner: bool,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish()
    }
}

impl Pki {
    /// A fresh CA named `name`, its files in a new temporary directory.
    pub fn new(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("outboxd-pki-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        Self::in_dir(name, dir, true)
    }

    /// A second CA whose files go to the same directory (for rotation to another CA).
    pub fn sibling(&self, name: &str) -> Result<Self> {
        Self::in_dir(name, self.dir.clone(), false)
    }

    fn in_dir(name: &str, dir: PathBuf, owner: bool) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let ca = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca, issuer.pem())?;
        Ok(Self { dir, ca, issuer, owner })
    }

    /// A server certificate for `localhost` and 127.0.0.1, written to `<stem>.pem` and
    /// `<stem>.key` (replacing them by rename, as a secret volume does).
    pub fn server(&self, stem: &str) -> Result<CertFiles> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, "outboxd");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, stem)
    }

    /// A server certificate naming only the DNS names `names`, for checks of the host name.
    pub fn server_named(&self, stem: &str, names: &[&str]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("server"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, stem)
    }

    /// A client certificate with subject `CN=<cn>` and the given SAN URIs.
    pub fn client(&self, stem: &str, cn: &str, uris: &[&str]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for u in uris {
            params.subject_alt_names.push(SanType::URI((*u).try_into()?));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, stem)
    }

    fn issue(&self, params: CertificateParams, stem: &str) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles { cert: self.dir.join(format!("{stem}.pem")), key: self.dir.join(format!("{stem}.key")) };
        write_atomically(&files.key, key.serialize_pem().as_bytes())?;
        write_atomically(&files.cert, cert.pem().as_bytes())?;
        Ok(files)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Writes a file by renaming a complete one over it: readers see the old or the new.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
