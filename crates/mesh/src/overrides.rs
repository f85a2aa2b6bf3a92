//! `file:` overrides of a repository load (node or router): written to a fresh private temporary
//! model directory (mode 0700, an unguessable name, never an existing path) that is removed when
//! its guard drops; a node keeps the guard as long as the model is loaded.
use std::path::{Component, Path, PathBuf};

use crate::{Error, Result};

/// At most this many `file:` overrides in one load request.
const MAX_OVERRIDE_FILES: usize = 64;

/// A temporary model directory built from `file:` overrides, removed when dropped.
pub struct OverrideDir(PathBuf);

impl OverrideDir {
    /// The model directory inside (`<root>/<name>`).
    pub fn model_dir(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl std::fmt::Debug for OverrideDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OverrideDir({})", self.0.display())
    }
}

impl Drop for OverrideDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks that an override path stays inside the model directory (no `..`, no absolute paths).
fn safe_relative(path: &str) -> Result<PathBuf> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(Error::invalid(format!(
            "file override path '{path}' must be relative and stay inside the model"
        )));
    }
    Ok(p.to_path_buf())
}

/// Writes `file:` overrides into a fresh directory laid out like a model directory.
/// Returns the guard and the model directory (`<temporary root>/<name>`).
pub fn write_override_dir(name: &str, files: &[(String, bytes::Bytes)]) -> Result<(OverrideDir, PathBuf)> {
    // The name becomes a directory: checked before anything is written.
    crate::repository::check_model_name(name)?;
    if files.len() > MAX_OVERRIDE_FILES {
        return Err(Error::invalid(format!(
            "at most {MAX_OVERRIDE_FILES} file overrides per load"
        )));
    }
    let root = crate::private::fresh_dir(&format!("mesh-{}-override-", std::process::id()))
        .map_err(|e| Error::internal(format!("cannot create a directory for file overrides: {e}")))?;
    let guard = OverrideDir(root.clone());
    let model_dir = root.join(name);
    for (path, bytes) in files {
        let target = model_dir.join(safe_relative(path)?);
        let io = |e: std::io::Error| Error::internal(format!("cannot write file override '{path}': {e}"));
        std::fs::create_dir_all(target.parent().unwrap_or(&model_dir)).map_err(io)?;
        std::fs::write(&target, bytes).map_err(io)?;
    }
    Ok((guard, model_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_paths_must_stay_inside_the_model() {
        assert!(safe_relative("1/model.onnx").is_ok());
        for bad in ["../x", "/etc/passwd", "1/../../x", "", "./a"] {
            assert!(safe_relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_traversal_name_writes_nothing() {
        let files = vec![("x".to_string(), bytes::Bytes::from_static(b"x"))];
        let escape = std::env::temp_dir().join(format!("mesh-esc-{}", std::process::id()));
        for name in ["../../../tmp/esc", escape.to_str().unwrap(), "..", "a/b"] {
            let e = write_override_dir(name, &files).unwrap_err();
            assert_eq!(e.code, crate::Code::InvalidArgument, "{name}");
        }
        assert!(!escape.exists());
    }

    #[test]
    fn override_dir_is_laid_out_and_removed() {
        let files = vec![("1/model.onnx".to_string(), bytes::Bytes::from_static(b"x"))];
        let (guard, dir) = write_override_dir("m", &files).unwrap();
        assert!(dir.ends_with("m"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(guard.model_dir("m"), dir);
        assert!(dir.join("1/model.onnx").is_file());
        let root = guard.0.clone();
        drop(guard);
        assert!(!root.exists());
    }
}
