"""Builds small TensorFlow models for the tests, with the TensorFlow of the interpreter that runs it
(scripts/setup-tensorflow.sh makes .venv-tf): usage `.venv-tf/bin/python scripts/gen_tf_models.py --out DIR`.

DIR/tf_add_sub/1/model.savedmodel      add_sub as a SavedModel, no config.pbtxt (auto-completed)
DIR/tf_add_sub_cfg/                    the same SavedModel with a Quick-Deploy-style config.pbtxt
DIR/tf_graphdef/                       add_sub as a frozen GraphDef (model.graphdef) with its config
DIR/tf_text/1/model.savedmodel         BYTES in, the length of each string out, no config.pbtxt
"""
import argparse
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

ADD_SUB_CONFIG = """name: "{name}"
platform: "{platform}"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
"""


class AddSub(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32), tf.TensorSpec([None, 16], tf.float32)])
    def serve(self, INPUT0, INPUT1):  # noqa: N803 - the signature's input names are Triton's
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


class Text(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, TEXT):  # noqa: N803
        return {"LENGTH": tf.strings.length(TEXT)}


def saved(module, path):
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def graphdef(path):
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, 16], name="INPUT0")
        b = tf.compat.v1.placeholder(tf.float32, [None, 16], name="INPUT1")
        tf.identity(a + b, name="OUTPUT0")
        tf.identity(a - b, name="OUTPUT1")
    with open(path, "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    out = p.parse_args().out
    shutil.rmtree(out, ignore_errors=True)
    for name in ("tf_add_sub", "tf_add_sub_cfg", "tf_graphdef", "tf_text"):
        os.makedirs(os.path.join(out, name, "1"))
    saved(AddSub(), os.path.join(out, "tf_add_sub", "1", "model.savedmodel"))
    shutil.copytree(os.path.join(out, "tf_add_sub", "1", "model.savedmodel"),
                    os.path.join(out, "tf_add_sub_cfg", "1", "model.savedmodel"))
    with open(os.path.join(out, "tf_add_sub_cfg", "config.pbtxt"), "w") as f:
        f.write(ADD_SUB_CONFIG.format(name="tf_add_sub_cfg", platform="tensorflow_savedmodel"))
    graphdef(os.path.join(out, "tf_graphdef", "1", "model.graphdef"))
    with open(os.path.join(out, "tf_graphdef", "config.pbtxt"), "w") as f:
        f.write(ADD_SUB_CONFIG.format(name="tf_graphdef", platform="tensorflow_graphdef"))
    saved(Text(), os.path.join(out, "tf_text", "1", "model.savedmodel"))
    print(f"TensorFlow {tf.__version__} models in {out}")


if __name__ == "__main__":
    main()
