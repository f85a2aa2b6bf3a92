"""Tensors: memory the server reads or wrote, shared with numpy (and anything speaking DLPack) without copies."""
from __future__ import annotations

import ctypes
import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy

from tritonserver._library import InvalidArgumentError, UnsupportedError
from tritonserver._types import NUMPY_OF, DataType, DLDeviceType, MemoryType, data_type_of


@dataclass
class MemoryBuffer:
    """A block of memory and the object that keeps it alive (`owner`): the memory is valid while
    a reference to the owner is held."""

    data_ptr: int
    memory_type: MemoryType
    memory_type_id: int
    size: int
    owner: Any

    @staticmethod
    def from_dlpack(owner: Any) -> "MemoryBuffer":
        """The memory of a contiguous CPU object that speaks DLPack (a numpy array, a CPU torch
        tensor...), held through `owner` itself: no copy, so what is written there is the owner's."""
        if not hasattr(owner, "__dlpack__"):
            raise InvalidArgumentError("Object does not support DLpack protocol")
        array = owner if isinstance(owner, numpy.ndarray) else _dlpack_array(owner)
        if not array.flags.writeable:  # as numpy's __dlpack__ refuses it: outputs may be written there
            raise InvalidArgumentError("Object does not support DLPack protocol: the array is read-only")
        if not array.flags.c_contiguous:
            raise InvalidArgumentError("Only contiguous memory is supported")
        pinned = getattr(owner, "__dlpack_device__", lambda: (DLDeviceType.kDLCPU, 0))()[0] == DLDeviceType.kDLCUDAHost
        buffer = MemoryBuffer(_address(array), MemoryType.CPU_PINNED if pinned else MemoryType.CPU, 0, array.nbytes,
                              owner)
        # The DLPack view holds the exported memory too (an exporter may hand out a temporary).
        buffer._view = array
        return buffer

    def _create_tritonserver_buffer_attributes(self):
        raise UnsupportedError("buffer attributes are not supported by the mesh's in-process API")


def _dlpack_array(obj: Any) -> numpy.ndarray:
    """A numpy array over the memory of a CPU object that speaks DLPack (no copy)."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is not None and device()[0] not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
        raise UnsupportedError(
            f"{type(obj).__name__} lives on device {device()}: the mesh's in-process API takes CPU memory; "
            "move it to the host first")
    try:
        return numpy.from_dlpack(obj)
    except (TypeError, BufferError, RuntimeError) as e:
        raise InvalidArgumentError(f"cannot read a {type(obj).__name__} through DLPack: {e}") from None


def _host_array(obj: Any) -> numpy.ndarray:
    """A C-contiguous numpy array over `obj`'s memory (a copy only when its layout is not contiguous)."""
    if not isinstance(obj, numpy.ndarray):
        obj = _dlpack_array(obj)
    if obj.dtype.byteorder == ">":
        obj = obj.astype(obj.dtype.newbyteorder("="))  # the server reads little-endian bytes
    if not obj.flags.c_contiguous:
        obj = numpy.ascontiguousarray(obj)
    return obj


_NUMPY_DTYPES = {t: numpy.dtype(v) for t, v in NUMPY_OF.items()}


def _address(array: numpy.ndarray) -> int:
    """Where an array's data starts: through the buffer protocol when it is writable (a third of the
    cost of `__array_interface__`, which read-only arrays still go through)."""
    if array.flags.writeable and array.nbytes:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    return array.__array_interface__["data"][0]


class _View:
    """What numpy reads a tensor's memory through; it keeps the tensor (and so its owner) alive."""

    def __init__(self, tensor: "Tensor", dtype: numpy.dtype):
        self._tensor = tensor
        self.__array_interface__ = {
            "data": (tensor.memory_buffer.data_ptr, False),
            "shape": tuple(tensor.shape),
            "typestr": dtype.str,
            "version": 3,
        }


@dataclass
class Tensor:
    """A tensor: its data type, shape, and the memory that holds it."""

    data_type: DataType
    shape: Sequence[int]
    memory_buffer: MemoryBuffer

    @property
    def data_ptr(self) -> int:
        return self.memory_buffer.data_ptr

    @property
    def memory_type(self) -> MemoryType:
        return self.memory_buffer.memory_type

    @property
    def memory_type_id(self) -> int:
        return self.memory_buffer.memory_type_id

    @property
    def size(self) -> int:
        return self.memory_buffer.size

    # -- DLPack ------------------------------------------------------------------------------
    def __dlpack__(self, *, stream: Any = None, **kwargs: Any):
        return self._numpy().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return (DLDeviceType.kDLCPU, 0)

    def _numpy(self) -> numpy.ndarray:
        """The tensor as a numpy array over its own memory."""
        if self.data_type == DataType.BYTES:
            raise InvalidArgumentError("a BYTES tensor has no DLPack form: use to_bytes_array() or to_string_array()")
        if self.data_type == DataType.BF16:
            raise UnsupportedError("numpy has no bfloat16: a BF16 tensor cannot be shared with it")
        dtype = _NUMPY_DTYPES[self.data_type]
        expected = math.prod(self.shape) * dtype.itemsize
        if expected != self.size:
            raise InvalidArgumentError(f"shape {list(self.shape)} of {self.data_type.name} needs {expected} bytes, "
                                       f"the tensor holds {self.size}")
        if expected == 0:
            return numpy.empty(tuple(self.shape), dtype)
        return numpy.asarray(_View(self, dtype))

    @staticmethod
    def from_dlpack(obj: Any) -> "Tensor":
        """A tensor over the memory of `obj` (no copy when it is a contiguous CPU array)."""
        array = _host_array(obj)
        if array.dtype.kind in ("U", "S", "O"):
            return Tensor.from_bytes_array(array)
        buffer = MemoryBuffer(_address(array), MemoryType.CPU, 0, array.nbytes, obj if array is obj else array)
        return Tensor(data_type_of(array.dtype), list(array.shape), buffer)

    # -- BYTES ---------------------------------------------------------------------------------
    @staticmethod
    def from_bytes_array(array: Any) -> "Tensor":
        """A BYTES tensor: each element (bytes, str or anything str() takes) length-prefixed, as Triton lays them out."""
        array = numpy.asarray(array, dtype=object) if not isinstance(array, numpy.ndarray) else array
        parts = []
        for item in array.reshape(-1):
            if isinstance(item, str):
                item = item.encode()
            elif not isinstance(item, (bytes, bytearray)):
                item = str(item).encode()
            parts.append(struct.pack("<I", len(item)))
            parts.append(bytes(item))
        data = numpy.frombuffer(b"".join(parts), dtype=numpy.uint8).copy()
        buffer = MemoryBuffer(_address(data), MemoryType.CPU, 0, data.nbytes, data)
        return Tensor(DataType.BYTES, list(array.shape), buffer)

    from_string_array = from_bytes_array

    def to_bytes_array(self) -> numpy.ndarray:
        """A BYTES tensor's elements as a numpy object array of bytes, in the tensor's shape."""
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"to_bytes_array needs a BYTES tensor, this one is {self.data_type.name}")
        import ctypes

        raw = ctypes.string_at(self.data_ptr, self.size) if self.size else b""
        items, at = [], 0
        while at < len(raw):
            if at + 4 > len(raw):
                raise InvalidArgumentError("a BYTES tensor ends inside an element's length")
            (n,) = struct.unpack_from("<I", raw, at)
            if at + 4 + n > len(raw):
                raise InvalidArgumentError("a BYTES tensor's element runs past its end")
            items.append(raw[at + 4:at + 4 + n])
            at += 4 + n
        out = numpy.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(tuple(self.shape))

    def to_string_array(self) -> numpy.ndarray:
        """A BYTES tensor's elements decoded as UTF-8 strings."""
        array = self.to_bytes_array()
        out = numpy.empty(array.shape, dtype=object)
        flat = out.reshape(-1)
        flat[:] = [b.decode("utf-8", "replace") for b in array.reshape(-1)]
        return out

    # -- devices -------------------------------------------------------------------------------
    def to_device(self, device: Any) -> "Tensor":
        """The tensor on `device` ("cpu", MemoryType.CPU...): the same tensor, as the mesh holds CPU memory only."""
        kind = _memory_type_of(device)
        if kind in (MemoryType.CPU, MemoryType.CPU_PINNED):
            return self
        raise UnsupportedError(f"device {device!r}: the mesh's in-process API answers in CPU memory only")

    def to_host(self) -> "Tensor":
        return self

    @staticmethod
    def _from_object(obj: Any) -> "Tensor":
        """A request input from what the caller gave: a Tensor, an array, a list or anything speaking DLPack."""
        if isinstance(obj, Tensor):
            return obj
        if not isinstance(obj, numpy.ndarray) and not hasattr(obj, "__dlpack__"):
            obj = numpy.array(obj)
        if isinstance(obj, numpy.ndarray) and obj.dtype.kind in ("U", "S", "O"):
            return Tensor.from_bytes_array(obj)
        return Tensor.from_dlpack(obj)


def _device_of(device: Any) -> tuple[MemoryType, int]:
    """A memory type and id from the ways the API names one: "cpu", "gpu:0", MemoryType,
    DLDeviceType, or a (MemoryType or DLDeviceType, id) tuple."""
    memory_id = 0
    if isinstance(device, tuple) and len(device) == 2:
        device, memory_id = device
        if not isinstance(device, (MemoryType, DLDeviceType)) or not isinstance(memory_id, int):
            raise InvalidArgumentError(f"Invalid memory type {(device, memory_id)}")
    if isinstance(device, MemoryType):
        return device, memory_id
    if isinstance(device, DLDeviceType):
        return {DLDeviceType.kDLCPU: MemoryType.CPU, DLDeviceType.kDLCUDAHost: MemoryType.CPU_PINNED}.get(
            device, MemoryType.GPU), memory_id
    if isinstance(device, str):
        name, _, number = device.partition(":")
        known = {"cpu": MemoryType.CPU, "cpu_pinned": MemoryType.CPU_PINNED, "gpu": MemoryType.GPU,
                 "cuda": MemoryType.GPU}
        kind = known.get(name.strip().lower())
        if kind is not None and (not number or number.strip().isdigit()):
            return kind, int(number) if number else 0
    raise InvalidArgumentError(f"unknown memory type or device {device!r} (cpu, cpu_pinned, gpu[:id])")


def _memory_type_of(device: Any) -> MemoryType:
    """The memory type of a device named as `_device_of` takes it."""
    return _device_of(device)[0]
