"""The mesh's Python stub: runs one instance of a Triton Python model (`TritonPythonModel` in model.py)
in its own process for mesh-node. Control messages travel over a Unix socket; tensor bytes travel
through a shared-memory file both sides map. Written for the mesh.

Frame: u32 header length, u32 blob length (little-endian), a JSON header, then the blob (tensor
bytes that did not fit in shared memory). The shared memory is split in two halves: mesh-node
writes the first (execute inputs, BLS results), this stub writes the second (outputs, BLS inputs);
each side starts its half afresh with every execute, which mesh-node sends one at a time."""
import collections
import importlib.machinery
import importlib.util
import itertools
import json
import mmap
import os
import queue
import socket
import struct
import sys
import threading
import time
import traceback
import types

import numpy as np

# The stub's own modules sit beside it (also when PYTHONSAFEPATH keeps the script's directory off sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mesh_stub_calls import ANSWERS, Calls, SpinPolicy  # noqa: E402
from mesh_stub_plain import Plain, rescheduled  # noqa: E402

ALIGN = 64
FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Answers of one decoupled request a model's thread may send ahead of its client; mesh-node sends a
# `credit` frame back for each answer its client takes (decoupled.rs).
STREAM_ALLOWANCE = 8
_NP = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
       "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
       "FP32": np.float32, "FP64": np.float64}


def serialize_bytes(array):
    """A BYTES tensor as Triton serializes it: each element a u32 little-endian length, then its bytes."""
    parts = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes(buf, shape):
    count = int(np.prod(shape)) if shape else 1
    out = np.empty(count, dtype=np.object_)
    view = memoryview(buf)
    pos = 0
    for i in range(count):
        (n,) = struct.unpack_from("<I", view, pos)
        pos += 4
        out[i] = bytes(view[pos:pos + n])
        pos += n
    return out.reshape(shape)


def _utils():
    """triton_python_backend_utils, imported once (it needs this module's host registered first)."""
    global _UTILS
    if _UTILS is None:
        import triton_python_backend_utils
        _UTILS = triton_python_backend_utils
    return _UTILS


_UTILS = None



class Host(Calls, Plain):
    """The stub's side of the link: frames, shared memory, BLS calls, and the model's lifecycle."""

    def __init__(self, sock, shm_path, shm_size, spin_us=0):
        self.sock = sock
        self.buf = bytearray()
        # recv(n) allocates n bytes per call (1 MiB costs ~20 µs); reading into one reused chunk does not
        self.chunk = bytearray(1 << 18)
        self.chunk_view = memoryview(self.chunk)
        self.write_lock = threading.Lock()
        fd = os.open(shm_path, os.O_RDWR)
        self.shm = mmap.mmap(fd, shm_size)
        self.shm_view = memoryview(self.shm)
        os.close(fd)
        self.half = shm_size // 2
        self.size = shm_size
        self.next_free = self.half
        self.alloc_lock = threading.Lock()
        self.calls = itertools.count(1)
        # BLS is refused in initialize() and finalize(), as Triton's stub refuses it.
        self.bls_open = False
        self.pending = {}
        self.pending_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self._loop = None  # made on first use: asyncio alone is about 10 MB of a stub's memory
        self.watching = False
        self.spin = SpinPolicy(spin_us / 1e6)
        self.model = None
        self.model_name = ""
        self.instance_name = ""
        self.output_names = []
        self.artifact = None
        self.inbox = None  # decoupled models: frames the reader thread took for the main thread
        self.cancelled = set()  # decoupled models: (seq, index) of requests whose client went away
        # decoupled models: answers each open request may still send before mesh-node returns credit
        # (its client took earlier ones); a model's own thread waits at zero, execute() never does.
        # An entry lives from the request's arrival to its final flag, or to mesh-node closing it
        # without one (execute() raised or returned responses, the request was rescheduled).
        self.allowance = {}
        self.allowance_cv = threading.Condition()
        self.decoupled = False
        self.concurrent = False
        self.later = collections.deque()  # frames to send with the next one (from __del__, which may run anywhere)

    @property
    def loop(self):
        """The stub's event loop, for `async def` models and `async_exec`. It is made, and asyncio
        imported, only when a model needs it."""
        if self._loop is None:
            import asyncio
            self._loop = asyncio.new_event_loop()
        return self._loop

    def start_reader(self):
        """Decoupled models answer from their own threads, which may also make BLS calls while the
        main thread waits for work; one reader thread then takes every frame and hands each to its
        waiter (a hand-off per frame, paid only by decoupled models)."""
        self.inbox = queue.SimpleQueue()

        def read():
            while True:
                header, blob = self.recv()
                op = header.get("op") if header is not None else None
                if op in ANSWERS:
                    self.complete(header, blob)
                    continue
                if op == "credit":
                    key = (header.get("seq"), header.get("index"))
                    with self.allowance_cv:
                        if key in self.allowance:
                            self.allowance[key] += 1
                            self.allowance_cv.notify_all()
                    continue
                self.inbox.put((header, blob))
                if header is None:
                    return

        threading.Thread(target=read, name="mesh-stub-reader", daemon=True).start()

    def next_frame(self):
        return self.inbox.get() if self.inbox is not None else self.recv()

    # ---- frames ----
    def send(self, header, blobs=()):
        head = json.dumps(header).encode()
        blob = b"".join(blobs)
        frame = struct.pack("<II", len(head), len(blob)) + head + blob
        with self.write_lock:
            # Frames left by __del__ go first, in order (taken under the lock, so two sending
            # threads cannot swap them).
            while self.later:
                extra = json.dumps(self.later.popleft()).encode()
                self.sock.sendall(struct.pack("<II", len(extra), 0) + extra)
            self.sock.sendall(frame)

    def buffered_frame(self):
        """A complete frame already read, if there is one."""
        if len(self.buf) < 8:
            return None
        hlen, blen = struct.unpack_from("<II", self.buf)
        end = 8 + hlen + blen
        if len(self.buf) < end:
            return None
        header = json.loads(self.buf[8:8 + hlen])
        blob = self.buf[8 + hlen:end]  # a bytearray of its own: inputs read from it are writable
        del self.buf[:end]
        return header, blob

    def recv(self, spin=None, until=None):
        """The next frame, read on the calling thread (no hand-off between threads: each costs a wake-up).
        Polls first for as long as the `spin` policy says: on a VM a quick answer then costs no wake-up.
        With `until` (whether a call's answer is in), returns a no-op at once once another thread put
        it there."""
        with self.read_lock:
            while True:
                if until is not None and until():
                    return {"op": "noop"}, b""
                frame = self.buffered_frame()
                if frame is not None:
                    return frame
                data = None
                # Only a wait for a new frame polls (and counts for the policy), not one for the
                # rest of a frame already arriving.
                poll = spin.next() if spin is not None and not self.buf else 0.0
                if poll > 0:
                    end = time.perf_counter() + poll
                    while True:
                        try:
                            data = self.sock.recv_into(self.chunk, 0, socket.MSG_DONTWAIT)
                            break
                        except BlockingIOError:
                            if time.perf_counter() > end:
                                break
                    spin.record(data is not None)
                if data is None:
                    data = self.sock.recv_into(self.chunk)
                if not data:
                    return None, b""
                self.buf += self.chunk_view[:data]

    def complete(self, header, blob):
        """A BLS answer arrived: hand it to its call (a decoupled call's answers one by one, each
        with its final flag); or a request's client went away (read by `is_cancelled()`)."""
        if header.get("op") == "cancel":
            with self.allowance_cv:
                self.cancelled.add((header.get("seq"), header.get("index")))
                self.allowance_cv.notify_all()
            return
        if header.get("op") in ("metric_reply", "model_control_reply"):
            with self.pending_lock:
                done = self.pending.pop(header["call_id"], None)
            if done is not None:
                done(header)
            return
        streamed = header.get("op") == "bls_stream"
        last = bool(header.get("last")) if streamed else True
        with self.pending_lock:
            if last:
                done = self.pending.pop(header["call_id"], None)
            else:
                done = self.pending.get(header["call_id"])
        if done is None:
            return
        try:
            result = None if header.get("empty") else self.bls_result(header, blob)
        except Exception as e:  # noqa: BLE001 - the caller gets the error; the reader lives on
            import triton_python_backend_utils as pb_utils
            result = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"cannot read the BLS answer: {e}"))
        if streamed:
            done(result, last)
        else:
            done(result)

    def read_available(self):
        """Appends what the socket holds now to the buffer, without blocking (the caller holds
        read_lock); False once mesh-node closed the link."""
        while True:
            try:
                data = self.sock.recv_into(self.chunk, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            if not data:
                return False
            self.buf += self.chunk_view[:data]

    def buffered_answers(self):
        """The complete answer frames at the head of the buffer (the caller holds read_lock); any
        other frame, and what follows it, stays for the main loop."""
        frames = []
        while len(self.buf) >= 8:
            hlen, blen = struct.unpack_from("<II", self.buf)
            if len(self.buf) < 8 + hlen + blen or json.loads(self.buf[8:8 + hlen]).get("op") not in ANSWERS:
                break
            frames.append(self.buffered_frame())
        return frames

    def take_waiting_answers(self):
        """Hands on the answer frames that arrived, without blocking, unless another thread is
        reading (it hands them on itself)."""
        if not self.read_lock.acquire(blocking=False):
            return
        try:
            self.read_available()
            frames = self.buffered_answers()
        finally:
            self.read_lock.release()
        for header, blob in frames:
            self.complete(header, blob)

    def on_readable(self):
        """asyncio reader callback while async BLS calls are pending: takes what arrived, without blocking."""
        with self.read_lock:
            if not self.read_available():
                self.loop.remove_reader(self.sock.fileno())
                self.watching = False
            frames = self.buffered_answers()
        for header, blob in frames:
            self.complete(header, blob)

    # ---- tensors ----
    def alloc(self, n):
        with self.alloc_lock:
            start = (self.next_free + ALIGN - 1) // ALIGN * ALIGN
            if start + n > self.size:
                return None
            self.next_free = start + n
            return start

    def encode(self, tensor, blobs, blob_len, inline=False):
        """Writes one pb_utils.Tensor to shared memory (or the frame blob if it does not fit, or
        when `inline`: answers sent from a decoupled model's threads, which may outlive the execute
        whose shared memory they would use). A tensor on a GPU is copied from there once, straight
        into its place (mesh_stub_cuda.to_host)."""
        gpu = tensor._gpu
        if gpu is not None:
            raw, shape, n = None, gpu.shape, gpu.nbytes
        else:
            array = tensor.as_numpy()
            if tensor.triton_dtype() == "BYTES":
                raw = np.frombuffer(serialize_bytes(np.asarray(array, dtype=np.object_)), dtype=np.uint8)
            else:
                raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            shape, n = array.shape, raw.nbytes
        desc = {"name": tensor.name(), "datatype": tensor.triton_dtype(), "shape": list(shape)}
        off = None if inline else self.alloc(n)
        if off is not None:
            dest = self.shm_view[off:off + n]
            desc["shm"] = [off, n]
        else:
            dest = bytearray(n)
            desc["inline"] = [blob_len[0], n]
            blobs.append(dest)
            blob_len[0] += n
        if raw is not None:
            memoryview(dest)[:] = raw
        elif n:
            import ctypes

            import mesh_stub_cuda
            mesh_stub_cuda.to_host(gpu, ctypes.addressof(ctypes.c_char.from_buffer(dest)))
        return desc

    def decode(self, desc, blob, copy):
        """One tensor, writable as in Triton (where an input's as_numpy() is a copy): a view of
        shared memory or of the frame (execute() inputs: mesh-node writes each execute's inputs
        afresh and never reads them back, so the model may change them in place at no cost), or a
        copy (BLS results, a decoupled model's inputs, which outlive the execute)."""
        dtype, shape = desc["datatype"], desc["shape"]
        if "shm" in desc:
            off, n = desc["shm"]
            source = self.shm
        else:
            off, n = desc["inline"]
            source = blob
        if dtype == "BYTES":
            array = deserialize_bytes(memoryview(source)[off:off + n], shape)
        else:
            np_type = _NP[dtype]
            array = np.frombuffer(source, dtype=np_type, count=n // np.dtype(np_type).itemsize, offset=off)
            array = array.reshape(shape)
            if copy or not array.flags.writeable:
                array = array.copy()
        return _utils().Tensor(desc["name"], array, _dtype=dtype)

    # ---- the model ----
    def load_module(self, path):
        """Imports model.py as the module `model` of its version directory's package (named by
        the directory, "1"), as Triton's stub does, so `from . import helper` finds a helper.py
        beside it; the model directory is on sys.path too."""
        directory = os.path.dirname(path)
        for p in (directory, os.path.dirname(directory)):
            if p not in sys.path:
                sys.path.insert(0, p)
        package = os.path.basename(directory)
        if package not in sys.modules:
            spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
            pkg = importlib.util.module_from_spec(spec)
            pkg.__path__ = [directory]
            sys.modules[package] = pkg
        name = f"{package}.{os.path.splitext(os.path.basename(path))[0]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        if not hasattr(module, "TritonPythonModel"):
            raise RuntimeError(f"{path} defines no class TritonPythonModel")
        return module.TritonPythonModel

    def auto_complete(self, header):
        import triton_python_backend_utils as pb_utils
        self.artifact = header.get("artifact")  # a TensorFlow model's files, for the bundled runner
        cls = self.load_module(header["model_file"])
        config = pb_utils.ModelConfig(header["config"])
        if hasattr(cls, "auto_complete_config"):
            config = cls.auto_complete_config(config) or config
        return {"op": "ok", "config": config.as_dict()}

    def initialize(self, header):
        self.artifact = header["args"].get("model_artifact")
        cls = self.load_module(header["model_file"])
        self.model = cls()
        self.model_name = header["args"].get("model_name", "")
        self.instance_name = header["args"].get("model_instance_name", self.model_name)
        # A request that names no outputs asks for all of them, and Triton's requested_output_names()
        # then lists every output of the config (PyTriton's proxy model produces only those).
        config = json.loads(header["args"].get("model_config") or "{}")
        self.output_names = [o["name"] for o in config.get("output", []) if "name" in o]
        if hasattr(self.model, "initialize"):
            result = self.model.initialize(header["args"])
            if isinstance(result, types.CoroutineType):
                self.loop.run_until_complete(result)
        self.bls_open = True
        self.decoupled = bool(header.get("decoupled"))
        if self.decoupled:
            # Requests outlive execute(): their inputs are copied out of shared memory.
            self.start_reader()
            # A decoupled `async def execute` runs on an event loop of its own thread, several
            # executions at once, as Triton runs it (mesh-node takes the next execute meanwhile).
            # A plain model's coroutine runs to completion, one execution at a time, as Triton's.
            import inspect
            if inspect.iscoroutinefunction(getattr(self.model, "execute", None)):
                self.concurrent = True
                threading.Thread(target=self.loop.run_forever, name="mesh-stub-loop", daemon=True).start()
        return {"op": "ok"}

    def requests_of(self, header, blob):
        import triton_python_backend_utils as pb_utils
        self.next_free = self.half
        requests = []
        for r in header["requests"]:
            req = pb_utils.InferenceRequest(
                model_name=self.model_name, requested_output_names=r["outputs"] or self.output_names,
                inputs=[self.decode(d, blob, copy=self.inbox is not None) for d in r["inputs"]], request_id=r["id"],
                correlation_id=r.get("correlation_id", 0), flags=r.get("flags", 0), parameters=r["parameters"],
                timeout=r.get("timeout", 0), trace=pb_utils.InferenceTrace(r.get("trace"), r.get("trace_context")))
            req._client_wanted = r["outputs"]  # what the client named: the outputs sent back (all if none)
            requests.append(req)
        return requests

    def response_desc(self, response, blobs, blob_len, wanted, inline=False):
        """One InferenceResponse as mesh-node reads it: its outputs (only those in `wanted`, the
        request's requested outputs, when it names any, so the rest is never copied), or its error."""
        import triton_python_backend_utils as pb_utils
        if not isinstance(response, pb_utils.InferenceResponse):
            return {"error": f"the model returned {type(response).__name__}, not InferenceResponse"}
        if response.has_error():
            return {"error": response.error().message(), "code": response.error().code()}
        try:
            tensors = [t for t in response.output_tensors() if not wanted or t.name() in wanted]
            return {"outputs": [self.encode(t, blobs, blob_len, inline) for t in tensors]}
        except Exception as e:  # noqa: BLE001
            return {"error": f"cannot send the outputs: {e}"}

    def stream(self, seq, index, wanted, response, flags):
        """One answer of a decoupled model's response sender. From the model's own threads it waits
        while the request's client holds STREAM_ALLOWANCE answers not taken yet (mesh-node returns
        credit as it takes them), so a client that stops reading stops that thread, not the instance;
        from execute() it is sent at once (the instance's thread serves every request)."""
        key = (seq, index)
        final = bool(flags & FINAL)
        with self.allowance_cv:
            # A request mesh-node closed has no entry: what it still sends is not waited for (and
            # dropped there), and makes no entry again.
            if threading.current_thread() is not threading.main_thread():
                while self.allowance.get(key, 1) <= 0 and key not in self.cancelled:
                    self.allowance_cv.wait()
            if final:
                self.allowance.pop(key, None)
                self.cancelled.discard(key)
            elif key in self.allowance:
                self.allowance[key] -= 1
        blobs, blob_len = [], [0]
        desc = None if response is None else self.response_desc(response, blobs, blob_len, wanted, inline=True)
        self.send({"op": "stream", "seq": seq, "index": index, "flags": flags, "response": desc}, blobs)

    def decoupled_requests(self, header, blob):
        """A decoupled execution's requests, each with its response sender and cancellation flag."""
        import triton_python_backend_utils as pb_utils
        seq = header["seq"]
        requests = self.requests_of(header, blob)
        senders = []
        with self.allowance_cv:
            self.allowance.update(((seq, i), STREAM_ALLOWANCE) for i in range(len(requests)))
        for i, req in enumerate(requests):
            cancelled = lambda key=(seq, i): key in self.cancelled
            wanted = req._client_wanted
            sender = pb_utils.ResponseSender(lambda r, f, i=i, w=wanted: self.stream(seq, i, w, r, f), cancelled)
            req._sender, req._cancelled = sender, cancelled
            senders.append(sender)
        return seq, requests, senders

    def execute_decoupled(self, header, blob):
        """execute() of a decoupled model: answers go through each request's response sender, now or
        later from the model's threads; mesh-node waits for every final flag."""
        seq, requests, senders = self.decoupled_requests(header, blob)
        try:
            result = self.model.execute(requests)
            if isinstance(result, types.CoroutineType):
                result = self.loop.run_until_complete(result)
        except Exception as e:  # noqa: BLE001 - fails the requests still open, not the stub
            for sender in senders:
                sender._closed = True
            self.forget(seq, range(len(requests)))
            return {"op": "executed", "seq": seq, "error": self.failure(e)}, []
        if result is not None:
            # As Triton: the requests still open fail (those that sent their final flag are done).
            for sender in senders:
                sender.close()
            self.forget(seq, range(len(requests)))
            message = (f"Failed to process the request(s) for model '{self.instance_name}', message: Python model "
                       f"'{self.instance_name}' is using the decoupled mode and the execute function must return None.")
            return {"op": "executed", "seq": seq, "error": message}, []
        again = rescheduled(requests)
        self.forget(seq, again)  # they come back in a later execution, under its number
        return {"op": "executed", "seq": seq, "reschedule": again}, []

    def forget(self, seq, indices):
        """Requests of execution `seq` that mesh-node closes without their final flag: their
        allowance and cancellation entries go, and a thread waiting to send on one goes on."""
        with self.allowance_cv:
            for i in indices:
                self.allowance.pop((seq, i), None)
                self.cancelled.discard((seq, i))
            self.allowance_cv.notify_all()

    def failure(self, e):
        """An exception of execute() as Triton reports it: the instance, the exception, and where
        in the model's code it was raised (innermost first; the stub's own frames left out); logged."""
        own = ("mesh_stub.py", "mesh_stub_plain.py", "mesh_stub_calls.py")
        frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.basename(f.filename) not in own]
        at = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
        message = (f"Failed to process the request(s) for model '{self.instance_name}', "
                   f"message: {type(e).__name__}: {e}\n\nAt:\n{at}")
        # Logged as Triton's stub logs it, also when no request is left to carry it (a decoupled
        # model that sent its final flags before raising).
        self.log("error", message.rstrip())
        return message

    def execute_async(self, header, blob):
        """execute() of a decoupled `async def execute` model: its coroutine is scheduled on the
        stub's event loop and this returns at once; the requests are answered by their response
        senders. If the coroutine raises (or is cancelled), the requests it left open fail with it."""
        import triton_python_backend_utils as pb_utils
        seq, requests, senders = self.decoupled_requests(header, blob)

        async def run():
            try:
                await self.model.execute(requests)
            except BaseException as e:  # noqa: BLE001 - fails this execution's open requests only
                error = pb_utils.InferenceResponse(error=pb_utils.TritonError(self.failure(e)))
                for i, sender in enumerate(senders):
                    with sender._lock:
                        if sender._closed:
                            continue
                        sender._closed = True
                    self.stream(seq, i, (), error, FINAL)
                if not isinstance(e, Exception):
                    raise

        import asyncio
        asyncio.run_coroutine_threadsafe(run(), self.loop)
        return {"op": "executed", "seq": seq}, []

    def execute(self, header, blob):
        if self.concurrent:
            return self.execute_async(header, blob)
        if header.get("decoupled"):
            return self.execute_decoupled(header, blob)
        return self.execute_plain(header, blob)

    def finalize(self):
        """The model's finalize(), then the stub's last answer: ok, or the error it raised. Either
        way the stub then exits, its output flushed."""
        self.bls_open = False
        reply = {"op": "ok"}
        try:
            if self.model is not None and hasattr(self.model, "finalize"):
                self.model.finalize()
        except Exception:  # noqa: BLE001 - reported to mesh-node with the traceback
            reply = {"op": "error", "message": traceback.format_exc()}
        flush_output()
        self.send(reply)

    def serve(self):
        while True:
            header, blob = self.next_frame()
            if header is None:
                return
            op = header.get("op")
            if op in ANSWERS:  # an answer to a call another thread waits for, or nobody does
                self.complete(header, blob)
                continue
            blobs = []
            try:
                if op == "execute":
                    reply, blobs = self.execute(header, blob)
                elif op == "auto_complete":
                    reply = self.auto_complete(header)
                elif op == "initialize":
                    reply = self.initialize(header)
                elif op == "finalize":
                    self.finalize()
                    return
                else:
                    reply = {"op": "error", "message": f"unknown op {op!r}"}
            except Exception:  # noqa: BLE001 - reported to mesh-node with the traceback
                reply = {"op": "error", "message": traceback.format_exc()}
            self.send(reply, blobs)


def flush_output():
    """What the model printed reaches the node before the stub exits (stdout is a pipe, so buffered)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def main():
    sock_path, shm_path, shm_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spin_us = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    sys.argv = [""]  # as Triton's stub leaves it: a model's argparse or unittest.main() sees no arguments
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    host = Host(sock, shm_path, shm_size, spin_us)
    sys.modules["mesh_stub_host"] = host
    host.serve()


if __name__ == "__main__":
    main()
