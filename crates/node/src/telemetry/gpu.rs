//! GPU metrics as tritonserver reports them (`nv_gpu_utilization`, `nv_gpu_memory_total_bytes`,
//! `nv_gpu_memory_used_bytes`, `nv_gpu_power_usage`, `nv_gpu_power_limit`, `nv_energy_consumption`,
//! each labelled `gpu_uuid`), read from NVML, loaded at run time, every `--metrics-interval-ms` for
//! the node's GPUs. Without NVML one log line says so and the metrics are absent.
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::time::Duration;

use metrics::gauge;

/// One GPU's reading, in NVML's units; None where NVML could not tell.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reading {
    pub utilization_percent: Option<u32>,
    /// (total, used) bytes.
    pub memory: Option<(u64, u64)>,
    pub power_mw: Option<u32>,
    pub limit_mw: Option<u32>,
    /// Energy since the driver loaded, in mJ.
    pub energy_mj: Option<u64>,
}

/// Turns readings into Triton's values (sans-IO): a fraction, bytes, watts, and joules used since
/// the node's first reading of that GPU.
#[derive(Default)]
pub struct Gauges {
    energy_start: HashMap<String, u64>,
}

impl Gauges {
    pub fn values(&mut self, uuid: &str, r: &Reading) -> Vec<(&'static str, f64)> {
        let mut out = Vec::new();
        if let Some(p) = r.utilization_percent {
            out.push(("nv_gpu_utilization", f64::from(p.min(100)) / 100.0));
        }
        if let Some((total, used)) = r.memory {
            out.push(("nv_gpu_memory_total_bytes", total as f64));
            out.push(("nv_gpu_memory_used_bytes", used as f64));
        }
        if let Some(mw) = r.power_mw {
            out.push(("nv_gpu_power_usage", f64::from(mw) / 1000.0));
        }
        if let Some(mw) = r.limit_mw {
            out.push(("nv_gpu_power_limit", f64::from(mw) / 1000.0));
        }
        if let Some(mj) = r.energy_mj {
            let start = *self.energy_start.entry(uuid.to_string()).or_insert(mj);
            out.push(("nv_energy_consumption", mj.saturating_sub(start) as f64 / 1000.0));
        }
        out
    }
}

/// NVML's status codes: 0 is success.
type Status = i32;
type Device = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: u32,
    memory: u32,
}

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// The NVML calls the sampler makes, resolved from `libnvidia-ml.so.1`.
struct Nvml {
    by_uuid: unsafe extern "C" fn(*const c_char, *mut Device) -> Status,
    utilization: unsafe extern "C" fn(Device, *mut Utilization) -> Status,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> Status,
    power: unsafe extern "C" fn(Device, *mut u32) -> Status,
    limit: unsafe extern "C" fn(Device, *mut u32) -> Status,
    energy: unsafe extern "C" fn(Device, *mut u64) -> Status,
    /// Kept loaded while the functions above are used.
    _library: libloading::Library,
}

impl Nvml {
    /// Loads NVML and initializes it; the error names what is missing.
    fn load() -> Result<Nvml, String> {
        const LIBRARY: &str = "libnvidia-ml.so.1";
        // SAFETY: loading NVML runs its initializers only; it is NVIDIA's documented entry point.
        let library =
            unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| format!("cannot load {LIBRARY}: {e}"))?;
        macro_rules! symbol {
            ($name:literal) => {
                // SAFETY: each name is resolved to the C signature NVML's header gives it.
                *unsafe { library.get($name) }
                    .map_err(|e| format!("{LIBRARY} has no {}: {e}", String::from_utf8_lossy($name)))?
            };
        }
        let init: unsafe extern "C" fn() -> Status = symbol!(b"nvmlInit_v2");
        let nvml = Nvml {
            by_uuid: symbol!(b"nvmlDeviceGetHandleByUUID"),
            utilization: symbol!(b"nvmlDeviceGetUtilizationRates"),
            memory: symbol!(b"nvmlDeviceGetMemoryInfo"),
            power: symbol!(b"nvmlDeviceGetPowerUsage"),
            limit: symbol!(b"nvmlDeviceGetEnforcedPowerLimit"),
            energy: symbol!(b"nvmlDeviceGetTotalEnergyConsumption"),
            _library: library,
        };
        // SAFETY: nvmlInit_v2 takes no arguments and may be called more than once.
        let status = unsafe { init() };
        if status != 0 {
            return Err(format!("nvmlInit_v2 failed (NVML status {status})"));
        }
        Ok(nvml)
    }

    fn device(&self, uuid: &str) -> Option<Device> {
        let name = CString::new(uuid).ok()?;
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a place for the handle, as NVML asks.
        (unsafe { (self.by_uuid)(name.as_ptr(), &mut device) } == 0).then_some(device)
    }

    fn read(&self, device: Device) -> Reading {
        Reading {
            utilization_percent: get(device, self.utilization).map(|u| u.gpu),
            memory: get(device, self.memory).map(|m| (m.total, m.used)),
            power_mw: get(device, self.power),
            limit_mw: get(device, self.limit),
            energy_mj: get(device, self.energy),
        }
    }
}

/// Calls one NVML getter for `device`: its value where NVML succeeded.
fn get<T: Default>(device: Device, getter: unsafe extern "C" fn(Device, *mut T) -> Status) -> Option<T> {
    let mut value = T::default();
    // SAFETY: a handle NVML gave, and a place of the type this getter writes.
    (unsafe { getter(device, &mut value) } == 0).then_some(value)
}

/// The memory of the GPU with this UUID now, as `(total, used)` bytes (all processes), from NVML.
pub fn memory(uuid: &str) -> Result<(u64, u64), String> {
    let nvml = Nvml::load()?;
    let device = nvml
        .device(uuid)
        .ok_or_else(|| format!("NVML does not know GPU {uuid}"))?;
    // Only the memory getter: the other readings cost NVML calls a load check does not need.
    get(device, nvml.memory)
        .map(|m| (m.total, m.used))
        .ok_or_else(|| format!("NVML gives no memory use for GPU {uuid}"))
}

/// Samples the GPUs named by `uuids` every `interval` on a thread of its own (NVML calls block).
/// Without NVML, or with none of the GPUs known to it, logs why once and samples nothing.
pub fn spawn_sampler(interval: Duration, uuids: Vec<String>) {
    let spawned = std::thread::Builder::new().name("gpu-metrics".into()).spawn(move || {
        let nvml = match Nvml::load() {
            Ok(nvml) => nvml,
            Err(e) => return tracing::warn!("GPU metrics (nv_gpu_*) are off: {e}"),
        };
        let devices: Vec<(String, Device)> = uuids
            .into_iter()
            .filter_map(|u| nvml.device(&u).map(|d| (u, d)))
            .collect();
        if devices.is_empty() {
            return tracing::warn!("GPU metrics (nv_gpu_*) are off: NVML knows none of this node's GPUs");
        }
        tracing::info!(gpus = devices.len(), "GPU metrics from NVML");
        let mut gauges = Gauges::default();
        loop {
            for (uuid, device) in &devices {
                for (name, value) in gauges.values(uuid, &nvml.read(*device)) {
                    gauge!(name, "gpu_uuid" => uuid.clone()).set(value);
                }
            }
            std::thread::sleep(interval);
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("GPU metrics (nv_gpu_*) are off: cannot start their thread: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_become_tritons_units_and_energy_counts_from_the_first() {
        let mut g = Gauges::default();
        let r = Reading {
            utilization_percent: Some(37),
            memory: Some((80 << 30, 1 << 30)),
            power_mw: Some(251_500),
            limit_mw: Some(700_000),
            energy_mj: Some(5_000_000),
        };
        let first: HashMap<_, _> = g.values("GPU-a", &r).into_iter().collect();
        assert_eq!(first["nv_gpu_utilization"], 0.37);
        assert_eq!(first["nv_gpu_memory_total_bytes"], (80u64 << 30) as f64);
        assert_eq!(first["nv_gpu_memory_used_bytes"], (1u64 << 30) as f64);
        assert_eq!(first["nv_gpu_power_usage"], 251.5);
        assert_eq!(first["nv_gpu_power_limit"], 700.0);
        assert_eq!(first["nv_energy_consumption"], 0.0, "since the node started");
        let later = Reading {
            energy_mj: Some(5_012_500),
            ..Reading::default()
        };
        let second = g.values("GPU-a", &later);
        assert_eq!(
            second,
            vec![("nv_energy_consumption", 12.5)],
            "what NVML could not tell is left out"
        );
        assert_eq!(
            g.values("GPU-b", &later),
            vec![("nv_energy_consumption", 0.0)],
            "per GPU"
        );
    }

    #[test]
    fn without_nvml_loading_says_what_is_missing() {
        if let Err(e) = Nvml::load() {
            assert!(e.contains("libnvidia-ml.so.1") || e.contains("nvml"), "{e}");
        }
    }
}
