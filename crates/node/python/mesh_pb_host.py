"""What the modules of the mesh's triton_python_backend_utils share, below all of them: the stub's
host (the link to mesh-node) and pb_utils' exception. Written for the mesh from the public API."""
import sys


class TritonModelException(Exception):
    """pb_utils' exception, shown under pb_utils' name, as in Triton."""
    __module__ = "triton_python_backend_utils"


def host():
    """The stub's host object (mesh_stub.Host), which the stub registers before it loads a model."""
    found = sys.modules.get("mesh_stub_host")
    if found is None:
        raise TritonModelException("triton_python_backend_utils needs the mesh stub to run")
    return found
