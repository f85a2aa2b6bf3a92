"""Requests and their answers: an InferenceRequest sent through the C API, and its responses read back from the library's response queue."""
from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import struct
import threading
from collections import deque
from ctypes import byref, c_int, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field

import numpy
from typing import Any, Optional

from tritonserver import _library as L
from tritonserver._allocators import MemoryAllocator, _Placement, placement_of
from tritonserver._library import ERRORS, InternalError, InvalidArgumentError, TritonError, UnknownError, UnsupportedError
from tritonserver._tensor import MemoryBuffer, Tensor, _address
from tritonserver._types import DATA_TYPE_OF, DataType, MemoryType

# "Model" in annotations is tritonserver._model.Model, not imported here: _model imports this module.
FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
EVENT_RESPONSE, EVENT_RELEASED = 1, 2
_PARAMETER_STRING, _PARAMETER_INT, _PARAMETER_BOOL, _PARAMETER_DOUBLE = 0, 1, 2, 3  # BYTES (4): the bytes

# The packed records of the library's one-call extensions (crates/capi/src/packed.rs).
_TENSOR = struct.Struct("<IIIIqQQ")
_RESPONSE = struct.Struct("<iIIII")
_PARAMETER = struct.Struct("<III")
_DIMS = [struct.Struct(f"<{n}q") for n in range(65)]  # a response's shapes (64 dims at most)
_DATA_TYPES = {int(t): t for t in DataType}
_MEMORY_TYPES = {int(t): t for t in MemoryType}
_NATIVE = {dtype: int(t) for dtype, t in DATA_TYPE_OF.items()}  # numpy dtypes sent as they are
_SLOTS = 8  # events one pop takes at most
_Slots = c_uint64 * (4 * _SLOTS)  # MESH_ResponseEvent: kind | flags << 32, handle, packed, packed_size


@dataclass
class InferenceRequest:
    """One request to a model: its inputs (Tensors, arrays or lists), parameters and options.
    `output_memory_allocator` (a MemoryAllocator) gives the memory of every output, asked for
    `output_memory_type` when that is set."""

    model: "Model"
    request_id: Optional[str] = None
    flags: int = 0
    correlation_id: Optional[int | str] = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Optional[Any] = None
    output_memory_allocator: Optional[MemoryAllocator] = None
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
            L.ignore(L.lib().TRITONSERVER_InferenceResponseDelete(self.handle))
            self.handle = 0


_ORPHANS: list["_Pending"] = []  # sent requests dropped before their release: freed once released
_ORPHANS_LOCK = threading.RLock()  # re-entrant: a __del__ run by the collector may come while it is held
_QUEUES: list = []  # idle (queue, event slots) pairs, reused by the next request
_QUEUES_KEPT = 64


def _parameters_of(h: int, parameters: dict) -> None:
    for key, value in parameters.items():
        name = L.text(key)
        if isinstance(value, bool):
            L.call("TRITONSERVER_InferenceRequestSetBoolParameter", h, name, value)
        elif isinstance(value, int):
            L.call("TRITONSERVER_InferenceRequestSetIntParameter", h, name, value)
        elif isinstance(value, float):
            L.call("TRITONSERVER_InferenceRequestSetDoubleParameter", h, name, value)
        elif isinstance(value, str):
            L.call("TRITONSERVER_InferenceRequestSetStringParameter", h, name, value.encode())
        else:
            raise InvalidArgumentError(f"parameter '{key}' has type {type(value).__name__}: parameters are str, int, "
                                       "bool or float")


def _record(dims: int, name_len: int) -> struct.Struct:
    """The packed tensor record for `dims` dims and a name of `name_len` bytes (compiled once)."""
    found = _RECORDS.get((dims, name_len))
    if found is None:  # (the library refuses more dims than it takes, naming the limit)
        found = struct.Struct(f"<IIIIqQQ{dims}q{name_len}s")
        if len(_RECORDS) < 1024:
            _RECORDS[(dims, name_len)] = found
    return found


_RECORDS: dict = {}


def _input_record(name: Any, value: Any, keep: list) -> bytes:
    """One input as the library's packed tensor record; what holds its memory goes to `keep`."""
    if type(name) is not str:
        raise TypeError(f"expected a str, got {type(name).__name__}: {name!r}")
    data_type = _NATIVE.get(value.dtype) if type(value) is numpy.ndarray else None
    if data_type is not None and value.flags.c_contiguous:
        keep.append(value)
        shape, memory, base, size = value.shape, (0, 0), _address(value), value.nbytes
    else:
        t = Tensor._from_object(value)
        keep.append(t)
        data_type, shape, memory = int(t.data_type), t.shape, (int(t.memory_type), int(t.memory_type_id))
        base, size = t.data_ptr, t.size
    encoded = name.encode()
    return _record(len(shape), len(encoded)).pack(len(encoded), data_type, len(shape), *memory, base, size, *shape,
                                                  encoded)


class _Pending:
    """A request in flight: its C request, its queue, and the input tensors it borrows until released."""

    __slots__ = ("model", "request", "handle", "queue", "slots", "tensors", "events", "final", "released",
                 "defer_queue", "reusable_queue", "placement")

    def __init__(self, model: "Model", request: InferenceRequest):
        self.model, self.request = model, request
        self.handle = self.queue = None
        self.tensors: list = []
        self.events: deque = deque()
        self.final = self.released = False
        self.defer_queue = False  # an asyncio reader still watches the queue's eventfd
        self.reusable_queue = True  # false once the queue has an eventfd, or saw a refused request
        if _ORPHANS:
            _collect_orphans()
        # Refused here, before anything is made, as r24.10 refuses a memory type without an allocator.
        self.placement: Optional[_Placement] = placement_of(request.output_memory_allocator,
                                                            request.output_memory_type)
        server, made, f = model._server_ptr(), c_void_p(), L.lib()
        L.check(f.TRITONSERVER_InferenceRequestNew(byref(made), server, L.text(model.name), int(model.version)))
        self.handle = made.value
        try:
            packed = self._fill(request)
            self.queue, self.slots = _idle_queue()
        except BaseException:
            self.released = True  # never sent: the request is still ours, and nothing borrows the inputs
            self._free()
            raise
        send = f.MESH_ServerInferPacked if self.placement is None else f.MESH_ServerInferPackedHeld
        refused = send(server, self.handle, packed, len(packed), self.queue)
        if refused:
            self.released = True  # the request is still ours, and nothing borrows the inputs
            self.reusable_queue = False
            self._free()
            L.check(refused)

    def _fill(self, r: InferenceRequest) -> bytes:
        """Sets the request's options; answers its inputs as packed records (sent with the request)."""
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
        if r.parameters:
            _parameters_of(h, r.parameters)
        return b"".join([_input_record(name, value, self.tensors) for name, value in r.inputs.items()])

    def _free(self) -> None:
        """The C request once released (inputs no longer borrowed), and the queue (unless deferred).
        A request the library took deletes itself when released; only a refused one is deleted here."""
        if self.released and self.handle:
            L.ignore(L.lib().TRITONSERVER_InferenceRequestDelete(self.handle))
        if self.released:
            self.handle = None
            self.tensors = []
        if self.queue and self.released and not self.defer_queue:
            if self.reusable_queue and not self.events and len(_QUEUES) < _QUEUES_KEPT:
                _QUEUES.append((self.queue, self.slots))  # empty: every event of the request was taken
            else:
                L.lib().MESH_ResponseQueueDelete(self.queue)
            self.queue = None

    def done(self) -> bool:
        return self.final and self.released

    def poll(self, timeout_us: int) -> tuple[bool, Optional[InferenceResponse]]:
        """Waits for the next event: (False, None) when the time ran out, (True, None) for the release,
        (True, response) for an answer."""
        if not self.events:
            count, slots = c_uint32(), self.slots
            L.check(L.lib().MESH_ResponseQueuePopMany(self.queue, timeout_us, slots, _SLOTS, byref(count)))
            for i in range(0, 4 * count.value, 4):
                self.events.append((slots[i], slots[i + 1], slots[i + 2], slots[i + 3]))
            if not self.events:
                return False, None
        kind_flags, handle, packed, size = self.events.popleft()
        kind, flags = kind_flags & 0xFFFFFFFF, kind_flags >> 32
        response = None
        if kind == EVENT_RELEASED:
            self.released = True
            self.handle = None  # the library deleted it
        else:
            self.final = self.final or bool(flags & FINAL)
            response = _response(self.model, self.request, handle, flags, packed, size, self.placement)
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


def _idle_queue() -> tuple[int, Any]:
    """A response queue and room for its events: an idle one, or a new one."""
    try:
        return _QUEUES.pop()
    except IndexError:
        made = c_void_p()
        L.check(L.lib().MESH_ResponseQueueNew(byref(made)))
        return made.value, _Slots()


def _collect_orphans() -> None:
    """Frees dropped requests that were released since (their queues are drained of what is left)."""
    with _ORPHANS_LOCK:
        waiting = list(_ORPHANS)
        _ORPHANS.clear()
    for p in waiting:
        # What is left in its queue goes with it (responses are deleted as they are dropped, their
        # outputs never placed: nobody reads them, so the application's allocator is not asked).
        p.placement = None
        while not p.released and p.queue and p.poll(0)[0]:
            pass
        if p.released:
            p.final = True
            p.events.clear()
            p._free()
        else:
            with _ORPHANS_LOCK:
                _ORPHANS.append(p)


def _parameter_value(kind: int, value: bytes) -> Any:
    if kind == _PARAMETER_STRING:
        return value.decode("utf-8", "replace")
    if kind == _PARAMETER_INT:
        return struct.unpack("<q", value)[0]
    if kind == _PARAMETER_BOOL:
        return value != b"\0"
    if kind == _PARAMETER_DOUBLE:
        return struct.unpack("<d", value)[0]
    return value


def _response(model: "Model", request: InferenceRequest, handle: Optional[int], flags: int, packed: Optional[int],
              size: int, placement: Optional[_Placement] = None) -> InferenceResponse:
    """An InferenceResponse over a C response and its packed record. Outputs are not copied: they
    keep the C response alive, or, with a `placement`, lie in the buffers its allocator gave (the
    library copies each there once; the C response goes as soon as that is done)."""
    result = InferenceResponse(model, request.request_id, {}, {}, None, None, bool(flags & FINAL))
    if not handle:
        return result
    owner = _Response(handle)
    try:
        if not packed:
            raise InternalError("the response has no record")
        raw = ctypes.string_at(packed, size)
        code, error_len, id_len, parameter_count, output_count = _RESPONSE.unpack_from(raw, 0)
        at = _RESPONSE.size
        if code >= 0:
            cls = ERRORS[code] if code < len(ERRORS) else UnknownError
            result.error = cls(raw[at:at + error_len].decode("utf-8", "replace"), result)
        at += error_len
        result.request_id = raw[at:at + id_len].decode("utf-8", "replace") or request.request_id
        at += id_len
        for _ in range(parameter_count):
            kind, name_len, value_len = _PARAMETER.unpack_from(raw, at)
            at += _PARAMETER.size
            name, at = raw[at:at + name_len].decode(), at + name_len
            result.parameters[name] = _parameter_value(kind, raw[at:at + value_len])
            at += value_len
        outputs, held = result.outputs, []
        for _ in range(output_count):
            name_len, data_type, dims, memory_type, memory_id, data, byte_size = _TENSOR.unpack_from(raw, at)
            at += _TENSOR.size
            shape = list(_DIMS[dims].unpack_from(raw, at))
            at += 8 * dims
            name, at = raw[at:at + name_len].decode(), at + name_len
            if placement is not None:
                held.append((name, _DATA_TYPES[data_type], shape, byte_size))
                continue
            buffer = MemoryBuffer(data, _MEMORY_TYPES[memory_type], memory_id, byte_size, owner)
            outputs[name] = Tensor(_DATA_TYPES[data_type], shape, buffer)
    except (TritonError, struct.error, KeyError, IndexError) as e:
        error = InternalError(f"Unexpected error in creating response object: {e}")
        error.args += (result,)
        result.error = error
        return result
    if held and result.error is None:
        try:
            result.outputs = placement.place(handle, held)
        except (TritonError, struct.error, OverflowError) as e:  # the allocator failed, or gave unusable memory
            error = e if isinstance(e, TritonError) else InternalError(f"the allocator's buffers: {e}")
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
        pending.reusable_queue = False
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
