"""The planner follows the decision guide; components refuse jobs that cannot fit; an
out-of-memory step explains itself."""

from __future__ import annotations

import re
import sys

import pytest

from components.cpu_memory import check_cpu_memory
from components.ddp import ddp
from components.errors import ComponentArgumentError
from components.fsdp import fsdp
from components.pipeline import pipeline
from tests.support.processes import run_command, run_forked
from tests.support.runs import torchx_cli
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError
from trainers.planning.planner import GIB, candidates, job_candidate, recommend
from trainers.sizing.memory_formulas import Adapters, activation_bytes
from trainers.sizing.projection import DEFAULT_MATMUL_EFFICIENCY
from trainers.sizing.shapes import MODEL_SIZES


def test_a_model_that_fits_one_device_gets_ddp():
    best = recommend(MODEL_SIZES["125m"], 1024, 256, 8, 1, 80 * GIB, "bf16", "cuda")
    assert best.trainer == "ddp" and not best.checkpointing
    assert best.micro_batch * best.grad_accum * 8 == 256


def test_a_batch_that_does_not_fit_gets_accumulation_then_checkpointing():
    roomy = recommend(MODEL_SIZES["125m"], 1024, 256, 8, 1, 80 * GIB, "bf16", "cuda")
    tight = recommend(MODEL_SIZES["125m"], 1024, 256, 8, 1, 8 * GIB, "bf16", "cuda")
    assert tight.trainer == "ddp"
    assert tight.micro_batch < roomy.micro_batch and tight.grad_accum > roomy.grad_accum


def test_a_model_that_does_not_fit_gets_fsdp_then_more_parallelism():
    assert recommend(MODEL_SIZES["1b"], 2048, 256, 8, 1, 16 * GIB, "bf16",
                     "cuda").trainer == "fsdp"
    assert recommend(MODEL_SIZES["7b"], 2048, 256, 8, 1, 80 * GIB, "bf16",
                     "cuda").trainer == "fsdp"


def test_nothing_fits_names_the_smallest_configuration():
    with pytest.raises(ConfigError, match=r"no configuration fits 8\.0 GiB per device: the "
                                          r"smallest, fsdp zero3 \(dp 8\).*needs 1\d\.\d GiB"):
        recommend(MODEL_SIZES["7b"], 2048, 256, 8, 1, 8 * GIB, "bf16", "cuda")


def test_gpipe_holds_more_micro_batches_than_1f1b():
    def job(schedule: str):
        cfg = parse_config(["--model", "small", "--pp", "2", "--schedule", schedule,
                            "--microbatches", "8"], "pipeline", world_sizes=[2],
                           check_paths=False)
        return job_candidate(cfg, "pipeline", 2, "cpu")

    gpipe, one_f_one_b = job("gpipe"), job("1f1b")
    assert (gpipe.in_flight, one_f_one_b.in_flight) == (8, 2)  # all m vs pp micro-batches
    # GPipe's last stage holds all 8 with the output side; 1F1B's first stage holds 2
    # without it, its last stage 1 with it.
    seq = parse_config(["--model", "small"], "ddp", world_sizes=[1], check_paths=False).seq_len
    last = gpipe.anatomy.activations
    first = activation_bytes(MODEL_SIZES["small"], gpipe.micro_batch, seq, "fp32", False,
                             pp=2, output_side=False)
    assert first < last
    assert gpipe.peak_bytes - one_f_one_b.peak_bytes == 8 * last - max(2 * first, last)


def test_3d_when_nothing_simpler_fits():
    """llama-8b at 8k tokens on 2 nodes of 8 x 20 GiB, a global batch of 8: FSDP cannot split
    8 sequences over 16 ranks, tensor parallelism alone does not fit, a pipeline of pp 2 x dp
    8 leaves each replica one sequence, fewer than the 2 micro-batches 1F1B needs."""
    best = recommend(MODEL_SIZES["llama-8b"], 8192, 8, 8, 2, 20 * GIB, "bf16", "cuda")
    assert (best.trainer, best.layout.sharding) == ("pipeline", "zero3")
    assert best.layout.tp > 1 and best.layout.dp > 1 and best.layout.pp == 2
    assert 8 % best.layout.tp == 0  # TP inside a node


def _plan(*args: str) -> str:
    return run_forked("trainers.planning.plan", args).stdout


def test_plan_command_prints_the_table_and_a_command():
    out = _plan("--model", "1b", "--device-memory-gb", "16")
    assert "fsdp zero3 (dp 8)" in out and "recommended: fsdp" in out
    assert ("torchx run -s slurm components/fsdp.py:fsdp -j 1x8 --gpu 8 --device_memory_gb 16 "
            "--cpu 64 --memMB 262144 -- --model 1b") in out


# (planner arguments) across models, node counts, GPU types, CPU plans and every strategy
# the planner recommends; at most 2 nodes, the local Slurm cluster's partition size.
PLANS = [
    ("--model", "1b", "--device-memory-gb", "16"),  # fsdp
    ("--model", "small", "--gpu-type", "l4", "--global-batch", "64"),  # ddp
    ("--model", "7b", "--nodes", "2", "--gpu-type", "a100-40gb", "--global-batch", "64"),
    ("--model", "llama-8b", "--nodes", "2", "--devices-per-node", "4", "--gpu-type", "h100",
     "--global-batch", "32", "--seq-len", "4096"),
    ("--model", "7b", "--nodes", "2", "--device-memory-gb", "24", "--global-batch", "8"),  # tp
    ("--model", "llama-8b", "--nodes", "2", "--device-memory-gb", "20", "--global-batch", "8",
     "--seq-len", "8192"),  # pipeline x tp x fsdp
    ("--model", "small", "--device", "cpu", "--devices-per-node", "2", "--device-memory-gb",
     "2", "--global-batch", "16"),
]


def test_every_command_the_planner_prints_is_accepted_on_kubernetes():
    assert_planner_commands_accepted("kubernetes")  # Slurm's: tests/system/test_slurm_commands.py


def assert_planner_commands_accepted(scheduler: str) -> None:
    """Each command the planner prints for ``scheduler``, dry-run as printed (no workspace
    snapshot) from the repository root, whose .torchxconfig holds the scheduler's settings."""
    trainers = set()
    for plan in PLANS:
        out = _plan(*plan, "--scheduler", scheduler)
        (command,) = [line.strip() for line in out.splitlines()
                      if line.strip().startswith("torchx run ")]
        words = command.split()
        trainers.add(words[4])
        proc = torchx_cli("run", "--dryrun", "--workspace", "", *words[2:])
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert "=== SCHEDULER REQUEST ===" in proc.stdout
    assert trainers >= {"components/ddp.py:ddp", "components/fsdp.py:fsdp"}
    assert "components/tensor_parallel.py:tensor_parallel" in trainers
    assert "components/pipeline.py:pipeline" in trainers


@pytest.mark.parametrize("args, message", [
    (["--device-memory-gb", "0"], "--device-memory-gb must be positive"),
    (["--nodes=-1"], "--nodes must be positive"),
    (["--seq-len", "9000"], "--seq-len must be in 1..2048"),
    (["--model", "huge"], "--model huge: not a built-in size"),
    (["--dtype", "fp8"], "invalid choice: 'fp8'"),
    (["--heads", "5"], "--heads 5 does not divide the hidden size 4096"),
    (["--model", "7b", "--device-memory-gb", "4"], "no configuration fits 4.0 GiB"),
    (["--lora-rank=-1"], "--lora-rank must be >= 0"),
    (["--lora-targets", "wq"], "--lora-targets applies only to LoRA; pass --lora-rank R"),
    (["--model", "llama-tiny", "--lora-rank", "4", "--lora-targets", "nope"],
     "--lora-targets nope matches no linear layer of a llama model; pass some of "),
    (["--peak-tflops", "500"], "--peak-tflops without a --gpu-type of the table needs the "
                               "fabric: pass --intra-node-gbps B and --inter-node-gbps B"),
    (["--gpu-type", "h100", "--matmul-efficiency", "1.5"],
     "--matmul-efficiency is a share of the peak, at most 1"),
    (["--gpu-type", "h100", "--inter-node-gbps=-1"], "--inter-node-gbps must be >= 0"),
    (["--device", "cpu", "--peak-tflops", "1"], "--peak-tflops describes GPUs"),
])
def test_plan_command_rejects_bad_input_in_one_line(args, message):
    proc = run_forked("trainers.planning.plan", args, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("trainers.planning.plan: error: ") and message in line


PROJECTED = re.compile(r"^projected: ([\d,]+) tokens/s per device, MFU (0\.\d+), ([\d,.]+) "
                       r"device-hours per billion tokens$", re.MULTILINE)


def _projected(out: str) -> tuple[float, float, float]:
    (match,) = PROJECTED.findall(out)
    return tuple(float(x.replace(",", "")) for x in match)


def test_the_plan_projects_each_configuration_and_prints_a_line_a_script_reads():
    out = _plan("--model", "7b", "--gpu-type", "h100", "--nodes", "4", "--global-batch", "512")
    assert "tok/s/dev   MFU" in out.splitlines()[1]
    rows = out.splitlines()[2:7]
    assert all(re.search(r" [\d,]+ 0\.\d{3}$", row) for row in rows), rows
    tokens, mfu, hours = _projected(out)
    # The three figures agree: MFU = tokens/s x FLOPs per token / peak; hours = 1e9 / tokens.
    fpt = MODEL_SIZES["7b"].flops_per_token(2048)
    assert mfu == pytest.approx(tokens * fpt / 989.4e12, abs=6e-4)
    assert hours == pytest.approx(1e9 / tokens / 3600, rel=2e-3)
    assert 0 < mfu <= DEFAULT_MATMUL_EFFICIENCY
    # A slower fabric and a lower efficiency each cost throughput; the flags override the table.
    slow = _projected(_plan("--model", "7b", "--gpu-type", "h100", "--nodes", "4",
                            "--global-batch", "512", "--inter-node-gbps", "1",
                            "--intra-node-gbps", "1"))
    assert slow[0] < tokens
    assert _projected(_plan("--model", "7b", "--gpu-type", "h100", "--nodes", "4",
                            "--global-batch", "512", "--matmul-efficiency", "0.2"))[0] < tokens
    # A slower memory costs the work that is not matmuls more.
    assert _projected(_plan("--model", "7b", "--gpu-type", "h100", "--nodes", "4",
                            "--global-batch", "512", "--hbm-gbps", "100"))[0] < tokens


def test_the_projection_needs_a_known_peak_and_scales_on_request():
    out = _plan("--model", "1b", "--device-memory-gb", "16")
    assert "(no projection for this GPU: pass --gpu-type" in out and "projected:" not in out
    out = _plan("--model", "1b", "--device-memory-gb", "16", "--peak-tflops", "312",
                "--intra-node-gbps", "300", "--inter-node-gbps", "25", "--scaling")
    _projected(out)
    fp32 = _plan("--model", "1b", "--gpu-type", "h100", "--dtype", "fp32")
    assert "(no projection for fp32 (the table's peaks are bf16)" in fp32
    _projected(_plan("--model", "1b", "--gpu-type", "h100", "--dtype", "fp32", "--peak-tflops",
                     "494.7"))  # the fabric still from the table
    scaling_row = re.compile(r"^ +[\d,]+ +[\d,]+ +[\d,]+ 0\.")
    scaled = [line.split() for line in out.splitlines() if scaling_row.match(line)]
    assert [int(r[0].replace(",", "")) for r in scaled] == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert all(int(r[1].replace(",", "")) == 256 // 8 * int(r[0].replace(",", ""))
               for r in scaled)  # weak scaling: the batch per device stays


def test_custom_shape():
    out = run_forked("trainers.planning.plan", [
        "--layers", "4", "--heads", "8", "--hidden", "512", "--vocab", "1000", "--context",
        "128", "--device", "cpu", "--devices-per-node", "2", "--device-memory-gb", "4",
        "--global-batch", "16"]).stdout
    assert "recommended: ddp" in out


def test_components_refuse_a_job_that_cannot_fit():
    ddp("--model", "tiny")  # 2 GiB per rank on the default CPU node: fits
    with pytest.raises(ComponentArgumentError, match=r"trainers.ddp: --model 1b needs .* GiB "
                                                     r"per rank, devices have 16.00 "
                                                     r"\(14.40 usable\); try trainers.fsdp"):
        ddp("--model", "1b", "--dtype", "bf16", gpu=8, j="1x8", device_memory_gb=16)
    # A CPU node of 4096 MB for 2 processes: refused by a scheduler that enforces the request
    # (components/cpu_memory.py), in the dry run before anything is submitted.
    (role,) = fsdp("--model", "1b").roles
    with pytest.raises(ComponentArgumentError, match="no configuration fits 2.0 GiB"):
        check_cpu_memory("slurm", role)
    pipeline("--model", "small", "--pp", "2", "--schedule", "1f1b", "--microbatches", "8",
             "--batch-size", "8")


LORA_8B = ("--model", "llama-8b", "--lora-rank", "16", "--nodes", "1", "--devices-per-node",
           "8", "--device-memory-gb", "40")


def test_lora_on_llama_8b_fits_8_devices_of_40_gb_and_its_command_is_accepted():
    """LoRA r=16 on one node of 8 x 40 GB: DDP with activation checkpointing (full training
    needs FSDP there); the printed command carries --lora-rank 16 and dry-runs as printed."""
    out = _plan(*LORA_8B)
    assert "recommended: ddp (dp 8), micro-batch 2 x 16 accumulation, activation checkpointing"\
        in out
    assert ("torchx run -s slurm components/ddp.py:ddp -j 1x8 --gpu 8 --device_memory_gb 40 "
            "--cpu 64 --memMB 262144 -- --model llama-8b --batch-size 256 --dtype bf16 "
            "--grad-accum 16 --activation-checkpointing --lora-rank 16") in out
    assert "recommended: fsdp" in _plan(*[a for a in LORA_8B if a not in ("--lora-rank", "16")])
    out = _plan(*LORA_8B, "--scheduler", "kubernetes")
    (command,) = [line.strip() for line in out.splitlines()
                  if line.strip().startswith("torchx run ")]
    proc = torchx_cli("run", "--dryrun", "--workspace", "", *command.split()[2:])
    assert proc.returncode == 0, (command, proc.stderr[-2000:])
    assert "--lora-rank" in proc.stdout


def test_lora_candidates_are_the_trainers_that_serve_lora():
    """Where only tensor or pipeline parallelism would fit, a LoRA plan has none to offer."""
    shape, adapters = MODEL_SIZES["llama-8b"], Adapters(16)
    trainers = {c.trainer for c in candidates(shape, 8192, 16, 8, 2, "bf16", "cuda", adapters)}
    assert trainers == {"ddp", "fsdp"}
    assert {c.trainer for c in candidates(shape, 8192, 16, 8, 2, "bf16", "cuda")} == {
        "ddp", "fsdp", "tensor_parallel", "pipeline"}
    with pytest.raises(ConfigError, match="no configuration fits 4.0 GiB"):
        recommend(shape, 8192, 16, 8, 2, 4 * GIB, "bf16", "cuda", adapters)


def test_the_pre_flight_prices_lora_jobs():
    """A LoRA job the full-training price would refuse is scheduled; its candidate holds
    adapter-sized gradients."""
    job = ["--model", "llama-8b", "--dtype", "bf16", "--batch-size", "256", "--grad-accum",
           "16", "--activation-checkpointing"]
    ddp(*job, "--lora-rank", "16", gpu=8, j="1x8", device_memory_gb=40)
    with pytest.raises(ComponentArgumentError, match="try trainers.fsdp"):
        ddp(*job, gpu=8, j="1x8", device_memory_gb=40)
    cfg = parse_config([*job, "--lora-rank", "16"], "ddp", world_sizes=[8])
    assert job_candidate(cfg, "ddp", 8, "cuda").anatomy.grads == 6_815_744 * 4


@pytest.mark.slow
def test_out_of_memory_prints_the_anatomy_and_what_to_try(tmp_path):
    # 5 GiB of address space (util-linux's prlimit): the step's activations do not fit
    cmd = ["prlimit", f"--as={5 * GIB}", sys.executable, "-m", "trainers.ddp", "--model",
           "small", "--batch-size", "192",
           "--steps", "2", "--output-dir", str(tmp_path), "--peak-tflops", "1",
           "--tensorboard", "false", "--eval-every", "0", "--train-samples", "256"]
    proc = run_command(cmd)
    assert proc.returncode == 1
    assert "trainers.ddp: out of memory" in proc.stderr and "Traceback" not in proc.stderr
    assert "activations" in proc.stderr and "--activation-checkpointing" in proc.stderr
    assert "python -m trainers.planning.plan --model small --global-batch 192" in proc.stderr
