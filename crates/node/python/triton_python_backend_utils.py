"""The mesh's own `triton_python_backend_utils`: the API Triton's Python models import as `pb_utils`,
backed by the mesh stub (mesh_stub.py) instead of Triton's. Written for the mesh from the public API."""
import enum
import json
import numbers
import threading
import traceback

import numpy as np

# pb_utils' names defined in modules of their own (below this one, which re-exports them).
from mesh_pb_host import TritonModelException
from mesh_pb_host import host as _host
from mesh_pb_metrics import Metric, MetricFamily  # noqa: F401 - pb_utils' names

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

_DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}

# Triton's public table of config type names to numpy types (models iterate over it, e.g. to
# declare one input per type in auto_complete_config).
TRITON_STRING_TO_NUMPY = {
    ("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}"): (bool if name == "BOOL" else t)
    for name, t in _DTYPES.items()
}


def triton_string_to_numpy(triton_type):
    """'TYPE_FP32' (config spelling) or 'FP32' (wire spelling) -> the numpy type."""
    name = triton_type[5:] if triton_type.startswith("TYPE_") else triton_type
    if name == "STRING":
        name = "BYTES"
    return _DTYPES.get(name)


_BY_NUMPY = {np.dtype(t): name for name, t in _DTYPES.items() if name != "BYTES"}


def numpy_to_triton_type(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    return _BY_NUMPY.get(dtype)


def using_decoupled_model_transaction_policy(model_config):
    """Whether a model's config (the dict json.loads(args["model_config"]) gives) makes it decoupled."""
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


def get_input_config_by_name(model_config, name):
    for i in model_config.get("input", []):
        if i["name"] == name:
            return i
    return None


def get_output_config_by_name(model_config, name):
    for o in model_config.get("output", []):
        if o["name"] == name:
            return o
    return None


class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        self._message = str(message)
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r})"


# Argument checks, as Triton's stub (pybind11) makes them: an argument of the wrong type (None
# included) is a TypeError naming it; text may also be given as UTF-8 bytes.
def _text(value, what):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _integer(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return int(value)


def _list(value, what):
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be a list, not {type(value).__name__}")
    return list(value)


def _cuda():
    """mesh_stub_cuda (DLPack capsules and the CUDA driver), imported on first use."""
    import mesh_stub_cuda
    return mesh_stub_cuda


class Tensor:
    """A named tensor, in CPU memory (a numpy array) or on a GPU (from `from_dlpack` of a CUDA
    tensor, or a BLS output with a GPU preferred_memory). Inputs handed to execute() are writable
    views of shared memory, valid while execute() runs, as Triton's copies are."""

    def __init__(self, name, array, _dtype=None):
        name = _text(name, "Tensor name")
        if array is None:
            raise TypeError("Tensor array must be a numpy array, not NoneType")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        if array.dtype.kind in ("S", "U"):
            array = array.astype(np.object_)
        self._name = name
        self._array = array
        self._gpu = None
        self._triton_dtype = _dtype or numpy_to_triton_type(array.dtype)
        if self._triton_dtype is None:
            raise TritonModelException(f"tensor '{name}' has unsupported numpy dtype {array.dtype}")

    @classmethod
    def _on_gpu(cls, name, data):
        """A tensor of device memory (a mesh_stub_cuda.GpuData)."""
        tensor = cls.__new__(cls)
        tensor._name, tensor._array, tensor._gpu, tensor._triton_dtype = name, None, data, data.dtype
        return tensor

    def name(self):
        return self._name

    def as_numpy(self):
        if self._gpu is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def triton_dtype(self):
        return self._triton_dtype

    def shape(self):
        return list(self._gpu.shape if self._gpu is not None else self._array.shape)

    def is_cpu(self):
        return self._gpu is None

    def to_dlpack(self):
        if self._triton_dtype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._gpu is not None:
            return _cuda().make_capsule(self._gpu, self)  # zero-copy; the capsule keeps this alive
        array = self._array
        if not array.flags.writeable:  # DLPack 0.x cannot say read-only
            array = array.view()
            try:
                array.flags.writeable = True  # still zero-copy when the memory itself is writable
            except ValueError:
                array = self._array.copy()
        return array.__dlpack__()

    def __dlpack__(self, stream=None, **_):
        """The DLPack protocol, as Triton's Tensor has it (no work is pending on its memory; a
        consumer's max_version is answered with an unversioned capsule, which the protocol allows)."""
        return self.to_dlpack()

    def __dlpack_device__(self):
        if self._gpu is not None:
            return (_cuda().KDL_CUDA, self._gpu.device)
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name, capsule):
        """A tensor from a DLPack capsule or an object with `__dlpack__` and `__dlpack_device__`,
        in CPU memory or on a GPU, sharing its memory (C-contiguous only), with Triton's errors.
        An object on a GPU is asked for its tensor on DLPack's stream 1 (the legacy default
        stream), which is then synchronised, so no work on the memory is pending."""
        if _text(name, "Tensor name") == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        cuda = _cuda()
        if type(capsule).__name__ == "PyCapsule":
            try:
                device_type, _ = cuda.capsule_device(capsule)
            except ValueError as e:
                raise TritonModelException(str(e)) from None
            if device_type == cuda.KDL_CUDA:
                return Tensor._taken(name, capsule)
            source = _Capsule(capsule)
        elif hasattr(capsule, "__dlpack__") and hasattr(capsule, "__dlpack_device__"):
            device_type, device_id = capsule.__dlpack_device__()
            if device_type == cuda.KDL_CUDA:
                tensor = Tensor._taken(name, capsule.__dlpack__(stream=1))
                try:
                    cuda.synchronize(device_id)
                except cuda.CudaError as e:
                    raise TritonModelException(f"Failed to synchronize CUDA device with id {device_id}: {e}") from None
                return tensor
            source = capsule
        else:
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes")
        if device_type not in (cuda.KDL_CPU, cuda.KDL_CUDA_HOST):
            raise TritonModelException(f"DLDevice type {device_type} is not support by Python backend.")
        try:
            array = np.from_dlpack(source)
        except BufferError as e:
            raise TritonModelException(f"DLPack tensor is not supported by the mesh's Python stub: {e}") from e
        if array.ndim > 1 and not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
                "C-Order are supported.")
        return Tensor(name, array)

    @staticmethod
    def _taken(name, capsule):
        try:
            return Tensor._on_gpu(name, _cuda().take_capsule(capsule))
        except ValueError as e:
            raise TritonModelException(str(e)) from None

    def _to_gpu(self, device):
        """This tensor copied to GPU `device` (itself when it is there already, or is a string
        tensor, which stays in CPU memory as in Triton)."""
        if self._gpu is not None or self._triton_dtype == "BYTES":
            return self
        array = np.ascontiguousarray(self._array)
        data = _cuda().to_device(array.ctypes.data, array.nbytes, array.shape, self._triton_dtype, int(device))
        return Tensor._on_gpu(self._name, data)

    def __repr__(self):
        where = f", gpu={self._gpu.device}" if self._gpu is not None else ""
        return f"Tensor({self._name!r}, {self._triton_dtype}, shape={self.shape()}{where})"


class _Capsule:
    """Lets np.from_dlpack take a bare DLPack capsule (what torch.utils.dlpack.to_dlpack returns)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def _placed(response, preferred):
    """A BLS call's response with its outputs where the request's preferred_memory asks: on a GPU
    preference they are copied to that GPU, where the stub reaches a CUDA driver; a preference that
    cannot be met leaves them in CPU memory, as Triton treats it (a preference, not a demand)."""
    if (preferred is None or preferred.preferred_memory_type != TRITONSERVER_MEMORY_GPU
            or response.has_error()):
        return response
    try:
        response._outputs = [t._to_gpu(preferred.preferred_device_id) for t in response._outputs]
    except _cuda().CudaError as e:
        _once("bls-cpu", f"BLS outputs stay in CPU memory: {e}")
    return response


_WARNED = set()


def _once(key, message):
    """Logs `message` the first time `key` comes up in this process."""
    if key not in _WARNED:
        _WARNED.add(key)
        Logger.log_warn(message)


def get_input_tensor_by_name(request, name):
    for t in request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(response, name):
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


class PreferredMemory:
    """Where a BLS call's outputs should be: TRITONSERVER_MEMORY_GPU and a device id copy them to
    that GPU for the caller (where the stub reaches a CUDA driver); anything else keeps them in CPU
    memory."""

    def __init__(self, preferred_memory_type=TRITONSERVER_MEMORY_CPU, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


_NO_OUTPUTS = ()  # InferenceResponse's default outputs (an explicit None is a TypeError, as in Triton)


class InferenceResponse:
    def __init__(self, output_tensors=_NO_OUTPUTS, error=None, parameters=None):
        self._outputs = _list(output_tensors, "output_tensors")
        if any(t is None for t in self._outputs):
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters


class ResponseSender:
    """How a model answers a request through `request.get_response_sender()`: a decoupled model
    zero or more responses, then the final flag; any other model exactly one response (then the
    final flag), instead of returning it from execute(). Usable from any thread; the answer reaches
    the client as soon as it is sent."""

    def __init__(self, send, cancelled, decoupled=True):
        self._send = send
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"send() takes an InferenceResponse, not {type(response).__name__}")
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response.")
                if response is None and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before "
                        "sending a response.")
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            if response is not None:
                self._sent += 1
            self._send(response, flags)

    def claim(self):
        """Takes the sender's one response for the one execute() returned (not decoupled):
        False when the model sent one already."""
        with self._lock:
            if self._sent > 0 or self._closed:
                return False
            self._sent, self._closed = 1, True
            return True

    def close(self):
        with self._lock:
            self._closed = True

    def is_cancelled(self):
        return bool(self._cancelled())


class InferenceTrace:
    """A request's trace, as `request.trace()` gives it: pass it to a BLS request
    (`InferenceRequest(..., trace=request.trace())`) to trace that call as the request's child."""

    def __init__(self, trace_id=None, context=None):
        self._id = trace_id
        self._context = context

    def get_context(self):
        """The request's OpenTelemetry context as Triton gives it: JSON text with its
        `traceparent` (and `tracestate`) in OpenTelemetry mode; None when the request is not
        traced, or traced in Triton's trace file mode."""
        return self._context or None


_NO_INPUTS = ()  # InferenceRequest's default inputs and output names (None is a TypeError)


class InferenceRequest:
    """A request: the ones execute() receives, and the ones a model builds for BLS. Its arguments
    are checked as Triton's are (TypeError for a wrong type, None included)."""

    def __init__(self, model_name="", requested_output_names=_NO_INPUTS, inputs=_NO_INPUTS, request_id="",
                 correlation_id=0, model_version=-1, flags=0, timeout=0, preferred_memory=None,
                 parameters=None, trace=None):
        model_name = _text(model_name, "model_name")
        request_id = _text(request_id, "request_id")
        inputs = [] if inputs is _NO_INPUTS else _list(inputs, "inputs")
        if any(t is None for t in inputs):
            raise TritonModelException(
                f"Input tensor for request with id '{request_id}' and model name '{model_name}' should "
                "not be empty.")
        requested = [] if requested_output_names is _NO_INPUTS else _list(requested_output_names,
                                                                            "requested_output_names")
        requested = [_text(n, "a requested output name") for n in requested]
        if not isinstance(correlation_id, (str, bytes)):
            correlation_id = _integer(correlation_id, "correlation_id")
        elif isinstance(correlation_id, bytes):
            correlation_id = correlation_id.decode("utf-8")
        self.model_name = model_name
        self._requested = requested
        self._inputs = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self.model_version = _integer(model_version, "model_version")
        self._flags = _integer(flags, "flags")
        self._timeout = _integer(timeout, "timeout")
        self.preferred_memory = preferred_memory
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        if parameters is None:
            parameters = {}
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters)
        if trace is not None and not isinstance(trace, InferenceTrace):
            raise TypeError("trace must be an InferenceTrace (request.trace())")
        self._trace = trace if trace is not None else InferenceTrace()
        self._sender = None
        self._sender_for = None  # a model that is not decoupled: makes the sender on first use
        self._cancelled = None

    def inputs(self):
        return self._inputs

    def requested_output_names(self):
        return self._requested

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def trace(self):
        """The request's trace (pass it to a BLS request to trace that call as a child)."""
        return self._trace

    def flags(self):
        return self._flags

    def timeout(self):
        """The request's timeout in microseconds (0: none)."""
        return self._timeout

    def set_release_flags(self, flags):
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE runs the request again in a later execution
        (a decoupled model must not have sent its final flag; a plain one returns None for it)."""
        self._release_flags = flags

    def parameters(self):
        return self._parameters

    def get_response_sender(self):
        if self._sender is None and self._sender_for is not None:
            return self._sender_for()
        if self._sender is None:
            raise TritonModelException("get_response_sender() is only available on the requests execute() receives")
        return self._sender

    def is_cancelled(self):
        return bool(self._cancelled and self._cancelled())

    def exec(self, decoupled=False):
        """Runs the request on another model. With decoupled=True, an iterator of the responses
        the model sends, as they arrive (a bare final flag is the last, with no outputs)."""
        if decoupled:
            return self._placing(_host().bls_stream(self))
        return _placed(_host().bls(self), self.preferred_memory)

    def stream_exec(self):
        """The older name of exec(decoupled=True)."""
        return self._placing(_host().bls_stream(self))

    async def async_exec(self, decoupled=False):
        """exec() as a coroutine; with decoupled=True it resolves to the iterator of the
        responses once the first one is in."""
        if decoupled:
            return self._placing(await _host().bls_stream_async(self))
        return _placed(await _host().bls_async(self), self.preferred_memory)

    def _placing(self, responses):
        """A decoupled call's response iterator, placing each response as _placed does."""
        if self.preferred_memory is not None:
            preferred = self.preferred_memory
            responses.place = lambda response: _placed(response, preferred)
        return responses


class LogLevel(enum.Enum):
    """A log line's level (an enum, as Triton's: Logger.log(message, 1) is a TypeError)."""
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Messages to the server's log, under the model's name; VERBOSE ones appear only at
    --log-verbose 1 or more."""
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE
    _NAMES = {LogLevel.INFO: "info", LogLevel.WARNING: "warn", LogLevel.ERROR: "error", LogLevel.VERBOSE: "verbose"}

    @staticmethod
    def log(message, level=LogLevel.INFO):
        if not isinstance(level, LogLevel):
            raise TypeError(f"level must be a pb_utils.LogLevel, not {type(level).__name__}")
        _host().log(Logger._NAMES[level], _text(message, "message"))

    @staticmethod
    def log_info(message):
        _host().log("info", _text(message, "message"))

    @staticmethod
    def log_warn(message):
        _host().log("warn", _text(message, "message"))

    @staticmethod
    def log_error(message):
        _host().log("error", _text(message, "message"))

    @staticmethod
    def log_verbose(message):
        _host().log("verbose", _text(message, "message"))


class ModelConfig:
    """What auto_complete_config(auto_complete_model_config) receives and returns."""

    def __init__(self, config):
        self._config = config

    def as_dict(self):
        return self._config

    def _add(self, key, spec):
        if not isinstance(spec, dict) or "name" not in spec:
            raise TritonModelException(f"{key} needs a dict with at least a 'name'")
        entries = self._config.setdefault(key, [])
        for e in entries:
            if e.get("name") == spec["name"]:
                for k, v in spec.items():
                    if k in e and e[k] not in ([], "", 0, None) and e[k] != v and k != "name":
                        raise TritonModelException(
                            f"auto-complete: {key} '{spec['name']}' has {k}={e[k]!r} in config, not {v!r}")
                    e.setdefault(k, v)
                return
        entries.append(dict(spec))

    def add_input(self, input):  # noqa: A002 - Triton's parameter name
        self._add("input", input)

    def add_output(self, output):
        self._add("output", output)

    def set_max_batch_size(self, max_batch_size):
        current = self._config.get("max_batch_size", 0)
        if current not in (0, max_batch_size) and self._config.get("_mesh_sets_max_batch_size"):
            raise TritonModelException(
                f"auto-complete: max_batch_size is {current} in config, not {max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict):
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)


def load_model(model_name, config="", files=None):
    """Loads (or reloads) a model, as a client's repository load does (explicit model control):
    `config` a JSON config replacing config.pbtxt, `files` {"file:<version>/<name>": bytes}."""
    model_name = _text(model_name, "model_name")
    config = _text(config, "config")
    blobs, described, at = [], [], 0
    for path, content in (files or {}).items():
        content = bytes(content)
        described.append([_text(path, "a file name"), at, len(content)])
        blobs.append(content)
        at += len(content)
    if described and not config:
        raise TritonModelException("load_model: files need a config")
    _host().model_control("load", model_name, "load_model", blobs, config=config, files=described)


def unload_model(model_name, unload_dependents=False):
    """Unloads a model, as a client's repository unload does (explicit model control)."""
    _host().model_control("unload", _text(model_name, "model_name"), "unload_model",
                          unload_dependents=bool(unload_dependents))


def is_model_ready(model_name, model_version=""):
    """Whether a model (its default version, or `model_version`) is ready: False for one the
    server does not know."""
    return bool(_host().model_control("ready", _text(model_name, "model_name"), "is_model_ready",
                                      version=_text(model_version, "model_version")))


def format_exception():
    return "".join(traceback.format_exc())

