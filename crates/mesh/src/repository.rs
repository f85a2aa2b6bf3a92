//! Model repository layout shared by mesh-node and mesh-router: the model directories of the
//! repositories (Triton's layout), their numeric version folders, and the rules for names from
//! clients and configs that become paths in them.
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use crate::{Error, Result};

/// The longest model name accepted where a name becomes a directory (a file name's usual limit).
pub const MAX_MODEL_NAME_BYTES: usize = 255;

/// Checks a model name that becomes a directory name (load, unload, overrides, placement): one
/// path component, not `.` or `..`, without `/`, `\` or NUL, at most [`MAX_MODEL_NAME_BYTES`].
/// Anything else could name a directory outside the repository.
pub fn check_model_name(name: &str) -> Result<()> {
    check_path_component("model name", name)
}

/// Checks a name that becomes one path component (`what` names it in the error), by the rules of
/// [`check_model_name`].
pub fn check_path_component(what: &str, name: &str) -> Result<()> {
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > MAX_MODEL_NAME_BYTES {
        "it is longer than 255 bytes"
    } else if name == "." || name == ".." {
        "it is '.' or '..'"
    } else if name.contains(['/', '\\']) {
        "it contains '/' or '\\'"
    } else if name.contains('\0') {
        "it contains a NUL character"
    } else {
        return Ok(());
    };
    let shown: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    Err(Error::invalid(format!(
        "invalid {what} '{shown}': {why}; a {what} must be one path component (not '.' or '..', no '/', \
         '\\' or NUL, at most {MAX_MODEL_NAME_BYTES} bytes)"
    )))
}

/// Checks a file name a config gives (`label_filename`, `default_model_filename`): a relative path
/// that stays inside the model's directory.
pub fn check_file_in_model(field: &str, path: &str) -> Result<()> {
    let p = Path::new(path);
    let inside = !path.is_empty() && !path.contains('\0') && p.components().all(|c| matches!(c, Component::Normal(_)));
    if inside {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{field} '{}' must be a file inside the model directory (a relative path without '..')",
        path.escape_debug()
    )))
}

/// A model directory found in a repository.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDir {
    /// The model's name: its directory's name.
    pub name: String,
    /// The name a node's model table keeps it under: `name`, or with `--model-namespacing` the
    /// directory's path (see [`namespaced_key`]).
    pub key: String,
    pub path: PathBuf,
    /// Numeric version folders found, ascending.
    pub versions: Vec<i64>,
}

impl ModelDir {
    /// The model `name` in the directory `path`, with the version folders found there.
    pub fn at(name: &str, path: PathBuf) -> ModelDir {
        let versions = version_dirs(&path);
        ModelDir {
            name: name.to_string(),
            key: name.to_string(),
            path,
            versions,
        }
    }
}

/// The key of a model when `--model-namespacing` makes each repository a namespace: the path of
/// its directory. No model name can be one (a name is one path component, without `/`), so a
/// key never meets a name, and the key says which repository the model came from.
pub fn namespaced_key(dir: &Path) -> String {
    dir.to_string_lossy().into_owned()
}

/// The model name a table key stands for: the key itself, or the last part of a namespaced key.
pub fn name_of_key(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// Whether a table key is a namespaced one (a directory's path).
pub fn is_namespaced(key: &str) -> bool {
    key.contains('/')
}

/// Lists the models of every repository; a name found in two repositories is an error for that name.
pub fn scan(repos: &[PathBuf]) -> (Vec<ModelDir>, Vec<(String, String)>) {
    scan_with(repos, false)
}

/// Lists the models of every repository. Without `namespacing`, a name found in two repositories
/// is an error for that name. With it (Triton's `--model-namespacing`), each repository is a
/// namespace: every model is listed, also a name found in several, keyed by its directory's path.
pub fn scan_with(repos: &[PathBuf], namespacing: bool) -> (Vec<ModelDir>, Vec<(String, String)>) {
    let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut seen_repos = std::collections::BTreeSet::new();
    // A repository given twice is one namespace, not two.
    for repo in repos.iter().filter(|r| seen_repos.insert(r.as_path())) {
        let Ok(entries) = std::fs::read_dir(repo) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() && !name.starts_with('.') {
                found.entry(name).or_default().push(path);
            }
        }
    }
    let mut models = Vec::new();
    for (name, paths) in found {
        if namespacing {
            models.extend(paths.into_iter().map(|path| ModelDir {
                key: namespaced_key(&path),
                ..ModelDir::at(&name, path)
            }));
            continue;
        }
        if paths.len() > 1 {
            let shown: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
            errors.push((
                name,
                format!("model name is found in more than one repository: {}", shown.join(", ")),
            ));
            continue;
        }
        let path = paths.into_iter().next().expect("one path");
        models.push(ModelDir::at(&name, path));
    }
    (models, errors)
}

/// Numeric subdirectories, ascending; anything else is ignored as Triton does.
pub fn version_dirs(model: &Path) -> Vec<i64> {
    let mut v: Vec<i64> = std::fs::read_dir(model)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .then(|| n.parse::<i64>().ok())
                .flatten()
        })
        .filter(|&v| v > 0)
        .collect();
    v.sort_unstable();
    v
}

/// What a directory fingerprint covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fingerprint {
    /// Everything: a change to any file or folder changes it.
    All,
    /// Everything but the model's top-level `config.pbtxt` (a change of the model's files only).
    Content,
}

/// Entries a fingerprint looks at, at most (a huge directory costs no more than this to poll).
pub const FINGERPRINT_ENTRIES: usize = 10_000;
/// Folder depth a fingerprint looks into (a SavedModel's `variables/` is 3 below the model).
pub const FINGERPRINT_DEPTH: usize = 8;

/// The one way the mesh tells that a model directory changed, on nodes (repository polling) and
/// on routers (before hashing a model to ship it): a hash of the names, sizes and modification
/// times of what lies under it (links followed, as loading does), sorted, without reading file
/// contents. Bounded by [`FINGERPRINT_ENTRIES`] and [`FINGERPRINT_DEPTH`]; an unreadable folder
/// counts as empty.
pub fn fingerprint(model: &Path, what: Fingerprint) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut stack = vec![(model.to_path_buf(), 0usize)];
    let mut seen = 0;
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        depth.hash(&mut h);
        for e in entries {
            if what == Fingerprint::Content && depth == 0 && e.file_name() == "config.pbtxt" {
                continue;
            }
            seen += 1;
            if seen > FINGERPRINT_ENTRIES {
                return h.finish();
            }
            e.file_name().hash(&mut h);
            if let Ok(m) = std::fs::metadata(e.path()) {
                m.is_dir().hash(&mut h);
                m.len().hash(&mut h);
                m.modified().ok().hash(&mut h);
                if m.is_dir() && depth < FINGERPRINT_DEPTH {
                    stack.push((e.path(), depth + 1));
                }
            }
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_sees_every_change_below_the_model_and_content_skips_its_config() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path();
        std::fs::create_dir_all(m.join("1/model.savedmodel/variables")).unwrap();
        std::fs::write(m.join("config.pbtxt"), "name: \"m\"").unwrap();
        std::fs::write(m.join("1/model.savedmodel/variables/v.data"), "abc").unwrap();
        let (all, content) = (fingerprint(m, Fingerprint::All), fingerprint(m, Fingerprint::Content));
        assert_eq!(fingerprint(m, Fingerprint::All), all, "stable");
        // A file three folders down (a SavedModel's variables) changes both.
        std::fs::write(m.join("1/model.savedmodel/variables/v.data"), "abcd").unwrap();
        let (all2, content2) = (fingerprint(m, Fingerprint::All), fingerprint(m, Fingerprint::Content));
        assert_ne!(all2, all);
        assert_ne!(content2, content);
        // The config changes only the full one.
        std::fs::write(m.join("config.pbtxt"), "name: \"m\" max_batch_size: 4").unwrap();
        assert_ne!(fingerprint(m, Fingerprint::All), all2);
        assert_eq!(fingerprint(m, Fingerprint::Content), content2);
        // A new empty version folder is a change; a missing directory is stable.
        std::fs::create_dir(m.join("2")).unwrap();
        assert_ne!(fingerprint(m, Fingerprint::Content), content2);
        let gone = m.join("nothing");
        assert_eq!(
            fingerprint(&gone, Fingerprint::All),
            fingerprint(&gone, Fingerprint::All)
        );
    }

    #[test]
    fn model_names_are_one_path_component() {
        for ok in ["m", "add_sub", "ocr.v2", "a-b", "名前", &"x".repeat(255)] {
            assert!(check_model_name(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(256);
        for (bad, why) in [
            ("", "empty"),
            (".", "'.' or '..'"),
            ("..", "'.' or '..'"),
            ("../../../tmp/esc", "'/'"),
            ("/tmp/esc", "'/'"),
            ("a\\b", "'\\'"),
            ("a\0b", "NUL"),
            (long.as_str(), "255"),
        ] {
            let e = check_model_name(bad).unwrap_err();
            assert_eq!(e.code, crate::Code::InvalidArgument);
            assert!(e.message.contains(why), "{bad}: {}", e.message);
            assert!(e.message.contains("one path component"), "{}", e.message);
        }
    }

    #[test]
    fn config_file_names_stay_inside_the_model() {
        assert!(check_file_in_model("label_filename", "labels.txt").is_ok());
        assert!(check_file_in_model("default_model_filename", "sub/model.onnx").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a", "a\0"] {
            let e = check_file_in_model("default_model_filename", bad).unwrap_err();
            assert!(e.message.starts_with("default_model_filename"), "{}", e.message);
        }
    }

    #[test]
    fn scan_ignores_non_numeric_folders_and_reports_duplicates() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        for d in ["m/1", "m/10", "m/2", "m/notes", "m/0", "dup/1"] {
            std::fs::create_dir_all(a.path().join(d)).unwrap();
        }
        std::fs::create_dir_all(b.path().join("dup/1")).unwrap();
        std::fs::write(a.path().join("stray.txt"), "x").unwrap();
        let (models, errors) = scan(&[a.path().to_path_buf(), b.path().to_path_buf()]);
        assert_eq!(models.len(), 1);
        assert_eq!(models[0].name, "m");
        assert_eq!(models[0].versions, vec![1, 2, 10]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].1.contains("more than one repository"));
        // With namespacing, both copies are listed, every model under its path.
        let (models, errors) = scan_with(
            &[a.path().to_path_buf(), b.path().to_path_buf(), a.path().to_path_buf()],
            true,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let keys: Vec<_> = models.iter().map(|m| (m.name.as_str(), m.key.as_str())).collect();
        let (da, db) = (a.path().join("dup"), b.path().join("dup"));
        let dm = a.path().join("m");
        let mut want = vec![
            ("dup", da.to_str().unwrap()),
            ("dup", db.to_str().unwrap()),
            ("m", dm.to_str().unwrap()),
        ];
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want);
        for m in &models {
            assert_eq!(name_of_key(&m.key), m.name);
            assert!(is_namespaced(&m.key));
            assert!(!is_namespaced(&m.name));
        }
    }
}
