"""execute() of a model that is not decoupled, for the mesh's stub (mesh_stub.py): each request
is answered once, by the response execute() returns for it, or, as Triton 2.51's Python backend
allows, through its response sender (one response, then the final flag) before, while or after
execute() returns. An execution's answers go back together: when execute() returns with requests
still unanswered, the stub waits for their senders (a model's thread, or a task on the stub's event
loop for an `async def execute`), within mesh-node's execute timeout. A mixin of the stub's Host.
Written for the mesh."""
import threading
import types


def rescheduled(requests):
    """Places of the requests the model asked to run again (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)."""
    return [i for i, r in enumerate(requests) if getattr(r, "_release_flags", 1) & 2]


class _Answers:
    """The responses one execution's requests sent through their senders, which are made only
    when a model asks for one (most never do)."""

    def __init__(self, count, probe):
        self.cv = threading.Condition()
        self.slots = [None] * count
        self.senders = [None] * count
        self.claimed = [False] * count
        self.wake = None  # set while an event loop waits: wakes it from another thread
        self.probe = probe  # whether request i's client went away

    def sender_for(self, i):
        import triton_python_backend_utils as pb_utils
        with self.cv:
            if self.senders[i] is None:
                s = pb_utils.ResponseSender(lambda r, f: self.deliver(i, r), lambda: self.probe(i), decoupled=False)
                if self.claimed[i]:  # execute() returned this request's response already
                    s._sent, s._closed = 1, True
                self.senders[i] = s
            return self.senders[i]

    def claim(self, i):
        """Takes request i's one response for the one execute() returned: False when its sender
        sent one already."""
        with self.cv:
            sender = self.senders[i]
            if sender is None:
                self.claimed[i] = True
                return True
        return sender.claim()

    def close(self):
        """No sender sends any more (senders made later start closed)."""
        with self.cv:
            self.claimed = [True] * len(self.claimed)
            made = [s for s in self.senders if s is not None]
        for s in made:  # outside the condition: a sender's lock is taken before it, in deliver
            s.close()

    def deliver(self, i, response):
        if response is None:  # the final flag after the response: nothing more to send
            return
        with self.cv:
            self.slots[i] = response
            self.cv.notify_all()
            wake = self.wake
        if wake is not None:
            wake()

    def missing(self, places):
        with self.cv:
            return [i for i in places if self.slots[i] is None]


class Plain:
    def execute_plain(self, header, blob):
        """One execute() of the frame's requests; with `each` (requests of a model without dynamic
        batching that queued while it was busy), one execute() per request, one after another, as
        Triton runs them: each answer but the last goes back at once in an `answer` frame, and the
        reply carries the last one (the others marked `streamed`) and the rescheduled places."""
        requests = self.requests_of(header, blob)
        seq = header.get("seq")
        if self.cancelled:  # clients of earlier executions that went away
            with self.allowance_cv:
                self.cancelled = {k for k in self.cancelled if k[0] == seq}
        blobs, blob_len = [], [0]
        if not header.get("each"):
            responses, again = self.run_plain(requests, 0, seq, blobs, blob_len)
        else:
            responses, again = [], []
            for i, request in enumerate(requests):
                last = i == len(requests) - 1
                own_blobs, own_len = (blobs, blob_len) if last else ([], [0])
                answered, later = self.run_plain([request], i, seq, own_blobs, own_len)
                if later:
                    again.append(i)
                elif not last:
                    self.send({"op": "answer", "index": i, "response": answered[0]}, own_blobs)
                    answered = [{"streamed": True}]
                responses += answered
        return {"op": "responses", "responses": responses, "reschedule": again}, blobs

    def run_plain(self, requests, base, seq, blobs, blob_len):
        """Runs execute(requests) (the frame's requests from place `base` on) and describes each
        request's answer into `blobs`; returns the descriptions and the places (in `requests`) of
        those the model rescheduled."""
        answers = _Answers(len(requests), lambda i: self.plain_cancelled(seq, base + i))
        for i, req in enumerate(requests):
            req._sender_for = lambda i=i: answers.sender_for(i)
            req._cancelled = lambda i=i: answers.probe(i)
        is_async = False
        try:
            result = self.model.execute(requests)
            if isinstance(result, types.CoroutineType):
                is_async = True
                result = self.loop.run_until_complete(result)
        except Exception as e:  # noqa: BLE001 - the model's error fails its requests, not the stub
            return self.plain_failed(requests, answers, self.failure(e), blobs, blob_len)
        if result is not None and (not isinstance(result, (list, tuple)) or len(result) != len(requests)):
            got = len(result) if isinstance(result, (list, tuple)) else type(result).__name__
            return self.plain_failed(
                requests, answers, f"execute() must return a list of {len(requests)} InferenceResponse, got {got}",
                blobs, blob_len)
        returned = list(result) if result is not None else [None] * len(requests)
        again = rescheduled(requests)
        # A returned response is the sender's one response: later sends are refused.
        claimed = [r is not None and i not in again and answers.claim(i) for i, r in enumerate(returned)]
        waiting = [i for i in range(len(requests)) if i not in again and not claimed[i]]
        self.await_senders(answers, waiting, is_async)
        responses = []
        for i, request in enumerate(requests):
            sent = answers.slots[i]
            if i in again:
                if returned[i] is None:
                    responses.append({"rescheduled": True})
                else:  # as Triton: a rescheduled request's place in the list holds None
                    again.remove(i)
                    responses.append({"error": "Expected a None object in the execute function return list for "
                                               "reschduled request"})
            elif claimed[i]:
                responses.append(self.response_desc(returned[i], blobs, blob_len, request._client_wanted))
            else:
                if returned[i] is not None:
                    self.log("warn", "a response was sent for this request already; the one execute() "
                                     "returned is ignored, as a model that is not decoupled answers once")
                responses.append(self.response_desc(sent, blobs, blob_len, request._client_wanted))
        return responses, again

    def plain_cancelled(self, seq, index):
        """`request.is_cancelled()`: mesh-node sends a `cancel` frame when the client goes away."""
        self.take_waiting_answers()
        return (seq, index) in self.cancelled

    def await_senders(self, answers, places, is_async):
        """Waits until every request in `places` has its response from its sender: on the event
        loop for an async model (its tasks run meanwhile), else on a condition the sender's thread
        signals (a BLS call from that thread reads its own answer, so it is never stuck behind this)."""
        if not answers.missing(places):
            return
        if is_async:
            import asyncio
            event = asyncio.Event()
            loop = self.loop
            answers.wake = lambda: loop.call_soon_threadsafe(event.set)

            async def settle():
                while answers.missing(places):
                    await event.wait()
                    event.clear()

            try:
                self.loop.run_until_complete(settle())
            finally:
                answers.wake = None
            return
        with answers.cv:
            answers.cv.wait_for(lambda: not answers.missing(places))

    def plain_failed(self, requests, answers, message, blobs, blob_len):
        """execute() raised or returned something else: requests answered through their senders
        keep those answers, the others get `message`; every sender closes."""
        answers.close()
        return [self.response_desc(s, blobs, blob_len, r._client_wanted) if s is not None else {"error": message}
                for s, r in zip(answers.slots, requests)], []
