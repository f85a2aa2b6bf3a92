"""Serves a TensorFlow model (`platform: "tensorflow_savedmodel"` or `"tensorflow_graphdef"`) as a
Triton model inside the Python backend's stub, with the interpreter's own TensorFlow. mesh-node runs
this file in place of a model.py; the model's files are `host.artifact`."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ info lines are not the node's log

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

INSTALL = ("TensorFlow is not installed in the interpreter that runs this model ({exe}): install it "
           "there (pip install tensorflow-cpu), or give the node an interpreter that has it "
           "(--backend-config python,interpreter=PATH, or the model's EXECUTION_ENV_PATH parameter)")

# TensorFlow dtype name -> Triton config type
TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "string": "TYPE_STRING", "bfloat16": "TYPE_BF16",
}
SIGNATURE = "serving_default"
DEFAULT_MAX_BATCH_SIZE = 4


def _tf():
    try:
        import tensorflow as tf
    except ImportError as e:
        raise pb_utils.TritonModelException(f"{INSTALL.format(exe=sys.executable)} ({e})")
    return tf


def _artifact():
    return sys.modules["mesh_stub_host"].artifact


def _signature(tf, path):
    loaded = tf.saved_model.load(path)
    if SIGNATURE not in loaded.signatures:
        raise pb_utils.TritonModelException(
            f"the SavedModel at {path} has no '{SIGNATURE}' signature (it has {sorted(loaded.signatures)})")
    return loaded, loaded.signatures[SIGNATURE]


def _specs(signature):
    """The signature's inputs and outputs: name -> (Triton type, shape with None for a free dim)."""
    _, kwargs = signature.structured_input_signature
    outputs = signature.structured_outputs
    def spec(t):
        name = t.dtype.name
        if name not in TYPES:
            raise pb_utils.TritonModelException(f"TensorFlow type {name} has no Triton type")
        return TYPES[name], [None if d is None else int(d) for d in t.shape]
    return ({k: spec(v) for k, v in kwargs.items()}, {k: spec(v) for k, v in outputs.items()})


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        """Fills inputs, outputs and max_batch_size from a SavedModel's serving signature, where
        config.pbtxt leaves them out (a GraphDef names no inputs: its config must list them)."""
        cfg = config.as_dict()
        if cfg.get("platform") != "tensorflow_savedmodel":
            return config
        if cfg.get("input") and cfg.get("output"):
            return config  # nothing to fill: TensorFlow is not even imported
        tf = _tf()
        _, signature = _signature(tf, _artifact())
        inputs, outputs = _specs(signature)
        every = list(inputs.values()) + list(outputs.values())
        batched_model = all(shape and shape[0] is None for _, shape in every)
        if not cfg.get("max_batch_size") and batched_model and not cfg.get("input") and not cfg.get("output"):
            config.set_max_batch_size(DEFAULT_MAX_BATCH_SIZE)
        batched = int(config.as_dict().get("max_batch_size") or 0) > 0

        def tensor(name, kind, shape):
            shape = shape[1:] if batched else shape
            spec = {"name": name, "data_type": kind, "dims": [-1 if d is None else d for d in shape]}
            if not shape:  # one value per batch row: dims [1], reshaped to none for the model
                spec.update(dims=[1], reshape={"shape": []})
            return spec
        if not cfg.get("input"):
            for name, (kind, shape) in sorted(inputs.items()):
                config.add_input(tensor(name, kind, shape))
        if not cfg.get("output"):
            for name, (kind, shape) in sorted(outputs.items()):
                config.add_output(tensor(name, kind, shape))
        return config

    def initialize(self, args):
        import json
        self.config = json.loads(args["model_config"])
        path = args["model_artifact"]
        tf = self.tf = _tf()
        self.outputs = [o["name"] for o in self.config.get("output", [])]
        self.inputs = [i["name"] for i in self.config.get("input", [])]
        self.batched = int(self.config.get("max_batch_size") or 0) > 0
        # reshape: the model's shape of a tensor (batch dim excluded) when it differs from dims.
        self.reshape = {t["name"]: (t.get("reshape") or {}).get("shape")
                        for t in self.config.get("input", []) + self.config.get("output", []) if t.get("reshape")}
        self.dims = {t["name"]: t.get("dims", []) for t in self.config.get("output", [])}
        if self.config.get("platform") == "tensorflow_graphdef":
            self.session = self._graphdef(tf, path)
            self.signature = None
        else:
            self.loaded, self.signature = _signature(tf, path)
            inputs, outputs = _specs(self.signature)
            for name in self.inputs:
                if name not in inputs:
                    raise pb_utils.TritonModelException(
                        f"input '{name}' is not in the SavedModel's signature; it has {sorted(inputs)}")
            for name in self.outputs:
                if name not in outputs:
                    raise pb_utils.TritonModelException(
                        f"output '{name}' is not in the SavedModel's signature; it has {sorted(outputs)}")

    def _graphdef(self, tf, path):
        graph_def = tf.compat.v1.GraphDef()
        with open(path, "rb") as f:
            graph_def.ParseFromString(f.read())
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        self.graph = graph
        tensor = lambda n: n if ":" in n else f"{n}:0"
        try:
            self.feeds = {n: graph.get_tensor_by_name(tensor(n)) for n in self.inputs}
            self.fetches = {n: graph.get_tensor_by_name(tensor(n)) for n in self.outputs}
        except KeyError as e:
            raise pb_utils.TritonModelException(f"the GraphDef at {path} has no tensor {e}")
        return tf.compat.v1.Session(graph=graph)

    def _run(self, request):
        feed = {}
        for name in self.inputs:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is None:
                raise pb_utils.TritonModelException(f"input '{name}' is missing")
            value = t.as_numpy()
            if name in self.reshape:
                value = value.reshape(list(value.shape[:1] if self.batched else []) + list(self.reshape[name]))
            feed[name] = value
        wanted = request.requested_output_names() or self.outputs
        if self.signature is None:
            values = self.session.run({n: self.fetches[n] for n in wanted},
                                      feed_dict={self.feeds[n]: v for n, v in feed.items()})
        else:
            result = self.signature(**{n: self.tf.constant(v) for n, v in feed.items()})
            values = {n: result[n].numpy() for n in wanted}
        tensors = []
        for name in wanted:
            value = np.asarray(values[name])
            if name in self.reshape:  # back to the config's dims
                value = value.reshape(list(value.shape[:1] if self.batched else []) + list(self.dims[name]))
            if value.dtype.kind in ("S", "U", "O"):
                value = np.array([v if isinstance(v, bytes) else str(v).encode() for v in value.reshape(-1)],
                                 dtype=np.object_).reshape(value.shape)
            tensors.append(pb_utils.Tensor(name, value))
        return pb_utils.InferenceResponse(tensors)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._run(request))
            except pb_utils.TritonModelException as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
            except Exception as e:  # noqa: BLE001 - TensorFlow's errors fail their request
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"TensorFlow failed: {type(e).__name__}: {e}")))
        return responses

    def finalize(self):
        if getattr(self, "session", None) is not None:
            self.session.close()
