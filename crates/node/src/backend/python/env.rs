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

/// Unpacks a tarball into a cache folder named after its path, size and time, once.
fn unpack(tarball: &Path) -> Result<PathBuf, String> {
    use std::hash::{Hash, Hasher};
    let name = tarball.to_string_lossy();
    if !(name.ends_with(".tar.gz") || name.ends_with(".tgz") || name.ends_with(".tar")) {
        return Err(format!(
            "EXECUTION_ENV_PATH {name} is neither a directory nor a .tar.gz/.tgz/.tar"
        ));
    }
    let meta = std::fs::metadata(tarball).map_err(|e| format!("cannot read {name}: {e}"))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name.as_ref(), meta.len(), meta.modified().ok()).hash(&mut h);
    let target = std::env::temp_dir()
        .join("mesh-node-envs")
        .join(format!("{:016x}", h.finish()));
    if target.join(".unpacked").is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&target).map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let status = Command::new("tar")
        .arg("-xf")
        .arg(tarball)
        .arg("-C")
        .arg(&target)
        .status()
        .map_err(|e| format!("cannot run tar to unpack {name}: {e}"))?;
    if !status.success() {
        return Err(format!("tar could not unpack {name} ({status})"));
    }
    std::fs::write(target.join(".unpacked"), b"").map_err(|e| e.to_string())?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

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
