"""--tf32: parsed by every trainer and component, decided from the device's compute capability,
applied once where the device is set up, recorded in the summary; no effect on the CPU.

What TF32 does to a matmul needs an Ampere or newer GPU; here the decision is checked with
explicit capabilities and the CPU path end to end.
"""

from __future__ import annotations

import json

import pytest
import torch

from components.fsdp import fsdp
from tests.support.runs import TINY, losses, run_trainer
from trainers.config.parsing import parse_config
from trainers.core.distributed import configure_tf32, tf32_applies
from trainers.errors import ConfigError
from trainers.options.trainer_table import TRAINERS


@pytest.mark.parametrize("name", sorted(TRAINERS))
@pytest.mark.parametrize("args, expected", [
    ([], True),
    (["--tf32"], True),
    (["--tf32", "true"], True),
    (["--tf32", "false"], False),
    (["--tf32=off"], False),
    (["--no-tf32"], False),
    (["--no-tf32", "--tf32"], True),  # the last one wins, as argparse does
])
def test_every_trainer_parses_tf32(tmp_path, name, args, expected):
    world = 2 if name in ("tensor_parallel", "pipeline") else 1
    extra = {"tensor_parallel": ["--tp", "2"], "pipeline": ["--pp", "2"]}.get(name, [])
    cfg = parse_config(["--output-dir", str(tmp_path / "run"), *extra, *args], name,
                       world_sizes=[world])
    assert cfg.tf32 is expected


def test_bad_tf32_value_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="argument --tf32: expected true or false, got 'maybe'"):
        parse_config(["--output-dir", str(tmp_path), "--tf32", "maybe"], "ddp", world_sizes=[1])
    with pytest.raises(ConfigError, match="ignored explicit argument 'false'"):
        parse_config(["--output-dir", str(tmp_path), "--no-tf32=false"], "ddp", world_sizes=[1])


def test_component_passes_no_tf32_to_the_trainer():
    command = fsdp("--model", "tiny", "--no-tf32", j="1x2").roles[0].args[-1]
    assert "-m trainers.fsdp --model tiny --no-tf32" in command


@pytest.mark.parametrize("capability, on", [
    ((6, 0), False),   # P100
    ((7, 0), False),   # V100: no TF32 tensor cores
    ((7, 5), False),   # T4
    ((8, 0), True),    # A100
    ((8, 6), True),    # A10, RTX 30xx
    ((8, 9), True),    # L4, L40S
    ((9, 0), True),    # H100, H200
    ((10, 0), True),   # B200
    ((12, 0), True),   # RTX 50xx
])
def test_tf32_follows_the_compute_capability(capability, on):
    assert tf32_applies(True, "cuda", capability) is on
    assert tf32_applies(False, "cuda", capability) is False  # --no-tf32 always wins


@pytest.mark.parametrize("device_type, capability, rocm", [
    ("cpu", None, False),
    ("cpu", (9, 0), False),   # a capability does not make the CPU a GPU
    ("cuda", None, False),    # capability unknown
    ("cuda", (9, 4), True),   # ROCm (MI300) reports gfx numbers, not NVIDIA's
])
def test_tf32_is_off_off_nvidia_gpus(device_type, capability, rocm):
    assert tf32_applies(True, device_type, capability, rocm) is False


def _precisions() -> tuple[str, str]:
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


@pytest.mark.parametrize("requested", [True, False])
def test_cpu_leaves_torch_settings_alone(requested):
    before = _precisions()
    assert configure_tf32(requested, torch.device("cpu")) is False
    assert _precisions() == before


def test_the_run_environment_records_tf32_off_on_cpu(world_of_one):
    assert world_of_one.device.type == "cpu" and world_of_one.tf32 is False


@pytest.mark.slow
def test_cpu_run_is_unaffected_and_its_summary_says_tf32_off(tmp_path):
    runs = {}
    for flag in ("true", "false"):
        run_dir = tmp_path / flag
        proc = run_trainer([*TINY, "--steps", "3", "--device", "cpu", "--tf32", flag,
                            "--output-dir", str(run_dir)])
        assert json.loads((run_dir / "summary.json").read_text())["tf32"] is False
        assert "tf32=False" in proc.stdout.splitlines()[-1]
        runs[flag] = losses(run_dir)
    assert runs["true"] == runs["false"]  # bit for bit: nothing changed on the CPU
