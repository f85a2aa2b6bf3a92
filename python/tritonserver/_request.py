"""Requests and their answers: an InferenceRequest sent through the C API, and its responses read back from the library's response queue."""
from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import threading
from ctypes import byref, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field

import numpy
from typing import TYPE_CHECKING, Any, Optional

from tritonserver import _library as L
from tritonserver._library import InternalError, InvalidArgumentError, TritonError, UnsupportedError
from tritonserver._tensor import MemoryBuffer, Tensor, _memory_type_of
from tritonserver._types import DataType, MemoryType

if TYPE_CHECKING:
    from tritonserver._model import Model

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
EVENT_RESPONSE, EVENT_RELEASED = 1, 2
_PARAMETER_STRING, _PARAMETER_INT, _PARAMETER_BOOL, _PARAMETER_DOUBLE = 0, 1, 2, 3


@dataclass
class InferenceRequest:
    """One request to a model: its inputs (Tensors, arrays or lists), parameters and options."""

    model: "Model"
    request_id: Optional[str] = None
    flags: int = 0
    correlation_id: Optional[int | str] = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Optional[Any] = None
    response_queue: Optional[queue.SimpleQueue | asyncio.Queue] = None


@dataclass
class InferenceResponse:
    """One answer: its outputs (Tensors over the server's buffers), parameters, error and whether it is the last."""

    model: "Model"
    request_id: Optional[str] = None
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: Optional[TritonError] = None
    classification_label: Optional[str] = None
    final: bool = False


class _Response:
    """A C response, deleted (and its output buffers freed) when the last Tensor over it goes."""

    def __init__(self, handle: int):
        self.handle = handle

    def __del__(self):
        if self.handle:
            L.lib().TRITONSERVER_InferenceResponseDelete(self.handle)
            self.handle = 0


_ALLOCATOR = None
_ORPHANS: list["_Pending"] = []  # sent requests dropped before their release: freed once released
_ORPHANS_LOCK = threading.Lock()


def _allocator() -> int:
    """One response allocator for every request: the library's own CPU allocator (no Python callback)."""
    global _ALLOCATOR
    if _ALLOCATOR is None:
        made = c_void_p()
        L.call("TRITONSERVER_ResponseAllocatorNew", byref(made), L.address("MESH_CpuAlloc"),
               L.address("MESH_CpuRelease"), None)
        _ALLOCATOR = made.value
    return _ALLOCATOR


def _parameter(request: int, key: str, value: Any) -> None:
    name = L.text(key)
    if isinstance(value, bool):
        L.call("TRITONSERVER_InferenceRequestSetBoolParameter", request, name, value)
    elif isinstance(value, int):
        L.call("TRITONSERVER_InferenceRequestSetIntParameter", request, name, value)
    elif isinstance(value, float):
        L.call("TRITONSERVER_InferenceRequestSetDoubleParameter", request, name, value)
    elif isinstance(value, str):
        L.call("TRITONSERVER_InferenceRequestSetStringParameter", request, name, value.encode())
    else:
        raise InvalidArgumentError(f"parameter '{key}' has type {type(value).__name__}: parameters are str, int, "
                                   "bool or float")


class _Pending:
    """A request in flight: its C request, its queue, and the input tensors it borrows until released."""

    def __init__(self, model: "Model", request: InferenceRequest):
        self.model, self.request = model, request
        self.handle = self.queue = None
        self.tensors: list[Tensor] = []
        self.final = self.released = False
        self.defer_queue = False  # an asyncio reader still watches the queue's eventfd
        _collect_orphans()
        if request.output_memory_type is not None:
            kind = _memory_type_of(request.output_memory_type)
            if kind == MemoryType.GPU:
                raise UnsupportedError(f"output memory {request.output_memory_type!r}: the mesh's in-process API "
                                       "answers in CPU memory")
        made = c_void_p()
        L.call("TRITONSERVER_InferenceRequestNew", byref(made), model._server_ptr(), L.text(model.name),
               int(model.version))
        self.handle = made.value
        try:
            self._fill(request)
            q = c_void_p()
            L.call("MESH_ResponseQueueNew", byref(q))
            self.queue = q.value
            L.call("TRITONSERVER_InferenceRequestSetReleaseCallback", self.handle,
                   L.address("MESH_ResponseQueueReleased"), self.queue)
            L.call("TRITONSERVER_InferenceRequestSetResponseCallback", self.handle, _allocator(), None,
                   L.address("MESH_ResponseQueueComplete"), self.queue)
            L.call("TRITONSERVER_ServerInferAsync", model._server_ptr(), self.handle, None)
        except BaseException:
            self.released = True  # refused: the request is still ours, and nothing borrows the inputs
            self._free()
            raise

    def _fill(self, r: InferenceRequest) -> None:
        h = self.handle
        if r.request_id is not None:
            L.call("TRITONSERVER_InferenceRequestSetId", h, L.text(r.request_id))
        # A new C request starts with flags, priority and timeout 0: only other values are set.
        if r.flags:
            L.call("TRITONSERVER_InferenceRequestSetFlags", h, int(r.flags))
        if isinstance(r.correlation_id, str):
            L.call("TRITONSERVER_InferenceRequestSetCorrelationIdString", h, r.correlation_id.encode())
        elif r.correlation_id is not None:
            L.call("TRITONSERVER_InferenceRequestSetCorrelationId", h, int(r.correlation_id))
        if r.priority:
            L.call("TRITONSERVER_InferenceRequestSetPriorityUInt64", h, int(r.priority))
        if r.timeout:
            L.call("TRITONSERVER_InferenceRequestSetTimeoutMicroseconds", h, int(r.timeout))
        for name, value in r.inputs.items():
            t = Tensor._from_object(value)
            self.tensors.append(t)
            shape = numpy.asarray(t.shape, dtype=numpy.int64)  # read by the call, not kept
            L.call("TRITONSERVER_InferenceRequestAddInput", h, L.text(name), int(t.data_type),
                   shape.__array_interface__["data"][0] if shape.size else None, shape.size)
            L.call("TRITONSERVER_InferenceRequestAppendInputData", h, L.text(name), t.data_ptr, t.size,
                   int(t.memory_type), int(t.memory_type_id))
        for key, value in r.parameters.items():
            _parameter(h, key, value)

    def _free(self) -> None:
        """The C request once released (inputs no longer borrowed), and the queue (unless deferred)."""
        if self.released and self.handle:
            L.lib().TRITONSERVER_InferenceRequestDelete(self.handle)
            self.handle = None
            self.tensors = []
        if self.queue and self.released and not self.defer_queue:
            L.lib().MESH_ResponseQueueDelete(self.queue)
            self.queue = None

    def done(self) -> bool:
        return self.final and self.released

    def poll(self, timeout_us: int) -> tuple[bool, Optional[InferenceResponse]]:
        """Waits for the next event: (False, None) when the time ran out, (True, None) for the release,
        (True, response) for an answer."""
        kind, handle, flags = c_uint32(), c_void_p(), c_uint32()
        L.call("MESH_ResponseQueuePop", self.queue, timeout_us, byref(kind), byref(handle), byref(flags))
        response = None
        if kind.value == EVENT_RELEASED:
            self.released = True
        elif kind.value == EVENT_RESPONSE:
            self.final = self.final or bool(flags.value & FINAL)
            response = _response(self.model, self.request, handle.value, flags.value)
        else:
            return False, None
        if self.done():
            self._free()
        return True, response

    def __del__(self):
        if self.handle is None:
            return
        if self.released:
            self._free()
        else:
            with _ORPHANS_LOCK:
                _ORPHANS.append(self)


def _collect_orphans() -> None:
    """Frees dropped requests that were released since (their queues are drained of what is left)."""
    with _ORPHANS_LOCK:
        waiting = list(_ORPHANS)
        _ORPHANS.clear()
    for p in waiting:
        # What is left in its queue goes with it (responses are deleted as they are dropped).
        while not p.released and p.queue and p.poll(0)[0]:
            pass
        if p.released:
            p.final = True
            p._free()
        else:
            with _ORPHANS_LOCK:
                _ORPHANS.append(p)


def _parameters(handle: int) -> dict[str, Any]:
    lb, out = L.lib(), {}
    count = c_uint32()
    L.call("TRITONSERVER_InferenceResponseParameterCount", handle, byref(count))
    for i in range(count.value):
        name, kind, value = c_char_p(), c_uint32(), c_void_p()
        L.call("TRITONSERVER_InferenceResponseParameter", handle, i, byref(name), byref(kind), byref(value))
        reader = {_PARAMETER_STRING: lambda p: ctypes.string_at(p).decode(),
                  _PARAMETER_INT: lambda p: ctypes.cast(p, ctypes.POINTER(c_int64))[0],
                  _PARAMETER_BOOL: lambda p: ctypes.cast(p, ctypes.POINTER(c_bool))[0],
                  _PARAMETER_DOUBLE: lambda p: ctypes.cast(p, ctypes.POINTER(c_double))[0]}.get(kind.value)
        if reader is not None and value.value:
            out[name.value.decode()] = reader(value.value)
    del lb
    return out


def _response(model: "Model", request: InferenceRequest, handle: int, flags: int) -> InferenceResponse:
    """An InferenceResponse over a C response (outputs not copied: they keep the C response alive)."""
    result = InferenceResponse(model, request.request_id, final=bool(flags & FINAL))
    if not handle:
        return result
    owner = _Response(handle)
    try:
        error = L.error_from(L.lib().TRITONSERVER_InferenceResponseError(handle))  # owned by the response
        if error is not None:
            error.args += (result,)
            result.error = error
        rid = c_char_p()
        L.call("TRITONSERVER_InferenceResponseId", handle, byref(rid))
        result.request_id = (rid.value or b"").decode() or request.request_id
        result.parameters = _parameters(handle)
        count = c_uint32()
        L.call("TRITONSERVER_InferenceResponseOutputCount", handle, byref(count))
        for i in range(count.value):
            name, dtype, shape, dims = c_char_p(), c_uint32(), ctypes.POINTER(c_int64)(), c_uint64()
            base, size, mtype, mid, userp = c_void_p(), c_size_t(), c_uint32(), c_int64(), c_void_p()
            L.call("TRITONSERVER_InferenceResponseOutput", handle, i, byref(name), byref(dtype), byref(shape),
                   byref(dims), byref(base), byref(size), byref(mtype), byref(mid), byref(userp))
            buffer = MemoryBuffer(base.value or 0, MemoryType(mtype.value), mid.value, size.value, owner)
            result.outputs[name.value.decode()] = Tensor(DataType(dtype.value), [shape[d] for d in range(dims.value)],
                                                         buffer)
    except TritonError as e:
        error = InternalError(f"Unexpected error in creating response object: {e}")
        error.args += (result,)
        result.error = error
    return result


class _Answers:
    """What both iterators share: the final response ends them; an error raises when asked to."""

    _complete = False
    _raise = False

    def _hand_out(self, response: InferenceResponse) -> InferenceResponse:
        self._complete = response.final
        if response.error is not None and self._raise:
            raise response.error
        return response

    def cancel(self) -> None:
        raise UnsupportedError("cancelling a request is not supported by the mesh's in-process API")


class ResponseIterator(_Answers):
    """The responses of one request, as they come (blocking; the GIL is free while it waits)."""

    def __init__(self, pending: _Pending, raise_on_error: bool = False):
        self._pending, self._raise = pending, raise_on_error
        self._complete = False
        self._mine: Optional[queue.SimpleQueue] = None
        user = pending.request.response_queue
        if user is not None:
            self._mine = queue.SimpleQueue()
            threading.Thread(target=self._fetch_into, args=(user,), daemon=True).start()

    def _next(self) -> InferenceResponse:
        while True:
            _, response = self._pending.poll(100_000)  # wakes up to let signals through
            if response is not None:
                while response.final and not self._pending.released:  # the release follows at once
                    self._pending.poll(100_000)
                return response

    def _fetch_into(self, user: queue.SimpleQueue) -> None:
        while True:
            response = self._next()
            self._mine.put(response)
            user.put(response)
            if response.final:
                return

    def __iter__(self):
        return self

    def __next__(self) -> InferenceResponse:
        if self._complete:
            raise StopIteration
        return self._hand_out(self._mine.get() if self._mine is not None else self._next())


class AsyncResponseIterator(_Answers):
    """The responses of one request for asyncio: woken by the queue's eventfd, never blocking the loop."""

    def __init__(self, pending: _Pending, raise_on_error: bool = False, loop=None):
        self._pending, self._raise = pending, raise_on_error
        self._complete = False
        self._loop = loop or asyncio.get_running_loop()
        self._ready: asyncio.Queue = asyncio.Queue()
        self._user = pending.request.response_queue
        pending.defer_queue = True
        fd = c_int()
        L.call("MESH_ResponseQueueFd", pending.queue, byref(fd))
        self._fd = fd.value
        self._loop.add_reader(self._fd, self._drain)
        self._drain()

    def _drain(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            pass
        p = self._pending
        while not p.done():
            got, response = p.poll(0)
            if not got:
                break
            if response is not None:
                self._ready.put_nowait(response)
                if self._user is not None:
                    self._user.put_nowait(response)
        if p.done() and p.defer_queue:
            self._loop.remove_reader(self._fd)
            p.defer_queue = False
            p._free()

    def __aiter__(self):
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._complete:
            raise StopAsyncIteration
        return self._hand_out(await self._ready.get())
