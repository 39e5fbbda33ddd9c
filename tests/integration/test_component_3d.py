"""The pipeline component in 3-D (stages over ``--pp``, tensor parallel inside ``--tp``, FSDP2
over the data-parallel rest) through ``torchx run -s local_cwd``: eight processes train as one
process does, and ``--allow-cross-node-tp`` lets a tensor-parallel group span nodes. The same
on two Slurm nodes: tests/system/test_slurm_3d.py; rendered for Volcano and JobSet:
tests/integration/test_kubernetes_render.py; refused placements: the bad-input matrix."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.runs import TINY, assert_close, losses, run_trainer, torchx_cli, without

# 2 stages x 2 data-parallel replicas x tensor-parallel pairs on -j 1x8 (and 2x4)
THREE_D = ["--pp", "2", "--tp", "2", "--microbatches", "4"]
# A few steps of the tiny model; batch 16: 8 sequences a pipeline, 2 a micro-batch.
RUN = [*without(TINY, "--batch-size", "--steps"), "--batch-size", "16", "--steps", "3"]


@pytest.mark.slow
def test_3d_pipeline_on_local_cwd_trains_as_one_process(tmp_path):
    """-j 1x8 -- --pp 2 --tp 2 (dp 2): the job succeeds on 8 ranks and its losses are the
    one-process run's (trainers.ddp, same arguments) within 1e-5."""
    run_dir, reference = tmp_path / "3d", tmp_path / "one-process"
    # --memMB: the default 4096 MB a node is 0.5 GiB for each of 8 processes, below what the
    # memory pre-flight wants for the tiny model.
    proc = torchx_cli("run", "-s", "local_cwd", "components/pipeline.py:pipeline", "-j", "1x8",
                      "--memMB", "6144", "--", *RUN, *THREE_D, "--output-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "job finished: succeeded" in proc.stderr.lower()  # "Job" on 0.7.0, "job" on main
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["steps"]) == (8, 3)
    options = json.loads((run_dir / "config.json").read_text())["options"]
    assert (options["pp"], options["tp"]) == (2, 2)
    run_trainer([*RUN, "--output-dir", str(reference)])
    assert_close(losses(run_dir), losses(reference))


def test_allow_cross_node_tp_accepts_a_tensor_parallel_group_across_nodes():
    """-j 4x2 -- --pp 2 --tp 4: each tensor-parallel group would span two nodes, which the
    component refuses (the bad-input matrix's row) unless --allow-cross-node-tp, with which the
    dry run renders the job."""
    proc = torchx_cli("run", "--dryrun", "-s", "local_cwd", "components/pipeline.py:pipeline",
                      "-j", "4x2", "--", "--model", "tiny", "--pp", "2", "--tp", "4",
                      "--allow-cross-node-tp", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the AppDef is pretty-printed: its command is split into adjacent string literals
    command = re.sub(r"['\"]\n\s*['\"]", "", proc.stdout)
    assert "--nnodes 4 --nproc_per_node 2 " in command
    assert "-m trainers.pipeline --model tiny --pp 2 --tp 4 --allow-cross-node-tp " in command
