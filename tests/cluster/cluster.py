"""A small real cluster on this machine: nodes as network namespaces, with SLURM, munge and sshd.

    with Cluster(nodes=2) as cluster:
        cluster.run("node1", ["sinfo"])                  # a command on node1, as a user there
        job = cluster.popen("node1", ["sbatch", ...])    # in the background
        cluster.kill_node("node2")                       # SIGKILL every process of node2

Each node is a network namespace with one address in a private /24, joined to the others by a
bridge that lives in a namespace of its own (the machine's own network is not touched). Every
process of a node runs under `nsenter --net` plus `unshare --uts --mount`, which gives it the
node's hostname and a bind-mounted `/etc/hosts` (the nodes by name) and `/etc/ssh/ssh_config`
(the nodes' host keys trusted, this cluster's key, batch mode), as a cluster's login and compute
nodes have. The file system is shared, as a cluster's is.

Daemons, each started in the foreground under `setsid` and stopped by PID: one munged (its socket
is a file, which every namespace sees), slurmctld on node1, slurmd and sshd on every node. SLURM
22.05's slurmd must be started with `nsenter` (`ip netns exec` mounts a fresh /sys, where it finds
no cgroup file system). `stop()` kills every process of every node, then the daemons, deletes the
namespaces and the work folder, also when start-up failed half way.

Traffic goes only to the namespaces made here. Needs root (namespaces, bind mounts) and the
Debian packages in `PACKAGES`, which `ensure_packages()` installs with apt when missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = {  # command -> Debian package
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sbatch": "slurm-client",
    "munged": "munge",
    "sshd": "openssh-server",
    "pdsh": "pdsh",
    "mpirun": "openmpi-bin",
}
SBIN = ("/usr/sbin", "/sbin")


def which(command: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN)
    return shutil.which(command, path=path)


def missing_packages() -> list[str]:
    return sorted({pkg for cmd, pkg in PACKAGES.items() if which(cmd) is None})


def ensure_packages(timeout: float = 600) -> None:
    """Install the packages this cluster needs (apt, about 10-60 s), once."""
    missing = missing_packages()
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # the package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=timeout)
        done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install {' '.join(missing)} failed:\n{done.stderr[-2000:]}")


def cannot_make_namespaces() -> str | None:
    """Why this machine cannot host the cluster (None when it can)."""
    if os.geteuid() != 0:
        return "needs root: network namespaces, bind mounts and daemons"
    probe = f"mnprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _free_subnet() -> str:
    """A 10.X.Y.0/24 no interface of this machine uses (the first three octets)."""
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    for y in range(200, 250):
        prefix = f"10.{os.getpid() % 200 + 10}.{y}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test cluster")


class Cluster:
    """`nodes` nodes named node1.. with SLURM and sshd (module docstring)."""

    def __init__(self, nodes: int = 2, *, kill_wait: int = 5):
        self.names = [f"node{i + 1}" for i in range(nodes)]
        tag = f"mn{os.getpid() % 100000}"
        self.netns = {name: f"{tag}{name}" for name in self.names}
        self.hub = f"{tag}hub"
        prefix = _free_subnet()
        self.addr = {name: f"{prefix}.{10 + i}" for i, name in enumerate(self.names)}
        self.dir = Path(tempfile.mkdtemp(prefix="mncluster-"))
        self.kill_wait = kill_wait
        self.daemons: list[subprocess.Popen] = []
        self.node_daemons: dict[str, list[tuple[list[str], str]]] = {n: [] for n in self.names}
        self.made_privsep: Path | None = None
        self.env = {
            **os.environ,
            "SLURM_CONF": str(self.dir / "slurm.conf"),
            "PATH": os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN),
        }

    # -- commands on a node ----------------------------------------------------------------
    def node_argv(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run on `node`: its network namespace, hostname, /etc/hosts and ssh config."""
        enter = (
            'hostname "$0" && mount --bind "$1" /etc/hosts && '
            'mount --bind "$2" /etc/ssh/ssh_config && shift 3 && exec "$@"'
        )
        return [
            "nsenter", f"--net=/run/netns/{self.netns[node]}", "--",
            "unshare", "--uts", "--mount", "--propagation", "private", "--",
            "sh", "-c", enter, node, str(self.dir / "hosts"), str(self.dir / "ssh_config"), "--",
            *argv,
        ]  # fmt: skip

    def run(self, node: str, argv: list[str], *, timeout: float = 60, env=None, **kwargs):
        """Run `argv` on `node` to its end; returns the CompletedProcess (text output)."""
        return subprocess.run(
            self.node_argv(node, argv),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )

    def popen(self, node: str, argv: list[str], *, env=None, **kwargs) -> subprocess.Popen:
        """Start `argv` on `node` in a session of its own (so it can be signalled as a group)."""
        return subprocess.Popen(
            self.node_argv(node, argv),
            env={**self.env, **(env or {})},
            start_new_session=True,
            **kwargs,
        )

    def pids(self, node: str) -> list[int]:
        """Every process in `node`'s network namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.netns[node]], capture_output=True, text=True
        ).stdout
        return [int(p) for p in out.split()]

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL every process of `node` (its daemons and every rank on it), as a node that
        loses power; returns the PIDs killed."""
        killed = []
        for _ in range(20):  # children forked while we kill: go round until none is left
            pids = self.pids(node)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        return killed

    # -- set-up ------------------------------------------------------------------------------
    def start(self) -> Cluster:
        try:
            self._network()
            self._files()
            self._munge()
            self._slurm()
            self._sshd()
            self._wait_until_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _ip(self, *args: str, ns: str | None = None) -> None:
        argv = ["ip", *(["-n", ns] if ns else []), *args]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")

    def _network(self) -> None:
        self._ip("netns", "add", self.hub)
        self._ip("link", "add", "br0", "type", "bridge", ns=self.hub)
        self._ip("link", "set", "br0", "up", ns=self.hub)
        for i, node in enumerate(self.names):
            ns, outer = self.netns[node], f"v{i}"
            self._ip("netns", "add", ns)
            self._ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", outer, ns=self.hub)
            self._ip("link", "set", outer, "master", "br0", ns=self.hub)
            self._ip("link", "set", outer, "up", ns=self.hub)
            self._ip("addr", "add", f"{self.addr[node]}/24", "dev", "eth0", ns=ns)
            self._ip("link", "set", "eth0", "up", ns=ns)
            self._ip("link", "set", "lo", "up", ns=ns)

    def _files(self) -> None:
        d = self.dir
        hosts = ["127.0.0.1 localhost"] + [f"{self.addr[n]} {n}" for n in self.names]
        (d / "hosts").write_text("\n".join(hosts) + "\n")
        for key in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True
            )
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        host_key = (d / "host_key.pub").read_text().strip()
        known = [f"{n},{self.addr[n]} {host_key}" for n in self.names]
        (d / "known_hosts").write_text("\n".join(known) + "\n")
        (d / "ssh_config").write_text(
            f"Host {' '.join(self.names)}\n"
            f"  IdentityFile {d / 'client_key'}\n"
            f"  UserKnownHostsFile {d / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  User root\n"
            "  ConnectTimeout 10\n"
        )
        for node in self.names:
            (d / "spool" / node).mkdir(parents=True)
        (d / "state").mkdir()

    def _node_daemon(self, node: str, argv: list[str], log: str) -> None:
        self.node_daemons[node].append((argv, log))
        self._daemon(self.node_argv(node, argv), log)

    def revive(self, node: str) -> None:
        """Start `node`'s daemons again after `kill_node` (a node back from a reboot)."""
        for argv, log in self.node_daemons[node]:
            self._daemon(self.node_argv(node, argv), log)
        self._wait_until_idle()

    def _daemon(self, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.dir / log, "ab")  # noqa: SIM115 - the daemon writes it until stopped
        proc = subprocess.Popen(
            argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()
        self.daemons.append(proc)
        return proc

    def _munge(self) -> None:
        d = self.dir / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "munge.socket"
        self._daemon(
            [which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
             f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
             f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"],
            "munged.out",
        )  # fmt: skip
        _wait_for(lambda: self.munge_socket.exists(), 20, "munged's socket")

    def _slurm(self) -> None:
        d, first = self.dir, self.names[0]
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.addr[n]} CPUs=1 State=UNKNOWN" for n in self.names
        )
        (d / "slurm.conf").write_text(
            f"ClusterName=mn\nSlurmctldHost={first}({self.addr[first]})\n"
            "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            f"StateSaveLocation={d / 'state'}\nSlurmdSpoolDir={d / 'spool'}/%n\n"
            f"SlurmctldPidFile={d / 'slurmctld.pid'}\nSlurmdPidFile={d / 'spool'}/%n/slurmd.pid\n"
            f"SlurmctldLogFile={d / 'slurmctld.log'}\nSlurmdLogFile={d / 'spool'}/%n/slurmd.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nMpiDefault=none\n"
            "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
            "JobCompType=jobcomp/none\nReturnToService=2\nSchedulerType=sched/backfill\n"
            f"KillWait={self.kill_wait}\nInactiveLimit=0\nMinJobAge=10\nSlurmdTimeout=30\n"
            "SlurmctldTimeout=30\nMessageTimeout=20\n"
            f"{nodes}\nPartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        self._daemon(self.node_argv(first, [which("slurmctld"), "-D", "-i"]), "slurmctld.out")
        for node in self.names:
            self._node_daemon(node, [which("slurmd"), "-D", "-N", node], f"slurmd-{node}.out")

    def _sshd(self) -> None:
        d = self.dir
        privsep = Path("/run/sshd")  # sshd's privilege-separation folder, made by its service
        if not privsep.is_dir():
            privsep.mkdir(mode=0o755)
            self.made_privsep = privsep
        for node in self.names:
            conf = d / f"sshd-{node}.conf"
            conf.write_text(
                f"ListenAddress {self.addr[node]}\nHostKey {d / 'host_key'}\n"
                f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / f'sshd-{node}.pid'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n"
                "StrictModes no\nAcceptEnv *\nPermitUserEnvironment no\n"
                "Subsystem sftp internal-sftp\n"
            )
            self._node_daemon(
                node, [which("sshd"), "-D", "-e", "-f", str(conf)], f"sshd-{node}.out"
            )

    def _wait_until_idle(self, timeout: float = 60) -> None:
        def idle() -> bool:
            out = self.run(self.names[0], ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(n) == "idle" for n in self.names)

        _wait_for(idle, timeout, "every slurmd to register idle", self._logs)

        def answers(node: str) -> bool:
            return self.run(self.names[0], ["ssh", node, "true"], timeout=20).returncode == 0

        for node in self.names:  # and sshd answering on every node
            _wait_for(lambda node=node: answers(node), timeout, f"sshd on {node}", self._logs)

    def _logs(self) -> str:
        parts = []
        for path in sorted(self.dir.rglob("*.log")) + sorted(self.dir.glob("*.out")):
            text = path.read_text(errors="replace")[-1500:]
            parts.append(f"--- {path.relative_to(self.dir)}\n{text}")
        return "\n".join(parts)

    # -- tear-down ---------------------------------------------------------------------------
    def stop(self) -> None:
        for node in self.names:
            if node in self.netns and Path(f"/run/netns/{self.netns[node]}").exists():
                self.kill_node(node)
        for proc in self.daemons:
            _kill_group(proc)
        for ns in [*self.netns.values(), self.hub]:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.made_privsep is not None:
            shutil.rmtree(self.made_privsep, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_for(ready, timeout: float, what: str, logs=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    detail = f"\n{logs()}" if logs else ""
    raise TimeoutError(f"the test cluster: no {what} after {timeout:.0f} s{detail}")
