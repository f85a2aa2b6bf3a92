//! `mesh-ops certs`: create the cluster CA and issue certificates into a directory (keys written with mode 0600).

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use mesh::cluster::certs::{CertificateAuthority, LeafRequest, Role, San};

/// The CA's common name unless told otherwise.
pub const DEFAULT_CA_NAME: &str = "mesh cluster CA";
/// The longest certificate name accepted (it becomes a file name and a DNS label).
const MAX_NAME: usize = 63;

/// What `certs init` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitReport {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub subject: String,
    pub days: u32,
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
}

impl fmt::Display for IssueReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "wrote {} ({} certificate for '{}', valid {} days)",
            self.cert.display(),
            self.role,
            self.name,
            self.days
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
    Ok(InitReport {
        cert,
        key,
        subject: ca.subject().to_string(),
        days,
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
    })
}

/// A certificate name must make a safe file name: letters, digits, `-`, `_` and `.`, not starting with `.` or
/// `-`, at most 63 characters, and not `ca` (the CA's own files).
pub fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() {
        bail!("the certificate name is empty");
    }
    if name.chars().count() > MAX_NAME {
        bail!("certificate name '{name}' is longer than {MAX_NAME} characters");
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        bail!(
            "certificate name {name:?} contains {bad:?}: use letters, digits, '-', '_' and '.' only (it names the \
             files NAME.pem and NAME.key)"
        );
    }
    if name.starts_with('.') || name.starts_with('-') {
        bail!("certificate name '{name}' must not start with '.' or '-'");
    }
    if name.eq_ignore_ascii_case("ca") {
        bail!("certificate name '{name}' is reserved for the CA's own files (ca.pem, ca.key)");
    }
    Ok(())
}

/// Writes `contents` to `path` through a temporary file in the same directory and a rename, so a reader never
/// sees half a file; `secret` files are created with mode 0600.
fn write_file(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let written = options
        .open(&tmp)
        .and_then(|mut file| file.write_all(contents.as_bytes()).and_then(|()| file.sync_all()))
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
#[path = "certs_tests.rs"]
mod tests;
