"""``--model MODULE:ATTR``: the worked example (examples/custom_model) trains under the
trainers exactly as one process does, and a name that is not a spec is refused in one line."""

from __future__ import annotations

import pytest

from tests.support.runs import assert_close, losses, run_trainer
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError

EXAMPLE = "examples.custom_model.conv_lm:SPEC"
RUN = ["--model", EXAMPLE, "--steps", "6", "--batch-size", "8", "--eval-every", "0",
       "--checkpoint-every", "0", "--log-every", "1", "--tensorboard", "false",
       "--device", "cpu", "--peak-tflops", "1"]


def test_the_spec_resolves_with_its_counted_parameters(tmp_path):
    from examples.custom_model.conv_lm import SPEC
    cfg = parse_config(["--model", EXAMPLE, "--output-dir", str(tmp_path)], "ddp")
    assert cfg.seq_len == 64
    assert SPEC.shape.num_params() == sum(p.numel() for p in SPEC.meta_model().parameters())
    assert not SPEC.shape.tensor_parallel and SPEC.shape.pipeline


@pytest.mark.parametrize("trainer, model, extra, message", [
    ("ddp", "no_such_module:SPEC", [], "module no_such_module does not import"),
    ("ddp", "examples.custom_model.conv_lm:SHAPE", [], "is not a model spec"),
    ("ddp", "examples.custom_model.conv_lm:MISSING", [], "is not a model spec"),
    ("tensor_parallel", EXAMPLE, ["--tp", "2"], "has no tensor-parallel plan"),
    ("ddp", "not a name", [], "not a built-in size, hf:DIR or MODULE:ATTR"),
])
def test_bad_names_are_refused(tmp_path, trainer, model, extra, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(["--model", model, "--output-dir", str(tmp_path), *extra], trainer,
                     world_sizes=[2])


@pytest.mark.slow
def test_ddp_fsdp_and_pipeline_match_one_process(tmp_path):
    run_trainer([*RUN, "--output-dir", str(tmp_path / "one")])
    single = losses(tmp_path / "one")
    assert single[6] < single[1]
    for name, module, extra in (("ddp", "trainers.ddp", []),
                                ("fsdp", "trainers.fsdp", ["--activation-checkpointing"]),
                                ("pipeline", "trainers.pipeline", ["--pp", "2"])):
        run_trainer([*RUN, *extra, "--output-dir", str(tmp_path / name)], nproc=2,
                    module=module)
        assert_close(losses(tmp_path / name), single)
