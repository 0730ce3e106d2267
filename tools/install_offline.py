"""Install the trainer from a wheelhouse, with no network, into the Python that runs this
(`make install-offline WHEELHOUSE=DIR`), keeping the environment's own torch.

    python tools/install_offline.py --wheelhouse DIR [--no-deepspeed-ops]

Before anything is installed it checks that torch is importable and inside the range of
requirements/requirements.txt, and, for a CUDA build of torch, that nvcc's CUDA major version
is torch's (else the fused kernels would fail to build or to load). Then, all with
`pip --no-index --find-links DIR`: the runtime requirements (pip keeps the torch it finds), the
quick-start data packages, this package (`-e .`, building the csrc/ kernels for the visible
GPUs or TORCH_CUDA_ARCH_LIST), and DeepSpeed's ops this trainer needs, rebuilt from the
DeepSpeed source archive in DIR (`tools/build_deepspeed_ops.py`). `tools/wheelhouse.py` makes DIR.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron.errors import run_tool  # noqa: E402


class OfflineInstallError(ValueError):
    """The environment or the wheelhouse cannot give a working install (the message says why)."""


def torch_range() -> str:
    for line in (REPO / "requirements" / "requirements.txt").read_text().splitlines():
        if re.match(r"^torch\b", line.strip()):
            return line.strip()[len("torch") :]
    raise OfflineInstallError("requirements/requirements.txt names no torch range")


def check_torch() -> str:
    """The environment's torch version, refused (with the range) when outside what we support."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    try:
        import torch
    except ImportError as err:
        raise OfflineInstallError(
            f"{sys.executable} has no torch ({err}); install your PyTorch first, in the range "
            f"torch{torch_range()}"
        ) from None
    version = Version(torch.__version__.split("+")[0])
    if version not in SpecifierSet(torch_range()):
        raise OfflineInstallError(
            f"torch {torch.__version__} of {sys.executable} is outside the supported range "
            f"torch{torch_range()} (requirements/requirements.txt)"
        )
    return torch.__version__


def nvcc_major() -> str | None:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    nvcc = shutil.which("nvcc") or (home and str(Path(home) / "bin" / "nvcc"))
    if not nvcc or not Path(nvcc).exists():
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    return found.group(1) if found else None


def check_cuda() -> None:
    """nvcc and torch must agree on the CUDA major version when both are there."""
    import torch

    if torch.version.cuda is None:
        return
    nvcc = nvcc_major()
    if nvcc is None:
        print("note: no nvcc found: the fused csrc/ kernels will not be built (PyTorch fallback)")
        return
    if nvcc != torch.version.cuda.split(".")[0]:
        raise OfflineInstallError(
            f"nvcc is CUDA {nvcc} but torch {torch.__version__} was built for CUDA "
            f"{torch.version.cuda}: kernels built by this nvcc would not load. Put a CUDA "
            f"{torch.version.cuda.split('.')[0]} nvcc first on PATH (or set CUDA_HOME)"
        )


def pip(wheelhouse: Path, *args: str, env: dict | None = None) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse),
            *args]  # fmt: skip
    print("+", " ".join(argv), flush=True)
    if subprocess.run(argv, cwd=REPO, env=env).returncode != 0:
        raise OfflineInstallError(
            f"pip could not install {' '.join(args)} from {wheelhouse} (its output is above); "
            "a wheel may be missing: rebuild the folder with tools/wheelhouse.py for this Python"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--no-deepspeed-ops", action="store_true",
                        help="leave DeepSpeed's ops to be compiled when first needed")  # fmt: skip
    args = parser.parse_args(argv)
    house = args.wheelhouse.resolve()
    if not house.is_dir() or not any(house.glob("deepspeed-*")):
        raise OfflineInstallError(
            f"--wheelhouse {args.wheelhouse}: not a wheelhouse (no deepspeed-* in it); make one "
            "on a machine with network: python tools/wheelhouse.py --out DIR --python "
            f"{sys.version_info.major}.{sys.version_info.minor}"
        )
    version = check_torch()
    check_cuda()
    req = REPO / "requirements"
    pip(house, "-r", str(req / "requirements.txt"))
    pip(house, "--no-deps", "-r", str(req / "requirements-data.txt"))
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    pip(house, "--no-build-isolation", "--no-deps", "-e", str(REPO), env=env)
    if not args.no_deepspeed_ops:
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(house))
        build = [sys.executable, str(REPO / "tools" / "build_deepspeed_ops.py")]
        if subprocess.run(build, env=env).returncode != 0:
            raise OfflineInstallError("DeepSpeed's ops did not build (the output above says why)")
    import torch  # noqa: F401 - still the same one

    print(f"installed offline from {house}; torch {version} kept")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
