//! The header's enums (data, memory, parameter and instance-group kinds, log levels) and their names.
use std::ffi::{c_char, c_int, CStr};

use mesh::DataType;

use crate::error::{Failure, FailureExt};
use crate::{ffi, text, TRITONSERVER_Error};

/// `TRITONSERVER_MemoryType` values.
pub const MEMORY_CPU: u32 = 0;
pub const MEMORY_CPU_PINNED: u32 = 1;
pub const MEMORY_GPU: u32 = 2;

/// `TRITONSERVER_ParameterType` values.
pub const PARAMETER_STRING: u32 = 0;
pub const PARAMETER_INT: u32 = 1;
pub const PARAMETER_BOOL: u32 = 2;
pub const PARAMETER_DOUBLE: u32 = 3;
pub const PARAMETER_BYTES: u32 = 4;

/// Names of the data types in the header's order (`TRITONSERVER_TYPE_BOOL` = 1 ... `BF16` = 14).
const TYPE_NAMES: [&CStr; 14] = [
    c"BOOL", c"UINT8", c"UINT16", c"UINT32", c"UINT64", c"INT8", c"INT16", c"INT32", c"INT64", c"FP16", c"FP32",
    c"FP64", c"BYTES", c"BF16",
];

/// The mesh's data type for the header's value; 0 (INVALID) and unknown values are none.
pub fn dtype_from_raw(v: u32) -> Option<DataType> {
    (v as usize).checked_sub(1).and_then(|i| DataType::ALL.get(i).copied())
}

/// The header's value for a data type.
pub fn dtype_to_raw(d: DataType) -> u32 {
    DataType::ALL.iter().position(|x| *x == d).map_or(0, |i| i as u32 + 1)
}

/// The C name of a memory type.
pub fn memory_type_name(v: u32) -> &'static CStr {
    match v {
        MEMORY_CPU => c"CPU",
        MEMORY_CPU_PINNED => c"CPU_PINNED",
        MEMORY_GPU => c"GPU",
        _ => c"<invalid>",
    }
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_DataTypeString(datatype: u32) -> *const c_char {
    match dtype_from_raw(datatype) {
        Some(d) => TYPE_NAMES[dtype_to_raw(d) as usize - 1].as_ptr(),
        None => c"<invalid>".as_ptr(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_StringToDataType(dtype: *const c_char) -> u32 {
    // SAFETY: a NUL-terminated string (the header's contract); null is INVALID.
    match unsafe { text(dtype, "dtype") } {
        Ok(name) => DataType::from_wire(name).map_or(0, dtype_to_raw),
        Err(_) => 0,
    }
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_DataTypeByteSize(datatype: u32) -> u32 {
    dtype_from_raw(datatype)
        .and_then(DataType::element_size)
        .map_or(0, |s| s as u32)
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_MemoryTypeString(memtype: u32) -> *const c_char {
    memory_type_name(memtype).as_ptr()
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_ParameterTypeString(paramtype: u32) -> *const c_char {
    match paramtype {
        PARAMETER_STRING => c"STRING",
        PARAMETER_INT => c"INT",
        PARAMETER_BOOL => c"BOOL",
        PARAMETER_DOUBLE => c"DOUBLE",
        PARAMETER_BYTES => c"BYTES",
        _ => c"<invalid>",
    }
    .as_ptr()
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_InstanceGroupKindString(kind: u32) -> *const c_char {
    match kind {
        0 => c"AUTO",
        1 => c"CPU",
        2 => c"GPU",
        3 => c"MODEL",
        _ => c"<invalid>",
    }
    .as_ptr()
}

/// `TRITONSERVER_LogLevel`: INFO, WARN, ERROR, VERBOSE.
fn log_level(level: u32) -> Option<tracing::Level> {
    match level {
        0 => Some(tracing::Level::INFO),
        1 => Some(tracing::Level::WARN),
        2 => Some(tracing::Level::ERROR),
        3 => Some(tracing::Level::DEBUG),
        _ => None,
    }
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_LogIsEnabled(level: u32) -> bool {
    log_level(level).is_some_and(|l| mesh::logging::allows(&l))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_LogMessage(
    level: u32,
    filename: *const c_char,
    line: c_int,
    msg: *const c_char,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let level = log_level(level).ok_or_else(|| Failure::invalid(format!("unknown log level {level}")))?;
        // SAFETY: NUL-terminated strings (the header's contract).
        let (file, msg) = unsafe { (text(filename, "filename").unwrap_or("?"), text(msg, "msg")?) };
        match level {
            tracing::Level::ERROR => tracing::error!(file, line, "{msg}"),
            tracing::Level::WARN => tracing::warn!(file, line, "{msg}"),
            tracing::Level::INFO => tracing::info!(file, line, "{msg}"),
            _ => tracing::debug!(file, line, "{msg}"),
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_keep_the_headers_values_and_sizes() {
        assert_eq!(dtype_from_raw(0), None);
        assert_eq!(dtype_from_raw(11), Some(DataType::Fp32));
        assert_eq!(dtype_from_raw(13), Some(DataType::Bytes));
        assert_eq!(dtype_from_raw(15), None);
        for d in DataType::ALL {
            assert_eq!(dtype_from_raw(dtype_to_raw(d)), Some(d));
            // SAFETY: the name is a static C string.
            let name = unsafe { CStr::from_ptr(TRITONSERVER_DataTypeString(dtype_to_raw(d))) };
            assert_eq!(name.to_str().unwrap(), d.wire_name());
        }
        let sizes: Vec<u32> = (0..16u32).map(|t| TRITONSERVER_DataTypeByteSize(t)).collect();
        // Triton 2.51's libtritonserver answers the same table.
        assert_eq!(sizes, [0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0, 2, 0]);
        // SAFETY: static C strings.
        unsafe {
            assert_eq!(TRITONSERVER_StringToDataType(c"FP32".as_ptr()), 11);
            assert_eq!(TRITONSERVER_StringToDataType(c"fp32".as_ptr()), 0);
            assert_eq!(TRITONSERVER_StringToDataType(std::ptr::null()), 0);
        }
    }
}
