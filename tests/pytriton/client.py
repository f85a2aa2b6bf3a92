"""PyTriton's own clients against a PyTriton script served on the mesh (run by tests/test_pytriton.py
in .venv-pytriton): ModelClient, FuturesModelClient and DecoupledModelClient. Prints one JSON line.
Usage: client.py HTTP_PORT GRPC_PORT"""
import json
import sys

import numpy as np
from pytriton.client import DecoupledModelClient, FuturesModelClient, ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError

http, grpc = (f"localhost:{p}" for p in sys.argv[1:3])
out = {}
with ModelClient(http, "double") as c:
    out["double_http"] = c.infer_batch(x=np.array([[1, 2], [3, 4]], np.float32))["y"].tolist()
with ModelClient(f"grpc://{grpc}", "upper") as c:
    out["upper_grpc"] = [v.decode() for v in c.infer_sample(text=np.array([b"mesh"]))["upper"].tolist()]
with FuturesModelClient(http, "double") as c:
    futures = [c.infer_batch(x=np.full((1, 3), i, np.float32)) for i in range(8)]
    out["double_futures"] = [f.result()["y"].tolist() for f in futures]
try:
    with ModelClient(http, "fails") as c:
        c.infer_batch(x=np.ones((1, 2), np.float32))
    out["fails"] = "no error"
except PyTritonClientInferenceServerError as e:
    out["fails"] = str(e)
with DecoupledModelClient(f"grpc://{grpc}", "count") as c:
    out["count"] = [r["i"].tolist() for r in c.infer_batch(n=np.array([[3]], np.int32))]
print(json.dumps(out))
