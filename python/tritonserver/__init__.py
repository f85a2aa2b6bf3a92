"""tritonserver: Triton's in-process Python API (the r24.10 package's names and behaviour) over the mesh's libtritonserver.so.

A program written for Triton's `tritonserver` package runs unchanged: `Server(model_repository=...)`,
`start()`, `model(name).infer(inputs=...)`, `load`/`unload`, `metrics()`, one exception class per
error code, and outputs written straight into the application's memory by its own
`MemoryAllocator`. The package is pure Python over the C API (ctypes); the library finds Python
models' interpreter (this one, by default), and no callback runs in Python on the server's threads
(an allocator runs on the thread that reads the answer).
Differences from Triton's package are listed in the README ("Inside a Python program").
"""
from tritonserver._allocators import CPUAllocator as CPUAllocator
from tritonserver._allocators import MemoryAllocator as MemoryAllocator
from tritonserver._allocators import default_memory_allocators as default_memory_allocators
from tritonserver._library import AlreadyExistsError as AlreadyExistsError
from tritonserver._library import CancelledError as CancelledError
from tritonserver._library import InternalError as InternalError
from tritonserver._library import InvalidArgumentError as InvalidArgumentError
from tritonserver._library import NotFoundError as NotFoundError
from tritonserver._library import TritonError as TritonError
from tritonserver._library import UnavailableError as UnavailableError
from tritonserver._library import UnknownError as UnknownError
from tritonserver._library import UnsupportedError as UnsupportedError
from tritonserver._model import Model as Model
from tritonserver._request import AsyncResponseIterator as AsyncResponseIterator
from tritonserver._request import InferenceRequest as InferenceRequest
from tritonserver._request import InferenceResponse as InferenceResponse
from tritonserver._request import ResponseIterator as ResponseIterator
from tritonserver._server import Metric as Metric
from tritonserver._server import MetricFamily as MetricFamily
from tritonserver._server import ModelDictionary as ModelDictionary
from tritonserver._server import ModelLoadDeviceLimit as ModelLoadDeviceLimit
from tritonserver._server import Options as Options
from tritonserver._server import RateLimiterResource as RateLimiterResource
from tritonserver._server import Server as Server
from tritonserver._tensor import MemoryBuffer as MemoryBuffer
from tritonserver._tensor import Tensor as Tensor
from tritonserver._types import DataType as DataType
from tritonserver._types import DLDeviceType as DLDeviceType
from tritonserver._types import InstanceGroupKind as InstanceGroupKind
from tritonserver._types import LogFormat as LogFormat
from tritonserver._types import MemoryType as MemoryType
from tritonserver._types import MetricFormat as MetricFormat
from tritonserver._types import MetricKind as MetricKind
from tritonserver._types import ModelBatchFlag as ModelBatchFlag
from tritonserver._types import ModelControlMode as ModelControlMode
from tritonserver._types import ModelTxnPropertyFlag as ModelTxnPropertyFlag
from tritonserver._types import RateLimitMode as RateLimitMode

__version__ = "2.51.0+mesh"
__all__: list[str] = []
