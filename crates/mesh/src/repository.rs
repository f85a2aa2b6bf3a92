//! Model repository layout shared by mesh-node and mesh-router: the model directories of the
//! repositories (Triton's layout) and their numeric version folders.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A model directory found in a repository.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDir {
    pub name: String,
    pub path: PathBuf,
    /// Numeric version folders found, ascending.
    pub versions: Vec<i64>,
}

/// Lists the models of every repository; a name found in two repositories is an error for that name.
pub fn scan(repos: &[PathBuf]) -> (Vec<ModelDir>, Vec<(String, String)>) {
    let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut errors = Vec::new();
    for repo in repos {
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
        if paths.len() > 1 {
            let shown: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
            errors.push((
                name,
                format!("model name is found in more than one repository: {}", shown.join(", ")),
            ));
            continue;
        }
        let path = paths.into_iter().next().expect("one path");
        let versions = version_dirs(&path);
        models.push(ModelDir { name, path, versions });
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
