//! Finds and loads the ONNX Runtime shared library at start-up, with a clear error instead of a panic;
//! a node whose library is not found serves without it, and only ONNX models fail to load.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ort::environment::Environment;

/// ONNX Runtime as the node has it: its environment, or why there is none.
#[derive(Clone)]
pub struct Ort(Result<Arc<Environment>, Arc<str>>);

impl Ort {
    /// Loads the library. A library named by `--backend-config onnxruntime,library=` or
    /// `ORT_DYLIB_PATH` must load; when none is named and none is found, the node starts without
    /// ONNX Runtime (one warning), so a repository of other models needs none.
    pub fn load(configured: Option<String>) -> Result<Ort, String> {
        let named = configured.is_some() || std::env::var_os("ORT_DYLIB_PATH").is_some();
        match init(configured) {
            Ok(env) => Ok(Ort(Ok(Arc::new(env)))),
            Err(why) if !named => {
                tracing::warn!("{why}; serving without ONNX Runtime: ONNX models fail to load, the others serve");
                Ok(Ort(Err(why.into())))
            }
            Err(why) => Err(why),
        }
    }

    /// Whether the library is loaded: nothing may call into ONNX Runtime otherwise (with dynamic
    /// loading, a call would look for the library itself).
    pub fn loaded(&self) -> bool {
        self.0.is_ok()
    }

    /// The environment, or the load error a model that needs it reports.
    pub fn env(&self) -> Result<&Arc<Environment>, String> {
        self.0
            .as_ref()
            .map_err(|why| format!("this model needs ONNX Runtime, which this node could not load: {why}"))
    }
}

/// The library file name inside the PyPI `onnxruntime==1.31.1` wheel.
const WHEEL_LIBRARY: &str = "libonnxruntime.so.1.31.1";

/// Candidate library paths: `--backend-config onnxruntime,library=`, `ORT_DYLIB_PATH`, then the project venv.
pub fn candidates(configured: Option<String>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = configured {
        out.push(PathBuf::from(p));
    }
    if let Ok(p) = std::env::var("ORT_DYLIB_PATH") {
        out.push(PathBuf::from(p));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    for root in roots {
        let lib = root.join(".venv/lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path().join("site-packages/onnxruntime/capi").join(WHEEL_LIBRARY);
            if p.is_file() {
                out.push(p);
            }
        }
    }
    out
}

/// Loads the library and builds the ONNX Runtime environment.
pub fn init(configured: Option<String>) -> Result<ort::environment::Environment, String> {
    let found = candidates(configured);
    let Some(path) = found.first() else {
        return Err(format!(
            "ONNX Runtime library not found: set ORT_DYLIB_PATH to .../onnxruntime/capi/{WHEEL_LIBRARY} \
             (pip install onnxruntime==1.31.1), or run scripts/setup.sh to create the project venv"
        ));
    };
    if !path.is_file() {
        return Err(format!(
            "ONNX Runtime library {} does not exist (from ORT_DYLIB_PATH or --backend-config)",
            path.display()
        ));
    }
    let builder = ort::init_from(path).map_err(|e| format!("cannot load ONNX Runtime from {}: {e}", path.display()))?;
    let env = builder
        .with_name("mesh-node")
        .build()
        .map_err(|e| format!("cannot start ONNX Runtime from {}: {e}", path.display()))?;
    tracing::info!(library = %path.display(), "ONNX Runtime loaded");
    Ok(env)
}
