//! Finds and loads the ONNX Runtime shared library at start-up, with a clear error instead of a panic;
//! a node whose library is not found serves without it, and only ONNX models fail to load. Before a
//! GPU session, the CUDA and cuDNN libraries that PyPI's `onnxruntime-gpu[cuda,cudnn]` installed
//! beside it are loaded, so its CUDA execution provider finds them with no `LD_LIBRARY_PATH`.
use mesh::sync::Locked;
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
    /// ONNX Runtime allows one environment per process: a second node in the same process (an
    /// embedding program's) shares the first one's.
    pub fn load(configured: Option<String>) -> Result<Ort, String> {
        static SHARED: std::sync::Mutex<Option<Arc<Environment>>> = std::sync::Mutex::new(None);
        let mut shared = SHARED.locked();
        if let Some(env) = shared.as_ref() {
            return Ok(Ort(Ok(env.clone())));
        }
        let named = configured.is_some() || std::env::var_os("ORT_DYLIB_PATH").is_some();
        match init(configured) {
            Ok(env) => {
                let env = Arc::new(env);
                *shared = Some(env.clone());
                Ok(Ort(Ok(env)))
            }
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
    let _ = LOADED_FROM.set(path.clone());
    Ok(env)
}

/// The library the node loaded, for finding what was installed beside it.
static LOADED_FROM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The CUDA libraries ONNX Runtime's CUDA execution provider needs, in the order they are loaded
/// (each before those that need it); cuDNN's parts are all taken.
const CUDA_LIBRARIES: &[&str] = &[
    "libcudart.so.",
    "libnvrtc.so.",
    "libcublasLt.so.",
    "libcublas.so.",
    "libcurand.so.",
    "libcufft.so.",
    "libcudnn",
];

/// The CUDA libraries under a site-packages' `nvidia/` tree (PyPI's `nvidia-*` wheels: `nvidia/<part>/lib`
/// or `nvidia/cu13/lib`), in `CUDA_LIBRARIES`' order; versioned names only (`libX.so.N...`).
pub fn cuda_libraries(site_packages: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for part in std::fs::read_dir(site_packages.join("nvidia"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let lib = part.path().join("lib");
        if lib.is_dir() {
            dirs.push(lib);
        }
    }
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let name = |p: &PathBuf| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for prefix in CUDA_LIBRARIES {
        out.extend(
            files
                .iter()
                .filter(|p| {
                    let n = name(p);
                    n.starts_with(prefix) && n.contains(".so.") && !out.contains(*p)
                })
                .cloned()
                .collect::<Vec<_>>(),
        );
    }
    out
}

/// Loads, once, the CUDA libraries installed beside the ONNX Runtime the node loaded (when it came
/// from a venv's `onnxruntime/capi`), each global so the CUDA provider resolves its needs from them.
/// A library that does not load is skipped: the provider then says what it misses.
pub fn load_cuda_libraries() {
    // Kept for the life of the process: the provider holds pointers into them.
    static LOADED: std::sync::OnceLock<Vec<libloading::os::unix::Library>> = std::sync::OnceLock::new();
    LOADED.get_or_init(|| {
        let Some(site) = LOADED_FROM.get().and_then(|p| p.ancestors().nth(3)) else {
            return Vec::new();
        };
        let mut loaded = Vec::new();
        for path in cuda_libraries(site) {
            let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
            // SAFETY: these are NVIDIA's CUDA libraries from the venv, whose initialisers only
            // register themselves.
            match unsafe { libloading::os::unix::Library::open(Some(&path), flags) } {
                Ok(lib) => loaded.push(lib),
                Err(e) => tracing::debug!(library = %path.display(), "not loaded: {e}"),
            }
        }
        if !loaded.is_empty() {
            tracing::info!(
                count = loaded.len(),
                site = %site.display(),
                "CUDA libraries loaded for ONNX Runtime's CUDA execution provider"
            );
        }
        loaded
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_libraries_of_pypis_nvidia_wheels_are_found_in_load_order() {
        let site = std::env::temp_dir().join(format!("mesh-cuda-libs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&site);
        for (dir, file) in [
            ("nvidia/cudnn/lib", "libcudnn.so.9"),
            ("nvidia/cudnn/lib", "libcudnn_graph.so.9"),
            ("nvidia/cublas/lib", "libcublas.so.13"),
            ("nvidia/cublas/lib", "libcublasLt.so.13"),
            ("nvidia/cu13/lib", "libcudart.so.13"),
            ("nvidia/cu13/lib", "libcudart.so"),
            ("nvidia/cu13/lib", "libnvrtc.so.13"),
            ("nvidia/curand/lib", "libcurand.so.10"),
            ("nvidia/curand/lib", "README"),
            ("nvidia/nccl/lib", "libnccl.so.2"),
        ] {
            std::fs::create_dir_all(site.join(dir)).unwrap();
            std::fs::write(site.join(dir).join(file), b"").unwrap();
        }
        let names: Vec<String> = cuda_libraries(&site)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "libcudart.so.13",
                "libnvrtc.so.13",
                "libcublasLt.so.13",
                "libcublas.so.13",
                "libcurand.so.10",
                "libcudnn.so.9",
                "libcudnn_graph.so.9",
            ]
        );
        assert!(cuda_libraries(&site.join("nowhere")).is_empty());
        std::fs::remove_dir_all(&site).unwrap();
    }
}
