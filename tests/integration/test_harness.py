"""The test harness explains its failures: a hung run shows every rank's stack and leaves no
process, a forked rank starts its children as a cold interpreter does, a rank's error is named
in torchrun's summary, ``--pg-timeout`` turns a hung collective into an error, a test that
leaves a process running fails, and so does a module that launches more than
tests/launches.json allows it, counted over every pytest-xdist worker."""

from __future__ import annotations

import json
import multiprocessing
import re
import sys
import textwrap

import pytest

from tests.support.processes import (
    LAUNCH_TABLE,
    live_launched,
    run_command,
    run_forked,
    torchrun,
)
from tests.support.runs import TINY, run_trainer
from tests.support.workers.faulty import MESSAGE

HANG = "tests.support.workers.faulty"
STACK = "Fatal Python error: Aborted"


def _sections(report: str) -> dict[str, str]:
    """The labelled outputs of a failure report: ``{label: text}``."""
    parts = re.split(r"^----- (\S+) -----$", report, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_a_hung_forked_run_shows_every_ranks_stack_and_leaves_nothing():
    with pytest.raises(AssertionError, match="missed its 8 s deadline") as failure:
        run_forked(HANG, ["hang"], nproc=2, timeout=8)
    sections = _sections(str(failure.value))
    assert "in barrier" in sections["rank0.stderr"] and STACK in sections["rank0.stderr"]
    assert "in hang" in sections["rank1.stderr"] and STACK in sections["rank1.stderr"]
    assert live_launched() == []


def test_a_forked_rank_starts_its_children_as_a_cold_interpreter_does():
    """The default start method is the platform's, not the forkserver's that forked the rank:
    a DataLoader's workers fork from the rank instead of starting a server of their own."""
    proc = run_forked("tests.support.workers.start_method", [], nproc=2)
    assert proc.stdout.split() == [multiprocessing.get_all_start_methods()[0]] * 2


@pytest.mark.slow
def test_a_hung_torchrun_run_shows_every_ranks_stack_and_leaves_nothing():
    """torchrun's workers run in sessions of their own: the deadline finds and aborts them."""
    job = torchrun(HANG, ["hang"], 2)
    job.wait_for("rank 0 joined", 120)
    job.wait_for("rank 1 joined", 30)
    with pytest.raises(AssertionError, match="missed its 1 s deadline") as failure:
        job.wait(timeout=1)
    ranks = {label.split("/")[-2]: text for label, text in _sections(str(failure.value)).items()
             if label.endswith("stderr.log")}
    assert sorted(ranks) == ["0", "1"], failure.value
    assert "in barrier" in ranks["0"] and STACK in ranks["0"]
    assert "in hang" in ranks["1"] and STACK in ranks["1"]
    assert live_launched() == []


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_its_traceback_in_torchruns_summary(tmp_path):
    proc = run_trainer([*TINY, "--model", f"{HANG}:RAISES_ON_RANK_1", "--output-dir",
                        str(tmp_path)], nproc=2, launcher="torchrun", check=False)
    assert proc.returncode != 0
    summary = proc.stderr[proc.stderr.index("Root Cause"):]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", summary), summary
    assert "Traceback" in summary and f"RuntimeError: {MESSAGE}" in summary, summary


def test_pg_timeout_turns_a_hung_collective_into_an_error():
    proc = run_forked(HANG, ["hang", "--pg-timeout", "3"], nproc=2, check=False, timeout=60)
    assert proc.returncode != 0
    assert "rank 0 joined" in proc.stdout
    assert re.search(r"[Tt]imed? ?out", proc.stderr), proc.stderr[-3000:]


def test_a_test_that_leaves_a_process_running_fails(tmp_path):
    (tmp_path / "test_leaves.py").write_text(textwrap.dedent("""
        from tests.support.processes import start

        def test_leaves_a_sleeper():
            start(["sleep", "60"])
    """))
    proc = run_command([sys.executable, "-m", "pytest", "-p", "tests.support.processes",
                        "-p", "no:cacheprovider", "test_leaves.py"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert re.search(r"test_leaves.py::test_leaves_a_sleeper left 1 process\(es\) running "
                     r"\(killed now\):\n\d+: sleep 60", proc.stdout), proc.stdout
    assert "1 passed, 1 error" in proc.stdout


def test_launches_over_the_table_fail_the_run_counted_over_every_worker(tmp_path):
    """A module allowed one launch whose four tests launch one each, run by two pytest-xdist
    workers: the run fails, naming the module and all four launches. A shared run (allowed
    once), made by each worker that needs it, is within the table."""
    module = next(name for name, kinds in json.loads(LAUNCH_TABLE.read_text()).items()
                  if kinds.get("launched") == 1)
    path = tmp_path / module
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent("""
        import pytest
        from tests.support.processes import run_command, run_forked, shared_launches

        @pytest.fixture(scope="session")
        def shared():
            with shared_launches("single_process"):
                run_forked("platform", [])
    """) + "".join(f"\ndef test_{n}(shared):\n    run_command(['true'], check=True)\n"
                   for n in range(4)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = run_command([sys.executable, "-m", "pytest", "-p", "tests.support.processes",
                        "-p", "no:cacheprovider", "-n", "2", "--dist", "load", module],
                       cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "4 passed" in proc.stdout, proc.stdout
    over = proc.stdout.split("launches over tests/launches.json (update it on purpose):")[1]
    assert f"{module}: 4 launched (tests/launches.json allows 1)" in over, proc.stdout
    assert "shared: " not in over, proc.stdout


def test_pg_timeout_sets_every_later_group_s_default(monkeypatch):
    """``--pg-timeout`` is the world's timeout and the default of the groups formed after it
    (``new_group`` would otherwise take torch's backend default); 0 leaves torch's."""
    import torch.distributed as dist

    from trainers.config.parsing import parse_config
    from trainers.core.distributed import pg_timeout

    c10d = dist.distributed_c10d
    monkeypatch.setattr(c10d, "default_pg_timeout", c10d.default_pg_timeout)
    monkeypatch.setattr(c10d, "default_pg_nccl_timeout", c10d.default_pg_nccl_timeout)
    assert pg_timeout(parse_config(["--device", "cpu"], "ddp")) is None
    timeout = pg_timeout(parse_config(["--device", "cpu", "--pg-timeout", "90"], "ddp"))
    assert timeout.total_seconds() == 90
    assert c10d._get_default_timeout("gloo") == timeout
