"""The fault-scenario checker (tests/checker.py) finds each kind of violation it promises to, and
reports by phase; no server involved."""
from checker import History


def history_with(n: int) -> History:
    h = History(seed=42)
    for _ in range(n):
        h.end(h.begin("add_sub", deadline_s=5), ok=True, correct=True)
    return h


def test_a_clean_run_has_no_violations_and_full_success():
    h = history_with(10)
    assert h.violations() == []
    r = h.report()
    assert (r["requests"], r["answered"], r["success_rate"], r["errors"], r["seed"]) == (10, 10, 1.0, {}, 42)
    assert r["latency"]["before"]["requests"] == 10 and r["latency"]["during"]["requests"] == 0
    assert "seed 42: 10 requests, success 100.00%" in h.table()


def test_each_violation_is_found():
    h = history_with(2)
    twice = h.begin("add_sub")
    h.end(twice, ok=True, correct=True)
    h.end(twice, ok=False, kind="UNAVAILABLE")
    h.begin("add_sub")  # never answered
    wrong = h.begin("add_sub")
    h.end(wrong, ok=True, correct=False)
    late = h.begin("add_sub", deadline_s=1)
    late.sent -= 5
    h.end(late, ok=True, correct=True)
    once = h.begin("counter")
    h.end(once, ok=True, correct=True)
    v = h.violations(executions={once.id: 2}, non_idempotent={"counter"})
    assert any("got 2 terminal answers" in x for x in v), v
    assert any("got 0 terminal answers" in x for x in v), v
    assert any("wrong result" in x for x in v), v
    assert any("past its 1s deadline" in x for x in v), v
    assert any("ran 2 times on non-idempotent counter" in x for x in v), v
    assert len(v) == 5, v
    # An idempotent model may run twice (a retry of a stateless request).
    assert h.violations(executions={once.id: 2}) == [x for x in v if "non-idempotent" not in x]


def test_errors_are_counted_by_kind_and_latency_split_by_phase():
    h = History(seed=1)
    h.end(h.begin("m"), ok=True, correct=True)
    h.mark("fault")
    h.end(h.begin("m"), ok=False, kind="UNAVAILABLE")
    h.end(h.begin("m"), ok=True, correct=True)
    h.mark("detected")
    h.mark("healed")
    h.end(h.begin("m"), ok=True, correct=True)
    h.mark("recovered")
    r = h.report()
    assert r["errors"] == {"UNAVAILABLE": 1}
    assert [r["latency"][p]["requests"] for p in ("before", "during", "after")] == [1, 1, 1]
    assert r["detect_ms"] is not None and r["detect_ms"] >= 0 and r["recover_ms"] >= 0
    assert r["success_rate"] == 0.75


def test_the_seed_replays_the_fault_choices():
    a, b = History(seed=7), History(seed=7)
    assert [a.rng.randint(0, 1000) for _ in range(5)] == [b.rng.randint(0, 1000) for _ in range(5)]
