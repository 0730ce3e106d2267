"""The hostfile pre-flight report: the hosts a launch will use after include/exclude, from the
launcher's own parser, so a malformed line is an error naming the file and line."""

from __future__ import annotations

from megatron.config import config_from_dict
from megatron.preflight import ERROR, OK, run_preflight
from tests.tiny import BARE

TINY = dict(BARE, tokenizer_type="CharLevelTokenizer")


def host_findings(shared_fs=True, **keys):
    cfg = config_from_dict({**TINY, **keys}, world_size=4, vocab_size=512)
    found = run_preflight(cfg, "generate.py", shared_fs=shared_fs)
    return [f for f in found if f.check == "hostfile"]


def test_hosts_in_use_after_include_and_exclude(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# cluster\nworker-0 slots=4\nworker-1 slots=4  # spare\n")
    (included,) = host_findings(hostfile=str(hostfile), include="worker-1:0,2")
    assert included.level == OK
    assert included.message == (
        f"hostfile {hostfile}: 2 host(s); using worker-1 (slots 0,2); left out: worker-0"
    )
    (excluded,) = host_findings(hostfile=str(hostfile), exclude="worker-0:3", shared_fs=False)
    assert excluded.message.endswith("using worker-0 (slots 0-2), worker-1 (slots 0-3)")


def test_malformed_line_and_unknown_host(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=4\nworker-1 slots=four\n")
    (bad,) = host_findings(hostfile=str(hostfile))
    assert bad.level == ERROR
    assert bad.message.startswith(f"hostfile {hostfile}, line 2 ('worker-1 slots=four')")
    hostfile.write_text("worker-0 slots=4\n")
    (unknown,) = host_findings(hostfile=str(hostfile), include="worker-9")
    assert unknown.message == (
        f"include: host 'worker-9' is not in hostfile {hostfile}; known hosts: worker-0"
    )


def test_no_hostfile_no_finding():
    assert host_findings() == []
