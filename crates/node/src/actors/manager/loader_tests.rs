//! The loader without a server: GPU limits, the platform read from a model's file, the backend a
//! config picks, and which config changes apply in place.
use super::*;
use mesh::proto::ModelInstanceGroup;

#[test]
fn gpu_limits_are_read_as_tritonserver_writes_them_and_reject_what_is_over() {
    let limits = super::gpu_limits(&["0:0.8".into(), " 1 : 0.5".into()]).unwrap();
    assert_eq!(limits.into_iter().collect::<Vec<_>>(), vec![(0, 0.8), (1, 0.5)]);
    for bad in ["0", "x:0.5", "0:x", "-1:0.5", "0:-0.1", "0:NaN", ":"] {
        let e = super::gpu_limits(&[bad.into()]).unwrap_err();
        assert!(e.contains("<device_id>:<fraction>") && e.contains(bad), "{e}");
    }
    const GIB: u64 = 1 << 30;
    assert!(super::check_gpu_limit("m", 0, 0.5, (80 * GIB, 40 * GIB)).is_ok());
    let e = super::check_gpu_limit("m", 1, 0.5, (80 * GIB, 40 * GIB + 1)).unwrap_err();
    assert!(
        e.starts_with("can not create model 'm': memory limit set for GPU 1 has exceeded, model loading is rejected"),
        "{e}"
    );
    assert!(super::check_gpu_limit("m", 0, 0.0, (80 * GIB, 0)).is_ok());
}

#[test]
fn a_config_without_platform_or_backend_gets_them_from_the_model_file() {
    let root = tempfile::tempdir().unwrap();
    let detect = |file: &str, dir: bool| {
        let path = root.path().join(file.replace('.', "_"));
        std::fs::create_dir_all(path.join("1")).unwrap();
        if dir {
            std::fs::create_dir_all(path.join("1").join(file)).unwrap();
        } else {
            std::fs::write(path.join("1").join(file), b"x").unwrap();
        }
        let md = ModelDir {
            versions: vec![1],
            ..ModelDir::at("m", path)
        };
        let mut c = ModelConfig::default();
        detect_platform(&mut c, &md);
        (c.platform, c.backend)
    };
    assert_eq!(
        detect("model.savedmodel", true),
        ("tensorflow_savedmodel".into(), "".into())
    );
    assert_eq!(
        detect("model.graphdef", false),
        ("tensorflow_graphdef".into(), "".into())
    );
    assert_eq!(detect("model.py", false), ("".into(), "python".into()));
    assert_eq!(detect("model.pt", false), ("pytorch_libtorch".into(), "".into()));
    assert_eq!(
        detect("model.onnx", false),
        ("".into(), "".into()),
        "ONNX stays the default"
    );
}

fn with_count(count: i32) -> ModelConfig {
    ModelConfig {
        name: "m".into(),
        max_batch_size: 8,
        instance_group: vec![ModelInstanceGroup {
            count,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn torchscript_configs_pick_the_torch_backend() {
    let kind = |platform: &str, backend: &str| {
        backend_kind(&ModelConfig {
            platform: platform.into(),
            backend: backend.into(),
            ..Default::default()
        })
    };
    assert_eq!(kind("pytorch_libtorch", ""), Ok(BackendKind::Torch));
    assert_eq!(kind("", "pytorch"), Ok(BackendKind::Torch));
    assert_eq!(kind("pytorch_libtorch", "pytorch"), Ok(BackendKind::Torch));
    assert!(kind("pytorch_libtorch", "onnxruntime").is_err());
}

#[cfg(not(feature = "torch"))]
#[test]
fn without_the_feature_a_torchscript_model_says_how_to_get_it() {
    let err = open_torch(&ModelConfig::default(), std::path::Path::new("model.pt"), Device::Cpu)
        .err()
        .expect("no torch in this build");
    assert!(
        err.contains("without TorchScript support") && err.contains("scripts/setup-torch.sh"),
        "{err}"
    );
}

#[test]
fn a_count_change_alone_applies_in_place() {
    assert!(only_instances_differ(&with_count(1), &with_count(3)));
    assert!(
        !only_instances_differ(&with_count(2), &with_count(2)),
        "no change is not a resize"
    );
    let mut other = with_count(3);
    other.max_batch_size = 4;
    assert!(
        !only_instances_differ(&with_count(1), &other),
        "any other change reloads"
    );
}

#[test]
fn a_rollouts_override_brings_only_its_version_policy() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    std::fs::create_dir_all(dir.join("configs")).unwrap();
    let own = "name: \"m\"\nbackend: \"python\"\nversion_policy: { specific: { versions: [1] } }\n";
    std::fs::write(dir.join("config.pbtxt"), own).unwrap();
    std::fs::write(
        dir.join("configs").join("big.pbtxt"),
        format!("{own}max_batch_size: 8\n"),
    )
    .unwrap();
    let md = ModelDir::at("m", dir);
    let policy_only = mesh::config::config_from_json(
        r#"{"name": "m", "version_policy": {"specific": {"versions": [1, 2]}},
            "parameters": {"mesh.version_policy_only": {"string_value": "true"}}}"#,
    )
    .unwrap();
    let settings = |name: Option<&str>| LoadSettings {
        config_name: name.map(str::to_string),
        auto_complete: true,
        retries: 0,
        threads: 1,
        namespacing: false,
        gpu_limits: BTreeMap::new(),
    };
    let versions = |c: &ModelConfig| format!("{:?}", c.version_policy.as_ref().unwrap().policy_choice);
    // Its own config.pbtxt (max_batch_size still left to auto-complete), serving both versions.
    let (c, sets_mbs) = written_config(&md, Some(policy_only.clone()), &settings(None)).unwrap();
    assert_eq!((c.backend.as_str(), sets_mbs, c.parameters.len()), ("python", false, 0));
    assert_eq!(versions(&c), "Some(Specific(Specific { versions: [1, 2] }))");
    // --model-config-name still picks its file.
    let (c, sets_mbs) = written_config(&md, Some(policy_only), &settings(Some("big"))).unwrap();
    assert_eq!((c.max_batch_size, sets_mbs), (8, true));
    assert_eq!(versions(&c), "Some(Specific(Specific { versions: [1, 2] }))");
}
