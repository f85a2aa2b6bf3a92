//! Model repository layout: which models exist, where, and which of their versions the policy serves.
pub mod placed;

pub use mesh::repository::{
    fingerprint, is_namespaced, name_of_key, scan, scan_with, version_dirs, Fingerprint, ModelDir,
};

use std::path::PathBuf;

use mesh::config::ModelConfig;
use mesh::proto::model_version_policy::PolicyChoice;

/// Checks that every repository is a readable directory; a bad path is a start-up error, not a model error.
pub fn check_repositories(repos: &[PathBuf]) -> Result<(), String> {
    for repo in repos {
        std::fs::read_dir(repo).map_err(|e| format!("cannot read model repository {}: {e}", repo.display()))?;
    }
    Ok(())
}

/// The versions a config's version_policy selects from those present (default: latest 1).
pub fn select_versions(config: &ModelConfig, available: &[i64]) -> Result<Vec<i64>, String> {
    let policy = config.version_policy.as_ref().and_then(|p| p.policy_choice.as_ref());
    let chosen: Vec<i64> = match policy {
        None => available.iter().rev().take(1).rev().copied().collect(),
        Some(PolicyChoice::Latest(l)) => {
            let n = l.num_versions.max(1) as usize;
            available[available.len().saturating_sub(n)..].to_vec()
        }
        Some(PolicyChoice::All(_)) => available.to_vec(),
        Some(PolicyChoice::Specific(s)) => {
            if let Some(missing) = s.versions.iter().find(|v| !available.contains(v)) {
                return Err(format!(
                    "version_policy asks for version {missing}, which has no directory"
                ));
            }
            let mut v = s.versions.clone();
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    if chosen.is_empty() {
        return Err("no version directories (numeric folders such as 1/) to serve".into());
    }
    Ok(chosen)
}

/// The default file name for a platform or backend, overridden by `default_model_filename`.
pub fn model_file_name(config: &ModelConfig) -> String {
    if !config.default_model_filename.is_empty() {
        return config.default_model_filename.clone();
    }
    match (config.platform.as_str(), config.backend.as_str()) {
        ("pytorch_libtorch", _) | (_, "pytorch") => "model.pt".into(),
        (_, "python") => "model.py".into(),
        ("tensorflow_savedmodel", _) => "model.savedmodel".into(),
        ("tensorflow_graphdef", _) => "model.graphdef".into(),
        ("tensorrt_plan", _) | (_, "tensorrt") => "model.plan".into(),
        _ => "model.onnx".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::config::parse_pbtxt;

    fn pick(policy: &str, avail: &[i64]) -> Result<Vec<i64>, String> {
        select_versions(&parse_pbtxt(&format!("name: \"m\" {policy}")).unwrap(), avail)
    }

    #[test]
    fn version_policies() {
        assert_eq!(pick("", &[1, 2, 3]).unwrap(), vec![3]);
        assert_eq!(
            pick("version_policy: { latest { num_versions: 2 } }", &[1, 2, 3]).unwrap(),
            vec![2, 3]
        );
        assert_eq!(
            pick("version_policy: { latest { num_versions: 9 } }", &[1, 3]).unwrap(),
            vec![1, 3]
        );
        assert_eq!(pick("version_policy: { all { } }", &[1, 2, 3]).unwrap(), vec![1, 2, 3]);
        assert_eq!(
            pick("version_policy: { specific { versions: [3, 1] } }", &[1, 2, 3]).unwrap(),
            vec![1, 3]
        );
        assert!(pick("version_policy: { specific { versions: [4] } }", &[1, 2, 3])
            .unwrap_err()
            .contains("version 4"));
        assert!(pick("", &[]).unwrap_err().contains("no version directories"));
    }

    #[test]
    fn default_file_names() {
        let c = |t: &str| model_file_name(&parse_pbtxt(t).unwrap());
        assert_eq!(c("platform: \"onnxruntime_onnx\""), "model.onnx");
        assert_eq!(c("backend: \"python\""), "model.py");
        assert_eq!(c("platform: \"pytorch_libtorch\""), "model.pt");
        assert_eq!(
            c("backend: \"onnxruntime\" default_model_filename: \"w.onnx\""),
            "w.onnx"
        );
    }
}
