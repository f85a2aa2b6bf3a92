//! `TRITONSERVER_ServerOptions`: each setter becomes the `mesh-node` flag of the same meaning, with the C API's own defaults.
use std::ffi::{c_char, c_int, c_uint};

use crate::error::{Failure, FailureExt};
use crate::{ffi, out, text, TRITONSERVER_Error};

/// What `TRITONSERVER_ServerNew` will start: `mesh-node` flags, in the order they were set (a
/// flag set twice takes its last value, as on the command line).
#[derive(Debug, Clone)]
pub struct TRITONSERVER_ServerOptions {
    pub flags: Vec<String>,
    /// How many repositories were named (a server needs at least one).
    pub repositories: usize,
}

/// Where the C API's defaults differ from `mesh-node`'s, they are set first: tritonserver.h's
/// options start with exit_on_error and strict_model_config on, polling control, and metrics on.
/// POLL in the C API polls only when asked, so the automatic poll is pushed out of reach.
fn defaults() -> Vec<String> {
    [
        "--exit-on-error=true",
        "--strict-model-config=true",
        "--model-control-mode=poll",
        "--repository-poll-secs=315360000",
    ]
    .map(String::from)
    .to_vec()
}

impl TRITONSERVER_ServerOptions {
    fn new() -> Self {
        TRITONSERVER_ServerOptions {
            flags: defaults(),
            repositories: 0,
        }
    }

    fn push(&mut self, flag: &str, value: impl std::fmt::Display) {
        self.flags.push(format!("--{flag}={value}"));
    }
}

/// Runs a setter on live options.
unsafe fn set(
    options: *mut TRITONSERVER_ServerOptions,
    f: impl FnOnce(&mut TRITONSERVER_ServerOptions) -> Result<(), Failure>,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: options this library made and the caller has not deleted (the header's contract).
        let o = unsafe { options.as_mut() }.ok_or_else(|| Failure::invalid("options is null"))?;
        f(o)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsNew(
    options: *mut *mut TRITONSERVER_ServerOptions,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        *out(options, "options")? = Box::into_raw(Box::new(TRITONSERVER_ServerOptions::new()));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsDelete(
    options: *mut TRITONSERVER_ServerOptions,
) -> *mut TRITONSERVER_Error {
    if !options.is_null() {
        // SAFETY: options this library made and the caller has not deleted.
        drop(unsafe { Box::from_raw(options) });
    }
    std::ptr::null_mut()
}

/// Setters taking one string, as the flag of the same meaning.
macro_rules! string_setter {
    ($name:ident, $flag:literal, $what:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            options: *mut TRITONSERVER_ServerOptions,
            value: *const c_char,
        ) -> *mut TRITONSERVER_Error {
            // SAFETY: a NUL-terminated string (the header's contract).
            let v = unsafe { text(value, $what) };
            // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
            unsafe {
                set(options, |o| {
                    o.push($flag, v?);
                    Ok(())
                })
            }
        }
    };
}

/// Setters taking one number or flag, as the flag of the same meaning.
macro_rules! value_setter {
    ($name:ident, $flag:literal, $ty:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            options: *mut TRITONSERVER_ServerOptions,
            value: $ty,
        ) -> *mut TRITONSERVER_Error {
            // SAFETY: see `set`.
            unsafe {
                set(options, |o| {
                    o.push($flag, value);
                    Ok(())
                })
            }
        }
    };
}

string_setter!(TRITONSERVER_ServerOptionsSetServerId, "id", "server_id");
string_setter!(TRITONSERVER_ServerOptionsSetStartupModel, "load-model", "model_name");
string_setter!(
    TRITONSERVER_ServerOptionsSetModelConfigName,
    "model-config-name",
    "model_config_name"
);
string_setter!(
    TRITONSERVER_ServerOptionsSetCacheDirectory,
    "cache-directory",
    "cache_dir"
);
string_setter!(TRITONSERVER_ServerOptionsSetLogFile, "log-file", "file");
string_setter!(
    TRITONSERVER_ServerOptionsSetBackendDirectory,
    "backend-directory",
    "backend_dir"
);
string_setter!(
    TRITONSERVER_ServerOptionsSetRepoAgentDirectory,
    "repoagent-directory",
    "repoagent_dir"
);
value_setter!(
    TRITONSERVER_ServerOptionsSetStrictModelConfig,
    "strict-model-config",
    bool
);
value_setter!(TRITONSERVER_ServerOptionsSetExitOnError, "exit-on-error", bool);
value_setter!(TRITONSERVER_ServerOptionsSetStrictReadiness, "strict-readiness", bool);
value_setter!(TRITONSERVER_ServerOptionsSetExitTimeout, "exit-timeout-secs", c_uint);
value_setter!(
    TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize,
    "pinned-memory-pool-byte-size",
    u64
);
value_setter!(
    TRITONSERVER_ServerOptionsSetResponseCacheByteSize,
    "response-cache-byte-size",
    u64
);
value_setter!(
    TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability,
    "min-supported-compute-capability",
    f64
);
value_setter!(
    TRITONSERVER_ServerOptionsSetBufferManagerThreadCount,
    "buffer-manager-thread-count",
    c_uint
);
value_setter!(
    TRITONSERVER_ServerOptionsSetModelLoadThreadCount,
    "model-load-thread-count",
    c_uint
);
value_setter!(
    TRITONSERVER_ServerOptionsSetModelLoadRetryCount,
    "model-load-retry-count",
    c_uint
);
value_setter!(TRITONSERVER_ServerOptionsSetModelNamespacing, "model-namespacing", bool);
value_setter!(
    TRITONSERVER_ServerOptionsSetEnablePeerAccess,
    "enable-peer-access",
    bool
);
value_setter!(TRITONSERVER_ServerOptionsSetGpuMetrics, "allow-gpu-metrics", bool);
value_setter!(TRITONSERVER_ServerOptionsSetCpuMetrics, "allow-cpu-metrics", bool);
value_setter!(TRITONSERVER_ServerOptionsSetMetricsInterval, "metrics-interval-ms", u64);

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetModelRepositoryPath(
    options: *mut TRITONSERVER_ServerOptions,
    model_repository_path: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract).
    let path = unsafe { text(model_repository_path, "model_repository_path") };
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            o.push("model-repository", path?);
            o.repositories += 1;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetModelControlMode(
    options: *mut TRITONSERVER_ServerOptions,
    mode: u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            let mode = match mode {
                0 => "none",
                1 => "poll",
                2 => "explicit",
                _ => return Err(Failure::invalid(format!("unknown model control mode {mode}"))),
            };
            o.push("model-control-mode", mode);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetRateLimiterMode(
    options: *mut TRITONSERVER_ServerOptions,
    mode: u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            let mode = match mode {
                0 => "off",
                1 => "execution_count",
                _ => return Err(Failure::invalid(format!("unknown rate limiter mode {mode}"))),
            };
            o.push("rate-limit", mode);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsAddRateLimiterResource(
    options: *mut TRITONSERVER_ServerOptions,
    resource_name: *const c_char,
    resource_count: usize,
    device: c_int,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract).
    let name = unsafe { text(resource_name, "resource_name") };
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            o.push("rate-limit-resource", format!("{}:{resource_count}:{device}", name?));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize(
    options: *mut TRITONSERVER_ServerOptions,
    gpu_device: c_int,
    size: u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            o.push("cuda-memory-pool-byte-size", format!("{gpu_device}:{size}"));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetCudaVirtualAddressSize(
    options: *mut TRITONSERVER_ServerOptions,
    gpu_device: c_int,
    size: usize,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            o.push("cuda-virtual-address-size", format!("{gpu_device}:{size}"));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetCacheConfig(
    options: *mut TRITONSERVER_ServerOptions,
    cache_name: *const c_char,
    config_json: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: NUL-terminated strings (the header's contract).
    let (name, json) = unsafe { (text(cache_name, "cache_name"), text(config_json, "config_json")) };
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            let (name, json) = (name?, json?);
            let config: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)
                .map_err(|e| Failure::invalid(format!("the cache config of '{name}' is not a JSON object: {e}")))?;
            for (key, value) in config {
                let value = value.as_str().map_or_else(|| value.to_string(), str::to_string);
                o.push("cache-config", format!("{name},{key}={value}"));
            }
            Ok(())
        })
    }
}

value_setter!(TRITONSERVER_ServerOptionsSetLogInfo, "log-info", bool);
value_setter!(TRITONSERVER_ServerOptionsSetLogWarn, "log-warning", bool);
value_setter!(TRITONSERVER_ServerOptionsSetLogError, "log-error", bool);

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetLogVerbose(
    options: *mut TRITONSERVER_ServerOptions,
    level: c_int,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            o.push("log-verbose", level.clamp(0, 255));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetLogFormat(
    options: *mut TRITONSERVER_ServerOptions,
    format: u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            let format = match format {
                0 => "default",
                1 => "ISO8601",
                _ => return Err(Failure::invalid(format!("unknown log format {format}"))),
            };
            o.push("log-format", format);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetMetrics(
    options: *mut TRITONSERVER_ServerOptions,
    metrics: bool,
) -> *mut TRITONSERVER_Error {
    // The metrics are always counted in process (TRITONSERVER_ServerMetrics reads them); the
    // setting decides, as in Triton, whether the samplers of CPU and GPU use run.
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            if !metrics {
                o.push("allow-gpu-metrics", false);
                o.push("allow-cpu-metrics", false);
            }
            Ok(())
        })
    }
}

/// Setters of `<group>,<setting>=<value>` flags.
macro_rules! triple_setter {
    ($name:ident, $flag:literal, $what:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            options: *mut TRITONSERVER_ServerOptions,
            group: *const c_char,
            setting: *const c_char,
            value: *const c_char,
        ) -> *mut TRITONSERVER_Error {
            // SAFETY: NUL-terminated strings (the header's contract).
            let parts = unsafe { (text(group, $what), text(setting, "setting"), text(value, "value")) };
            // SAFETY: see `set`.
            unsafe {
                set(options, |o| {
                    let (group, setting, value) = (parts.0?, parts.1?, parts.2?);
                    match group {
                        "" => o.push($flag, format!("{setting}={value}")),
                        _ => o.push($flag, format!("{group},{setting}={value}")),
                    }
                    Ok(())
                })
            }
        }
    };
}

triple_setter!(
    TRITONSERVER_ServerOptionsSetBackendConfig,
    "backend-config",
    "backend_name"
);
triple_setter!(TRITONSERVER_ServerOptionsSetHostPolicy, "host-policy", "policy_name");
triple_setter!(TRITONSERVER_ServerOptionsSetMetricsConfig, "metrics-config", "name");

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit(
    options: *mut TRITONSERVER_ServerOptions,
    kind: u32,
    device_id: c_int,
    fraction: f64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set`.
    unsafe {
        set(options, |o| {
            if kind != 2 {
                return Err(Failure::unsupported(
                    "a model load device limit is only supported for GPUs",
                ));
            }
            o.push("model-load-gpu-limit", format!("{device_id}:{fraction}"));
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> *mut TRITONSERVER_ServerOptions {
        let mut o = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert!(unsafe { TRITONSERVER_ServerOptionsNew(&mut o) }.is_null());
        o
    }

    #[test]
    fn setters_become_mesh_node_flags_after_the_c_apis_defaults() {
        let o = options();
        // SAFETY: live options and NUL-terminated strings.
        unsafe {
            assert!(TRITONSERVER_ServerOptionsSetModelRepositoryPath(o, c"/models".as_ptr()).is_null());
            assert!(TRITONSERVER_ServerOptionsSetModelControlMode(o, 2).is_null());
            assert!(TRITONSERVER_ServerOptionsSetExitOnError(o, false).is_null());
            assert!(TRITONSERVER_ServerOptionsSetBackendConfig(
                o,
                c"python".as_ptr(),
                c"interpreter".as_ptr(),
                c"/py".as_ptr()
            )
            .is_null());
            assert!(TRITONSERVER_ServerOptionsSetMetricsConfig(
                o,
                c"".as_ptr(),
                c"summary_latencies".as_ptr(),
                c"true".as_ptr()
            )
            .is_null());
            assert!(
                TRITONSERVER_ServerOptionsSetCacheConfig(o, c"local".as_ptr(), c"{\"size\": 1048576}".as_ptr())
                    .is_null()
            );
            let flags = &(*o).flags;
            assert_eq!(&flags[..4], &defaults()[..]);
            assert_eq!(
                &flags[4..],
                [
                    "--model-repository=/models",
                    "--model-control-mode=explicit",
                    "--exit-on-error=false",
                    "--backend-config=python,interpreter=/py",
                    "--metrics-config=summary_latencies=true",
                    "--cache-config=local,size=1048576",
                ]
            );
            assert_eq!((*o).repositories, 1);
            // Every flag parses as mesh-node's own command line would.
            assert!(mesh_node::cli::Args::parse_flags(flags).is_ok());
            TRITONSERVER_ServerOptionsDelete(o);
        }
    }

    #[test]
    fn bad_values_are_refused_with_invalid_arg_and_change_nothing() {
        let o = options();
        // SAFETY: live options; null and out-of-range values are what is tested.
        unsafe {
            let e = TRITONSERVER_ServerOptionsSetModelControlMode(o, 7);
            assert_eq!(crate::error::TRITONSERVER_ErrorCode(e), 3);
            crate::error::TRITONSERVER_ErrorDelete(e);
            let e = TRITONSERVER_ServerOptionsSetServerId(o, std::ptr::null());
            assert_eq!(crate::error::TRITONSERVER_ErrorCode(e), 3);
            crate::error::TRITONSERVER_ErrorDelete(e);
            let e = TRITONSERVER_ServerOptionsSetCacheConfig(o, c"local".as_ptr(), c"[1]".as_ptr());
            assert_eq!(crate::error::TRITONSERVER_ErrorCode(e), 3);
            crate::error::TRITONSERVER_ErrorDelete(e);
            assert_eq!((*o).flags, defaults());
            let e = TRITONSERVER_ServerOptionsSetLogInfo(std::ptr::null_mut(), true);
            assert_eq!(crate::error::TRITONSERVER_ErrorCode(e), 3);
            crate::error::TRITONSERVER_ErrorDelete(e);
            TRITONSERVER_ServerOptionsDelete(o);
        }
    }
}
