"""Calls a Python model makes that mesh-node answers, for the mesh's stub (mesh_stub.py): BLS
requests (sync, async and decoupled) and custom-metric operations, plus log lines, and whether a
wait for their answers polls first (SpinPolicy). A mixin of the stub's Host, which provides the
frames (send, recv, complete) and tensors (encode, decode). Written for the mesh."""
import os
import queue
import sys
import threading

# Frames mesh-node may send while an execute runs, which whoever reads them hands on: answers to a
# call of this stub (a BLS call or a custom-metric operation), and a request's client going away.
ANSWERS = ("bls_response", "bls_stream", "metric_reply", "model_control_reply", "cancel")


class SpinPolicy:
    """Whether a wait for mesh-node's answer polls before it sleeps (`spin-microseconds`), by the
    rule of mesh-node's own waits (backend/python/spin.rs): a poll that catches the answer adds one
    to a score, one that misses takes three off, and waits poll while the score is in its upper half
    (over time, while more than three polls in four catch; at most three misses in a row stop
    them). Below it, every 32nd wait polls as a probe, and a probe that catches starts polls again.
    A BLS call to a Python model takes longer than a poll, so its waits soon stop burning the CPU
    that model needs."""
    MAX, THRESHOLD, MISS, PROBE_EVERY = 12, 6, 3, 32

    def __init__(self, seconds):
        self.seconds = seconds
        self.score = self.MAX
        self.since_probe = 0
        self.probing = False
        # How the waits went (read by tests): over any run, missed <= 4 + 2 * caught + waits // 32.
        self.waits = self.caught = self.missed = 0

    def next(self):
        """Seconds the next wait polls before it sleeps; one that gets more reports to `record`."""
        self.waits += 1
        if self.seconds <= 0:
            return 0.0
        if self.score >= self.THRESHOLD:
            return self.seconds
        self.since_probe += 1
        if self.since_probe >= self.PROBE_EVERY:
            self.since_probe = 0
            self.probing = True
            return self.seconds
        return 0.0

    def record(self, caught):
        if caught:
            self.caught += 1
        else:
            self.missed += 1
        probe, self.probing = self.probing, False
        if caught and probe:
            self.score = self.THRESHOLD
        elif caught:
            self.score = min(self.score + 1, self.MAX)
        else:
            self.score = max(self.score - self.MISS, 0)


class ResponseIterator:
    """The responses of a decoupled BLS call, as Triton's ResponseIterator: `next()` waits for the
    next one (reading mesh-node's frames itself when the stub has no reader thread) and ends after
    the final flag. A bare final flag (the called model's `send(flags=FINAL)` with no response) is
    the iteration's last item, an InferenceResponse with no outputs, as in Triton. `cancel()`
    cancels the call: the called model sees `is_cancelled()` and the iterator ends with a
    CANCELLED error."""

    def __init__(self, host, call_id):
        self.host, self.call_id = host, call_id
        self.answers = queue.SimpleQueue()
        self.done = self.cancelled = False
        self.place = None  # puts each response where the request's preferred_memory asks

    def put(self, result, last):
        self.answers.put((result, last))

    def __iter__(self):
        return self

    def __next__(self):
        while not self.done:
            if self.host.inbox is None:  # no reader thread: read frames here until ours is in
                self.host.read_until(lambda: not self.answers.empty())
            result, last = self.answers.get()
            self.done = bool(last)
            if result is None and last:  # the bare final flag: an empty response, as Triton's
                import triton_python_backend_utils as pb_utils
                result = pb_utils.InferenceResponse([])
            if result is not None:
                return result if self.place is None else self.place(result)
        raise StopIteration

    def cancel(self):
        if not self.done and not self.cancelled:
            self.cancelled = True
            self.host.send({"op": "bls_cancel", "call_id": self.call_id})


class Calls:
    def bls_message(self, request):
        if not self.bls_open:
            import triton_python_backend_utils as pb_utils
            raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")
        blobs, blob_len = [], [0]
        call_id = next(self.calls)
        version = request.model_version
        header = {
            "op": "bls", "call_id": call_id, "model": request.model_name,
            "version": "" if version is None or int(version) < 0 else str(version),
            "id": request.request_id(), "outputs": list(request.requested_output_names()),
            "parameters": request.parameters(), "timeout": request.timeout(),
            "correlation_id": request.correlation_id(), "flags": request.flags(),
            "trace": request.trace()._id,
            # Inline when executions overlap (a decoupled or async model): the shared memory is
            # started afresh by the next execute, which this call may outlive.
            "inputs": [self.encode(t, blobs, blob_len, inline=self.inbox is not None) for t in request.inputs()],
        }
        return call_id, header, blobs

    def bls_result(self, header, blob):
        import triton_python_backend_utils as pb_utils
        if header.get("error") is not None:
            code = header.get("code", pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(header["error"], code))
        return pb_utils.InferenceResponse([self.decode(d, blob, copy=True) for d in header["outputs"]])

    def bls(self, request):
        call_id, header, blobs = self.bls_message(request)
        header["sync"] = True
        return self.wait_answer(call_id, header, blobs)

    def wait_answer(self, call_id, header, blobs=()):
        """Sends a call mesh-node answers and waits for the answer on this thread."""
        box = []
        if self.inbox is not None:  # the reader thread completes the call
            arrived = threading.Event()
            with self.pending_lock:
                self.pending[call_id] = lambda result: (box.append(result), arrived.set())
            self.send(header, blobs)
            arrived.wait()
            return box[0]
        with self.pending_lock:
            self.pending[call_id] = box.append
        self.send(header, blobs)
        self.read_until(lambda: box)
        return box[0]

    def read_until(self, ready):
        """Reads mesh-node's frames on this thread, handing each answer to its call, until `ready()`
        (whoever read the frame that made it so)."""
        while not ready():
            frame, blob = self.recv(self.spin, until=ready)
            if frame is None:
                raise RuntimeError("mesh-node closed the link")
            if frame.get("op") in ANSWERS:
                self.complete(frame, blob)

    async def await_call(self, call_id, header, blobs, on_answer, done):
        """Sends a BLS call and awaits `done`, which `on_answer` resolves; without a reading thread
        the event loop reads the socket meanwhile (several calls may be awaited at once)."""
        import asyncio
        loop = asyncio.get_running_loop()
        with self.pending_lock:
            self.pending[call_id] = on_answer
        watch = self.inbox is None
        if watch and not self.watching:
            loop.add_reader(self.sock.fileno(), self.on_readable)
            self.watching = True
        self.send(header, blobs)
        try:
            return await done
        finally:
            if watch:
                with self.pending_lock:
                    idle = not self.pending
                if idle and self.watching:
                    loop.remove_reader(self.sock.fileno())
                    self.watching = False

    async def bls_async(self, request):
        import asyncio
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call_id, header, blobs = self.bls_message(request)
        if self.inbox is None:
            on_answer = future.set_result
        else:  # the reading thread completes the call
            on_answer = lambda result: loop.call_soon_threadsafe(future.set_result, result)  # noqa: E731
        return await self.await_call(call_id, header, blobs, on_answer, future)

    def bls_stream(self, request):
        """A decoupled BLS call: its responses as they arrive (the last one after the final flag)."""
        call_id, header, blobs = self.bls_message(request)
        header["decoupled"] = True
        stream = ResponseIterator(self, call_id)
        with self.pending_lock:
            self.pending[call_id] = stream.put
        self.send(header, blobs)
        return stream

    async def bls_stream_async(self, request):
        """async_exec(decoupled=True): the same iterator as exec(decoupled=True), as Triton's
        (`next()` waits for the next response; `cancel()` cancels the call), once the first answer
        is in: until then the event loop runs other executes and tasks, as in Triton."""
        import asyncio
        loop = asyncio.get_running_loop()
        first = loop.create_future()
        call_id, header, blobs = self.bls_message(request)
        header["decoupled"] = True
        stream = ResponseIterator(self, call_id)

        def resolve():
            if not first.done():
                first.set_result(stream)

        def on_answer(result, last):
            stream.put(result, last)
            if self.inbox is None:
                resolve()
            else:  # the reading thread hands the answer on
                loop.call_soon_threadsafe(resolve)
        return await self.await_call(call_id, header, blobs, on_answer, first)

    def log(self, level, message, depth=2):
        """A line for the server's log, with the model file and line that wrote it (as Triton's
        `model.py:42]` prefix says)."""
        frame = {"op": "log", "level": level, "message": str(message)}
        try:
            caller = sys._getframe(depth)
            frame["at"] = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
        except ValueError:
            pass
        self.send(frame)

    def model_control(self, action, model_name, what, blobs=(), **fields):
        """`pb_utils.load_model`/`unload_model`/`is_model_ready`: a repository call mesh-node
        makes for the model (explicit model control applies); its value, or TritonModelException."""
        import triton_python_backend_utils as pb_utils
        if not self.bls_open:
            raise pb_utils.TritonModelException(f"{what} is only supported during the 'execute' function.")
        call_id = next(self.calls)
        header = {"op": "model_control", "call_id": call_id, "action": action, "model": model_name, **fields}
        answer = self.wait_answer(call_id, header, blobs)
        if answer.get("error") is not None:
            raise pb_utils.TritonModelException(answer["error"])
        return answer.get("value")

    def metric(self, frame):
        """A custom-metric operation mesh-node answers: its value, or TritonModelException."""
        call_id = next(self.calls)
        answer = self.wait_answer(call_id, {"op": "metric", "call_id": call_id, **frame})
        if answer.get("error") is not None:
            import triton_python_backend_utils as pb_utils
            raise pb_utils.TritonModelException(answer["error"])
        value = answer.get("value")
        return float(value) if isinstance(value, str) else value

    def metric_later(self, frame, flush=False):
        """A metric operation needing no answer: sent now with `flush`, else with the next frame."""
        if flush:
            self.send({"op": "metric", **frame})
        else:
            self.later.append({"op": "metric", **frame})
