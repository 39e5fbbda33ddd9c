"""The split of a step into compute, exposed communication, data wait and host overhead, from
profiler intervals (trainers/sizing/step_breakdown.py)."""

from __future__ import annotations

import pytest

from trainers.sizing.step_breakdown import (
    Breakdown,
    is_comm,
    is_data,
    mean_breakdown,
    step_breakdown,
    subtract,
    union,
    within,
)


def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones():
    assert union([(5, 7), (0, 2), (1, 3), (3, 4), (8, 8)]) == [(0, 4), (5, 7)]


def test_subtract_keeps_what_lies_outside():
    assert subtract([(0, 10), (20, 30)], [(2, 3), (5, 22), (29, 40)]) == [
        (0, 2), (3, 5), (22, 29)]
    assert subtract([(0, 10)], []) == [(0, 10)]
    assert subtract([(0, 10)], [(-5, 15)]) == []


def test_within_cuts_to_the_window():
    assert within([(-5, 5), (8, 20), (30, 40)], (0, 10)) == [(0, 5), (8, 10)]


def test_communication_behind_compute_is_hidden_and_the_rest_is_exposed():
    # 0-100 us step: compute 0-60, a collective 40-80 on another thread (20 us behind compute,
    # 20 exposed), data 60-70 (precedes communication), nothing 80-100 (host).
    b = step_breakdown((0, 100), compute=[(0, 60)], comm=[(40, 80)], data=[(60, 70)])
    assert b.compute_s == pytest.approx(60e-6)
    assert b.data_wait_s == pytest.approx(10e-6)
    assert b.exposed_comm_s == pytest.approx(10e-6)  # 70-80: neither compute nor data
    assert b.host_s == pytest.approx(20e-6)
    assert b.step_s == pytest.approx(sum(getattr(b, p) for p in Breakdown.PARTS))


def test_an_operator_waiting_on_a_collective_counts_as_communication():
    # an operator 0-50 inside which c10d waits 30-50 (as a synchronous all-reduce does)
    b = step_breakdown((0, 50), compute=[(0, 50)], comm=[], data=[], blocking=[(30, 50)])
    assert (b.compute_s, b.exposed_comm_s, b.host_s) == pytest.approx((30e-6, 20e-6, 0.0))


def test_data_loading_inside_the_loader_is_data_wait_not_compute():
    b = step_breakdown((0, 40), compute=[(0, 40)], comm=[], data=[(0, 15)])
    assert (b.data_wait_s, b.compute_s) == pytest.approx((15e-6, 25e-6))


def test_mean_breakdown_and_shares():
    a = Breakdown(10.0, 6.0, 2.0, 1.0, 1.0)
    b = Breakdown(20.0, 10.0, 6.0, 1.0, 3.0)
    mean = mean_breakdown([a, b])
    assert mean == Breakdown(15.0, 8.0, 4.0, 1.0, 2.0)
    assert mean.share("exposed_comm_s") == pytest.approx(4 / 15)


@pytest.mark.parametrize("name,comm", [("gloo:all_reduce", True), ("c10d::allreduce_", True),
                                      ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", True),
                                      ("_c10d_functional::wait_tensor", True),
                                      ("aten::mm", False), ("Optimizer.step#AdamW.step", False)])
def test_communication_is_told_by_name(name, comm):
    assert is_comm(name) is comm


def test_the_data_loader_is_told_by_name():
    assert is_data("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
    assert not is_data("aten::copy_")
