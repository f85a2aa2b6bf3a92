"""The checker of fault scenarios (issue 9): every client request and its outcome are recorded in a
History, and a run is checked the way Jepsen-style checkers do:
  - every request got exactly one terminal answer;
  - every success carries the right result (the models compute something checkable);
  - no success came after the request's deadline;
  - no request ran twice on a model marked non-idempotent (given the executions the model counted).
It reports the success rate, errors by kind, p50/p99 latency before, during and after the fault,
the time to detect the fault and to recover, and the random seed that chose the fault's moment, so
a failing run can be replayed. Reports go to a JSON file and a table.
"""
from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Op:
    id: int
    model: str
    sent: float
    deadline_s: float
    answers: int = 0
    done: float | None = None
    ok: bool | None = None
    correct: bool | None = None
    kind: str | None = None


@dataclass
class History:
    """Requests of one run and the moments of its fault."""

    seed: int = field(default_factory=lambda: random.randrange(2**32))
    ops: list[Op] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        self._lock = threading.Lock()
        self.rng = random.Random(self.seed)

    def begin(self, model: str, deadline_s: float = 60.0) -> Op:
        with self._lock:
            op = Op(len(self.ops), model, time.monotonic(), deadline_s)
            self.ops.append(op)
            return op

    def end(self, op: Op, ok: bool, correct: bool | None = None, kind: str | None = None) -> None:
        """Records one terminal answer (a second one for the same request is a violation)."""
        with self._lock:
            op.answers += 1
            if op.done is None:
                op.done, op.ok, op.correct, op.kind = time.monotonic(), ok, correct, None if ok else (kind or "error")

    def mark(self, what: str) -> None:
        """A moment of the run: "fault", "detected", "healed", "recovered"."""
        self.marks[what] = time.monotonic()

    # -- checks -------------------------------------------------------------
    def violations(self, executions: dict[int, int] | None = None, non_idempotent: set[str] = frozenset()) -> list[str]:
        out = []
        for op in self.ops:
            if op.answers != 1:
                out.append(f"request {op.id} ({op.model}) got {op.answers} terminal answers")
            if op.ok and op.correct is not True:
                out.append(f"request {op.id} ({op.model}) succeeded with a wrong result")
            if op.ok and op.done is not None and op.done - op.sent > op.deadline_s:
                out.append(f"request {op.id} ({op.model}) succeeded {op.done - op.sent:.2f}s after it was sent, "
                           f"past its {op.deadline_s}s deadline")
            runs = (executions or {}).get(op.id, 0)
            if op.model in non_idempotent and runs > 1:
                out.append(f"request {op.id} ran {runs} times on non-idempotent {op.model}")
        return out

    # -- report -------------------------------------------------------------
    def _phase(self, op: Op) -> str:
        fault, healed = self.marks.get("fault"), self.marks.get("healed")
        if fault is None or op.sent < fault:
            return "before"
        if healed is None or op.sent < healed:
            return "during"
        return "after"

    @staticmethod
    def _pct(values: list[float], p: float) -> float | None:
        if not values:
            return None
        v = sorted(values)
        return v[min(len(v) - 1, int(p / 100 * len(v)))]

    def report(self) -> dict:
        done = [op for op in self.ops if op.done is not None]
        ok = [op for op in done if op.ok]
        errors: dict[str, int] = {}
        for op in done:
            if not op.ok:
                errors[op.kind] = errors.get(op.kind, 0) + 1
        latency = {}
        for phase in ("before", "during", "after"):
            ms = [(op.done - op.sent) * 1000 for op in ok if self._phase(op) == phase]
            latency[phase] = {"requests": len(ms), "p50_ms": self._pct(ms, 50), "p99_ms": self._pct(ms, 99)}
        since = lambda a, b: (self.marks[b] - self.marks[a]) * 1000 if a in self.marks and b in self.marks else None  # noqa: E731
        return {
            "seed": self.seed,
            "requests": len(self.ops),
            "answered": len(done),
            "success_rate": len(ok) / len(self.ops) if self.ops else None,
            "errors": errors,
            "latency": latency,
            "detect_ms": since("fault", "detected"),
            "recover_ms": since("healed", "recovered"),
        }

    def table(self) -> str:
        r = self.report()
        f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines = [f"seed {r['seed']}: {r['requests']} requests, success {100 * (r['success_rate'] or 0):.2f}%, "
                 f"errors {r['errors'] or 'none'}, detect {f(r['detect_ms'])} ms, recover {f(r['recover_ms'])} ms",
                 "phase   requests  p50 ms  p99 ms"]
        for phase, v in r["latency"].items():
            lines.append(f"{phase:<7} {v['requests']:>8}  {f(v['p50_ms']):>6}  {f(v['p99_ms']):>6}")
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"report": self.report(), "marks": self.marks,
                                    "ops": [asdict(op) for op in self.ops]}, indent=1))
