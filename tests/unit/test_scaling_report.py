"""What trainers.scaling concludes: efficiency, the table and each pitfall with its fix
(trainers/scaling/report.py), from phases as the runs would give them."""

from __future__ import annotations

import pytest

from trainers.scaling.report import Facts, Phase, efficiency, pitfalls, table
from trainers.sizing.step_breakdown import Breakdown

HEALTHY = Facts("ddp", num_workers=0, tp=1, grad_accum=1, duplicated=0, sampled=16)


def phase(name: str, devices: int, tokens_per_s: float, compute: float, comm: float = 0.0,
          data: float = 0.0, host: float = 0.001, nodes: int = 1) -> Phase:
    step = compute + comm + data + host
    return Phase(name, nodes, devices // nodes, tokens_per_s,
                 Breakdown(step, compute, comm, data, host), tokens_per_replica=2048)


def kinds(found) -> list[str]:
    return [p.kind for p in found]


def test_good_scaling_shows_no_pitfall():
    runs = [phase("1 process", 1, 1000, 0.1), phase("2 processes", 2, 1960, 0.1, comm=0.002)]
    assert efficiency(runs[0], runs[1]) == pytest.approx(0.98)
    assert pitfalls(runs, HEALTHY) == []


def test_exposed_communication_names_the_batch_and_the_bf16_reduction_for_ddp_only():
    runs = [phase("1 process", 1, 1000, 0.1), phase("2 processes", 2, 1300, 0.1, comm=0.05)]
    found = pitfalls(runs, HEALTHY)
    assert kinds(found) == ["batch", "scaling"]
    assert "--grad-accum" in found[0].message and "--grad-reduce-dtype bf16" in found[0].message
    assert "2,048 tokens per replica" in found[0].message
    assert "exposed communication grew most" in found[1].message
    fsdp = pitfalls(runs, Facts("fsdp", 0, 1, 1, 0, 16))
    assert "--grad-reduce-dtype" not in fsdp[0].message
    tensor_parallel = pitfalls(runs, Facts("tensor_parallel", 0, 2, 1, 0, 16))
    assert "a smaller --tp than 2" in tensor_parallel[0].message


def test_data_wait_names_more_loader_workers():
    runs = [phase("1 process", 1, 1000, 0.1, data=0.02), phase("2 processes", 2, 1900, 0.1,
                                                                  data=0.02)]
    found = pitfalls(runs, Facts("ddp", 2, 1, 1, 0, 16))
    assert kinds(found) == ["data"]
    assert "--num-workers 4" in found[0].message


def test_duplicated_samples_and_tensor_parallel_across_nodes():
    runs = [phase("1 process", 1, 1000, 0.1),
            phase("2 nodes x 2", 4, 3900, 0.1, nodes=2)]
    found = pitfalls(runs, Facts("tensor_parallel", 0, tp=4, grad_accum=1, duplicated=8,
                                 sampled=16))
    assert kinds(found) == ["duplicates", "placement"]
    assert "8 of the 16 sequences" in found[0].message
    assert "--tp <= 2" in found[1].message


@pytest.mark.parametrize("grown,cause", [("compute", "OMP_NUM_THREADS"),
                                         ("host", "--compile")])
def test_sublinear_scaling_names_the_part_that_grew(grown, cause):
    slow = {"compute": dict(compute=0.2), "host": dict(compute=0.1, host=0.1)}[grown]
    runs = [phase("1 process", 1, 1000, 0.1), phase("2 processes", 2, 1200, **slow)]
    found = pitfalls(runs, HEALTHY)
    assert kinds(found) == ["scaling"]
    assert "0.60 of 1 process" in found[0].message and cause in found[0].message


def test_the_table_has_a_row_per_run_with_efficiency_and_shares():
    runs = [phase("1 process", 1, 1000, 0.09), phase("2 processes", 2, 1800, 0.08, comm=0.011)]
    text = table(runs)
    assert text.splitlines()[3].startswith("| 2 processes | 2 | 1,800 | 900 | 0.90 | 92.0 ms |")
    assert "11.0 ms (12%)" in text


def test_sublinear_scaling_from_communication_names_its_fixes_without_the_batch_pitfall():
    # 11% of the step on collectives: below the batch pitfall, yet the part that grew most
    runs = [phase("1 process", 1, 1532, 0.162, host=0.006),
            phase("2 processes", 2, 2449, 0.184, comm=0.024, host=0.004)]
    found = pitfalls(runs, HEALTHY)
    assert kinds(found) == ["scaling"]
    assert found[0].message.endswith("try a larger batch per device (--batch-size), or gradient "
                                     "accumulation (--grad-accum: one reduction per step), or "
                                     "--grad-reduce-dtype bf16 (half the bytes)")
