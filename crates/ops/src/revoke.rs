//! `mesh-ops certs revoke` and `certs crl`: revoking by NAME (through the CA directory's record of issued
//! certificates) or SERIAL, and the directory's certificate revocation list (`crl.pem`, signed by the CA, written atomically with a
//! CRL number that grows on every write).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use mesh::cluster::certs::CertificateAuthority;
use mesh::cluster::crl::{self, Entry, Reason, Serial};
use mesh::cluster::reload::CRL_BESIDE_CA;

pub use crate::ca_dir::INDEX;
use crate::ca_dir::{check_name, read_index, unix, write_file, Issued};

/// Days a revocation list is due for renewal after it is written, unless told otherwise. Members keep using a list
/// past it (and warn); refresh it with `mesh-ops certs crl DIR`.
pub const DEFAULT_CRL_DAYS: u32 = 30;
/// One certificate `certs revoke` put on the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revoked {
    pub serial: Serial,
    /// Its name, when the index or NAME.pem knows it.
    pub name: Option<String>,
    /// It was on the list already (revoking twice is not an error).
    pub already: bool,
}

/// What `certs revoke` and `certs crl` wrote (or, for `certs crl --show`, found).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrlReport {
    pub path: PathBuf,
    pub written: bool,
    pub number: Option<u64>,
    pub next_update: Option<SystemTime>,
    /// What this command revoked (empty for `certs crl`).
    pub revoked: Vec<Revoked>,
    /// Every entry of the list, with its name when known.
    pub entries: Vec<(Entry, Option<String>)>,
}

impl fmt::Display for CrlReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.revoked {
            let name = r.name.as_deref().map(|n| format!(" ('{n}')")).unwrap_or_default();
            match r.already {
                true => writeln!(f, "serial {}{name} was already revoked", r.serial)?,
                false => writeln!(f, "revoked serial {}{name}", r.serial)?,
            }
        }
        let number = self.number.map_or("-".into(), |n| n.to_string());
        let next = self.next_update.map_or("-".into(), crl::show_time);
        let verb = if self.written { "wrote" } else { "read" };
        writeln!(
            f,
            "{verb} {} (revocation list number {number}, next update {next}): {} certificate(s) revoked",
            self.path.display(),
            self.entries.len()
        )?;
        for (e, name) in &self.entries {
            let reason = e.reason.map(|r| format!(" ({r})")).unwrap_or_default();
            writeln!(
                f,
                "  {}  {}  since {}{reason}",
                e.serial,
                name.as_deref().unwrap_or("?"),
                crl::show_time(e.revoked_at)
            )?;
        }
        write!(
            f,
            "members pick it up within a second where it is their --cluster-crl (default: crl.pem beside \
             --cluster-ca); copy it to the others; refresh it before its next update with `mesh-ops certs crl DIR`"
        )
    }
}

/// The CA of `dir`, or an error saying how to make one.
fn load_ca(dir: &Path) -> anyhow::Result<CertificateAuthority> {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if !cert.exists() {
        bail!(
            "no CA in {}: {} is missing (run `mesh-ops certs init {}` first)",
            dir.display(),
            cert.display(),
            dir.display()
        );
    }
    CertificateAuthority::load(&cert, &key).map_err(anyhow::Error::msg)
}

/// The serials `target` names: every certificate issued for the NAME (the index and NAME.pem), else one SERIAL.
fn serials_of(dir: &Path, target: &str, index: &[Issued]) -> anyhow::Result<Vec<(Serial, Option<String>)>> {
    let mut found: Vec<(Serial, Option<String>)> = index
        .iter()
        .filter(|i| i.name == target)
        .map(|i| (i.serial.clone(), Some(i.name.clone())))
        .collect();
    let pem = dir.join(format!("{target}.pem"));
    if check_name(target).is_ok() && pem.is_file() {
        let text = std::fs::read_to_string(&pem).with_context(|| format!("cannot read {}", pem.display()))?;
        let serial = Serial::of_pem(&text).map_err(|e| anyhow::anyhow!("{}: {e}", pem.display()))?;
        if !found.iter().any(|(s, _)| *s == serial) {
            found.push((serial, Some(target.to_string())));
        }
    }
    if !found.is_empty() {
        return Ok(found);
    }
    match target.parse::<Serial>() {
        Ok(serial) => {
            let name = index.iter().find(|i| i.serial == serial).map(|i| i.name.clone());
            Ok(vec![(serial, name)])
        }
        Err(_) => bail!(
            "no certificate named '{target}' was issued from {} (none in {}, no {}); give a NAME or a SERIAL in hex \
             (`openssl x509 -noout -serial -in CERT`)",
            dir.display(),
            dir.join(INDEX).display(),
            pem.display()
        ),
    }
}

/// The list in `dir` now: its entries and number (none and 0 when there is none yet).
fn current(ca: &CertificateAuthority, path: &Path) -> anyhow::Result<(Vec<Entry>, u64, Option<SystemTime>)> {
    if !path.exists() {
        return Ok((Vec::new(), 0, None));
    }
    let crls = ca.read_crl(path).map_err(anyhow::Error::msg)?;
    let number = crls.iter().filter_map(|c| c.number).max().unwrap_or(0);
    let next = crls.iter().filter_map(|c| c.next_update).min();
    Ok((crls.into_iter().flat_map(|c| c.entries).collect(), number, next))
}

/// Writes `entries` as the CA's list with the next number; the report names every entry.
fn write_list(
    dir: &Path,
    ca: &CertificateAuthority,
    entries: Vec<Entry>,
    number: u64,
    crl_days: u32,
    revoked: Vec<Revoked>,
) -> anyhow::Result<CrlReport> {
    if crl_days == 0 || crl_days > mesh::cluster::certs::MAX_DAYS {
        bail!(
            "--crl-days {crl_days} is out of range (1 to {})",
            mesh::cluster::certs::MAX_DAYS
        );
    }
    let number = number
        .checked_add(1)
        .context("the revocation list's number cannot grow any more")?;
    let valid_for = Duration::from_secs(u64::from(crl_days) * 86_400);
    let pem = ca.sign_crl(number, &entries, valid_for).map_err(anyhow::Error::msg)?;
    let path = dir.join(CRL_BESIDE_CA);
    write_file(&path, &pem, false)?;
    let index = read_index(dir)?;
    Ok(CrlReport {
        path,
        written: true,
        number: Some(number),
        next_update: SystemTime::now().checked_add(valid_for),
        revoked,
        entries: named(entries, &index),
    })
}

fn named(entries: Vec<Entry>, index: &[Issued]) -> Vec<(Entry, Option<String>)> {
    entries
        .into_iter()
        .map(|e| {
            let name = index.iter().find(|i| i.serial == e.serial).map(|i| i.name.clone());
            (e, name)
        })
        .collect()
}

/// Revokes `target` (a NAME: every certificate issued for it; or a SERIAL in hex) and writes `dir/crl.pem`.
pub fn revoke(dir: &Path, target: &str, reason: Option<Reason>, crl_days: u32) -> anyhow::Result<CrlReport> {
    let ca = load_ca(dir)?;
    let index = read_index(dir)?;
    let serials = serials_of(dir, target, &index)?;
    let path = dir.join(CRL_BESIDE_CA);
    let (mut entries, number, _) = current(&ca, &path)?;
    // A CRL keeps whole seconds.
    let now = UNIX_EPOCH + Duration::from_secs(unix(SystemTime::now()));
    let mut revoked = Vec::new();
    for (serial, name) in serials {
        let already = entries.iter().any(|e| e.serial == serial);
        if !already {
            entries.push(Entry {
                serial: serial.clone(),
                revoked_at: now,
                reason: reason.filter(|r| *r != Reason::Unspecified),
            });
        }
        revoked.push(Revoked { serial, name, already });
    }
    write_list(dir, &ca, entries, number, crl_days, revoked)
}

/// Writes `dir/crl.pem` again with the next number and a new next-update time (an empty list when there was none),
/// or with `show`, only reads it.
pub fn crl(dir: &Path, crl_days: u32, show: bool) -> anyhow::Result<CrlReport> {
    let ca = load_ca(dir)?;
    let path = dir.join(CRL_BESIDE_CA);
    let (entries, number, next_update) = current(&ca, &path)?;
    if !show {
        return write_list(dir, &ca, entries, number, crl_days, Vec::new());
    }
    if !path.exists() {
        bail!(
            "no revocation list in {} yet ({} is written by `mesh-ops certs revoke` or `mesh-ops certs crl`)",
            dir.display(),
            path.display()
        );
    }
    Ok(CrlReport {
        path,
        written: false,
        number: Some(number),
        next_update,
        revoked: Vec::new(),
        entries: named(entries, &read_index(dir)?),
    })
}

#[cfg(test)]
#[path = "revoke_tests.rs"]
mod tests;
