"""The API's enumerations, with the C header's values, and data types as numpy sees them."""
from enum import IntEnum

import numpy


class DataType(IntEnum):
    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(IntEnum):
    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class ModelControlMode(IntEnum):
    NONE = 0
    POLL = 1
    EXPLICIT = 2


class RateLimitMode(IntEnum):
    OFF = 0
    EXEC_COUNT = 1


class LogFormat(IntEnum):
    DEFAULT = 0
    ISO8601 = 1


class InstanceGroupKind(IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


class MetricFormat(IntEnum):
    PROMETHEUS = 0


class MetricKind(IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class ModelBatchFlag(IntEnum):
    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(IntEnum):
    ONE_TO_ONE = 1
    DECOUPLED = 2


class ModelIndexFlag(IntEnum):
    READY = 1


class DLDeviceType(IntEnum):
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14


# Fixed-size data types and their numpy types (BYTES is numpy's object/bytes/str).
NUMPY_OF = {
    DataType.BOOL: numpy.bool_,
    DataType.UINT8: numpy.uint8,
    DataType.UINT16: numpy.uint16,
    DataType.UINT32: numpy.uint32,
    DataType.UINT64: numpy.uint64,
    DataType.INT8: numpy.int8,
    DataType.INT16: numpy.int16,
    DataType.INT32: numpy.int32,
    DataType.INT64: numpy.int64,
    DataType.FP16: numpy.float16,
    DataType.FP32: numpy.float32,
    DataType.FP64: numpy.float64,
}
DATA_TYPE_OF = {numpy.dtype(v): k for k, v in NUMPY_OF.items()}


def data_type_of(dtype: numpy.dtype) -> DataType:
    """The data type of a numpy dtype (strings and bytes are BYTES)."""
    dtype = numpy.dtype(dtype)
    if dtype.kind in ("U", "S", "O"):
        return DataType.BYTES
    found = DATA_TYPE_OF.get(dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype)
    if found is None:
        from tritonserver._library import InvalidArgumentError

        raise InvalidArgumentError(f"numpy dtype {dtype} has no Triton data type")
    return found
