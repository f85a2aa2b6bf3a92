//! `TRITONSERVER_Error`: Triton's error codes and messages, and the mesh's errors mapped onto them.
use std::ffi::{c_char, CStr, CString};

/// `TRITONSERVER_Error_Code`, with the header's values.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Unknown = 0,
    Internal = 1,
    NotFound = 2,
    InvalidArg = 3,
    Unavailable = 4,
    Unsupported = 5,
    AlreadyExists = 6,
    Cancelled = 7,
}

impl Code {
    /// The code for a value an application passed in (`TRITONSERVER_ErrorNew`); unknown values are UNKNOWN.
    pub fn from_raw(v: u32) -> Code {
        match v {
            1 => Code::Internal,
            2 => Code::NotFound,
            3 => Code::InvalidArg,
            4 => Code::Unavailable,
            5 => Code::Unsupported,
            6 => Code::AlreadyExists,
            7 => Code::Cancelled,
            _ => Code::Unknown,
        }
    }

    /// Triton's words for the code (`TRITONSERVER_ErrorCodeString`).
    pub fn text(self) -> &'static CStr {
        match self {
            Code::Unknown => c"Unknown",
            Code::Internal => c"Internal",
            Code::NotFound => c"Not found",
            Code::InvalidArg => c"Invalid argument",
            Code::Unavailable => c"Unavailable",
            Code::Unsupported => c"Unsupported",
            Code::AlreadyExists => c"Already exists",
            // Triton 2.51 answers "<invalid code>" here, a slip in its table; the mesh names it.
            Code::Cancelled => c"Cancelled",
        }
    }
}

impl From<mesh::Code> for Code {
    fn from(c: mesh::Code) -> Code {
        match c {
            mesh::Code::InvalidArgument | mesh::Code::PayloadTooLarge => Code::InvalidArg,
            mesh::Code::NotFound => Code::NotFound,
            mesh::Code::Unavailable | mesh::Code::Overloaded => Code::Unavailable,
            mesh::Code::Unsupported => Code::Unsupported,
            mesh::Code::Internal => Code::Internal,
            mesh::Code::AlreadyExists => Code::AlreadyExists,
            mesh::Code::Cancelled => Code::Cancelled,
            mesh::Code::Unknown => Code::Unknown,
        }
    }
}

/// An error the application owns until it calls `TRITONSERVER_ErrorDelete`.
#[derive(Debug)]
pub struct TRITONSERVER_Error {
    pub code: Code,
    pub message: CString,
}

/// An error on its way out of a function (a box, so it crosses into C as one pointer).
pub type Failure = Box<TRITONSERVER_Error>;

/// Making failures: `Failure::of(code, message)` and the common codes.
pub trait FailureExt {
    fn of(code: Code, message: impl Into<String>) -> Failure;
    fn invalid(message: impl Into<String>) -> Failure {
        Self::of(Code::InvalidArg, message)
    }
    fn unavailable(message: impl Into<String>) -> Failure {
        Self::of(Code::Unavailable, message)
    }
    fn unsupported(message: impl Into<String>) -> Failure {
        Self::of(Code::Unsupported, message)
    }
    fn internal(message: impl Into<String>) -> Failure {
        Self::of(Code::Internal, message)
    }
    fn into_raw(self) -> *mut TRITONSERVER_Error;
}

impl FailureExt for Failure {
    fn of(code: Code, message: impl Into<String>) -> Failure {
        let mut bytes = message.into().into_bytes();
        bytes.retain(|b| *b != 0); // a NUL inside would cut the C string short
        Box::new(TRITONSERVER_Error {
            code,
            message: CString::new(bytes).unwrap_or_default(),
        })
    }
    fn into_raw(self) -> *mut TRITONSERVER_Error {
        Box::into_raw(self)
    }
}

/// The mesh's error as Triton's.
pub fn from_mesh(e: mesh::Error) -> Failure {
    Failure::of(e.code.into(), e.message)
}

/// The error an application passed back (from an allocator callback), taken over and freed.
pub(crate) unsafe fn take(raw: *mut TRITONSERVER_Error) -> Option<Failure> {
    // SAFETY: a non-null error comes from TRITONSERVER_ErrorNew (a Box this library made).
    (!raw.is_null()).then(|| unsafe { Box::from_raw(raw) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorNew(code: u32, msg: *const c_char) -> *mut TRITONSERVER_Error {
    let message = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null message is a NUL-terminated string (the header's contract).
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    };
    Failure::of(Code::from_raw(code), message).into_raw()
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorDelete(error: *mut TRITONSERVER_Error) {
    // SAFETY: see `take`; deleting null is a no-op.
    drop(unsafe { take(error) });
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorCode(error: *mut TRITONSERVER_Error) -> u32 {
    // SAFETY: a non-null error is one this library made and the caller has not deleted.
    unsafe { error.as_ref() }.map_or(Code::Unknown, |e| e.code) as u32
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorCodeString(error: *mut TRITONSERVER_Error) -> *const c_char {
    // SAFETY: as TRITONSERVER_ErrorCode.
    unsafe { error.as_ref() }
        .map_or(Code::Unknown, |e| e.code)
        .text()
        .as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorMessage(error: *mut TRITONSERVER_Error) -> *const c_char {
    // SAFETY: as TRITONSERVER_ErrorCode; the message lives as long as the error.
    match unsafe { error.as_ref() } {
        Some(e) => e.message.as_ptr(),
        None => c"".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_keep_the_headers_values_and_tritons_words() {
        for v in 0..8u32 {
            assert_eq!(Code::from_raw(v) as u32, v);
        }
        assert_eq!(Code::from_raw(99), Code::Unknown);
        assert_eq!(Code::InvalidArg.text(), c"Invalid argument");
        assert_eq!(Code::from(mesh::Code::Overloaded), Code::Unavailable);
    }

    #[test]
    fn an_error_crosses_as_one_pointer_and_keeps_its_message() {
        let raw = Failure::of(Code::NotFound, "no model 'x'\0 here").into_raw();
        // SAFETY: `raw` was made just above.
        unsafe {
            assert_eq!(TRITONSERVER_ErrorCode(raw), 2);
            assert_eq!(
                CStr::from_ptr(TRITONSERVER_ErrorMessage(raw)).to_str().unwrap(),
                "no model 'x' here"
            );
            assert_eq!(CStr::from_ptr(TRITONSERVER_ErrorCodeString(raw)), c"Not found");
            TRITONSERVER_ErrorDelete(raw);
        }
    }
}
