"""The step-time projection: its collective costs against hand-computed values, its overlap
and bubble rules, and the comparison with the published scaling tables
(bench/published_scaling.csv) recomputed, with the goals asserted where they are met."""

from __future__ import annotations

import dataclasses
import math

import pytest

from bench.projection_check import (
    ABSOLUTE_GOAL,
    CHANGE_GOAL_POINTS,
    compare,
    hardware_of,
    job_of,
    read_rows,
    table,
)
from tests.support.runs import REPO
from trainers.errors import ConfigError
from trainers.sizing.memory_formulas import Layout, activation_bytes
from trainers.sizing.projection import (
    DEFAULT_MATMUL_EFFICIENCY,
    Assumptions,
    Hardware,
    Job,
    all_reduce_s,
    at_scale,
    calibrate,
    group_gbps,
    non_matmul_bytes,
    project,
    recompute_factor,
    ring_all_gather_s,
    ring_reduce_scatter_s,
)
from trainers.sizing.shapes import MODEL_SIZES, ModelConfig

H100 = Hardware(989.4e12, 450.0, 50.0)
# No latency, full line rate: the bandwidth terms alone.
IDEAL = Assumptions(matmul_efficiency=0.5, link_efficiency=1.0, latency_s=0.0)


def test_ring_all_gather_and_reduce_scatter_move_n_minus_1_over_n_of_the_bytes():
    # 4 ranks, 1 GB in all, 100 GB/s: 3/4 x 1e9 / 1e11 = 7.5 ms, plus 3 steps of 10 us.
    assert ring_all_gather_s(4, 1e9, 100.0) == pytest.approx(0.0075)
    assert ring_all_gather_s(4, 1e9, 100.0, 10e-6) == pytest.approx(0.0075 + 3e-5)
    assert ring_reduce_scatter_s(4, 1e9, 100.0) == pytest.approx(0.0075)
    assert ring_all_gather_s(1, 1e9, 100.0, 10e-6) == 0.0


def test_all_reduce_moves_twice_as_much_and_takes_the_tree_latency_at_scale():
    # 8 ranks: 2 x 7/8 x 1e9 / 1e11 = 17.5 ms; ring 14 latency steps, tree 2 x 3 = 6.
    assert all_reduce_s(8, 1e9, 100.0) == pytest.approx(0.0175)
    assert all_reduce_s(8, 1e9, 100.0, 1e-6) == pytest.approx(0.0175 + 6e-6)
    # 2 ranks: the ring's 2 steps equal the tree's.
    assert all_reduce_s(2, 1e9, 100.0, 1e-6) == pytest.approx(0.01 + 2e-6)


def test_group_bandwidth_inside_a_node_and_across_nodes():
    # tp 8 inside a node: NVLink; dp over 16 nodes with tp 8 (one member per node): one NIC;
    # dp over 128 ranks, 8 per node: 8 NICs' worth, capped by NVLink.
    assert group_gbps(8, 1, H100, 1.0) == 450.0
    assert group_gbps(16, 8, H100, 1.0) == 50.0
    assert group_gbps(16, 4, H100, 1.0) == 100.0
    assert group_gbps(128, 1, H100, 0.8) == pytest.approx(0.8 * 400.0)
    assert group_gbps(128, 1, Hardware(1e15, 300.0, 50.0), 1.0) == 300.0


def _job(layout: Layout, micro: int = 1, batch: int = 0, **kw) -> Job:
    shape = MODEL_SIZES["7b"]
    batch = batch or layout.dp * micro * 8
    return Job(shape, 2048, batch, layout, micro, **kw)


def test_compute_alone_is_flops_over_peak_times_efficiency():
    job = _job(Layout("ddp", dp=1))
    p = project(job, H100, IDEAL)
    flops = MODEL_SIZES["7b"].flops_per_token(2048) * 2048 * 8
    assert p.step_s == pytest.approx(flops / (989.4e12 * 0.5))
    assert p.mfu == pytest.approx(0.5)
    assert p.device_hours_per_billion_tokens == pytest.approx(
        1e9 / p.tokens_per_s_per_device / 3600)


def test_full_recomputation_adds_a_forward_of_the_blocks():
    shape = MODEL_SIZES["llama-8b"]
    head = 6 * shape.vocab_size * shape.d_model
    fpt = shape.flops_per_token(8192)
    assert recompute_factor(shape, 8192, "full") == pytest.approx(1 + (fpt - head) / 3 / fpt)
    assert recompute_factor(shape, 8192, "none") == 1.0
    assert 1 < recompute_factor(shape, 8192, "selective") < recompute_factor(shape, 8192, "full")


def test_work_that_is_not_matmuls_moves_the_saved_activations_at_hbm_bandwidth():
    job = _job(Layout("ddp", dp=1))
    saved = activation_bytes(job.shape, 1, 2048, "bf16-params", checkpointing=False)
    assert non_matmul_bytes(job, IDEAL) == 4 * saved
    full = dataclasses.replace(job, recompute="full")
    assert non_matmul_bytes(full, IDEAL) == 5 * saved  # the recomputed forward writes again
    hbm = dataclasses.replace(H100, hbm_gbps=3350.0)
    p = project(job, hbm, IDEAL)
    assert p.non_matmul_s == pytest.approx(8 * 4 * saved / 3350e9)
    assert p.step_s == pytest.approx(project(job, H100, IDEAL).step_s + p.non_matmul_s)
    assert project(job, H100, IDEAL).non_matmul_s == 0.0  # no HBM bandwidth: not priced


def test_sequence_parallelism_splits_all_of_it_over_tp():
    job = _job(Layout("ddp", dp=1, tp=8))
    alone = non_matmul_bytes(dataclasses.replace(job, layout=Layout("ddp", dp=1)), IDEAL)
    split = non_matmul_bytes(job, dataclasses.replace(IDEAL, sequence_parallel=True))
    assert split == pytest.approx(alone / 8)
    assert alone / 8 < non_matmul_bytes(job, IDEAL) < alone  # norms and residuals replicated


def test_the_share_that_is_not_matmuls_falls_as_the_model_grows():
    # Bytes per token grow as d, FLOPs as d^2: wider models spend less of a step on it.
    hbm = dataclasses.replace(H100, hbm_gbps=3350.0)
    shares = []
    for d in (2048, 8192, 16384):
        shape = ModelConfig(vocab_size=50304, n_layers=24, n_heads=d // 128, d_model=d,
                            max_seq_len=4096)
        p = project(Job(shape, 4096, 8, Layout("ddp", dp=1), 1), hbm, IDEAL)
        shares.append(p.non_matmul_s / p.step_s)
    assert shares == sorted(shares, reverse=True) and shares[0] > 2 * shares[-1]


def test_ddp_hides_its_all_reduce_behind_the_last_backward_but_the_last_bucket():
    fast = project(_job(Layout("ddp", dp=8)), H100, IDEAL)
    bucket = all_reduce_s(8, 25 * 2**20, 450.0)
    assert fast.exposed_s["dp all-reduce"] == pytest.approx(bucket)
    slow_net = Hardware(989.4e12, 1.0, 1.0)  # 1 GB/s: the all-reduce outlasts the backward
    slow = project(_job(Layout("ddp", dp=8)), slow_net, IDEAL)
    total = all_reduce_s(8, MODEL_SIZES["7b"].num_params() * 4, 1.0)
    backward = slow.compute_s / 8 * 2 / 3
    assert slow.exposed_s["dp all-reduce"] == pytest.approx(total - backward)
    after = project(_job(Layout("ddp", dp=8)), slow_net,
                    dataclasses.replace(IDEAL, overlap_grad_reduce=False))
    assert after.exposed_s["dp all-reduce"] == pytest.approx(total)  # Megatron 2021's local DDP


def test_fsdp_exposes_only_the_first_gather_and_the_last_reduce_scatter_when_compute_wins():
    shape = MODEL_SIZES["7b"]
    p = project(_job(Layout("zero3", dp=8), micro=4, batch=32), H100, IDEAL)
    block = shape.block_matmul_params() + shape.block_norm_params()
    root = shape.num_params() - shape.n_layers * block
    gather = ring_all_gather_s(8, block * 2, 450.0)
    assert p.exposed_s["fsdp gathers"] == pytest.approx(gather + ring_all_gather_s(8, root * 2,
                                                                                   450.0))
    assert p.exposed_s["fsdp reduce-scatter"] == pytest.approx(
        ring_reduce_scatter_s(8, block * 4, 450.0) + ring_reduce_scatter_s(8, root * 4, 450.0))


def test_tensor_parallel_communication_is_on_the_critical_path_unless_overlapped():
    job = _job(Layout("ddp", dp=1, tp=8))
    exposed = project(job, H100, IDEAL).exposed_s["tp"]
    act = 2048 * 4096 * 2
    assert exposed == pytest.approx(8 * 4 * 32 * all_reduce_s(8, act, 450.0))
    hidden = project(job, H100, dataclasses.replace(IDEAL, tp_overlap=1.0))
    assert hidden.exposed_s["tp"] == 0.0


def test_pipeline_bubble_is_p_minus_1_micro_batches_and_interleaving_divides_it():
    job = _job(Layout("ddp", dp=1, pp=4), batch=8)  # m = 8
    p = project(job, H100, IDEAL)
    assert p.bubble_s / p.compute_s == pytest.approx(3 / 8)
    v2 = project(dataclasses.replace(job, schedule="interleaved", virtual_stages=2), H100, IDEAL)
    assert v2.bubble_s == pytest.approx(p.bubble_s / 2)


def test_jobs_the_projection_cannot_price_fail_with_one_line():
    with pytest.raises(ConfigError, match="not a multiple of dp 8 x micro-batch 3"):
        project(_job(Layout("ddp", dp=8), micro=3, batch=64), H100)
    with pytest.raises(ConfigError, match="cannot fill 4 pipeline stages"):
        project(_job(Layout("ddp", dp=1, pp=4), batch=2), H100)


def test_calibration_reproduces_its_row():
    job = _job(Layout("zero3", dp=64), micro=2, batch=128)
    eff = calibrate(job, H100, 9000.0)
    rate = project(job, H100, Assumptions(matmul_efficiency=eff)).tokens_per_s_per_device
    assert rate == pytest.approx(9000.0, rel=1e-6)
    with pytest.raises(ConfigError, match="needs more than the peak"):
        calibrate(job, H100, 1e7)


def test_the_line_a_script_reads():
    line = project(_job(Layout("ddp", dp=8)), H100).line()
    assert line.startswith("projected: ")
    assert " tokens/s per device, MFU 0." in line and line.endswith(
        " device-hours per billion tokens")


def test_published_rows_are_whole_and_sourced():
    rows = read_rows()
    assert {r["table"] for r in rows} == {"torchtitan", "llm-foundry", "megatron-h100",
                                          "megatron-a100-2021"}
    for row in rows:
        assert row["source"].startswith("https://github.com/"), row["row"]
        assert float(row["published"]) > 0
        job = job_of(row)
        assert job.devices == int(row["gpus"]), row["row"]
        hardware_of(row)
    published = {(r["table"], int(r["gpus"])): float(r["published"]) for r in rows}
    # The figures the issue quotes, as the sources print them.
    assert published[("torchtitan", 8)] == 5762 and published[("torchtitan", 128)] == 5605
    assert [published[("llm-foundry", n)] for n in (8, 128, 512)] == [10643, 10475, 9670]
    # Narayanan et al. 2021's configurations as the paper's scripts (run_table_1.sh) set them.
    sc21 = [job_of(r) for r in rows if r["table"] == "megatron-a100-2021"]
    assert [j.micro_batch for j in sc21] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]
    assert [j.layout.pp for j in sc21] == [1, 1, 1, 1, 2, 4, 8, 16, 35, 64]
    assert [j.virtual_stages for j in sc21] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]


@pytest.fixture(scope="module")
def comparison():
    return {t["table"]: t for t in compare(read_rows())}


def test_the_default_efficiency_is_torchtitans_8_gpu_calibration(comparison):
    assert comparison["torchtitan"]["matmul_efficiency"] == pytest.approx(
        DEFAULT_MATMUL_EFFICIENCY, abs=0.005)


def test_torchtitan_change_and_absolute_figures_within_the_goals(comparison):
    t = comparison["torchtitan"]
    assert abs(t["change_miss_points"]) <= CHANGE_GOAL_POINTS
    assert t["worst_absolute_error"] <= ABSOLUTE_GOAL
    assert t["published_change_points"] == pytest.approx(100 * (5605 / 5762 - 1))


def test_llm_foundry_absolute_figures_within_the_goal(comparison):
    """Its change from 8 to 512 GPUs (-9.1 points) is missed (projected -1.0): see
    docs/benchmarks.md; the absolute figures hold."""
    t = comparison["llm-foundry"]
    assert t["worst_absolute_error"] <= ABSOLUTE_GOAL
    assert t["published_change_points"] == pytest.approx(100 * (9670 / 10643 - 1))


@pytest.mark.parametrize("name, change_miss, worst", [
    ("llm-foundry", 8.2, 0.09), ("megatron-h100", 10.8, 0.30),
    ("megatron-a100-2021", 20.8, 0.175)])
def test_the_missed_goals_miss_by_no_more_than_documented(comparison, name, change_miss,
                                                          worst):
    """docs/benchmarks.md explains each miss; these bounds catch it growing."""
    t = comparison[name]
    assert abs(t["change_miss_points"]) <= change_miss
    assert t["worst_absolute_error"] <= worst


def test_every_table_is_calibrated_on_its_smallest_row(comparison):
    for t in comparison.values():
        first = t["rows"][0]
        assert first["gpus"] == min(r["gpus"] for r in t["rows"])
        assert first["predicted"] == pytest.approx(first["published"], rel=1e-6)
        assert all(math.isfinite(r["predicted"]) for r in t["rows"])


def test_weak_scaling_adds_replicas_with_the_same_batch_each():
    job = _job(Layout("zero3", dp=2, tp=2, pp=2), micro=1, batch=16)  # 8 per replica
    scaled = at_scale(job, 64)
    assert scaled.layout == Layout("zero3", dp=16, tp=2, pp=2)
    assert scaled.global_batch == 128 and scaled.micro_batches == job.micro_batches
    with pytest.raises(ConfigError, match="10 devices do not split into tp 2 x pp 2"):
        at_scale(job, 10)
    # More replicas never make a device faster.
    rates = [project(at_scale(job, n), H100).tokens_per_s_per_device for n in (8, 64, 1024)]
    assert rates == sorted(rates, reverse=True)


def test_docs_print_the_comparison_this_code_computes():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    section = page.split("## Projection against published tables", 1)[1]
    printed = section.split("```\n", 2)[1].rstrip("\n")
    assert printed == table({"tables": compare(read_rows())})
