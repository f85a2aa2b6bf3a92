"""Custom metrics of Python models (`pb_utils.MetricFamily`, `pb_utils.Metric`), exported on the
server's /metrics beside Triton's; part of the mesh's triton_python_backend_utils, which re-exports
them. Written for the mesh from the public API."""
import math
import weakref

import mesh_pb_host as pb


class MetricFamily:
    """A custom metric family, exported on the server's /metrics beside Triton's. Families of the
    same name share their metrics (the first description stays); a family lives while any object
    for it does."""
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name, description, kind):
        if kind not in (MetricFamily.COUNTER, MetricFamily.GAUGE, MetricFamily.HISTOGRAM):
            raise pb.TritonModelException("kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM")
        self._name = str(name)
        self._kind = kind
        pb.host().metric({"action": "family", "family": self._name, "description": str(description), "kind": kind})
        self._live = True

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - Triton's name
        return Metric(self, labels, buckets)

    def __del__(self):
        if getattr(self, "_live", False):
            pb.host().metric_later({"action": "family_drop", "family": self._name})


class Metric:
    """One labelled metric of a family: increment/set for counters and gauges (a counter only goes
    up), observe for histograms, value() for counters and gauges."""

    def __init__(self, family, labels=None, buckets=None):
        labels = dict(labels or {})
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in labels.items()):
            raise pb.TritonModelException("metric labels must map strings to strings")
        self._family = weakref.ref(family)
        self._name = family._name
        self._kind = family._kind
        self._labels = labels
        frame = {"action": "metric", "family": self._name, "labels": labels}
        if self._kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise pb.TritonModelException("a histogram metric needs buckets")
            frame["buckets"] = [float(b) for b in buckets]
            if not all(math.isfinite(b) for b in frame["buckets"]):
                raise pb.TritonModelException("histogram buckets must be finite numbers (+Inf is implied)")
        pb.host().metric(frame)
        self._live = True

    def _op(self, action, value=None, wait=False):
        if self._family() is None:
            raise pb.TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted.")
        frame = {"action": action, "family": self._name, "labels": self._labels}
        if value is not None:
            value = float(value)
            # NaN and infinities are not JSON: they travel as text ('nan', 'inf', '-inf').
            frame["value"] = value if math.isfinite(value) else repr(value)
        if wait:
            return pb.host().metric(frame)
        pb.host().metric_later(frame, flush=True)
        return None

    def increment(self, value):
        if self._kind == MetricFamily.HISTOGRAM:
            raise pb.TritonModelException("increment() is not supported on a histogram metric")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise pb.TritonModelException("a counter metric cannot be incremented by a negative value")
        self._op("increment", value)

    def set(self, value):
        if self._kind != MetricFamily.GAUGE:
            raise pb.TritonModelException("set() is only supported on a gauge metric")
        self._op("set", value)

    def observe(self, value):
        if self._kind != MetricFamily.HISTOGRAM:
            raise pb.TritonModelException("observe() is only supported on a histogram metric")
        self._op("observe", value)

    def value(self):
        if self._kind == MetricFamily.HISTOGRAM:
            raise pb.TritonModelException("value() is not supported on a histogram metric")
        return self._op("value", wait=True)

    def __del__(self):
        if getattr(self, "_live", False):
            pb.host().metric_later({"action": "metric_drop", "family": self._name, "labels": self._labels})
