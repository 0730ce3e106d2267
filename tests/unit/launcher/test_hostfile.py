"""Hostfile parsing and include/exclude filters: results, and errors naming file and line."""

import re

import pytest

from megatron.launcher import (
    HostfileError,
    LauncherError,
    parse_hostfile_text,
    parse_resource_filter,
    read_hostfile,
)
from megatron.launcher.hostfile import apply_resource_filter, format_hostfile, trim_resources


def test_parse_hostfile_keeps_order_and_skips_comments():
    text = "# cluster\n\nworker-2 slots=4  # fast\nworker-1 slots=8\n  worker-3   slots=2\n"
    pool = parse_hostfile_text(text)
    assert list(pool.items()) == [("worker-2", 4), ("worker-1", 8), ("worker-3", 2)]


def test_parse_hostfile_accepts_openmpi_options_and_addresses():
    pool = parse_hostfile_text("10.0.0.1 slots=2 max_slots=4\nn1.example.org slots=1\n")
    assert pool == {"10.0.0.1": 2, "n1.example.org": 1}


def test_format_hostfile_round_trips():
    pool = {"a": 2, "b": 3}
    assert parse_hostfile_text(format_hostfile(pool)) == pool


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("a slots=2\nb\n", 2, "exactly one 'slots=N'"),
        ("a slots=2\nb slots=x\n", 2, "exactly one 'slots=N'"),
        ("a slots=0\n", 1, "at least 1"),
        ("a slots=2\n# c\nb slots=1\na slots=4\n", 4, "already listed on line 1"),
        ("a slots=2 slots=3\n", 1, "exactly one 'slots=N'"),
        ("a slots=2 extra\n", 1, "unexpected 'extra'"),
        ("slots=2\n", 1, "expected 'HOSTNAME slots=N'"),
        ("a,b slots=2\n", 1, "expected 'HOSTNAME slots=N'"),
    ],
)
def test_parse_hostfile_errors_name_file_and_line(text, line, message):
    with pytest.raises(HostfileError, match=re.escape(message)) as err:
        parse_hostfile_text(text, source="/cluster/hosts")
    assert f"hostfile /cluster/hosts, line {line}" in str(err.value)


def test_empty_hostfile_is_an_error(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# nothing yet\n\n")
    with pytest.raises(HostfileError, match="lists no hosts") as err:
        read_hostfile(str(path))
    assert str(path) in str(err.value)


def test_missing_hostfile_is_an_error_not_a_local_fallback(tmp_path):
    with pytest.raises(HostfileError, match="does not exist") as err:
        read_hostfile(str(tmp_path / "nope"))
    assert "hostfile:" in str(err.value) and "nope" in str(err.value)


def test_read_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("n1 slots=2\nn2 slots=2\n")
    assert read_hostfile(str(path)) == {"n1": 2, "n2": 2}


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("worker-0", {"worker-0": []}),
        ("worker-0:0,2", {"worker-0": [0, 2]}),
        ("worker-0@worker-1:1", {"worker-0": [], "worker-1": [1]}),
        ("host1:0,1@host2", {"host1": [0, 1], "host2": []}),
        ("a:3,1@a:2", {"a": [1, 2, 3]}),
    ],
)
def test_parse_resource_filter(text, parsed):
    assert dict(parse_resource_filter(text)) == parsed


@pytest.mark.parametrize(
    "text, message",
    [
        ("a@@b", "empty host between '@'"),
        ("@a", "empty host between '@'"),
        ("a:x", "slot 'x' of host 'a'"),
        ("a:-1", "slot '-1' of host 'a'"),
        ("a:0,", "slot '' of host 'a'"),
        ("a:0:1", "is not NAME or NAME:SLOT"),
        (":0", "is not NAME or NAME:SLOT"),
    ],
)
def test_parse_resource_filter_errors_name_the_key(text, message):
    with pytest.raises(LauncherError, match=re.escape(message)) as err:
        parse_resource_filter(text, "exclude")
    assert str(err.value).startswith(f"exclude: {text!r}")


POOL = {"w0": 4, "w1": 4, "w2": 2}


def test_include_keeps_listed_hosts_in_pool_order():
    got = apply_resource_filter(POOL, "w2@w0:1,3", None, source="hostfile h")
    assert list(got.items()) == [("w0", [1, 3]), ("w2", [0, 1])]


def test_exclude_drops_slots_and_whole_hosts():
    got = apply_resource_filter(POOL, None, "w1@w0:0", source="hostfile h")
    assert list(got.items()) == [("w0", [1, 2, 3]), ("w2", [0, 1])]


def test_filter_errors_name_unknown_hosts_and_slots():
    with pytest.raises(LauncherError, match="host 'w9' is not in hostfile h; known hosts: w0"):
        apply_resource_filter(POOL, "w9", None, source="hostfile h")
    with pytest.raises(LauncherError, match="slot 2 of host 'w2' does not exist.*slots 0-1"):
        apply_resource_filter(POOL, None, "w2:2", source="hostfile h")
    with pytest.raises(LauncherError, match="leaves no hosts"):
        apply_resource_filter({"w0": 1}, None, "w0", source="hostfile h")


def test_trim_resources_mirrors_the_runner():
    resources = apply_resource_filter(POOL, None, None, source="h")
    got = trim_resources(resources, 2, 2, source="h")
    assert list(got.items()) == [("w0", [0, 1]), ("w1", [0, 1])]
    assert trim_resources(resources, -1, None) == resources
    with pytest.raises(LauncherError, match="num_nodes: 4 but only 3 host"):
        trim_resources(resources, 4, None)
    with pytest.raises(LauncherError, match="num_gpus: 3 but host 'w2' has only 2 slot"):
        trim_resources(resources, -1, 3, source="hostfile h")
    # CPU ranks on this machine: any count is allowed.
    assert trim_resources({"localhost": [0]}, -1, 3) == {"localhost": [0, 1, 2]}
