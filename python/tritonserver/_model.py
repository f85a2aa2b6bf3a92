"""Model: one model (and version) of a started server, its metadata, and inference on it."""
from __future__ import annotations

import json
from ctypes import byref, c_bool, c_uint32, c_void_p
from typing import Any, Optional

from tritonserver import _library as L
from tritonserver._library import InvalidArgumentError
from tritonserver._request import AsyncResponseIterator, InferenceRequest, ResponseIterator, _Pending
from tritonserver._types import ModelBatchFlag, ModelTxnPropertyFlag

# "Server" in annotations is tritonserver._server.Server, not imported here: _server imports this module.


class Model:
    """A model of a started server (`version` -1: the version its policy picks)."""

    def __init__(self, server: "Server", name: str, version: int = -1, state: Optional[str] = None,
                 reason: Optional[str] = None) -> None:
        if not getattr(server, "_handle", None):
            raise InvalidArgumentError("Server not started")
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def _server_ptr(self) -> int:
        return self._server._ptr()

    def create_request(self, **kwargs: Any) -> InferenceRequest:
        return InferenceRequest(model=self, **kwargs)

    def _request(self, inference_request: Optional[InferenceRequest], kwargs: dict) -> InferenceRequest:
        if inference_request is None:
            return InferenceRequest(model=self, **kwargs)
        if kwargs:
            raise InvalidArgumentError("give either an InferenceRequest or its fields, not both")
        return inference_request

    def infer(self, inference_request: Optional[InferenceRequest] = None, raise_on_error: bool = True,
              **kwargs: Any) -> ResponseIterator:
        """Sends a request; iterate over the result for its responses (a decoupled model may give several)."""
        request = self._request(inference_request, kwargs)
        return ResponseIterator(_Pending(request.model, request), raise_on_error)

    def async_infer(self, inference_request: Optional[InferenceRequest] = None, raise_on_error: bool = True,
                    **kwargs: Any) -> AsyncResponseIterator:
        """Sends a request from asyncio code; `async for` over the result for its responses."""
        request = self._request(inference_request, kwargs)
        return AsyncResponseIterator(_Pending(request.model, request), raise_on_error)

    def _message(self, function: str, *args) -> dict[str, Any]:
        message = c_void_p()
        L.call(function, self._server_ptr(), L.text(self.name), int(self.version), *args, byref(message))
        return json.loads(L.json_of(message))

    def metadata(self) -> dict[str, Any]:
        return self._message("TRITONSERVER_ServerModelMetadata")

    def config(self, config_version: int = 1) -> dict[str, Any]:
        return self._message("TRITONSERVER_ServerModelConfig", int(config_version))

    def statistics(self) -> dict[str, Any]:
        return self._message("TRITONSERVER_ServerModelStatistics")

    def ready(self) -> bool:
        ready = c_bool()
        L.call("TRITONSERVER_ServerModelIsReady", self._server_ptr(), L.text(self.name), int(self.version),
               byref(ready))
        return ready.value

    def batch_properties(self) -> ModelBatchFlag:
        flags = c_uint32()
        L.call("TRITONSERVER_ServerModelBatchProperties", self._server_ptr(), L.text(self.name), int(self.version),
               byref(flags), None)
        return ModelBatchFlag(flags.value)

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        flags = c_uint32()
        L.call("TRITONSERVER_ServerModelTransactionProperties", self._server_ptr(), L.text(self.name),
               int(self.version), byref(flags), None)
        return ModelTxnPropertyFlag(flags.value)

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})
