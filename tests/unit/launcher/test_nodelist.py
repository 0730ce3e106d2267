"""SLURM host list and task count expansion."""

import re

import pytest

from megatron.launcher import WorkerEnvironmentError, expand_slurm_nodelist
from megatron.launcher.nodelist import expand_slurm_tasks_per_node


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node01", ["node01"]),
        ("localhost", ["localhost"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("node[001-002]", ["node001", "node002"]),
        ("node[9-11]", ["node9", "node10", "node11"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("node[1,3,5]", ["node1", "node3", "node5"]),
        ("node[7]", ["node7"]),
        (
            "node[01-03,07],gpu-a[1-2]",
            ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"],
        ),
        ("login,node[1-2],x9", ["login", "node1", "node2", "x9"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[1-2].cluster.org", ["n1.cluster.org", "n2.cluster.org"]),
        ("[1-2]x", ["1x", "2x"]),
        (" node[1-2] ", ["node1", "node2"]),
        ("node[1-2, 4]", ["node1", "node2", "node4"]),
    ],
)
def test_expand_slurm_nodelist(nodelist, hosts):
    assert expand_slurm_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, message",
    [
        ("", "empty"),
        ("node[1-3", "never closed"),
        ("node1-3]", "without '['"),
        ("node[[1-2]]", "nested"),
        ("node[3-1]", "backwards"),
        ("node[a-c]", "expected N or N-M"),
        ("node[]", "expected N or N-M"),
        ("node1,,node2", "empty host name"),
        ("node[1-2],", "empty host name"),
    ],
)
def test_expand_slurm_nodelist_errors_name_the_variable(nodelist, message):
    with pytest.raises(WorkerEnvironmentError, match=re.escape(message)) as err:
        expand_slurm_nodelist(nodelist, "SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST" in str(err.value)


@pytest.mark.parametrize(
    "value, counts",
    [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("1,8(x2)", [1, 8, 8])],
)
def test_expand_slurm_tasks_per_node(value, counts):
    assert expand_slurm_tasks_per_node(value) == counts


def test_expand_slurm_tasks_per_node_rejects_garbage():
    with pytest.raises(WorkerEnvironmentError, match="SLURM_STEP_TASKS_PER_NODE='2x3'"):
        expand_slurm_tasks_per_node("2x3")
