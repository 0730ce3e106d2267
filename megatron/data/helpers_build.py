"""Build recipe for the compiled dataset index helpers (csrc/data_helpers.cpp).

For setup.py (paths are relative to the repository root, where setup.py lives)::

    from megatron.data.helpers_build import data_helpers_extension
    setup(..., ext_modules=[data_helpers_extension()], cmdclass={"build_ext": build_ext})
    # build_ext from pybind11.setup_helpers

For a checkout without installing: `python -m megatron.data.helpers_build` compiles the module
next to this file, where `megatron.data.index_helpers` imports it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

MODULE_NAME = "megatron.data._index_helpers"
SOURCE = "csrc/data_helpers.cpp"
REPO_ROOT = Path(__file__).resolve().parents[2]
# -ffp-contract=off: no fused multiply-add, so blending ties resolve as in the numpy twin.
COMPILE_ARGS = ["-O3", "-ffp-contract=off"]


def data_helpers_extension():
    """A `pybind11.setup_helpers.Pybind11Extension` for setup.py's `ext_modules`."""
    from pybind11.setup_helpers import Pybind11Extension

    return Pybind11Extension(
        MODULE_NAME, [SOURCE], cxx_std=17, extra_compile_args=list(COMPILE_ARGS)
    )


def compile_helpers(out_dir: str | Path, compiler: str = "g++") -> Path:
    """Compile the extension with `compiler` into `out_dir`; returns the shared library path."""
    import pybind11

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ("_index_helpers" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [
        compiler, *COMPILE_ARGS, "-shared", "-fPIC", "-std=c++17",
        f"-I{sysconfig.get_paths()['include']}", f"-I{pybind11.get_include()}",
        str(REPO_ROOT / SOURCE), "-o", str(target),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE} failed:\n{' '.join(cmd)}\n{result.stderr}")
    return target


def load_compiled(path: str | Path):
    """Import a compiled helper module from an explicit file (tests, benchmarks)."""
    spec = importlib.util.spec_from_file_location("_index_helpers", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    built = compile_helpers(Path(__file__).resolve().parent)
    print(f"built {built}", file=sys.stderr)
