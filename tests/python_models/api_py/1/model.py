import json
import math

import numpy as np
import triton_python_backend_utils as pb_utils


def expect_error(call, words):
    try:
        call()
    except pb_utils.TritonModelException as e:
        assert words in str(e), f"{words!r} not in {e}"
        return
    raise AssertionError(f"expected an error with {words!r}")


def hist_family_with_inf_bucket():
    family = pb_utils.MetricFamily("api_py_inf_buckets", "refused", pb_utils.MetricFamily.HISTOGRAM)
    return family.Metric(labels={}, buckets=[1.0, float("inf")])


def check_metrics():
    """The custom-metrics API as Triton's python_backend documents it."""
    counter = pb_utils.MetricFamily("api_py_checks", "checks run", pb_utils.MetricFamily.COUNTER)
    c = counter.Metric(labels={"kind": "counter"})
    assert c.value() == 0.0, c.value()
    c.increment(2.5)
    assert c.value() == 2.5
    same = counter.Metric(labels={"kind": "counter"})  # the same labels: the same metric
    assert same.value() == 2.5
    expect_error(lambda: c.increment(-1), "negative")
    expect_error(lambda: c.set(3), "gauge")
    expect_error(lambda: c.observe(3), "histogram")
    gauge = pb_utils.MetricFamily("api_py_level", "a level", pb_utils.MetricFamily.GAUGE)
    g = gauge.Metric()
    g.set(7)
    g.increment(-2)
    assert g.value() == 5.0, g.value()
    odd = gauge.Metric(labels={"case": "not a number"})
    odd.set(float("nan"))  # not JSON: it travels as text, and the instance lives on
    assert math.isnan(odd.value())
    odd.set(float("inf"))
    assert odd.value() == float("inf")
    expect_error(lambda: hist_family_with_inf_bucket(), "finite")
    expect_error(lambda: pb_utils.MetricFamily("api_py_level", "x", pb_utils.MetricFamily.COUNTER), "already exists")
    hist = pb_utils.MetricFamily("api_py_sizes", "sizes seen", pb_utils.MetricFamily.HISTOGRAM)
    expect_error(lambda: hist.Metric(labels={}), "buckets")
    expect_error(lambda: hist.Metric(labels={}, buckets=[2.5, 0.1]), "increasing")
    h = hist.Metric(labels={"model": "api_py"}, buckets=[1.0, 10.0])
    for v in (0.5, 5, 50):
        h.observe(v)
    expect_error(lambda: h.value(), "histogram")
    short = pb_utils.MetricFamily("api_py_short", "deleted soon", pb_utils.MetricFamily.GAUGE)
    orphan = short.Metric()
    del short
    expect_error(lambda: orphan.set(1), "has been deleted")
    return {"families": [counter, gauge, hist], "metrics": [c, same, g, h, odd]}


class TritonPythonModel:
    def initialize(self, args):
        self.kept = None
        family = pb_utils.MetricFamily("api_py_requests", "requests per mode", pb_utils.MetricFamily.COUNTER)
        self.requests = family
        self.per_mode = {}

    def counted(self, mode):
        if mode not in self.per_mode:
            self.per_mode[mode] = self.requests.Metric(labels={"mode": mode})
        self.per_mode[mode].increment(1)

    def answer(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0].decode()
        self.counted(mode.split(":")[0])
        if mode == "metrics":
            self.kept = check_metrics()  # kept, so /metrics shows them after this request
            return "ok"
        if mode == "info":
            return json.dumps({"timeout": request.timeout(), "flags": request.flags(),
                               "correlation_id": request.correlation_id(), "id": request.request_id(),
                               "parameters": json.loads(request.parameters())})
        if mode.startswith("code:"):
            code = getattr(pb_utils.TritonError, mode[5:])
            return pb_utils.TritonError(f"the model chose {mode[5:]}", code)
        if mode == "log":
            pb_utils.Logger.log_info("api_py says info")
            pb_utils.Logger.log_warn("api_py says warn")
            pb_utils.Logger.log_error("api_py says error")
            pb_utils.Logger.log_verbose("api_py says verbose")
            pb_utils.Logger.log("api_py logs at the WARNING level", pb_utils.Logger.WARNING)
            return "logged"
        if mode == "bls_missing":
            bls = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=["OUT"],
                                            inputs=[pb_utils.Tensor("X", np.zeros(1, np.float32))])
            response = bls.exec()
            assert response.has_error()
            return response.error().message()
        if mode == "raise":
            raise ValueError("api_py was told to raise")
        return pb_utils.TritonError(f"unknown mode {mode}", pb_utils.TritonError.INVALID_ARG)

    def execute(self, requests):
        responses = []
        for request in requests:
            out = self.answer(request)
            if isinstance(out, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(error=out))
            else:
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([out.encode()], dtype=np.object_))]))
        return responses
