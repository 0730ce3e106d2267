"""A stand-in for a local launch's process tree, signal handling as DeepSpeed 0.19.8's:

    python fake_run.py deepy FOLDER      run_local_runner over the tree below; prints how it ended
    python fake_run.py runner FOLDER     deepspeed.launcher.runner: no handler of its own
    python fake_run.py launch FOLDER deepspeed.launcher.launch
                                         launch.py: on SIGINT/SIGTERM, terminates the ranks,
                                         kills those not gone KILL_WAIT_S later (DeepSpeed: 30),
                                         exits 1
    python fake_run.py rank FOLDER N     a training rank: first unblocks SIGTERM as run_worker
                                         does; on SIGTERM "saves" (SAVE_S seconds), writes
                                         rankN.saved and exits 0 (a SIGTERM in its first
                                         instants, before its handler, kills it); its child, a
                                         data-loader worker, ignores SIGINT and SIGTERM

Each writes `{role}.{pid}` into FOLDER once its handlers are set; RUNNER_DELAY_S delays the
runner's start of launch.py (a stop that comes before the ranks exist).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
RANKS = 2


def _started(folder: Path, role: str) -> None:
    (folder / f"{role}.{os.getpid()}").write_text("")


def _child(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE), *args])


def deepy(folder: Path) -> None:
    from megatron.launcher.runner_process import run_local_runner

    def announce(state, signum):
        print(f"announced {state} {signal.Signals(signum).name}", flush=True)

    ended = run_local_runner([sys.executable, str(HERE), "runner", str(folder)], None, announce)
    print(f"ended status {ended.status} stop {ended.stop}", flush=True)


def runner(folder: Path) -> None:
    _started(folder, "runner")
    time.sleep(float(os.environ.get("RUNNER_DELAY_S", "0")))
    sys.exit(_child("launch", str(folder), "deepspeed.launcher.launch").wait())


def launch(folder: Path) -> None:
    ranks = [_child("rank", str(folder), str(n)) for n in range(RANKS)]

    def terminate(signum, frame):
        for rank in ranks:
            rank.terminate()
        deadline = time.monotonic() + float(os.environ.get("KILL_WAIT_S", "30"))
        while any(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        for rank in ranks:
            rank.kill()
        sys.exit(1)

    signal.signal(signal.SIGINT, terminate)
    signal.signal(signal.SIGTERM, terminate)
    _started(folder, "launch")
    while ranks:
        for rank in list(ranks):
            if rank.poll() == 0:
                ranks.remove(rank)
            elif rank.returncode is not None:
                terminate(signal.SIGTERM, None)
        time.sleep(0.05)


def rank(folder: Path, n: str) -> None:
    from megatron.launcher.stopping import take_sigterm

    take_sigterm()
    loader = None

    def save(signum, frame):
        (folder / f"rank{n}.sigterm").open("a").write("x")
        time.sleep(float(os.environ.get("SAVE_S", "0")))
        (folder / f"rank{n}.saved").write_text("")
        if loader:
            os.kill(loader, signal.SIGKILL)
            os.waitpid(loader, 0)
        sys.exit(0)

    signal.signal(signal.SIGTERM, save)
    loader = os.fork()
    if loader == 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _started(folder, "loader")
        time.sleep(600)
        os._exit(0)
    _started(folder, "rank")
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    roles = {"deepy": deepy, "runner": runner, "launch": launch, "rank": rank}
    roles[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:4] if sys.argv[1] == "rank" else ())
