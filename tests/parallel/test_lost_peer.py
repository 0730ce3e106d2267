"""A rank whose peer dies under a collective says which rank and host it lost (2 gloo ranks).

Rank 1 leaves the process group and exits while rank 0 waits in an all-reduce for it, as a
node that dies mid-step; rank 0's error, turned by `lost_peer_error`, names rank 1, its host
and its address, and counts as the cluster's situation (a message), not a bug (a traceback).
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from megatron.errors import is_user_error
from megatron.launcher.peers import lost_peer_error, record_peers
from megatron.training.checkpoint.disk_space import CheckpointSaveError
from tests.distributed import run_distributed


def _rank0_waits_for_a_rank_that_leaves(rank, world_size):
    peers = record_peers("127.0.0.1")
    if rank == 1:
        return None  # the harness tears the group down: rank 1's sockets close
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as error:
        lost = lost_peer_error(error)
        try:  # as a checkpoint save whose barrier broke reports it
            raise CheckpointSaveError(
                f"could not save checkpoint ckpt/global_step12 ({error})"
            ) from error
        except CheckpointSaveError as wrapped:
            through = str(lost_peer_error(wrapped))
        return [str(lost), is_user_error(lost), [(p.rank, p.host) for p in peers], through]
    return "the all-reduce went through without rank 1"


def test_the_lost_rank_is_named_with_its_host():
    message, user, peers, through = run_distributed(_rank0_waits_for_a_rank_that_leaves, 2)[0]
    host = socket.gethostname()
    assert peers == [(0, host), (1, host)]
    assert f"lost contact with rank 1 on {host} (127.0.0.1)" in message
    assert "`latest` stays on the last complete checkpoint" in message and user
    assert f"lost contact with rank 1 on {host} (127.0.0.1)" in through  # seen through the save


def test_an_error_from_elsewhere_is_not_a_lost_peer():
    try:
        raise RuntimeError("Connection reset by peer")  # not from a torch.distributed call
    except RuntimeError as error:
        assert lost_peer_error(error) is None
