//! `mesh-ops certs`: create the cluster CA and issue certificates into a directory (keys written with mode 0600;
//! every certificate issued is recorded in the directory's index, so `mesh-ops certs revoke` can revoke it by name).

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use mesh::cluster::certs::{describe_lifetime, CertificateAuthority, LeafRequest, Role, San};
use mesh::cluster::crl::Serial;
use mesh::cluster::reload::CRL_BESIDE_CA;

use crate::ca_dir::{check_name, record, write_file, INDEX};

/// The CA's common name unless told otherwise.
pub const DEFAULT_CA_NAME: &str = "mesh cluster CA";

/// What `certs init` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitReport {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub subject: String,
    pub days: u32,
    /// The revocation list and index of a CA this one replaced, removed.
    pub removed: Vec<PathBuf>,
}

impl fmt::Display for InitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "wrote {} (CA certificate '{}', valid {} days)",
            self.cert.display(),
            self.subject,
            self.days
        )?;
        writeln!(
            f,
            "wrote {} (CA private key, mode 0600: keep it off the cluster's machines)",
            self.key.display()
        )?;
        for path in &self.removed {
            writeln!(f, "removed {} (it belonged to the replaced CA)", path.display())?;
        }
        write!(
            f,
            "next: mesh-ops certs issue {} NAME --role router|node",
            self.cert.parent().unwrap_or(Path::new(".")).display()
        )
    }
}

/// What `certs issue` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueReport {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub name: String,
    pub role: Role,
    pub sans: Vec<San>,
    pub days: u32,
    /// How long it is valid (`days`, or `--hours`).
    pub lifetime: Duration,
    /// Its serial number (recorded in the CA directory's index).
    pub serial: Serial,
}

impl fmt::Display for IssueReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "wrote {} ({} certificate for '{}', serial {}, valid {})",
            self.cert.display(),
            self.role,
            self.name,
            self.serial,
            describe_lifetime(self.lifetime)
        )?;
        writeln!(f, "wrote {} (private key, mode 0600)", self.key.display())?;
        let sans: Vec<String> = self.sans.iter().map(San::to_string).collect();
        writeln!(f, "SANs: {}", sans.join(", "))?;
        write!(
            f,
            "use: --cluster-ca {} --cluster-cert {} --cluster-key {}",
            self.ca.display(),
            self.cert.display(),
            self.key.display()
        )
    }
}

/// Creates `dir` if needed and writes a new CA as `dir/ca.pem` and `dir/ca.key`. Refuses to replace an
/// existing CA unless `force`.
pub fn init(dir: &Path, common_name: &str, days: u32, force: bool) -> anyhow::Result<InitReport> {
    let cert = dir.join("ca.pem");
    let key = dir.join("ca.key");
    if !force {
        if let Some(existing) = [&cert, &key].into_iter().find(|p| p.exists()) {
            bail!(
                "{} already exists: {} already holds a cluster CA. Replacing it invalidates every certificate it \
                 issued; pass --force to replace it anyway",
                existing.display(),
                dir.display()
            );
        }
    }
    let ca = CertificateAuthority::generate(common_name, days).map_err(anyhow::Error::msg)?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_file(&key, ca.key_pem(), true)?;
    write_file(&cert, ca.cert_pem(), false)?;
    // The old CA's revocation list and index mean nothing for the new one.
    let mut removed = Vec::new();
    for old in [dir.join(CRL_BESIDE_CA), dir.join(INDEX)] {
        if fs::symlink_metadata(&old).is_ok() {
            fs::remove_file(&old).with_context(|| format!("cannot remove {}", old.display()))?;
            removed.push(old);
        }
    }
    Ok(InitReport {
        cert,
        key,
        subject: ca.subject().to_string(),
        days,
        removed,
    })
}

/// Loads the CA from `dir` and writes a certificate for `req.name` as `dir/NAME.pem` and `dir/NAME.key`.
/// Refuses to replace an existing one unless `force`.
pub fn issue(dir: &Path, req: &LeafRequest, force: bool) -> anyhow::Result<IssueReport> {
    check_name(&req.name)?;
    let ca_cert = dir.join("ca.pem");
    let ca_key = dir.join("ca.key");
    if !ca_cert.exists() {
        bail!(
            "no CA in {}: {} is missing (run `mesh-ops certs init {}` first)",
            dir.display(),
            ca_cert.display(),
            dir.display()
        );
    }
    let cert = dir.join(format!("{}.pem", req.name));
    let key = dir.join(format!("{}.key", req.name));
    if !force {
        if let Some(existing) = [&cert, &key].into_iter().find(|p| p.exists()) {
            bail!(
                "{} already exists; pass --force to re-issue '{}'",
                existing.display(),
                req.name
            );
        }
    }
    let ca = CertificateAuthority::load(&ca_cert, &ca_key).map_err(anyhow::Error::msg)?;
    let issued = ca
        .issue(req)
        .map_err(|e| anyhow::anyhow!("cannot issue '{}': {e}", req.name))?;
    // Recorded first: a serial in the index that never reached a file is harmless; a file whose serial is missing
    // from the index could not be revoked by name once replaced.
    let serial = record(dir, &req.name, req.role, &issued.cert_pem, req.validity())?;
    write_file(&key, &issued.key_pem, true)?;
    write_file(&cert, &issued.cert_pem, false)?;
    Ok(IssueReport {
        ca: ca_cert,
        cert,
        key,
        name: req.name.clone(),
        role: req.role,
        sans: issued.sans,
        days: req.days,
        lifetime: req.validity(),
        serial,
    })
}

#[cfg(test)]
#[path = "certs_tests.rs"]
mod tests;
