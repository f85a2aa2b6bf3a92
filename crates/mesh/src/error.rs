//! The one error type of the mesh, and its mapping to HTTP statuses and gRPC codes.

/// What kind of failure, which decides the HTTP status and gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    Unavailable,
    Unsupported,
    Internal,
    AlreadyExists,
    Cancelled,
    PayloadTooLarge,
    /// Refused at admission because the server is busy (in-flight budget, full queue): 503 /
    /// UNAVAILABLE to clients like `Unavailable`, and, across the cluster link, safe to retry on
    /// another node because the request never ran.
    Overloaded,
    /// A model's own error with Triton's TRITONSERVER_ERROR_UNKNOWN (`pb_utils.TritonError.UNKNOWN`):
    /// 400 / UNKNOWN, as Triton answers it.
    Unknown,
}

/// An error with a message that names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(Code::NotFound, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(Code::Unavailable, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::new(Code::Unsupported, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(Code::Internal, message)
    }
    pub fn overloaded(message: impl Into<String>) -> Self {
        Error::new(Code::Overloaded, message)
    }

    /// Triton's HTTP mapping: NOT_FOUND→404, UNAVAILABLE→503, UNSUPPORTED→501, INTERNAL→500, else 400.
    pub fn http_status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self.code {
            Code::NotFound => S::NOT_FOUND,
            Code::Unavailable | Code::Overloaded => S::SERVICE_UNAVAILABLE,
            Code::Unsupported => S::NOT_IMPLEMENTED,
            Code::Internal => S::INTERNAL_SERVER_ERROR,
            Code::PayloadTooLarge => S::PAYLOAD_TOO_LARGE,
            Code::InvalidArgument | Code::AlreadyExists | Code::Cancelled | Code::Unknown => S::BAD_REQUEST,
        }
    }

    /// The gRPC status code for this error.
    pub fn grpc_code(&self) -> tonic::Code {
        match self.code {
            Code::InvalidArgument | Code::PayloadTooLarge => tonic::Code::InvalidArgument,
            Code::NotFound => tonic::Code::NotFound,
            Code::Unavailable | Code::Overloaded => tonic::Code::Unavailable,
            Code::Unsupported => tonic::Code::Unimplemented,
            Code::Internal => tonic::Code::Internal,
            Code::AlreadyExists => tonic::Code::AlreadyExists,
            Code::Cancelled => tonic::Code::Cancelled,
            Code::Unknown => tonic::Code::Unknown,
        }
    }

    /// The label value for `nv_inference_request_failure{reason}`.
    pub fn metric_reason(&self) -> &'static str {
        match self.code {
            Code::Cancelled => "CANCELED",
            Code::Internal | Code::Unsupported => "BACKEND",
            Code::Unavailable | Code::Overloaded => "REJECTED",
            _ => "OTHER",
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(e.grpc_code(), e.message)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping_follows_triton() {
        assert_eq!(Error::not_found("x").http_status(), 404);
        assert_eq!(Error::unavailable("x").http_status(), 503);
        assert_eq!(Error::overloaded("x").http_status(), 503);
        assert_eq!(
            tonic::Status::from(Error::overloaded("busy")).code(),
            tonic::Code::Unavailable
        );
        assert_eq!(Error::unsupported("x").http_status(), 501);
        assert_eq!(Error::internal("x").http_status(), 500);
        assert_eq!(Error::invalid("x").http_status(), 400);
        assert_eq!(Error::new(Code::AlreadyExists, "x").http_status(), 400);
        assert_eq!(
            tonic::Status::from(Error::invalid("bad")).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            tonic::Status::from(Error::unsupported("no")).code(),
            tonic::Code::Unimplemented
        );
    }
}
