"""A PyTriton script as its users write it (Triton, bind, serve; @batch, @sample, a decoupled
generator, an error), served by tests/test_pytriton.py through `python -m mesh_pytriton`, and twice
in a cluster by tests/test_pytriton_cluster.py (add_sub is the cluster load's model).
Usage: serve.py HTTP_PORT GRPC_PORT METRICS_PORT"""
import sys

import numpy as np
from pytriton.decorators import batch, sample
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

http_port, grpc_port, metrics_port = (int(p) for p in sys.argv[1:4])


@batch
def double(x):
    return {"y": x * 2}


@batch
def add_sub(INPUT0, INPUT1):
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


@sample
def upper(text):
    return {"upper": np.char.upper(text.astype(np.bytes_))}


def fails(requests):
    raise ValueError("fails: the function refused its input")


@batch
def count(n):
    # A decoupled function yields several responses for one request.
    for i in range(int(n[0][0])):
        yield {"i": np.array([[i]], dtype=np.int32)}


config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
with Triton(config=config) as triton:
    triton.bind(model_name="double", infer_func=double,
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)))
    triton.bind(model_name="add_sub", infer_func=add_sub,
                inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(16,)),
                        Tensor(name="INPUT1", dtype=np.float32, shape=(16,))],
                outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(16,)),
                         Tensor(name="OUTPUT1", dtype=np.float32, shape=(16,))],
                config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=500)))
    triton.bind(model_name="upper", infer_func=upper,
                inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
                outputs=[Tensor(name="upper", dtype=bytes, shape=(1,))],
                config=ModelConfig(batching=False))
    triton.bind(model_name="fails", infer_func=fails,
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(max_batch_size=4))
    triton.bind(model_name="count", infer_func=count,
                inputs=[Tensor(name="n", dtype=np.int32, shape=(1,))],
                outputs=[Tensor(name="i", dtype=np.int32, shape=(1,))],
                config=ModelConfig(max_batch_size=1, decoupled=True))
    triton.serve()
