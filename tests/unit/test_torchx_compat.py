"""components.torchx_compat: the same results on torchx 0.7.0 and on TorchX main (.ci/run runs
this module in both environments)."""

from __future__ import annotations

import dataclasses
import warnings

from components.torchx_compat import replace_cfg, torchrun_app


def test_torchrun_app_warns_nothing_and_reads_a_bare_j_as_processes_on_one_node():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dist.ddp warns on TorchX main: it must not be called
        app = torchrun_app("--steps", "3", m="trainers.ddp", j="2", name="ddp", h=None, cpu=1,
                           gpu=0, memMB=1024, env=None, max_retries=0, rdzv_port=0,
                           mounts=None, image="i")
    (role,) = app.roles
    assert role.num_replicas == 1
    assert " --nnodes 1 --nproc_per_node 2 " in role.args[-1]
    assert role.args[-1].startswith("torchrun ") and role.args[-1].endswith("--steps 3")


@dataclasses.dataclass
class _Opts:
    job_dir: str | None = None
    partition: str | None = None
    _extra_cfg: dict[str, object] = dataclasses.field(default_factory=dict)


def test_replace_cfg_keeps_the_options_type():
    cfg = {"job_dir": "a", "exclusive": True}
    assert replace_cfg(cfg, job_dir="b") == {"job_dir": "b", "exclusive": True}
    assert cfg["job_dir"] == "a"
    typed = _Opts(job_dir="a", partition="debug", _extra_cfg={"exclusive": True})
    new = replace_cfg(typed, job_dir="b")
    assert new == _Opts(job_dir="b", partition="debug", _extra_cfg={"exclusive": True})
    assert typed.job_dir == "a"
