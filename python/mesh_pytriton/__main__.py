"""`python -m mesh_pytriton SCRIPT [ARGS...]`: runs a PyTriton script unchanged, on mesh-node."""
import runpy
import sys

from mesh_pytriton import install


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m mesh_pytriton SCRIPT [ARGS...]")
    install()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


main()
