"""Output memory from the application: MemoryAllocator, CPUAllocator, default_memory_allocators, and where a request's outputs are placed.

A request with `output_memory_allocator` (or an `output_memory_type`, or a default allocator the
application replaced) is sent so that the library holds each answer's outputs; the thread that
reads the answer asks the allocator for a buffer per output and the library copies each output
into its buffer once (`MESH_InferenceResponsePlaceOutputs`). The allocator runs in the
application's own thread, never on the server's: the GIL is never taken there. The rules of which
allocator gets which memory type are r24.10's.
"""
from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from typing import Any, Optional, Sequence

import numpy

from tritonserver import _library as L
from tritonserver._library import InternalError, InvalidArgumentError
from tritonserver._tensor import MemoryBuffer, Tensor, _device_of
from tritonserver._types import MemoryType


class MemoryAllocator(ABC):
    """Gives the memory a response's outputs are written to. An implementation need not give the
    memory type or id asked for; the mesh writes outputs to CPU (or CPU_PINNED) memory only."""

    @abstractmethod
    def allocate(self, size: int, memory_type: MemoryType, memory_type_id: int) -> MemoryBuffer:
        """A buffer of at least `size` bytes (its owner keeps it alive while the output is used)."""


class CPUAllocator(MemoryAllocator):
    """A numpy array of `size` bytes per output."""

    def __init__(self):
        pass

    def allocate(self, size: int, memory_type: MemoryType, memory_type_id: int) -> MemoryBuffer:
        return MemoryBuffer.from_dlpack(numpy.empty(size, numpy.byte))


# The allocator of each memory type, for requests that name no allocator (r24.10's; the
# application may change it). CPU only: the mesh writes outputs to CPU memory.
default_memory_allocators: dict[MemoryType, MemoryAllocator] = {MemoryType.CPU: CPUAllocator()}

_BUFFER = struct.Struct("<QQI4xq")  # MESH_OutputBuffer: base, byte_size, memory_type, memory_type_id


class _Placement:
    """Where one request's outputs go: r24.10's ResponseAllocator rules, applied on the thread that
    reads each answer."""

    __slots__ = ("allocator", "memory_type", "memory_type_id")

    def __init__(self, allocator: Optional[MemoryAllocator], device: Any):
        self.allocator = allocator
        self.memory_type: Optional[MemoryType] = None
        self.memory_type_id = 0
        if device is not None:
            self.memory_type, self.memory_type_id = _device_of(device)
            if allocator is None and self.memory_type not in default_memory_allocators:
                raise InvalidArgumentError(f"Memory type {self.memory_type} not supported by "
                                           f"default_memory_allocators: {default_memory_allocators}")

    def buffer(self, name: str, size: int, memory_type: MemoryType, memory_type_id: int) -> MemoryBuffer:
        """The buffer of one output (`memory_type`: what the server prefers); any failure of the
        allocator's is an InternalError naming the output."""
        if self.memory_type is not None:
            memory_type, memory_type_id = self.memory_type, self.memory_type_id
        allocator = self.allocator
        if allocator is None:
            allocator = default_memory_allocators.get(memory_type)
            if allocator is None:
                L.log(L.LOG_WARN, f"output '{name}': no allocator for {memory_type.name} memory in "
                                  "default_memory_allocators; falling back to CPU")
                memory_type, memory_type_id = MemoryType.CPU, 0
                allocator = default_memory_allocators.get(memory_type)
        try:
            if allocator is None:
                raise KeyError("default_memory_allocators has no CPU allocator")
            buffer = allocator.allocate(size, memory_type, memory_type_id)
            fields = (int(buffer.data_ptr), MemoryType(buffer.memory_type), int(buffer.memory_type_id),
                      int(buffer.size))
        except Exception as e:
            message = f"output '{name}': the allocator failed: {type(e).__name__}: {e}"
            L.log(L.LOG_ERROR, message)
            raise InternalError(message) from None
        if fields[3] < size or (not fields[0] and size):
            raise InternalError(f"output '{name}' needs {size} bytes; the allocator gave {fields[3]} at "
                                f"{fields[0]:#x}")
        return buffer

    def place(self, handle: int, outputs: Sequence[tuple]) -> dict[str, Tensor]:
        """Buffers for the held outputs of a C response (`outputs`: (name, data type, shape, byte
        size) each, in its order), which the library then fills: the outputs as Tensors over them."""
        buffers = [self.buffer(name, size, MemoryType.CPU, 0) for name, _, _, size in outputs]
        packed = b"".join(_BUFFER.pack(b.data_ptr, b.size, int(b.memory_type), b.memory_type_id) for b in buffers)
        L.check(L.lib().MESH_InferenceResponsePlaceOutputs(handle, packed, len(buffers)))
        placed = {}
        for (name, data_type, shape, size), b in zip(outputs, buffers):
            if b.size != size:  # a larger buffer: the tensor is the output's bytes of it
                b = MemoryBuffer(b.data_ptr, MemoryType(b.memory_type), b.memory_type_id, size, b.owner)
            placed[name] = Tensor(data_type, shape, b)
        return placed


def placement_of(allocator: Optional[MemoryAllocator], device: Any) -> Optional[_Placement]:
    """How a request's outputs are placed; None for the library's own CPU memory (what the
    default CPU allocator would give, without a call into Python per output)."""
    if allocator is None and type(default_memory_allocators.get(MemoryType.CPU)) is CPUAllocator:
        if device is None:
            return None
        if _Placement(None, device).memory_type == MemoryType.CPU:
            return None
    return _Placement(allocator, device)

