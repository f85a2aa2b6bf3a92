//! The C API's holders of data: JSON messages, metrics text and named parameters.
use std::ffi::{c_char, c_void, CString};

use mesh::Param;

use crate::error::{Failure, FailureExt};
use crate::types::{PARAMETER_BOOL, PARAMETER_BYTES, PARAMETER_DOUBLE, PARAMETER_INT, PARAMETER_STRING};
use crate::{ffi, out, text, TRITONSERVER_Error};

/// A JSON document (metadata, config, statistics, index), as Triton's HTTP endpoint would answer it.
pub struct TRITONSERVER_Message {
    pub json: String,
}

/// The metrics, in Prometheus' text format.
pub struct TRITONSERVER_Metrics {
    pub text: String,
}

/// A named value: a load parameter, a label, a response parameter.
pub struct TRITONSERVER_Parameter {
    pub name: CString,
    pub value: ParameterValue,
}

/// A parameter's value, kept where `TRITONSERVER_InferenceResponseParameter` can point at it.
pub enum ParameterValue {
    String(CString),
    Int(i64),
    Bool(bool),
    Double(f64),
    Bytes(Vec<u8>),
}

impl ParameterValue {
    /// The header's type and a pointer to the value as `TRITONSERVER_InferenceResponseParameter`
    /// gives it (a C string for STRING, the value itself otherwise).
    pub fn raw(&self) -> (u32, *const c_void) {
        match self {
            ParameterValue::String(s) => (PARAMETER_STRING, s.as_ptr().cast()),
            ParameterValue::Int(v) => (PARAMETER_INT, (v as *const i64).cast()),
            ParameterValue::Bool(v) => (PARAMETER_BOOL, (v as *const bool).cast()),
            ParameterValue::Double(v) => (PARAMETER_DOUBLE, (v as *const f64).cast()),
            ParameterValue::Bytes(v) => (PARAMETER_BYTES, v.as_ptr().cast()),
        }
    }

    /// A mesh parameter as one the C API can hand out.
    pub fn from_param(p: &Param) -> ParameterValue {
        match p {
            Param::Bool(b) => ParameterValue::Bool(*b),
            Param::Int(i) => ParameterValue::Int(*i),
            Param::Uint(u) => i64::try_from(*u).map_or(ParameterValue::Double(*u as f64), ParameterValue::Int),
            Param::Double(d) => ParameterValue::Double(*d),
            Param::String(s) => ParameterValue::String(c_string(s)),
        }
    }
}

/// A Rust string as a C string, with any NUL dropped.
pub fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MessageNewFromSerializedJson(
    message: *mut *mut TRITONSERVER_Message,
    base: *const c_char,
    byte_size: usize,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let message = out(message, "message")?;
        if base.is_null() && byte_size > 0 {
            return Err(Failure::invalid("base is null"));
        }
        let bytes = if byte_size == 0 {
            &[][..]
        } else {
            // SAFETY: `base` points at `byte_size` readable bytes (the header's contract).
            unsafe { std::slice::from_raw_parts(base.cast::<u8>(), byte_size) }
        };
        let json = std::str::from_utf8(bytes)
            .ok()
            .filter(|s| serde_json::from_str::<serde_json::Value>(s).is_ok())
            .ok_or_else(|| Failure::invalid("the message is not valid JSON"))?;
        *message = Box::into_raw(Box::new(TRITONSERVER_Message { json: json.to_string() }));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MessageDelete(message: *mut TRITONSERVER_Message) -> *mut TRITONSERVER_Error {
    if !message.is_null() {
        // SAFETY: a message this library made and the caller has not deleted.
        drop(unsafe { Box::from_raw(message) });
    }
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MessageSerializeToJson(
    message: *mut TRITONSERVER_Message,
    base: *mut *const c_char,
    byte_size: *mut usize,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: a message this library made and the caller has not deleted.
        let m = unsafe { message.as_ref() }.ok_or_else(|| Failure::invalid("message is null"))?;
        *out(base, "base")? = m.json.as_ptr().cast();
        *out(byte_size, "byte_size")? = m.json.len();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricsDelete(metrics: *mut TRITONSERVER_Metrics) -> *mut TRITONSERVER_Error {
    if !metrics.is_null() {
        // SAFETY: metrics this library made and the caller has not deleted.
        drop(unsafe { Box::from_raw(metrics) });
    }
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MetricsFormatted(
    metrics: *mut TRITONSERVER_Metrics,
    format: u32,
    base: *mut *const c_char,
    byte_size: *mut usize,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: metrics this library made and the caller has not deleted.
        let m = unsafe { metrics.as_ref() }.ok_or_else(|| Failure::invalid("metrics is null"))?;
        if format != 0 {
            return Err(Failure::invalid(format!(
                "unknown metrics format {format} (only TRITONSERVER_METRIC_PROMETHEUS)"
            )));
        }
        *out(base, "base")? = m.text.as_ptr().cast();
        *out(byte_size, "byte_size")? = m.text.len();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ParameterNew(
    name: *const c_char,
    kind: u32,
    value: *const c_void,
) -> *mut TRITONSERVER_Parameter {
    // SAFETY: `name` is a C string and `value` points at a value of `kind` (the header's contract).
    let made = unsafe {
        let Ok(name) = text(name, "name") else {
            return std::ptr::null_mut();
        };
        if value.is_null() {
            return std::ptr::null_mut();
        }
        let value = match kind {
            PARAMETER_STRING => match text(value.cast(), "value") {
                Ok(s) => ParameterValue::String(c_string(s)),
                Err(_) => return std::ptr::null_mut(),
            },
            PARAMETER_INT => ParameterValue::Int(*value.cast::<i64>()),
            PARAMETER_BOOL => ParameterValue::Bool(*value.cast::<bool>()),
            PARAMETER_DOUBLE => ParameterValue::Double(*value.cast::<f64>()),
            _ => return std::ptr::null_mut(), // BYTES goes through TRITONSERVER_ParameterBytesNew
        };
        TRITONSERVER_Parameter {
            name: c_string(name),
            value,
        }
    };
    Box::into_raw(Box::new(made))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ParameterBytesNew(
    name: *const c_char,
    byte_ptr: *const c_void,
    size: u64,
) -> *mut TRITONSERVER_Parameter {
    // SAFETY: `name` is a C string and `byte_ptr` points at `size` bytes (the header's contract).
    let Ok(name) = (unsafe { text(name, "name") }) else {
        return std::ptr::null_mut();
    };
    let Ok(size) = usize::try_from(size) else {
        return std::ptr::null_mut();
    };
    let bytes = if size == 0 {
        Vec::new()
    } else if byte_ptr.is_null() {
        return std::ptr::null_mut();
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(byte_ptr.cast::<u8>(), size) }.to_vec()
    };
    Box::into_raw(Box::new(TRITONSERVER_Parameter {
        name: c_string(name),
        value: ParameterValue::Bytes(bytes),
    }))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ParameterDelete(parameter: *mut TRITONSERVER_Parameter) {
    if !parameter.is_null() {
        // SAFETY: a parameter this library made and the caller has not deleted.
        drop(unsafe { Box::from_raw(parameter) });
    }
}
