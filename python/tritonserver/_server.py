"""Server and its Options: a mesh node started in this process through libtritonserver.so."""
from __future__ import annotations

import ctypes
import json
import sys
import time
from ctypes import byref, c_bool, c_size_t, c_void_p
from dataclasses import dataclass, field
from typing import Any, Optional

from tritonserver import _library as L
from tritonserver._library import InvalidArgumentError, UnavailableError, UnsupportedError
from tritonserver._model import Model
from tritonserver._types import InstanceGroupKind, LogFormat, MetricFormat, MetricKind, ModelControlMode, RateLimitMode


@dataclass
class RateLimiterResource:
    name: str
    count: int
    device: int


@dataclass
class ModelLoadDeviceLimit:
    kind: InstanceGroupKind
    device: int
    fraction: float


@dataclass
class Options:
    """Server options, with the Python API's defaults (checked when the server starts)."""

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True
    log_file: Optional[str] = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[ModelLoadDeviceLimit] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)

    def _create(self) -> int:
        """TRITONSERVER_ServerOptions from these options (the caller deletes them)."""
        if self.model_repository is None:
            raise InvalidArgumentError("Model repository must be specified.")
        made = c_void_p()
        L.call("TRITONSERVER_ServerOptionsNew", byref(made))
        o = made.value
        try:
            self._fill(o)
        except BaseException:
            L.lib().TRITONSERVER_ServerOptionsDelete(o)
            raise
        return o

    def _fill(self, o: int) -> None:
        c, t = L.call, L.text
        c("TRITONSERVER_ServerOptionsSetServerId", o, t(self.server_id))
        repositories = self.model_repository if isinstance(self.model_repository, list) else [self.model_repository]
        for path in repositories:
            c("TRITONSERVER_ServerOptionsSetModelRepositoryPath", o, t(path))
        c("TRITONSERVER_ServerOptionsSetModelControlMode", o, int(ModelControlMode(self.model_control_mode)))
        for name in self.startup_models:
            c("TRITONSERVER_ServerOptionsSetStartupModel", o, t(name))
        c("TRITONSERVER_ServerOptionsSetStrictModelConfig", o, _flag(self.strict_model_config))
        c("TRITONSERVER_ServerOptionsSetRateLimiterMode", o, int(RateLimitMode(self.rate_limiter_mode)))
        for r in self.rate_limiter_resources:
            c("TRITONSERVER_ServerOptionsAddRateLimiterResource", o, t(r.name), int(r.count), int(r.device))
        c("TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize", o, int(self.pinned_memory_pool_size))
        for device, size in self.cuda_memory_pool_sizes.items():
            c("TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize", o, int(device), int(size))
        for name, settings in self.cache_config.items():
            c("TRITONSERVER_ServerOptionsSetCacheConfig", o, t(name), json.dumps(settings).encode())
        c("TRITONSERVER_ServerOptionsSetCacheDirectory", o, t(self.cache_directory))
        c("TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability", o, float(self.min_supported_compute_capability))
        c("TRITONSERVER_ServerOptionsSetExitOnError", o, _flag(self.exit_on_error))
        c("TRITONSERVER_ServerOptionsSetStrictReadiness", o, _flag(self.strict_readiness))
        c("TRITONSERVER_ServerOptionsSetExitTimeout", o, int(self.exit_timeout))
        c("TRITONSERVER_ServerOptionsSetBufferManagerThreadCount", o, int(self.buffer_manager_thread_count))
        c("TRITONSERVER_ServerOptionsSetModelLoadThreadCount", o, int(self.model_load_thread_count))
        c("TRITONSERVER_ServerOptionsSetModelLoadRetryCount", o, int(self.model_load_retry_count))
        c("TRITONSERVER_ServerOptionsSetModelNamespacing", o, _flag(self.model_namespacing))
        c("TRITONSERVER_ServerOptionsSetEnablePeerAccess", o, _flag(self.enable_peer_access))
        if self.log_file:
            c("TRITONSERVER_ServerOptionsSetLogFile", o, t(self.log_file))
        # As Triton's package: a verbose log logs info, info logs warnings, warnings log errors.
        info = bool(self.log_info or self.log_verbose > 0)
        warn = bool(self.log_warn or info)
        c("TRITONSERVER_ServerOptionsSetLogInfo", o, info)
        c("TRITONSERVER_ServerOptionsSetLogWarn", o, warn)
        c("TRITONSERVER_ServerOptionsSetLogError", o, bool(self.log_error or warn))
        c("TRITONSERVER_ServerOptionsSetLogFormat", o, int(LogFormat(self.log_format)))
        c("TRITONSERVER_ServerOptionsSetLogVerbose", o, int(self.log_verbose))
        c("TRITONSERVER_ServerOptionsSetMetrics", o, _flag(self.metrics))
        c("TRITONSERVER_ServerOptionsSetCpuMetrics", o, _flag(self.cpu_metrics))
        c("TRITONSERVER_ServerOptionsSetGpuMetrics", o, _flag(self.gpu_metrics))
        c("TRITONSERVER_ServerOptionsSetMetricsInterval", o, int(self.metrics_interval))
        c("TRITONSERVER_ServerOptionsSetBackendDirectory", o, t(self.backend_directory))
        c("TRITONSERVER_ServerOptionsSetRepoAgentDirectory", o, t(self.repo_agent_directory))
        for limit in self.model_load_device_limits:
            c("TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit", o, int(limit.kind), int(limit.device),
              float(limit.fraction))
        for policy, settings in self.host_policies.items():
            for k, v in settings.items():
                c("TRITONSERVER_ServerOptionsSetHostPolicy", o, t(policy), t(k), t(v))
        for name, settings in self.metrics_configuration.items():
            for k, v in settings.items():
                c("TRITONSERVER_ServerOptionsSetMetricsConfig", o, t(name), t(k), t(v))
        backends = {k: dict(v) for k, v in self.backend_configuration.items()}
        # Python models run on this program's own interpreter unless the options name another.
        backends.setdefault("python", {}).setdefault("interpreter", sys.executable)
        for backend, settings in backends.items():
            for k, v in settings.items():
                c("TRITONSERVER_ServerOptionsSetBackendConfig", o, t(backend), t(k), t(str(v)))


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a bool, got {type(value).__name__}: {value!r}")
    return value


class ModelDictionary(dict):
    """Server.models(): (name, version) -> Model; a bare name gives the model's default version."""

    def __init__(self, server: "Server", models: list[Model]) -> None:
        super().__init__()
        for model in models:
            self[(model.name, model.version)] = model
        self._server = server
        self._model_names = [k[0] for k in self.keys()]

    def __getitem__(self, key):
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._model_names:
            return Model(self._server, name=key, version=-1)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    """A Triton server in this process: start() it, then reach its models."""

    _UNLOADED_STATES = [None, "UNAVAILABLE"]

    def __init__(self, options: Optional[Options] = None, **kwargs: Any) -> None:
        self.options: Options = options if options is not None else Options(**kwargs)
        self._handle: Optional[int] = None

    def _ptr(self) -> int:
        if not self._handle:
            raise InvalidArgumentError("Server not started")
        return self._handle

    def start(self, wait_until_ready: bool = False, polling_interval: float = 0.1,
              timeout: Optional[float] = None) -> "Server":
        if self._handle:
            raise InvalidArgumentError("Server already started")
        options = self.options._create()
        made = c_void_p()
        try:
            L.call("TRITONSERVER_ServerNew", byref(made), options)
        finally:
            L.lib().TRITONSERVER_ServerOptionsDelete(options)
        self._handle = made.value
        started = time.time()
        while wait_until_ready and not self.ready() and (timeout is None or time.time() - started < timeout):
            time.sleep(polling_interval)
        if wait_until_ready and not self.ready():
            raise UnavailableError("Timeout before ready")
        return self

    def stop(self) -> None:
        """Stops the server: models finish what they run and are unloaded."""
        handle, self._handle = self._ptr(), None
        L.call("TRITONSERVER_ServerDelete", handle)

    def __del__(self):
        if getattr(self, "_handle", None) and L._LIB is not None:
            handle, self._handle = self._handle, None
            raw = L._LIB.TRITONSERVER_ServerDelete(handle)
            if raw:
                L._LIB.TRITONSERVER_ErrorDelete(raw)

    def metadata(self) -> dict[str, Any]:
        message = c_void_p()
        L.call("TRITONSERVER_ServerMetadata", self._ptr(), byref(message))
        return json.loads(L.json_of(message))

    def live(self) -> bool:
        live = c_bool()
        L.call("TRITONSERVER_ServerIsLive", self._ptr(), byref(live))
        return live.value

    def ready(self) -> bool:
        ready = c_bool()
        L.call("TRITONSERVER_ServerIsReady", self._ptr(), byref(ready))
        return ready.value

    def model(self, model_name: str, model_version: int = -1) -> Model:
        self._ptr()
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        return ModelDictionary(self, self._model_index(exclude_not_ready))

    def _model_index(self, exclude_not_ready: bool = False) -> list[Model]:
        message = c_void_p()
        L.call("TRITONSERVER_ServerModelIndex", self._ptr(), 1 if exclude_not_ready else 0, byref(message))
        models = []
        for entry in json.loads(L.json_of(message)):
            version = int(entry["version"]) if entry.get("version") else -1
            models.append(Model(self, entry["name"], version, entry.get("state"), entry.get("reason")))
        return models

    def load(self, model_name: str, parameters: Optional[dict[str, str | int | bool | bytes]] = None) -> Model:
        """Loads (or reloads) a model; `parameters` may hold a "config" (JSON) and "file:<path>" contents."""
        lb, made = L.lib(), []
        try:
            for key, value in (parameters or {}).items():
                made.append(_load_parameter(key, value))
            array = (c_void_p * len(made))(*made)
            L.call("TRITONSERVER_ServerLoadModelWithParameters", self._ptr(), L.text(model_name), array, len(made))
        finally:
            for p in made:
                lb.TRITONSERVER_ParameterDelete(p)
        return self.model(model_name)

    def unload(self, model: str | Model, wait_until_unloaded: bool = False, polling_interval: float = 0.1,
               unload_dependents: bool = False) -> None:
        name = model.name if isinstance(model, Model) else model
        function = "TRITONSERVER_ServerUnloadModelAndDependents" if unload_dependents else "TRITONSERVER_ServerUnloadModel"
        L.call(function, self._ptr(), L.text(name))
        while wait_until_unloaded and any(
                m.state not in Server._UNLOADED_STATES for m in self._model_index() if m.name == name):
            time.sleep(polling_interval)

    def metrics(self, metric_format: MetricFormat = MetricFormat.PROMETHEUS) -> str:
        metrics, base, size = c_void_p(), c_void_p(), c_size_t()
        L.call("TRITONSERVER_ServerMetrics", self._ptr(), byref(metrics))
        try:
            L.call("TRITONSERVER_MetricsFormatted", metrics, int(metric_format), byref(base), byref(size))
            return ctypes.string_at(base, size.value).decode()
        finally:
            L.lib().TRITONSERVER_MetricsDelete(metrics)

    def poll_model_repository(self) -> None:
        L.call("TRITONSERVER_ServerPollModelRepository", self._ptr())

    def register_model_repository(self, repository_path: str, name_mapping: Optional[dict[str, str]] = None) -> None:
        L.call("TRITONSERVER_ServerRegisterModelRepository", self._ptr(), L.text(repository_path), None, 0)

    def unregister_model_repository(self, repository_path: str) -> None:
        L.call("TRITONSERVER_ServerUnregisterModelRepository", self._ptr(), L.text(repository_path))


def _load_parameter(key: str, value: Any) -> int:
    """A TRITONSERVER_Parameter for a load: a string (config) or bytes (a file:<path>'s contents)."""
    lb, name = L.lib(), L.text(key)
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
        p = lb.TRITONSERVER_ParameterBytesNew(name, data, len(data))
    elif isinstance(value, str):
        text = ctypes.create_string_buffer(value.encode())
        p = lb.TRITONSERVER_ParameterNew(name, 0, ctypes.cast(text, c_void_p))
    else:
        raise InvalidArgumentError(f"load parameter '{key}' must be a str or bytes, got {type(value).__name__}")
    if not p:
        raise InvalidArgumentError(f"load parameter '{key}' could not be made")
    return p


class MetricFamily:
    """Custom metric families are not served in process (Python models define theirs with pb_utils)."""

    def __init__(self, kind: MetricKind, name: str, description: str) -> None:
        raise UnsupportedError("custom metrics through the in-process API are not supported by the mesh; "
                               "Python models define theirs with pb_utils.MetricFamily")


class Metric:
    def __init__(self, family: MetricFamily, labels: Optional[dict[str, str]] = None) -> None:
        raise UnsupportedError("custom metrics through the in-process API are not supported by the mesh")
