//! `EXECUTION_ENV_PATH`: a Python environment directory, or a conda-pack tarball unpacked once into a cache.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The interpreter inside an environment (a directory, or a `.tar.gz`/`.tgz`/`.tar` to unpack).
pub fn interpreter_in(env: &Path) -> Result<PathBuf, String> {
    let dir = if env.is_dir() {
        env.to_path_buf()
    } else if env.is_file() {
        unpack(env)?
    } else {
        return Err(format!("EXECUTION_ENV_PATH {} does not exist", env.display()));
    };
    ["bin/python3", "bin/python"]
        .iter()
        .map(|p| dir.join(p))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("EXECUTION_ENV_PATH {} has no bin/python3", env.display()))
}

/// The cache of unpacked environments: a directory of this user's, mode 0700, made fresh when
/// missing. One that is a symlink, another user's, or open to others is refused, since whatever
/// sits in it becomes the interpreter a model runs on.
fn private_cache(root: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", root.display())),
    }
    let meta = std::fs::symlink_metadata(root).map_err(|e| format!("cannot read {}: {e}", root.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a private directory of this user (mode 0700, uid {me}, not a symlink); remove it",
            root.display()
        ));
    }
    Ok(())
}

/// The SHA-256 of a file, in hex.
fn content_hash(path: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut file, &mut h).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Unpacks a tarball once into a private cache, under the SHA-256 of its contents: a changed
/// tarball is a new directory, and a directory is used only if this process's user made it
/// there (the cache is private) and its record names the same hash.
fn unpack(tarball: &Path) -> Result<PathBuf, String> {
    let name = tarball.to_string_lossy();
    if !(name.ends_with(".tar.gz") || name.ends_with(".tgz") || name.ends_with(".tar")) {
        return Err(format!(
            "EXECUTION_ENV_PATH {name} is neither a directory nor a .tar.gz/.tgz/.tar"
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let root = std::env::temp_dir().join(format!("mesh-node-envs-{}", unsafe { libc::geteuid() }));
    private_cache(&root)?;
    let hash = content_hash(tarball)?;
    let target = root.join(&hash);
    if std::fs::read_to_string(target.join(".unpacked")).is_ok_and(|h| h == hash) {
        return Ok(target);
    }
    // Unpacked beside, then renamed into place: a half-unpacked directory is never used.
    let partial = root.join(format!("{hash}.{}.partial", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir(&partial).map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
    let status = Command::new("tar")
        .arg("-xf")
        .arg(tarball)
        .arg("-C")
        .arg(&partial)
        .status()
        .map_err(|e| format!("cannot run tar to unpack {name}: {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(format!("tar could not unpack {name} ({status})"));
    }
    std::fs::write(partial.join(".unpacked"), &hash).map_err(|e| e.to_string())?;
    if let Err(e) = std::fs::rename(&partial, &target) {
        let _ = std::fs::remove_dir_all(&partial);
        // Another process unpacked the same tarball meanwhile: use its copy.
        if !std::fs::read_to_string(target.join(".unpacked")).is_ok_and(|h| h == hash) {
            return Err(format!(
                "cannot move the unpacked {name} into {}: {e}",
                target.display()
            ));
        }
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_cache_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("envs");
        private_cache(&root).unwrap();
        assert_eq!(std::fs::metadata(&root).unwrap().permissions().mode() & 0o777, 0o700);
        private_cache(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_cache(&root).unwrap_err().contains("not a private directory"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(private_cache(&link).unwrap_err().contains("not a symlink"));
    }

    #[test]
    fn a_tarball_is_unpacked_under_its_content_hash() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("env/bin")).unwrap();
        std::fs::write(dir.path().join("env/bin/python3"), b"one").unwrap();
        let tar = dir.path().join("env.tar");
        let ok = Command::new("tar")
            .args([
                "-cf",
                tar.to_str().unwrap(),
                "-C",
                dir.path().join("env").to_str().unwrap(),
                ".",
            ])
            .status()
            .unwrap();
        assert!(ok.success());
        let first = unpack(&tar).unwrap();
        assert_eq!(
            first.file_name().unwrap().to_str().unwrap(),
            content_hash(&tar).unwrap()
        );
        assert_eq!(std::fs::read(first.join("bin/python3")).unwrap(), b"one");
        // A record that names another hash is not trusted: the tarball is unpacked again.
        std::fs::write(first.join(".unpacked"), "forged").unwrap();
        std::fs::write(first.join("bin/python3"), b"planted").unwrap();
        let again = unpack(&tar);
        // The rename onto an existing directory fails, and the forged copy is not used.
        assert!(again.is_err() || std::fs::read(first.join("bin/python3")).unwrap() == b"one");
        let _ = std::fs::remove_dir_all(first);
    }

    #[test]
    fn a_directory_env_needs_bin_python3() {
        let dir = tempfile::tempdir().unwrap();
        assert!(interpreter_in(dir.path()).unwrap_err().contains("no bin/python3"));
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/python3"), b"").unwrap();
        assert_eq!(interpreter_in(dir.path()).unwrap(), dir.path().join("bin/python3"));
        assert!(interpreter_in(&dir.path().join("missing"))
            .unwrap_err()
            .contains("does not exist"));
    }
}
