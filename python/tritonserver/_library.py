"""The mesh's libtritonserver.so through ctypes: loading it, the C functions' signatures, and errors.

Every call below goes through `call`, which turns a returned TRITONSERVER_Error into the exception
class of its code. ctypes releases the GIL for the length of each call, so a request that runs (or
a thread that waits on a response queue) never holds other Python threads up.
"""
import ctypes
import os
from ctypes import POINTER, byref, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from pathlib import Path


class TritonError(Exception):
    """An error from the server: the base of one class per Triton error code."""


class UnknownError(TritonError):
    pass


class InternalError(TritonError):
    pass


class NotFoundError(TritonError):
    pass


class InvalidArgumentError(TritonError):
    pass


class UnavailableError(TritonError):
    pass


class UnsupportedError(TritonError):
    pass


class AlreadyExistsError(TritonError):
    pass


class CancelledError(TritonError):
    pass


# TRITONSERVER_Error_Code -> exception class
ERRORS = [UnknownError, InternalError, NotFoundError, InvalidArgumentError, UnavailableError,
          UnsupportedError, AlreadyExistsError, CancelledError]
for _cls in [TritonError, *ERRORS]:
    _cls.__module__ = "tritonserver"


def _find_library() -> str:
    """MESH_TRITONSERVER_LIBRARY, else the library this checkout built, else the system's search."""
    explicit = os.environ.get("MESH_TRITONSERVER_LIBRARY")
    if explicit:
        return explicit
    built = Path(__file__).resolve().parents[2] / "target" / "release" / "libtritonserver.so"
    if built.is_file():
        return str(built)
    return "libtritonserver.so"


_LIB = None
P = c_void_p

# name: (return type, argument types); TRITONSERVER_Error* returns are c_void_p (checked by `call`).
_SIGNATURES = {
    "TRITONSERVER_ErrorCode": (c_uint32, [P]),
    "TRITONSERVER_ErrorMessage": (c_char_p, [P]),
    "TRITONSERVER_ErrorDelete": (None, [P]),
    "TRITONSERVER_ApiVersion": (P, [POINTER(c_uint32), POINTER(c_uint32)]),
    "TRITONSERVER_ServerOptionsNew": (P, [POINTER(P)]),
    "TRITONSERVER_ServerOptionsDelete": (P, [P]),
    "TRITONSERVER_ServerOptionsSetServerId": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetModelRepositoryPath": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetModelControlMode": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsSetStartupModel": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetStrictModelConfig": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetRateLimiterMode": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsAddRateLimiterResource": (P, [P, c_char_p, c_size_t, c_int]),
    "TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize": (P, [P, c_uint64]),
    "TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize": (P, [P, c_int, c_uint64]),
    "TRITONSERVER_ServerOptionsSetCacheConfig": (P, [P, c_char_p, c_char_p]),
    "TRITONSERVER_ServerOptionsSetCacheDirectory": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability": (P, [P, c_double]),
    "TRITONSERVER_ServerOptionsSetExitOnError": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetStrictReadiness": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetExitTimeout": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsSetBufferManagerThreadCount": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsSetModelLoadThreadCount": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsSetModelLoadRetryCount": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsSetModelNamespacing": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetEnablePeerAccess": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogFile": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetLogInfo": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogWarn": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogError": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetLogFormat": (P, [P, c_uint32]),
    "TRITONSERVER_ServerOptionsSetLogVerbose": (P, [P, c_int]),
    "TRITONSERVER_ServerOptionsSetMetrics": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetGpuMetrics": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetCpuMetrics": (P, [P, c_bool]),
    "TRITONSERVER_ServerOptionsSetMetricsInterval": (P, [P, c_uint64]),
    "TRITONSERVER_ServerOptionsSetBackendDirectory": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetRepoAgentDirectory": (P, [P, c_char_p]),
    "TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit": (P, [P, c_uint32, c_int, c_double]),
    "TRITONSERVER_ServerOptionsSetBackendConfig": (P, [P, c_char_p, c_char_p, c_char_p]),
    "TRITONSERVER_ServerOptionsSetHostPolicy": (P, [P, c_char_p, c_char_p, c_char_p]),
    "TRITONSERVER_ServerOptionsSetMetricsConfig": (P, [P, c_char_p, c_char_p, c_char_p]),
    "TRITONSERVER_ServerNew": (P, [POINTER(P), P]),
    "TRITONSERVER_ServerDelete": (P, [P]),
    "TRITONSERVER_ServerStop": (P, [P]),
    "TRITONSERVER_ServerIsLive": (P, [P, POINTER(c_bool)]),
    "TRITONSERVER_ServerIsReady": (P, [P, POINTER(c_bool)]),
    "TRITONSERVER_ServerModelIsReady": (P, [P, c_char_p, c_int64, POINTER(c_bool)]),
    "TRITONSERVER_ServerModelBatchProperties": (P, [P, c_char_p, c_int64, POINTER(c_uint32), POINTER(P)]),
    "TRITONSERVER_ServerModelTransactionProperties": (P, [P, c_char_p, c_int64, POINTER(c_uint32), POINTER(P)]),
    "TRITONSERVER_ServerMetadata": (P, [P, POINTER(P)]),
    "TRITONSERVER_ServerModelMetadata": (P, [P, c_char_p, c_int64, POINTER(P)]),
    "TRITONSERVER_ServerModelStatistics": (P, [P, c_char_p, c_int64, POINTER(P)]),
    "TRITONSERVER_ServerModelConfig": (P, [P, c_char_p, c_int64, c_uint32, POINTER(P)]),
    "TRITONSERVER_ServerModelIndex": (P, [P, c_uint32, POINTER(P)]),
    "TRITONSERVER_ServerLoadModel": (P, [P, c_char_p]),
    "TRITONSERVER_ServerLoadModelWithParameters": (P, [P, c_char_p, POINTER(P), c_uint64]),
    "TRITONSERVER_ServerUnloadModel": (P, [P, c_char_p]),
    "TRITONSERVER_ServerUnloadModelAndDependents": (P, [P, c_char_p]),
    "TRITONSERVER_ServerMetrics": (P, [P, POINTER(P)]),
    "TRITONSERVER_ServerPollModelRepository": (P, [P]),
    "TRITONSERVER_ServerRegisterModelRepository": (P, [P, c_char_p, POINTER(P), c_uint32]),
    "TRITONSERVER_ServerUnregisterModelRepository": (P, [P, c_char_p]),
    "TRITONSERVER_ServerInferAsync": (P, [P, P, P]),
    "TRITONSERVER_MessageSerializeToJson": (P, [P, POINTER(c_char_p), POINTER(c_size_t)]),
    "TRITONSERVER_MessageDelete": (P, [P]),
    "TRITONSERVER_MetricsFormatted": (P, [P, c_uint32, POINTER(c_void_p), POINTER(c_size_t)]),
    "TRITONSERVER_MetricsDelete": (P, [P]),
    "TRITONSERVER_ParameterNew": (P, [c_char_p, c_uint32, P]),
    "TRITONSERVER_ParameterBytesNew": (P, [c_char_p, P, c_uint64]),
    "TRITONSERVER_ParameterDelete": (None, [P]),
    "TRITONSERVER_ResponseAllocatorNew": (P, [POINTER(P), P, P, P]),
    "TRITONSERVER_ResponseAllocatorDelete": (P, [P]),
    "TRITONSERVER_InferenceRequestNew": (P, [POINTER(P), P, c_char_p, c_int64]),
    "TRITONSERVER_InferenceRequestDelete": (P, [P]),
    "TRITONSERVER_InferenceRequestSetId": (P, [P, c_char_p]),
    "TRITONSERVER_InferenceRequestSetFlags": (P, [P, c_uint32]),
    "TRITONSERVER_InferenceRequestSetCorrelationId": (P, [P, c_uint64]),
    "TRITONSERVER_InferenceRequestSetCorrelationIdString": (P, [P, c_char_p]),
    "TRITONSERVER_InferenceRequestSetPriorityUInt64": (P, [P, c_uint64]),
    "TRITONSERVER_InferenceRequestSetTimeoutMicroseconds": (P, [P, c_uint64]),
    "TRITONSERVER_InferenceRequestAddInput": (P, [P, c_char_p, c_uint32, P, c_uint64]),
    "TRITONSERVER_InferenceRequestAppendInputData": (P, [P, c_char_p, P, c_size_t, c_uint32, c_int64]),
    "TRITONSERVER_InferenceRequestAddRequestedOutput": (P, [P, c_char_p]),
    "TRITONSERVER_InferenceRequestSetReleaseCallback": (P, [P, P, P]),
    "TRITONSERVER_InferenceRequestSetResponseCallback": (P, [P, P, P, P, P]),
    "TRITONSERVER_InferenceRequestSetStringParameter": (P, [P, c_char_p, c_char_p]),
    "TRITONSERVER_InferenceRequestSetIntParameter": (P, [P, c_char_p, c_int64]),
    "TRITONSERVER_InferenceRequestSetBoolParameter": (P, [P, c_char_p, c_bool]),
    "TRITONSERVER_InferenceRequestSetDoubleParameter": (P, [P, c_char_p, c_double]),
    "TRITONSERVER_InferenceResponseDelete": (P, [P]),
    "TRITONSERVER_InferenceResponseError": (P, [P]),
    "TRITONSERVER_InferenceResponseModel": (P, [P, POINTER(c_char_p), POINTER(c_int64)]),
    "TRITONSERVER_InferenceResponseId": (P, [P, POINTER(c_char_p)]),
    "TRITONSERVER_InferenceResponseParameterCount": (P, [P, POINTER(c_uint32)]),
    "TRITONSERVER_InferenceResponseParameter": (P, [P, c_uint32, POINTER(c_char_p), POINTER(c_uint32), POINTER(P)]),
    "TRITONSERVER_InferenceResponseOutputCount": (P, [P, POINTER(c_uint32)]),
    "TRITONSERVER_InferenceResponseOutput": (P, [P, c_uint32, POINTER(c_char_p), POINTER(c_uint32),
                                                 POINTER(POINTER(c_int64)), POINTER(c_uint64), POINTER(P),
                                                 POINTER(c_size_t), POINTER(c_uint32), POINTER(c_int64), POINTER(P)]),
    "MESH_ResponseQueueNew": (P, [POINTER(P)]),
    "MESH_ResponseQueueDelete": (P, [P]),
    "MESH_ResponseQueueFd": (P, [P, POINTER(c_int)]),
    "MESH_ResponseQueuePopMany": (P, [P, c_int64, P, c_uint32, POINTER(c_uint32)]),
    "MESH_InferenceRequestAddInputsPacked": (P, [P, c_char_p, c_size_t]),
    "MESH_ServerInferPacked": (P, [P, P, c_char_p, c_size_t, P]),
    "MESH_ServerInferPackedHeld": (P, [P, P, c_char_p, c_size_t, P]),
    "MESH_InferenceResponsePlaceOutputs": (P, [P, c_char_p, c_uint32]),
    "TRITONSERVER_LogMessage": (P, [c_uint32, c_char_p, c_int, c_char_p]),
}


def lib():
    """The library, loaded and typed once."""
    global _LIB
    if _LIB is None:
        path = _find_library()
        try:
            loaded = ctypes.CDLL(path)
        except OSError as e:
            raise UnavailableError(
                f"cannot load the mesh's libtritonserver.so ({path}): {e}; run scripts/setup.sh, "
                "or set MESH_TRITONSERVER_LIBRARY") from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            f = getattr(loaded, name)
            f.restype, f.argtypes = restype, argtypes
        _LIB = loaded
    return _LIB


def error_from(raw) -> TritonError | None:
    """The exception for a TRITONSERVER_Error pointer (None for success); the error is not freed."""
    if not raw:
        return None
    lb = lib()
    code = lb.TRITONSERVER_ErrorCode(raw)
    message = (lb.TRITONSERVER_ErrorMessage(raw) or b"").decode("utf-8", "replace")
    cls = ERRORS[code] if code < len(ERRORS) else UnknownError
    return cls(message)


_BOUND: dict = {}


def call(name: str, *args) -> None:
    """Calls a function that returns a TRITONSERVER_Error*, raising (and freeing) the error."""
    f = _BOUND.get(name)
    if f is None:
        f = _BOUND[name] = getattr(lib(), name)
    check(f(*args))


def ignore(raw) -> None:
    """Frees the TRITONSERVER_Error a call returned, if any (where nothing could be done about it)."""
    if raw:
        lib().TRITONSERVER_ErrorDelete(raw)


def check(raw) -> None:
    """Raises (and frees) the TRITONSERVER_Error a call returned, if any."""
    if raw:
        error = error_from(raw)
        lib().TRITONSERVER_ErrorDelete(raw)
        raise error


LOG_WARN, LOG_ERROR = 1, 2  # TRITONSERVER_LogLevel


def log(level: int, message: str) -> None:
    """A line in the server's log (as Triton's package logs through the library), never raising."""
    ignore(lib().TRITONSERVER_LogMessage(level, b"tritonserver", 0, message.encode("utf-8", "replace")))


def json_of(message) -> str:
    """A TRITONSERVER_Message's JSON, with the message deleted."""
    base, size = c_char_p(), c_size_t()
    try:
        call("TRITONSERVER_MessageSerializeToJson", message, byref(base), byref(size))
        return ctypes.string_at(base, size.value).decode()
    finally:
        lib().TRITONSERVER_MessageDelete(message)


def text(value) -> bytes:
    """A Python string as the C string the library takes, after a type check."""
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {type(value).__name__}: {value!r}")
    return value.encode()
