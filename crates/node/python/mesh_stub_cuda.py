"""GPU tensors for the mesh's Python stub: DLPack capsules read and made (CUDA ones included), and
the copies between device and host memory, through the CUDA driver (libcuda, loaded with ctypes on
first use, so a stub on a machine without a GPU never needs it). Written for the mesh from DLPack's
public header (dlpack.h) and the CUDA driver API's documented signatures."""
import contextlib
import ctypes
import threading

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
_USED = b"used_dltensor"  # the name a consumed capsule takes (the DLPack protocol)
_NAME = b"dltensor"


class CudaError(RuntimeError):
    """A CUDA driver call failed, or there is no driver; the message says which."""


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

# DLPack type codes (kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool) and bits -> Triton's names.
_TO_TRITON = {(0, 8): "INT8", (0, 16): "INT16", (0, 32): "INT32", (0, 64): "INT64",
              (1, 8): "UINT8", (1, 16): "UINT16", (1, 32): "UINT32", (1, 64): "UINT64",
              (2, 16): "FP16", (2, 32): "FP32", (2, 64): "FP64", (4, 16): "BF16", (6, 8): "BOOL"}
_FROM_TRITON = {name: code for code, name in _TO_TRITON.items()}

# The capsule calls, on a library object of our own so their argument types are ours alone.
_py = ctypes.PyDLL(None)
_get_pointer = _py.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_is_valid = _py.PyCapsule_IsValid
_is_valid.restype, _is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_set_name = _py.PyCapsule_SetName
_set_name.restype, _set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_new_capsule = _py.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# The same two calls for the capsule destructor, which gets the capsule as a bare pointer.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _py))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _py))


def capsule_device(capsule):
    """(device type, device id) of a DLPack capsule not yet consumed, without consuming it."""
    if not _is_valid(capsule, _NAME):
        if _is_valid(capsule, b"dltensor_versioned"):
            raise ValueError("a versioned DLPack capsule (DLPack 1.x) is not supported: pass the tensor itself, "
                             "or a capsule from torch.utils.dlpack.to_dlpack")
        raise ValueError("the DLPack capsule was already consumed (a capsule can be read once)")
    managed = DLManagedTensor.from_address(_get_pointer(capsule, _NAME))
    return managed.dl_tensor.device.device_type, managed.dl_tensor.device.device_id


class GpuData:
    """A contiguous tensor in device memory: where it is, its shape and Triton type, and what keeps
    it alive (the producer's DLPack tensor, or memory this stub allocated)."""

    __slots__ = ("pointer", "device", "nbytes", "shape", "dtype", "_owner")

    def __init__(self, pointer, device, nbytes, shape, dtype, owner):
        self.pointer, self.device, self.nbytes = pointer, device, nbytes
        self.shape, self.dtype, self._owner = list(shape), dtype, owner


class _Consumed:
    """A consumed capsule's DLManagedTensor: its deleter runs once, when this goes."""

    def __init__(self, managed):
        self._managed = managed

    def __del__(self):
        managed, self._managed = self._managed, None
        if managed is not None and managed.contents.deleter:
            managed.contents.deleter(managed)


def take_capsule(capsule):
    """Consumes a CUDA DLPack capsule as Triton's stub does: C-contiguous (dims of 1 may have any
    stride), one lane, a type Triton has. Zero-copy: the result keeps the producer's memory alive
    and calls its deleter when dropped. Raises ValueError with Triton's words otherwise."""
    pointer = _get_pointer(capsule, _NAME)
    managed = ctypes.cast(ctypes.c_void_p(pointer), ctypes.POINTER(DLManagedTensor))
    t = managed.contents.dl_tensor
    if t.ndim < 0 or t.ndim > 64:
        raise ValueError(f"DLPack tensor has {t.ndim} dimensions (at most 64)")
    shape = [t.shape[i] for i in range(t.ndim)]
    if any(d < 0 for d in shape):
        raise ValueError(f"DLPack tensor has a negative dimension: {shape}")
    if t.strides:
        expected = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1:
                if t.strides[i] != expected:
                    raise ValueError("DLPack tensor is not contiguous. Only contiguous DLPack tensors "
                                     "that are stored in C-Order are supported.")
                expected *= shape[i]
    if t.device.device_type != KDL_CUDA:
        raise ValueError(f"DLDevice type {t.device.device_type} is not support by Python backend.")
    dtype = _TO_TRITON.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise ValueError(f"DLPack type code {t.dtype.code} of {t.dtype.bits} bits "
                         f"({t.dtype.lanes} lanes) has no Triton datatype")
    count = 1
    for d in shape:
        count *= d
    _set_name(capsule, _USED)
    return GpuData((t.data or 0) + t.byte_offset, t.device.device_id, count * t.dtype.bits // 8, shape,
                   dtype, _Consumed(managed))


# ---- capsules made here ----
_EXPORTS = {}  # address of each DLManagedTensor made here -> (it, its shape, what it keeps alive)
_EXPORTS_LOCK = threading.RLock()  # re-entrant: a finalizer run by the GC while it is held may drop a capsule


def _drop(address):
    with _EXPORTS_LOCK:
        entry = _EXPORTS.pop(address, None)
    del entry  # outside the lock: what it kept alive may release another capsule of ours


@DELETER
def _release(managed):
    _drop(ctypes.addressof(managed.contents))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_gone(capsule):
    # A capsule nobody consumed still owns its tensor (the DLPack protocol): release it.
    if _raw_is_valid(capsule, _NAME):
        _drop(_raw_get_pointer(capsule, _NAME))


def make_capsule(data, owner):
    """A DLPack capsule of the device memory `data` describes (a GpuData), keeping `owner` alive
    until the consumer's deleter (or the unconsumed capsule's end) releases it."""
    shape = (ctypes.c_int64 * max(len(data.shape), 1))(*data.shape)
    managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data, t.ndim, t.shape, t.strides, t.byte_offset = data.pointer, len(data.shape), shape, None, 0
    t.device = DLDevice(KDL_CUDA, data.device)
    code, bits = _FROM_TRITON[data.dtype]
    t.dtype = DLDataType(code, bits, 1)
    managed.deleter = _release
    with _EXPORTS_LOCK:
        _EXPORTS[ctypes.addressof(managed)] = (managed, shape, owner)
    return _new_capsule(ctypes.addressof(managed), _NAME, ctypes.cast(_capsule_gone, ctypes.c_void_p))


# ---- the CUDA driver ----
def _check(lib, result, call):
    if result != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(name))
        raise CudaError(f"{call} failed: {(name.value or b'error %d' % result).decode()}")


class _Driver:
    """libcuda, opened on first use; each device's primary context (the one torch and cupy use),
    retained once for the process."""

    def __init__(self):
        self.lock = threading.RLock()  # re-entrant: a DeviceMemory freed by the GC while it is held
        self.lib = None
        self.contexts = {}

    def load(self):
        with self.lock:
            if self.lib is None:
                try:
                    lib = ctypes.CDLL("libcuda.so.1")
                except OSError as e:
                    raise CudaError(f"this machine has no CUDA driver (libcuda.so.1: {e})") from None
                _check(lib, lib.cuInit(0), "cuInit")
                self.lib = lib
            return self.lib

    def context(self, device):
        lib = self.load()
        with self.lock:
            if device not in self.contexts:
                handle, context = ctypes.c_int(), ctypes.c_void_p()
                _check(lib, lib.cuDeviceGet(ctypes.byref(handle), int(device)), f"cuDeviceGet({device})")
                _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")
                self.contexts[device] = context
            return self.contexts[device]

    @contextlib.contextmanager
    def on(self, device):
        """Runs driver calls with `device`'s primary context current on this thread, restoring the
        thread's own afterwards."""
        context = self.context(device)
        _check(self.lib, self.lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            yield self.lib
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


DRIVER = _Driver()
_LEGACY_STREAM = ctypes.c_void_p(1)  # CU_STREAM_LEGACY: DLPack's stream 1


class DeviceMemory:
    """`nbytes` of device memory this stub allocated on `device`, freed when this goes."""

    def __init__(self, nbytes, device):
        self.device = device
        self.pointer = ctypes.c_uint64()
        with DRIVER.on(device) as lib:
            _check(lib, lib.cuMemAlloc_v2(ctypes.byref(self.pointer), ctypes.c_size_t(max(nbytes, 1))),
                         f"cuMemAlloc of {nbytes} bytes on GPU {device}")

    def __del__(self):
        pointer, self.pointer = getattr(self, "pointer", None), None
        if pointer is not None and DRIVER.lib is not None:
            try:
                with DRIVER.on(self.device) as lib:
                    lib.cuMemFree_v2(pointer)
            except Exception:  # noqa: BLE001 (at interpreter exit the driver may be gone first)
                pass


def synchronize(device):
    """Waits for the work queued on `device`'s legacy default stream (DLPack's stream 1, which a
    producer's `__dlpack__(stream=1)` makes wait for the tensor's own work)."""
    with DRIVER.on(device) as lib:
        _check(lib, lib.cuStreamSynchronize(_LEGACY_STREAM), "cuStreamSynchronize")


def to_host(data, address):
    """Copies the tensor `data` describes into host memory at `address` (returns when it is there)."""
    with DRIVER.on(data.device) as lib:
        _check(lib, lib.cuMemcpyDtoH_v2(ctypes.c_void_p(address), ctypes.c_uint64(data.pointer),
                                         ctypes.c_size_t(data.nbytes)),
                     f"copying {data.nbytes} bytes from GPU {data.device}")


def to_device(address, nbytes, shape, dtype, device):
    """A GpuData holding a copy of `nbytes` of host memory at `address`, on `device`."""
    memory = DeviceMemory(nbytes, device)
    with DRIVER.on(device) as lib:
        _check(lib, lib.cuMemcpyHtoD_v2(memory.pointer, ctypes.c_void_p(address), ctypes.c_size_t(nbytes)),
                     f"copying {nbytes} bytes to GPU {device}")
    # From pageable memory the call may return before the data is on the device: wait for it, so
    # no work is pending on the tensor (a consumer may read it on any stream).
    synchronize(device)
    return GpuData(memory.pointer.value, device, nbytes, shape, dtype, memory)
