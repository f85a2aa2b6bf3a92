//! The files of a CA directory: certificate names checked (they become file names), files written whole (a
//! temporary file and a rename, private where secret), and the record of issued certificates (`issued.tsv`), by
//! which `certs revoke` finds a NAME's serials.
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use mesh::cluster::certs::Role;
use mesh::cluster::crl::Serial;

/// The longest certificate name accepted (it becomes a file name and a DNS label).
const MAX_NAME: usize = 63;

/// The record of issued certificates in the CA directory.
pub const INDEX: &str = "issued.tsv";
const INDEX_HEADER: &str = "# certificates issued by this CA (mesh-ops certs issue): serial, name, role, not after \
                            (unix seconds)\n";

/// One certificate the CA issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub serial: Serial,
    pub name: String,
    pub role: String,
    /// Unix seconds.
    pub not_after: u64,
}

/// The index's entries; none when it does not exist yet. Errors name the file (and line).
pub fn read_index(dir: &Path) -> anyhow::Result<Vec<Issued>> {
    let path = dir.join(INDEX);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        Ok(m) if !m.is_file() => bail!(
            "{} is not a regular file (a symlink?); refusing to use it",
            path.display()
        ),
        Ok(_) => {}
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut issued = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let entry = match fields.as_slice() {
            [serial, name, role, not_after] => {
                serial
                    .parse::<Serial>()
                    .ok()
                    .zip(not_after.parse().ok())
                    .map(|(serial, not_after)| Issued {
                        serial,
                        name: name.to_string(),
                        role: role.to_string(),
                        not_after,
                    })
            }
            _ => None,
        };
        match entry {
            Some(e) => issued.push(e),
            None => bail!(
                "{}:{}: not 'SERIAL<TAB>NAME<TAB>ROLE<TAB>NOT_AFTER': {line:?}",
                path.display(),
                i + 1
            ),
        }
    }
    Ok(issued)
}

/// Adds a certificate to the index (created with mode 0600 through a fresh file and a rename).
pub fn record(dir: &Path, name: &str, role: Role, cert_pem: &str, lifetime: Duration) -> anyhow::Result<Serial> {
    let serial = Serial::of_pem(cert_pem).map_err(anyhow::Error::msg)?;
    let mut text = match read_index(dir)? {
        entries if entries.is_empty() => INDEX_HEADER.to_string(),
        _ => std::fs::read_to_string(dir.join(INDEX)).context("cannot read the index")?,
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let not_after = SystemTime::now().checked_add(lifetime).unwrap_or(SystemTime::now());
    text.push_str(&format!("{serial}\t{name}\t{role}\t{}\n", unix(not_after)));
    write_file(&dir.join(INDEX), &text, true)?;
    Ok(serial)
}

/// Whole seconds since the Unix epoch (0 before it).
pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
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
pub(crate) fn write_file(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
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
