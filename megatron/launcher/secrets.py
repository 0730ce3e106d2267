"""Secrets (API keys, tokens, passwords) reach the workers through files and environments only.

How DeepSpeed 0.19.8's runner moves environment variables to the workers, and why this
module exists:

* local launch (one host): `deepspeed.launcher.launch` inherits the whole environment;
  nothing is printed but the command line, so secrets can simply stay in the environment.
* pdsh: the remote shell starts empty; the runner copies variables whose names start with
  PYTHON, MLFLOW, MV2, UCX (and NCCL on CUDA) plus the lines of `.deepspeed_env` into the
  pdsh command as `export NAME=value;` and logs that command: a secret there is visible in
  the log and in `ps` on every node.
* slurm: `srun --export=ALL,NAME=value,...` with the same list on the command line.
* openmpi: `mpirun -x NAME=value` likewise, and nothing else crosses to remote nodes.
* mpich/impi/mvapich: `mpirun -genv NAME value`; the hydra launcher also forwards the
  whole environment by default.

So for multi-node launches, variables that look secret (`is_secret_name`) are taken out of
the runner's environment and written to a private file (mode 0600, shell syntax) in a
directory every node can read. Workers learn its path from `MEGATRON_SECRETS_FILE` (a path,
not a secret) and `load_forwarded_secrets()` puts the values back into `os.environ`; for
pdsh the runner also `source`s the file (`--venv_script`) on each node before starting.

Besides secrets, the variables of `CARRIED` reach remote ranks with the launching shell's
values: under pdsh through the same file (a remote shell would otherwise start with the
system's PATH, find other tools, e.g. another `ninja`, and rebuild DeepSpeed's compiled ops),
under OpenMPI as `-x NAME`; SLURM's `srun --export=ALL` and MPICH's hydra carry the whole
environment already.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from megatron.launcher.errors import LauncherError, WorkerEnvironmentError

SECRETS_FILE_VAR = "MEGATRON_SECRETS_FILE"
REDACTED = "***"
# A name is secret when one of its `_`-separated words is one of these (WANDB_API_KEY,
# HF_TOKEN, AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_PASSWORD, ...). SSH_AUTH_SOCK is not:
# pdsh and ssh need it in the runner's own environment.
# Non-secret variables a remote rank gets from the launching shell (module docstring).
CARRIED = (
    "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "OMP_NUM_THREADS",
    "TORCH_EXTENSIONS_DIR", "HF_HOME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
)  # fmt: skip
_SECRET_WORDS = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS"}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGNMENT_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=([^\s,;]*)")
_MIN_REDACT_LEN = 4  # shorter values would redact ordinary substrings of commands


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether an environment variable name holds a secret (or is listed in `extra`)."""
    if name in set(extra):
        return True
    return any(word in _SECRET_WORDS for word in name.upper().split("_"))


def secret_names(environ: Mapping[str, str], extra: Iterable[str] = ()) -> list[str]:
    """The names of the secret variables set in `environ`, sorted."""
    extra = set(extra)
    return sorted(name for name in environ if is_secret_name(name, extra))


def carried_names(environ: Mapping[str, str], extra: Iterable[str] = ()) -> list[str]:
    """The `CARRIED` variables set in `environ` (none of them secret)."""
    return [name for name in CARRIED if name in environ and not is_secret_name(name, extra)]


def redact_env(env: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """A copy of `env` with every secret value replaced by `***`, for printing."""
    extra = set(extra)
    return {k: (REDACTED if is_secret_name(k, extra) else v) for k, v in env.items()}


def redact_text(text: str, environ: Mapping[str, str], extra: Iterable[str] = ()) -> str:
    """`text` with the value of every secret variable of `environ` replaced by `***`."""
    values = {environ[name] for name in secret_names(environ, extra)}
    for value in sorted(values, key=len, reverse=True):  # longest first: no partial leftovers
        if len(value) >= _MIN_REDACT_LEN:
            text = text.replace(value, REDACTED)
    return text


def redact_argv(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, extra: Iterable[str] = ()
) -> list[str]:
    """`argv` safe to print.

    Replaces with `***` the values of the secret variables of `environ` (default
    `os.environ`) wherever they occur, the value of any `NAME=value` whose NAME is secret
    (`--export=ALL,HF_TOKEN=...`, `-x HF_TOKEN=...`, `export HF_TOKEN=...;`), and the value
    after `-genv/-env NAME` (MPICH/Intel MPI syntax).
    """
    environ = os.environ if environ is None else environ
    extra = set(extra)

    def hide(match: re.Match) -> str:
        name = match.group(1)
        return f"{name}={REDACTED}" if is_secret_name(name, extra) else match.group(0)

    out: list[str] = []
    for index, arg in enumerate(argv):
        after_genv = index >= 2 and argv[index - 2] in ("-genv", "-env")
        if after_genv and is_secret_name(argv[index - 1], extra):
            out.append(REDACTED)
            continue
        out.append(_ASSIGNMENT_RE.sub(hide, redact_text(arg, environ, extra)))
    return out


def check_deepspeed_env_files(
    environ: Mapping[str, str], cwd: str | None = None, extra: Iterable[str] = ()
) -> None:
    """Refuse secrets in the `.deepspeed_env` files the runner would read.

    The runner reads `$DS_ENV_FILE` (default `.deepspeed_env`) from the home directory and
    the working directory and puts every `NAME=value` line on the pdsh/srun/mpirun command
    line, which it also logs.
    """
    name = environ.get("DS_ENV_FILE", ".deepspeed_env")
    home = environ.get("HOME") or os.path.expanduser("~")
    for directory in (home, cwd or os.getcwd()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                key = line.split("=", 1)[0].strip()
                if "=" in line and is_secret_name(key, extra):
                    raise LauncherError(
                        f"{path}, line {number} sets {key}: DeepSpeed's runner would put its "
                        "value on the launch command line and in the log. Remove the line and "
                        "export the variable instead; deepy.py forwards secrets privately"
                    )


def write_secrets_file(values: Mapping[str, str], directory: str) -> str:
    """Write `values` as `export NAME='value'` lines to a new mode-0600 file in `directory`.

    The directory is created (mode 0700) if needed; the caller deletes the file when the
    run ends. Returns the file's absolute path.
    """
    for name in values:
        if not _NAME_RE.match(name):
            raise ValueError(f"secret name {name!r} is not a valid environment variable name")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="secrets-", suffix=".sh", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:  # mkstemp creates it 0600
        for name, value in sorted(values.items()):
            handle.write(f"export {name}={shlex.quote(value)}\n")
    return os.path.abspath(path)


def read_secrets_file(path: str) -> dict[str, str]:
    """Parse a file written by `write_secrets_file` back into {name: value}."""
    if not os.path.isfile(path):
        raise WorkerEnvironmentError(
            f"{SECRETS_FILE_VAR}={path!r} does not exist on this node; deepy.py writes it in a "
            "directory that every node must see (a shared filesystem, like the working "
            "directory)"
        )
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    # Parsed as a whole: a quoted value may span lines.
    bad = f"{SECRETS_FILE_VAR} file {path!r} is not a list of \"export NAME='value'\" lines"
    try:
        words = shlex.split(text)
    except ValueError:
        raise WorkerEnvironmentError(bad) from None
    if len(words) % 2 or any(w != "export" for w in words[::2]):
        raise WorkerEnvironmentError(bad)
    values = {}
    for assignment in words[1::2]:
        name, sep, value = assignment.partition("=")
        if not sep or not _NAME_RE.match(name):
            raise WorkerEnvironmentError(bad)
        values[name] = value
    return values


def load_forwarded_secrets(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Worker side: copy the secrets of `$MEGATRON_SECRETS_FILE` into `environ`.

    Variables already set are kept. Returns the names set; [] when the variable is unset
    (a local launch, where secrets are inherited directly).
    """
    environ = os.environ if environ is None else environ
    path = environ.get(SECRETS_FILE_VAR)
    if not path:
        return []
    loaded = []
    for name, value in read_secrets_file(path).items():
        if name not in environ:
            environ[name] = value
            loaded.append(name)
    return loaded
