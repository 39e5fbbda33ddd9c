"""bf16 MFU of llama-1b under FSDP on this machine's GPUs, eager and compiled (docs/benchmarks.md).

Measures the GPU's bf16 matmul peak first, then trains ``llama-1b`` with ``trainers.fsdp`` on
every visible GPU in bf16 for a few steps without and with ``--compile``, and prints tokens/s,
MFU against that peak, peak memory and compile time. Random token ids in a raw ``.bin`` file
stand in for data (throughput does not depend on them). Under 8 minutes on one datacenter GPU.
``--quick`` runs the same path on the CPU with ``llama-tiny`` (a smoke check for CI; bf16
only where the CPU multiplies bf16 in hardware, else fp32).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import harness
from bench.harness import BenchError
from bench.peak import measure_peak
from trainers.core.metrics import bf16_matmul_hardware
from trainers.options.model_names import model_shape

OVERRIDES = {"steps": 1, "micro_batch": 1, "nproc": 0}
QUICK = {"model": "llama-tiny", "seq_len": 64, "micro_batch": 2, "warmup": 3, "steps": 2,
         "nproc": 2, "device": "cpu", "peak_sizes": (256,), "peak_seconds": 0.2,
         "timeout_s": 900.0}
MFU_GOAL = 0.45  # on a datacenter GPU


@dataclass
class Plan:
    model: str = "llama-1b"
    seq_len: int = 2048
    micro_batch: int = 4  # sequences per rank per step
    warmup: int = 3  # the trainer's summary leaves out its first 3 steps (compilation)
    steps: int = 20  # steps after those
    nproc: int = 0  # ranks; 0: every visible GPU
    device: str = "cuda"
    peak_sizes: tuple[int, ...] = (4096, 8192)
    peak_seconds: float = 1.0
    timeout_s: float = 420.0


def token_file(path: Path, vocab: int, tokens: int) -> Path:
    """A raw uint32 array of ``tokens`` random ids below ``vocab`` at ``path``."""
    np.random.default_rng(0).integers(0, vocab, tokens, dtype=np.uint32).tofile(path)
    return path


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """The bf16 peak, then one FSDP run without and one with ``--compile``."""
    device = torch.device(plan.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("no CUDA device is visible; run with --quick for the CPU smoke check")
    nproc = plan.nproc or (torch.cuda.device_count() if device.type == "cuda" else 1)
    hardware = bf16_matmul_hardware(device)
    dtype = "bf16" if hardware else "fp32"
    peak = measure_peak(plan.peak_sizes, plan.peak_seconds,
                        torch.bfloat16 if hardware else torch.float32, device)
    shape = model_shape(plan.model)
    steps = plan.warmup + plan.steps
    data = token_file(scratch / "ids.bin", shape.vocab_size,
                      2 * steps * nproc * plan.micro_batch * (plan.seq_len + 1))
    runs = {}
    for compiled in (False, True):
        args = ["--model", plan.model, "--seq-len", str(plan.seq_len), "--device", plan.device,
                "--dtype", dtype, "--batch-size", str(plan.micro_batch * nproc),
                "--steps", str(steps), "--warmup-steps", "1", "--eval-every", "0",
                "--checkpoint-every", "0", "--tensorboard", "false", "--resume", "none",
                "--log-every", "5", "--peak-tflops", f"{peak['peak_flops'] / 1e12:.6g}",
                "--data", str(data), "--token-dtype", "uint32",
                "--vocab-size", str(shape.vocab_size), *(["--compile"] if compiled else [])]
        name = "compiled" if compiled else "eager"
        result = harness.run_trainer("trainers.fsdp", args, nproc, scratch, name, plan.timeout_s)
        summary = result["summary"]
        runs[name] = {"command": result["command"], "wall_s": result["wall_s"],
                      **{k: summary.get(k) for k in ("tokens_per_s", "mfu", "peak_memory_bytes",
                                                     "compile_time_s", "final_loss")}}
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else
            harness.host_info()["cpu"], "nproc": nproc, "dtype": dtype,
            "bf16_hardware": hardware, "peak": peak, "runs": runs}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """MFU of both runs against the goal, on a GPU only (the CPU smoke check has none)."""
    if report["plan"]["device"] != "cuda":
        return []
    return [{"name": f"bf16 MFU, fsdp, {name}", "value": run["mfu"], "target": MFU_GOAL,
             "pass": run["mfu"] >= MFU_GOAL} for name, run in report["runs"].items()]


def table(report: dict[str, Any]) -> str:
    plan, peak = report["plan"], report["peak"]
    goal = {c["name"].rsplit(", ", 1)[1]: c["pass"] for c in checks(report)}
    rows = [("run", "tokens/s", "MFU", "peak memory", "compile", "MFU >= 0.45")]
    for name, run in report["runs"].items():
        compile_s = run.get("compile_time_s")
        rows.append((name, f"{run['tokens_per_s']:,.0f}", f"{run['mfu']:.3f}",
                     f"{run['peak_memory_bytes'] / 2**30:.2f} GiB",
                     f"{compile_s:.1f}s" if compile_s is not None else "-",
                     {True: "pass", False: "MISS"}.get(goal.get(name), "n/a")))
    return "\n".join([
        f"{plan['model']} under FSDP on {report['nproc']} x {report['device']}, "
        f"{report['dtype']}, {plan['micro_batch']} x {plan['seq_len']} tokens per rank per step",
        f"measured {report['dtype']} matmul peak: {peak['peak_flops'] / 1e12:.1f} TFLOP/s per "
        f"device (n={peak['best_size']})", "", harness.columns(rows)])


if __name__ == "__main__":
    raise SystemExit(harness.main())
