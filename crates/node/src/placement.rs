//! GPU discovery (cudarc, dynamic loading) and Triton instance-group placement.
//!
//! Discovery is the only part that touches the driver; `restrict` and `place_instances` are pure,
//! so every placement rule is unit-tested without a GPU.
//!
//! Naming scheme: a group's name is its `name`, or `<model>_<group index>` when empty (the
//! implicit group of a config without `instance_group` is index 0). Instances are named
//! `<group name>_<n>`, where `n` counts from 0 over the whole group, GPU by GPU in the order the
//! GPUs are listed, then `count` per GPU. So `m` with `{ count: 2 }` on GPUs 0 and 1 gives `m_0_0`,
//! `m_0_1` on GPU 0 and `m_0_2`, `m_0_3` on GPU 1. Group names must be unique within a model.
use std::collections::HashSet;
use std::panic::catch_unwind;

use mesh::config::ModelConfig;
use mesh::proto::model_instance_group::Kind;
use mesh::proto::ModelInstanceGroup;

use crate::backend::onnx::Device;

/// Most instances one model may have: counts come from untrusted config files.
pub const MAX_INSTANCES_PER_MODEL: usize = 64;

/// One CUDA device as the driver reports it (indices already honour `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: i32,
    pub name: String,
    pub memory_bytes: u64,
    /// NVML's name for it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), Triton's `gpu_uuid` label.
    pub uuid: String,
}

/// A CUDA device UUID as NVML and nvidia-smi write it.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| bytes[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// What discovery found, plus one log line explaining it (including why there are no GPUs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDiscovery {
    pub gpus: Vec<GpuInfo>,
    pub note: String,
}

/// Lists the node's GPUs without ever panicking, so a CPU-only machine starts normally.
pub fn discover_gpus() -> GpuDiscovery {
    // SAFETY: only tries to dlopen the libcuda candidates and drops the handle again.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return cpu_only("no CUDA driver found (libcuda not present)".into());
    }
    match catch_unwind(query_driver) {
        Ok(Ok(gpus)) if gpus.is_empty() => cpu_only("CUDA driver reports no devices".into()),
        Ok(Ok(gpus)) => GpuDiscovery {
            note: describe(&gpus),
            gpus,
        },
        Ok(Err(e)) => cpu_only(format!("CUDA driver present but unusable ({e})")),
        Err(_) => cpu_only("CUDA driver panicked during discovery".into()),
    }
}

fn cpu_only(why: String) -> GpuDiscovery {
    GpuDiscovery {
        gpus: Vec::new(),
        note: format!("{why}: running CPU-only"),
    }
}

fn query_driver() -> Result<Vec<GpuInfo>, String> {
    use cudarc::driver::result::{self, device, DriverError};
    use cudarc::driver::sys::CUresult;
    match result::init() {
        Ok(()) => {}
        // cuInit itself fails with NO_DEVICE when the driver sees no (visible) GPU.
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(Vec::new()),
        Err(e) => return Err(format!("cuInit: {e}")),
    }
    let count = device::get_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
    (0..count)
        .map(|index| {
            let dev = device::get(index).map_err(|e| format!("cuDeviceGet({index}): {e}"))?;
            let name = device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {e}"))?;
            // SAFETY: `dev` was returned by `device::get`.
            let mem = unsafe { device::total_mem(dev) }.map_err(|e| format!("cuDeviceTotalMem: {e}"))?;
            let uuid = device::get_uuid(dev).map_err(|e| format!("cuDeviceGetUuid: {e}"))?;
            Ok(GpuInfo {
                index,
                name,
                memory_bytes: mem as u64,
                uuid: uuid_text(&uuid.bytes.map(|b| b as u8)),
            })
        })
        .collect()
}

fn describe(gpus: &[GpuInfo]) -> String {
    let list: Vec<String> = gpus
        .iter()
        .map(|g| {
            format!(
                "{} {} ({:.1} GiB)",
                g.index,
                g.name,
                g.memory_bytes as f64 / (1u64 << 30) as f64
            )
        })
        .collect();
    let plural = if gpus.len() == 1 { "" } else { "s" };
    format!("{} GPU{plural}: {}", gpus.len(), list.join(", "))
}

/// Applies `mesh-node --gpus 0,1`: keeps only the listed GPUs, rejecting any the node lacks.
///
/// `None` keeps everything; `Some(&[])` keeps nothing (run CPU-only).
pub fn restrict(found: &[GpuInfo], allowed: Option<&[i32]>) -> Result<Vec<GpuInfo>, String> {
    let Some(allowed) = allowed else {
        return Ok(found.to_vec());
    };
    if let Some(bad) = allowed.iter().find(|i| !found.iter().any(|g| g.index == **i)) {
        return Err(format!(
            "--gpus lists GPU {bad}, which this node does not have (found: {:?})",
            found.iter().map(|g| g.index).collect::<Vec<_>>()
        ));
    }
    Ok(found.iter().filter(|g| allowed.contains(&g.index)).cloned().collect())
}

/// One instance to start: which group it came from and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstancePlacement {
    pub name: String,
    /// The name Triton 2.51 gives it (a Python model's `model_instance_name`, checked against a real
    /// Triton): `<group>_<index>`, where an unnamed group of `instance_group` is `<model>_<group
    /// index>` and the implicit group of a config without one is `<model>` (so `m_0_0` and `m_0`).
    pub triton_name: String,
    /// Index into `instance_group` (0 for the implicit group of a config without one).
    pub group: usize,
    pub device: Device,
    /// KIND_MODEL: the backend/model chooses devices itself; `device` is then just `Cpu`.
    pub model_managed: bool,
}

/// Expands a model's `instance_group` into concrete instances on this node's `gpus` (Triton rules).
/// `auto_on_gpu`: whether the model's backend can run on these GPUs, so KIND_AUTO (and a config
/// without instance groups) takes them; else KIND_AUTO runs on CPU, and only KIND_GPU or an AUTO
/// group that lists GPUs asks for a GPU (and fails with the backend's reason if it cannot have one).
pub fn place_instances(
    config: &ModelConfig,
    gpus: &[i32],
    auto_on_gpu: bool,
) -> Result<Vec<InstancePlacement>, String> {
    let implicit = [ModelInstanceGroup {
        kind: Kind::Auto as i32,
        count: 1,
        ..Default::default()
    }];
    let groups = if config.instance_group.is_empty() {
        &implicit[..]
    } else {
        &config.instance_group[..]
    };
    let mut out = Vec::new();
    let mut names = HashSet::new();
    for (gi, group) in groups.iter().enumerate() {
        let gname = if group.name.is_empty() {
            format!("{}_{gi}", config.name)
        } else {
            group.name.clone()
        };
        if !names.insert(gname.clone()) {
            return Err(format!("instance group name '{gname}' is used twice"));
        }
        let kind = Kind::try_from(group.kind)
            .map_err(|_| format!("instance group '{gname}' has unknown kind {}", group.kind))?;
        if group.count < 0 {
            return Err(format!("instance group '{gname}' has negative count {}", group.count));
        }
        let count = group.count.max(1) as usize;
        let listed = &group.gpus;
        let on_gpu = match kind {
            Kind::Gpu => true,
            // AUTO listing GPUs is an explicit GPU request, so it fails like KIND_GPU without them.
            Kind::Auto => (auto_on_gpu && !gpus.is_empty()) || !listed.is_empty(),
            Kind::Cpu | Kind::Model => {
                if !listed.is_empty() {
                    let k = kind.as_str_name();
                    return Err(format!(
                        "instance group '{gname}' has kind {k} but lists GPUs {listed:?}"
                    ));
                }
                false
            }
        };
        let devices: Vec<Device> = if on_gpu {
            if gpus.is_empty() {
                return Err(format!(
                    "instance group '{gname}' asks for {} but this node has no GPUs (no CUDA driver or devices, or excluded by --gpus)",
                    kind.as_str_name()
                ));
            }
            if let Some(bad) = listed.iter().find(|i| !gpus.contains(i)) {
                return Err(format!(
                    "instance group '{gname}' lists GPU {bad}, which this node does not have (available: {gpus:?})"
                ));
            }
            let chosen = if listed.is_empty() { gpus } else { &listed[..] };
            chosen.iter().map(|&i| Device::Gpu(i)).collect()
        } else {
            vec![Device::Cpu]
        };
        let total = count.checked_mul(devices.len()).and_then(|n| n.checked_add(out.len()));
        if total.is_none_or(|n| n > MAX_INSTANCES_PER_MODEL) {
            return Err(format!(
                "model '{}' asks for more than {MAX_INSTANCES_PER_MODEL} instances (group '{gname}': count {count} x {} device(s))",
                config.name,
                devices.len()
            ));
        }
        let mut n = 0;
        let triton_group = if config.instance_group.is_empty() {
            config.name.clone()
        } else {
            gname.clone()
        };
        for device in devices {
            for _ in 0..count {
                let name = format!("{gname}_{n}");
                out.push(InstancePlacement {
                    triton_name: format!("{triton_group}_{n}"),
                    name,
                    group: gi,
                    device,
                    model_managed: kind == Kind::Model,
                });
                n += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, kind: Kind, count: i32, gpus: &[i32]) -> ModelInstanceGroup {
        let (name, kind, gpus) = (name.into(), kind as i32, gpus.to_vec());
        ModelInstanceGroup {
            name,
            kind,
            count,
            gpus,
            ..Default::default()
        }
    }

    fn config(instance_group: Vec<ModelInstanceGroup>) -> ModelConfig {
        ModelConfig {
            name: "m".into(),
            instance_group,
            ..Default::default()
        }
    }

    /// Placements rendered as "name:device" words, for compact assertions.
    fn ok(groups: Vec<ModelInstanceGroup>, gpus: &[i32]) -> String {
        let placed = place_instances(&config(groups), gpus, true).unwrap();
        let words: Vec<String> = placed.iter().map(|p| format!("{}:{:?}", p.name, p.device)).collect();
        words.join(" ")
    }

    fn err(groups: Vec<ModelInstanceGroup>, gpus: &[i32]) -> String {
        place_instances(&config(groups), gpus, true).unwrap_err()
    }

    fn gpu(index: i32) -> GpuInfo {
        GpuInfo {
            index,
            name: format!("Fake {index}"),
            memory_bytes: 80 << 30,
            uuid: format!("GPU-{index}"),
        }
    }

    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let bytes: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_text(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn discovery_never_panics_and_explains_itself() {
        let d = discover_gpus();
        assert!(!d.note.is_empty());
        // SAFETY: same dlopen probe as discover_gpus.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            assert!(d.gpus.is_empty());
            assert_eq!(d.note, "no CUDA driver found (libcuda not present): running CPU-only");
        }
    }

    #[test]
    fn note_lists_gpus() {
        assert_eq!(describe(&[gpu(0)]), "1 GPU: 0 Fake 0 (80.0 GiB)");
        let two = "2 GPUs: 0 Fake 0 (80.0 GiB), 1 Fake 1 (80.0 GiB)";
        assert_eq!(describe(&[gpu(0), gpu(1)]), two);
    }

    #[test]
    fn restrict_keeps_listed_and_rejects_missing() {
        let found = [gpu(0), gpu(1), gpu(2)];
        assert_eq!(restrict(&found, None).unwrap(), found.to_vec());
        assert_eq!(restrict(&found, Some(&[2, 0])).unwrap(), vec![gpu(0), gpu(2)]);
        assert!(restrict(&found, Some(&[])).unwrap().is_empty());
        let e = restrict(&found, Some(&[1, 7])).unwrap_err();
        assert_eq!(
            e,
            "--gpus lists GPU 7, which this node does not have (found: [0, 1, 2])"
        );
        assert!(restrict(&[], Some(&[0])).unwrap_err().contains("found: []"));
    }

    #[test]
    fn no_instance_group_is_one_per_gpu_or_one_cpu() {
        assert_eq!(ok(vec![], &[0, 1]), "m_0_0:Gpu(0) m_0_1:Gpu(1)");
        assert_eq!(ok(vec![], &[]), "m_0_0:Cpu");
    }

    #[test]
    fn gpu_kind_places_count_on_each_gpu() {
        let all = "m_0_0:Gpu(0) m_0_1:Gpu(0) m_0_2:Gpu(1) m_0_3:Gpu(1)";
        assert_eq!(ok(vec![group("", Kind::Gpu, 2, &[])], &[0, 1]), all);
        assert_eq!(ok(vec![group("g", Kind::Gpu, 0, &[1])], &[0, 1]), "g_0:Gpu(1)");
        let e = err(vec![group("g", Kind::Gpu, 1, &[0, 3])], &[0, 1]);
        assert_eq!(
            e,
            "instance group 'g' lists GPU 3, which this node does not have (available: [0, 1])"
        );
        let e = err(vec![group("g", Kind::Gpu, 1, &[])], &[]);
        assert!(
            e.starts_with("instance group 'g' asks for KIND_GPU but this node has no GPUs ("),
            "{e}"
        );
    }

    #[test]
    fn cpu_kind_counts_and_rejects_gpus() {
        assert_eq!(ok(vec![group("c", Kind::Cpu, 3, &[])], &[0]), "c_0:Cpu c_1:Cpu c_2:Cpu");
        let e = err(vec![group("c", Kind::Cpu, 1, &[0])], &[0]);
        assert_eq!(e, "instance group 'c' has kind KIND_CPU but lists GPUs [0]");
    }

    #[test]
    fn auto_kind_follows_available_gpus() {
        assert_eq!(
            ok(vec![group("a", Kind::Auto, 1, &[])], &[0, 1]),
            "a_0:Gpu(0) a_1:Gpu(1)"
        );
        assert_eq!(ok(vec![group("a", Kind::Auto, 1, &[1])], &[0, 1]), "a_0:Gpu(1)");
        assert_eq!(ok(vec![group("a", Kind::Auto, 2, &[])], &[]), "a_0:Cpu a_1:Cpu");
        assert!(err(vec![group("a", Kind::Auto, 1, &[0])], &[]).contains("KIND_AUTO but this node has no GPUs"));
        assert!(err(vec![group("a", Kind::Auto, 1, &[5])], &[0]).contains("GPU 5"));
    }

    #[test]
    fn auto_kind_stays_on_cpu_when_the_backend_cannot_use_the_gpus() {
        let cpu = |groups| {
            let placed = place_instances(&config(groups), &[0, 1], false).unwrap();
            placed
                .iter()
                .map(|p| format!("{}:{:?}", p.name, p.device))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(cpu(vec![group("a", Kind::Auto, 2, &[])]), "a_0:Cpu a_1:Cpu");
        assert_eq!(cpu(vec![]), "m_0_0:Cpu", "a config without instance groups");
        // Naming a GPU, or KIND_GPU, is still a request for one (the backend then says why it fails).
        assert_eq!(cpu(vec![group("a", Kind::Auto, 1, &[1])]), "a_0:Gpu(1)");
        assert_eq!(cpu(vec![group("g", Kind::Gpu, 1, &[])]), "g_0:Gpu(0) g_1:Gpu(1)");
    }

    #[test]
    fn model_kind_is_backend_managed() {
        let placed = place_instances(&config(vec![group("x", Kind::Model, 2, &[])]), &[0], true).unwrap();
        let got: Vec<_> = placed
            .iter()
            .map(|p| (p.name.as_str(), p.device, p.model_managed))
            .collect();
        assert_eq!(got, [("x_0", Device::Cpu, true), ("x_1", Device::Cpu, true)]);
        assert!(err(vec![group("x", Kind::Model, 1, &[0])], &[0]).contains("KIND_MODEL but lists GPUs"));
        let other = place_instances(&config(vec![group("c", Kind::Cpu, 1, &[])]), &[], true).unwrap();
        assert!(!other[0].model_managed);
    }

    #[test]
    fn several_groups_are_named_and_indexed_separately() {
        let groups = vec![
            group("", Kind::Cpu, 1, &[]),
            group("", Kind::Gpu, 1, &[0]),
            group("fast", Kind::Gpu, 1, &[]),
        ];
        let placed = place_instances(&config(groups), &[0], true).unwrap();
        let got: Vec<(&str, usize)> = placed.iter().map(|p| (p.name.as_str(), p.group)).collect();
        assert_eq!(got, [("m_0_0", 0), ("m_1_0", 1), ("fast_0", 2)]);
        // Triton 2.51's names (read from a real Triton's log): `<group>_<index>` for every instance,
        // an unnamed group being `<model>_<group index>`, the implicit one `<model>`.
        let triton: Vec<&str> = placed.iter().map(|p| p.triton_name.as_str()).collect();
        assert_eq!(triton, ["m_0_0", "m_1_0", "fast_0"]);
        let implicit = place_instances(&config(vec![]), &[], true).unwrap();
        assert_eq!(implicit[0].triton_name, "m_0");
        let pair = place_instances(&config(vec![group("", Kind::Cpu, 2, &[])]), &[], true).unwrap();
        let triton: Vec<&str> = pair.iter().map(|p| p.triton_name.as_str()).collect();
        assert_eq!(triton, ["m_0_0", "m_0_1"]);
        let dup = vec![group("m_1", Kind::Cpu, 1, &[]), group("", Kind::Cpu, 1, &[])];
        assert_eq!(err(dup, &[]), "instance group name 'm_1' is used twice");
    }

    #[test]
    fn bad_counts_and_kinds_are_rejected() {
        let e = err(vec![group("g", Kind::Cpu, -1, &[])], &[]);
        assert_eq!(e, "instance group 'g' has negative count -1");
        let mut odd = group("g", Kind::Cpu, 1, &[]);
        odd.kind = 9;
        assert_eq!(err(vec![odd], &[]), "instance group 'g' has unknown kind 9");
    }

    #[test]
    fn total_instances_are_capped() {
        let placed = place_instances(&config(vec![group("g", Kind::Cpu, 64, &[])]), &[], true).unwrap();
        assert_eq!(placed.len(), MAX_INSTANCES_PER_MODEL);
        assert!(err(vec![group("g", Kind::Cpu, 65, &[])], &[]).contains("more than 64 instances"));
        assert!(err(vec![group("g", Kind::Gpu, i32::MAX, &[])], &[0, 1]).contains("more than 64"));
        let split = vec![group("a", Kind::Cpu, 40, &[]), group("b", Kind::Gpu, 13, &[0, 1])];
        assert!(err(split, &[0, 1]).contains("group 'b': count 13 x 2 device(s)"));
    }
}
