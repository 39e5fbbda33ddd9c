"""Which profiler events are compute, communication and data (trainers/core/profiling.py), on
a GPU and on the CPU, from events shaped as torch.profiler lists them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from trainers.core.profiling import StepProfiler, breakdown_of_events, event_intervals

MAIN, GLOO = 1, 2


def event(name: str, start: float, end: float, thread: int = MAIN,
          device: DeviceType = DeviceType.CPU) -> SimpleNamespace:
    return SimpleNamespace(name=name, thread=thread, device_type=device,
                           time_range=SimpleNamespace(start=start, end=end))


def test_on_the_cpu_the_main_threads_operators_compute_and_gloo_threads_communicate():
    events = [event("ProfilerStep*", 0, 100),
              event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 10),
              event("aten::mm", 10, 60),
              event("c10d::allreduce_", 55, 60),  # the main thread's own collective
              event("gloo:all_reduce", 40, 80, thread=GLOO),
              event("aten::add_", 85, 95)]
    t = event_intervals(events)
    assert t.windows == [(0, 100)] and t.data == [(0, 10)]
    assert t.compute == [(10, 60), (85, 95)]
    assert (t.blocking, t.comm) == ([(55, 60)], [(40, 80)])
    b = breakdown_of_events(events)
    # compute 10-55 and 85-95; exposed 55-80; data 0-10; host 80-85 and 95-100
    assert (b.compute_s, b.exposed_comm_s, b.data_wait_s, b.host_s) == pytest.approx(
        (55e-6, 25e-6, 10e-6, 10e-6))


def test_on_a_gpu_the_kernels_are_the_device_and_nccl_kernels_communicate():
    cuda = DeviceType.CUDA
    events = [event("ProfilerStep*", 0, 100),
              event("aten::mm", 0, 5),  # a launch: host time, not the device's
              event("c10d::allreduce_", 5, 6),
              event("sm90_xmma_gemm_bf16bf16_bf16f32", 2, 50, thread=7, device=cuda),
              event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 70, thread=8, device=cuda)]
    t = event_intervals(events)
    assert (t.compute, t.comm, t.blocking) == ([(2, 50)], [(30, 70)], [])
    b = breakdown_of_events(events)
    assert (b.compute_s, b.exposed_comm_s, b.host_s) == pytest.approx((48e-6, 20e-6, 32e-6))


def test_no_profiled_step_gives_no_breakdown():
    assert breakdown_of_events([event("aten::mm", 0, 5)]) is None


def test_the_profiled_steps_are_the_attempts_last_and_never_its_first():
    profiler = StepProfiler(5, first=11, last=20, device=torch.device("cpu"))
    assert (profiler.active, profiler.first_profiled) == (5, 16)
    short = StepProfiler(5, first=18, last=20, device=torch.device("cpu"))
    assert (short.active, short.first_profiled) == (2, 19)  # step 18 warms the profiler up
    assert StepProfiler(0, first=1, last=20, device=torch.device("cpu")).active == 0
