"""Will scaling pay (``python -m trainers.scaling``, components/scaling.py): the trainer run
at 1 and 2 processes, and on 2 nodes through the component under ``torchx run -s local_cwd``;
tokens/s, the efficiency and each step's breakdown read back from what the runs wrote; the
data check on real repeated data; the component's checks before scheduling."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from components.errors import ComponentArgumentError
from components.scaling import scaling
from tests.support.processes import run_command, run_forked
from tests.support.runs import torchx_cli
from trainers.config.parsing import parse_config
from trainers.scaling.measure import duplicated_sequences
from trainers.sizing.step_breakdown import Breakdown

TRAINER = ["--model", "tiny", "--batch-size", "8", "--train-samples", "256", "--val-samples",
           "16"]
STEPS = ["--steps", "8", "--profile-steps", "2"]


def check_report(out: Path, names: list[str], devices: list[int]) -> dict:
    """scaling.json as the runs' own files say: each phase's tokens/s from its metrics.jsonl,
    its breakdown from its profile.json, parts summing to the step; the figure written."""
    report = json.loads((out / "scaling.json").read_text())
    phases = report["phases"]
    assert [p["name"] for p in phases] == names
    assert [p["nodes"] * p["procs_per_node"] for p in phases] == devices
    base = phases[0]["tokens_per_s_per_device"]
    for phase in phases:
        parts = phase["breakdown"]
        assert parts["step_s"] == pytest.approx(sum(parts[p] for p in Breakdown.PARTS))
        assert phase["efficiency"] == pytest.approx(phase["tokens_per_s_per_device"] / base)
        assert phase["tokens_per_replica"] == 4 * 64  # the largest run's 8 over 2, x seq 64
    assert phases[0]["breakdown"]["exposed_comm_s"] == 0.0  # one process: no collective
    assert all(p["breakdown"]["exposed_comm_s"] > 0 for p in phases[1:])
    assert report["duplicated_sequences"] == 0 and report["sampled_sequences"] == 8
    assert (out / "scaling.png").read_bytes().startswith(b"\x89PNG")
    return report


@pytest.mark.slow
def test_one_and_two_processes_are_measured_and_split_into_their_parts(tmp_path):
    out = tmp_path / "scaling"
    proc = run_command([sys.executable, "-m", "trainers.scaling", "--nproc", "2", *STEPS,
                        "--output-dir", str(out), "--", *TRAINER])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_report(out, ["1 process", "2 processes"], [1, 2])
    assert "| 2 processes | 2 |" in proc.stdout and "pitfalls:" in proc.stdout
    for run, batch in (("nproc1", 4), ("nproc2", 8)):  # the same batch per replica
        assert json.loads((out / run / "config.json").read_text())["options"]["batch_size"] == batch
        profile = json.loads((out / run / "profile.json").read_text())
        assert profile["steps"] == [7, 8] and len(profile["ranks"]) == int(run[-1])
        trace = json.loads((out / run / "profile-trace.json").read_text())
        assert any(e.get("name", "").startswith("ProfilerStep") for e in trace["traceEvents"])
        assert "step 8/8" in (out / run / "launch-node0.log").read_text()


@pytest.mark.slow
def test_the_component_measures_two_nodes_under_local_cwd(tmp_path):
    out = tmp_path / "scaling"
    stale = out / "nodes2x1"  # an earlier measurement's run: removed before this one runs
    stale.mkdir(parents=True)
    (stale / "launch-node0.log").write_text("earlier\n")
    (stale / "profile.json").write_text("{}")
    proc = torchx_cli("run", "-s", "local_cwd", "--wait", "--log", "scaling", "-j", "2x1",
                      *[a.replace("--profile-steps", "--profile_steps") for a in STEPS],
                      "--output_dir", str(out), "--", *TRAINER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_report(out, ["1 process", "2 nodes x 1"], [1, 2])
    assert "| 2 nodes x 1 | 2 |" in proc.stdout + proc.stderr


def test_the_data_check_finds_sequences_repeated_across_ranks(tmp_path):
    sequence = np.arange(64, dtype=np.uint16)
    (tmp_path / "repeated.bin").write_bytes(np.tile(sequence, 40).tobytes())
    varied = np.random.default_rng(0).integers(0, 256, 64 * 40, dtype=np.uint16)
    (tmp_path / "varied.bin").write_bytes(varied.tobytes())
    for name, duplicated in (("repeated", 7), ("varied", 0)):
        cfg = parse_config(["--model", "tiny", "--data", str(tmp_path / f"{name}.bin"),
                            "--token-dtype", "uint16", "--vocab-size", "256", "--seq-len", "64",
                            "--batch-size", "8", "--output-dir", str(tmp_path / "run")],
                           "ddp", world_sizes=[2])
        assert duplicated_sequences(cfg, 2) == (duplicated, 8)


@pytest.mark.parametrize("kwargs, message", [
    ({"j": "1:2x2"}, "-j 1:2x2: a measurement runs on a fixed number of nodes; pass -j 2x2"),
    ({"j": "1x1"}, "1 process is the baseline: pass --nproc 2"),
    ({"j": "1x2", "gpu": 4}, "2 processes per node with --gpu 4: each process drives one GPU; "
                             "pass -j <nodes>x4, or --gpu 2"),
    ({"trainer": "pipeline"}, "pass one of ddp, fsdp, tensor_parallel"),
    ({"steps": 5}, "--steps 5 leaves no timed steps"),
])
def test_a_bad_measurement_is_refused_before_scheduling(kwargs, message):
    with pytest.raises(ComponentArgumentError) as err:
        scaling("--model", "tiny", **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_job_runs_the_measurement_on_every_node():
    app = scaling("--model", "tiny", "--batch-size", "16", j="2x2", steps=12, rdzv_port=29511)
    (role,) = app.roles
    assert (role.num_replicas, role.min_replicas, role.port_map) == (2, 2, {"c10d": 29511})
    command = role.args[1]
    assert command.startswith("python -m trainers.scaling --trainer ddp --nproc 2 --nodes 2 "
                              "--node-rank '${replica_id}' --run-id '${app_id}' --steps 12")
    assert "--rdzv-endpoint $${${rank0_env}:=localhost}:29511 -- --model tiny" in command


@pytest.mark.slow
def test_a_run_that_fails_ends_the_measurement_with_its_log(tmp_path):
    out = tmp_path / "scaling"
    env = {"TRAINERS_KILL_AT": "0:3"}  # the first run, 1 process, dies
    proc = run_command([sys.executable, "-m", "trainers.scaling", *STEPS, "--output-dir",
                        str(out), "--", *TRAINER], env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"trainers.scaling: error: the 1 process run failed (exit 1); its log is "
        f"{out}/nproc1/launch-node0.log (the last lines above)")
    assert "Signal 9 (SIGKILL)" in (out / "nproc1" / "launch-node0.log").read_text()
    assert not (out / "nproc2").exists()  # nothing runs after a failed run
    assert not (out / "scaling.json").exists()


def test_a_directory_no_measurement_wrote_is_kept(tmp_path):
    mine = tmp_path / "scaling" / "nproc1"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine\n")
    proc = run_forked("trainers.scaling", [*STEPS, "--output-dir", str(tmp_path / "scaling"),
                                           "--", *TRAINER], check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"trainers.scaling: error: {mine} exists and holds no "
                           "trainers.scaling run; pass another --output-dir\n")
    assert (mine / "notes.txt").read_text() == "mine\n"
