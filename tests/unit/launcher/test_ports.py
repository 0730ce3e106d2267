"""The rendezvous port: a free one when the config leaves it open, a taken one refused."""

from __future__ import annotations

import socket

import pytest

from megatron.launcher.errors import LauncherError
from megatron.launcher.ports import choose_master_port, free_port, port_in_use


@pytest.fixture
def listener():
    """A socket listening on a port of this machine, as a running job's rank 0 would."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def test_port_in_use_sees_a_listener_on_loopback(listener):
    assert port_in_use(listener)
    assert not can_bind(listener)  # what torch's TCPStore would meet


def test_port_in_use_after_the_listener_closed():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    sock.close()
    assert not port_in_use(port)


def test_unset_port_on_one_machine_is_a_free_one(listener):
    local = {"num_gpus": 2, "master_port": listener}  # the default would be taken
    port = choose_master_port(local, set_in=None, device_count=0)
    assert port != listener and can_bind(port)
    assert free_port() != listener


def test_set_port_is_kept_when_free():
    port = free_port()
    assert choose_master_port({"master_port": port}, set_in="run.yml", device_count=0) == port


def test_set_port_in_use_is_refused_naming_key_port_and_file(listener):
    with pytest.raises(LauncherError) as caught:
        choose_master_port({"master_port": listener}, set_in="my/run.yml", device_count=0)
    message = str(caught.value)
    assert f"master_port: {listener}" in message and "my/run.yml" in message
    assert "already in use" in message


def test_multi_node_keeps_the_configured_port(tmp_path, listener):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    settings = {"hostfile": str(hostfile), "master_port": listener}
    # Rank 0 listens on node1, not here: neither replaced nor probed.
    assert choose_master_port(settings, set_in=None) == listener
    assert choose_master_port(settings, set_in="run.yml") == listener
