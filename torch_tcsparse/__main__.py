"""``python -m torch_tcsparse``: find or build the CUDA kernels now (ahead of a timed run, or in a
Docker image) and say which module serves, or in one line why none does."""
import sys

from . import _ext


def main() -> int:
    try:
        module = _ext.load(verbose=True)
    except RuntimeError as error:
        print(f"torch_tcsparse: no CUDA kernels: {error}")
        return 1
    print(f"{'prebuilt' if _ext.is_prebuilt(module) else 'built'}: {module.__name__} ({module.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
