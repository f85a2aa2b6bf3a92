//! Model metadata (KServe v2) derived from a model's config and its ready versions.
use crate::config::ModelConfig;
use crate::dispatch::ModelView;
use crate::dtype::DataType;

/// One input or output as model metadata shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

/// Model metadata: versions, platform, and tensors with batched shapes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

/// The platform name metadata reports, from `platform` or else `backend`.
pub fn platform_of(config: &ModelConfig) -> String {
    match (config.platform.as_str(), config.backend.as_str()) {
        ("", "onnxruntime") => "onnxruntime_onnx".into(),
        ("", b) => b.into(),
        (p, _) => p.into(),
    }
}

impl ModelMetadata {
    pub fn from_view(view: &ModelView) -> Self {
        let c = &view.config;
        let batched = c.max_batch_size > 0;
        let shape = |dims: &[i64]| -> Vec<i64> {
            let mut s = Vec::with_capacity(dims.len() + 1);
            if batched {
                s.push(-1);
            }
            s.extend_from_slice(dims);
            s
        };
        let dt = |v: i32| {
            DataType::from_config(v)
                .map_or("INVALID", |d| d.wire_name())
                .to_string()
        };
        ModelMetadata {
            name: c.name.clone(),
            versions: view.ready_versions.iter().map(|v| v.to_string()).collect(),
            platform: platform_of(c),
            inputs: c
                .input
                .iter()
                .map(|i| TensorMetadata {
                    name: i.name.clone(),
                    datatype: dt(i.data_type),
                    shape: shape(&i.dims),
                })
                .collect(),
            outputs: c
                .output
                .iter()
                .map(|o| TensorMetadata {
                    name: o.name.clone(),
                    datatype: dt(o.data_type),
                    shape: shape(&o.dims),
                })
                .collect(),
        }
    }
}
