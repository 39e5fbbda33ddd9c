"""components/schedulers/torchx_workarounds/releases.py: the same results on torchx 0.7.0 and on
TorchX main (.ci/run runs this module in both environments)."""

from __future__ import annotations

import dataclasses

from components.schedulers.torchx_workarounds.releases import replace_cfg


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
