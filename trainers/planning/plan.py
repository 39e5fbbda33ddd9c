"""Will it fit, how to split it: ``python -m trainers.planning.plan --model 7b --gpu-type h100``.

Prints the memory per rank of each configuration the planner (:mod:`trainers.planning.planner`)
prices, and the first of the decision guide's configurations that fits as a complete ``torchx
run`` command for ``--scheduler``: nodes and processes, GPUs, the GPUs' memory, the CPUs and
memory per node the component would ask for (:mod:`trainers.sizing.resources`), the image for
Kubernetes, and the trainer's options. The scheduler's own settings (Slurm partition and time,
Kubernetes queue and namespace) come from ``.torchxconfig``.

On GPUs whose peak and fabric it knows (``--gpu-type``, or ``--peak-tflops`` with
``--intra-node-gbps`` and ``--inter-node-gbps``) it also projects each configuration's
tokens/s per device and MFU (:mod:`trainers.sizing.projection`), and prints for the
recommended one the line ``projected: N tokens/s per device, MFU x, h device-hours per billion
tokens``; ``--scaling`` adds the recommended configuration weak-scaled to 8 ... 1,024 devices.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Sequence

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.options.model_names import MODEL_HELP, model_shape
from trainers.options.trainer_table import TRAINERS
from trainers.planning.planner import (
    GIB,
    Candidate,
    candidate_job,
    custom_shape,
    recommend,
    table,
)
from trainers.sizing.memory_formulas import FAMILIES, Adapters
from trainers.sizing.projection import (
    DEFAULT_MATMUL_EFFICIENCY,
    SCALES,
    Assumptions,
    Hardware,
    Job,
    Projection,
    at_scale,
    project,
)
from trainers.sizing.resources import (
    GPU_MEMORY_GB,
    GPU_PERF,
    gpu_memory_gb,
    node_request,
)
from trainers.sizing.shapes import ModelConfig

PROG = "trainers.planning.plan"
SCHEDULERS = ("slurm", "kubernetes", "local_cwd")


def main(argv: Sequence[str] | None = None) -> None:
    with exit_on_config_error(PROG):
        args = build_parser().parse_args(argv)
        shape, seq, adapters = _checked(args)
        best = _print_plan(args, shape, seq, adapters)
    print(_next_step(args, best, adapters))


def build_parser() -> OneLineParser:
    """The command's options: the job, the hardware, the projection's assumptions, a shape."""
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="7b", help=MODEL_HELP)
    parser.add_argument("--seq-len", type=int, default=0, help="0: the model's context")
    parser.add_argument("--global-batch", type=int, default=256, help="sequences per step")
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="plan torchft replica groups, one a node (components/"
                             "fault_tolerant.py): ddp or fsdp inside each node, each node's "
                             "share of --global-batch; a lost node's group heals while the "
                             "others train on (docs/reliability.md)")
    parser.add_argument("--device-memory-gb", type=float, default=80.0,
                        help="GB of one device (GPU; on --device cpu, each process's share)")
    parser.add_argument("--gpu-type", choices=list(GPU_MEMORY_GB), default=None,
                        help="the GPU model, instead of --device-memory-gb")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="slurm",
                        help="where the printed torchx run command submits the job")
    parser.add_argument("--image", default="",
                        help="container image for kubernetes (default: torchx-templates:cuda, "
                             "or :cpu with --device cpu; push it to your registry)")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA: rank of the adapters (0: train every parameter); only the "
                             "trainers that serve LoRA are planned")
    parser.add_argument("--lora-targets", default="",
                        help="LoRA: comma-separated linear layers (default: the family's)")
    proj = parser.add_argument_group(
        "projection (step time on these GPUs; the peak and fabric from --gpu-type's table, "
        f"{', '.join(GPU_PERF)}, or these flags)")
    proj.add_argument("--peak-tflops", type=float, default=0.0,
                      help="dense bf16 TFLOP/s of one GPU (0: --gpu-type's)")
    proj.add_argument("--matmul-efficiency", type=float, default=DEFAULT_MATMUL_EFFICIENCY,
                      help="share of the peak the model's matmuls reach on one GPU; measure it "
                           "on 1-2 GPUs (default: calibrated on torchtitan's 8 x H100 Llama "
                           "3.1 8B FSDP run, docs/benchmarks.md)")
    proj.add_argument("--intra-node-gbps", type=float, default=0.0,
                      help="GB/s one GPU sends inside its node, one direction (0: --gpu-type's)")
    proj.add_argument("--inter-node-gbps", type=float, default=0.0,
                      help="GB/s one GPU sends to other nodes, one direction (0: --gpu-type's)")
    proj.add_argument("--hbm-gbps", type=float, default=0.0,
                      help="GB/s of one GPU's memory, for the work that is not matmuls (0: "
                           "--gpu-type's; without one, that work is not priced)")
    proj.add_argument("--link-efficiency", type=float, default=Assumptions.link_efficiency,
                      help="share of the line rate a large collective reaches")
    proj.add_argument("--collective-latency-us", type=float,
                      default=Assumptions.latency_s * 1e6,
                      help="latency of one ring or tree step in microseconds")
    proj.add_argument("--scaling", action="store_true",
                      help="also project the recommended configuration on 8 ... 1,024 GPUs")
    shape_group = parser.add_argument_group("a shape of your own (overrides --model's)")
    for flag in ("layers", "heads", "hidden", "vocab", "context"):
        shape_group.add_argument(f"--{flag}", type=int, default=0)
    return parser


def _checked(args: argparse.Namespace) -> tuple[ModelConfig, int, Adapters | None]:
    """The shape, sequence length and LoRA adapters ``args`` ask for; ConfigError for any
    argument that cannot work (``--gpu-type`` sets ``args.device_memory_gb``)."""
    _check_numbers(args)
    if args.gpu_type is not None:
        if args.device == "cpu":
            raise ConfigError("--gpu-type describes GPUs; drop it with --device cpu")
        args.device_memory_gb = gpu_memory_gb(args.gpu_type)
    shape = custom_shape(model_shape(args.model), args.layers, args.heads, args.hidden,
                         args.vocab, args.context)
    if args.fault_tolerant and args.global_batch % args.nodes:
        raise ConfigError(f"--fault-tolerant: --global-batch {args.global_batch} does not split "
                          f"over {args.nodes} replica groups (--nodes); pass a multiple of "
                          f"{args.nodes}")
    seq = args.seq_len or shape.max_seq_len
    if not 0 < seq <= shape.max_seq_len:
        raise ConfigError(f"--seq-len must be in 1..{shape.max_seq_len}, got {seq}; pass "
                          "one in that range or 0 (the model's context)")
    return shape, seq, _adapters(args, shape.family)


def _print_plan(args: argparse.Namespace, shape: ModelConfig, seq: int,
                adapters: Adapters | None) -> Candidate:
    """Print the job, the table of layouts, the recommended one and its projection (or why
    there is none); return the recommended candidate."""
    devices = args.devices_per_node * args.nodes
    hardware = _hardware(args)
    assume = Assumptions(matmul_efficiency=args.matmul_efficiency,
                         link_efficiency=args.link_efficiency,
                         latency_s=args.collective_latency_us * 1e-6,
                         param_bytes=2 if args.dtype == "bf16" else 4)
    projection = (functools.partial(project, hw=hardware, assume=assume)
                  if hardware is not None and adapters is None else None)
    print(f"{args.model}: {shape.num_params() / 1e9:.2f}B parameters, {seq} tokens, "
          f"{args.dtype}, {args.nodes} x {args.devices_per_node} devices of "
          f"{args.device_memory_gb:g} GiB"
          + (f", LoRA rank {args.lora_rank}" if adapters else ""))
    print(table(shape, seq, args.dtype, devices, args.device, adapters, projection,
                args.global_batch))
    if args.fault_tolerant:  # each node a replica group training its share of the batch
        best = recommend(shape, seq, args.global_batch // args.nodes, args.devices_per_node, 1,
                         int(args.device_memory_gb * GIB), args.dtype, args.device, adapters)
        if best.trainer not in FAULT_TOLERANT_TRAINERS:
            raise ConfigError(f"--fault-tolerant: replica groups hold ddp or fsdp inside one "
                              f"node, and {args.model} needs {best.describe()} there; drop "
                              "--fault-tolerant (restarts from checkpoints instead) or use "
                              "devices with more memory")
    else:
        best = recommend(shape, seq, args.global_batch, args.devices_per_node, args.nodes,
                         int(args.device_memory_gb * GIB), args.dtype, args.device, adapters)
    print(f"\nrecommended: {best.describe()}: {best.peak_bytes / GIB:.1f} GiB per rank")
    if projection is not None:
        job = candidate_job(best, shape, seq, args.global_batch)
        _print_projection(job, projection(job), projection, args.scaling)
    elif args.device == "cuda":
        why = ("LoRA jobs (the projection prices full training)" if adapters else
               "fp32 (the table's peaks are bf16): pass --peak-tflops T (your GPU's fp32 "
               "or TF32 peak)" if args.dtype == "fp32" else
               f"this GPU: pass --gpu-type (one of {', '.join(GPU_PERF)}) or --peak-tflops T "
               "--intra-node-gbps B --inter-node-gbps B")
        print(f"  (no projection for {why})")
    return best


# The trainers a replica group can hold (components/fault_tolerant.py).
FAULT_TOLERANT_TRAINERS = ("ddp", "fsdp")


def _next_step(args: argparse.Namespace, best: Candidate, adapters: Adapters | None) -> str:
    """The ``torchx run`` line that trains ``best``, or for a shape of one's own what to do."""
    if any(getattr(args, flag) for flag in ("layers", "heads", "hidden", "vocab", "context")):
        return ("  (a shape of your own: give the trainers a --model that has it, e.g. "
                "MODULE:ATTR, in the command's place)")
    trainer_args = (f"--model {args.model} --batch-size {args.global_batch} --dtype {args.dtype} "
                    + best.flags() + (f" --seq-len {args.seq_len}" if args.seq_len else "")
                    + (f" --lora-rank {args.lora_rank}" if adapters else "")
                    + (f" --lora-targets {args.lora_targets}" if adapters and args.lora_targets
                       else ""))
    if args.fault_tolerant:
        return "  " + torchx_command(
            args, f"components/fault_tolerant.py:fault_tolerant --trainer {best.trainer} "
            f"--groups {args.nodes}", trainer_args)
    return "  " + torchx_command(args, TRAINERS[best.trainer].component, trainer_args)


def _hardware(args: argparse.Namespace) -> Hardware | None:
    """The GPU the projection prices (None: its peak is unknown, or --device cpu): the
    --gpu-type's row of the table (bf16 peaks: for --dtype fp32 only with --peak-tflops),
    each figure overridden by its flag; ConfigError for a peak without a fabric."""
    if args.device == "cpu":
        if args.peak_tflops:
            raise ConfigError("--peak-tflops describes GPUs; drop it with --device cpu")
        return None
    perf = GPU_PERF.get(args.gpu_type or "")
    peak = args.peak_tflops or (perf.peak_tflops if perf and args.dtype == "bf16" else 0.0)
    if not peak:
        return None
    intra = args.intra_node_gbps or (perf.intra_node_gbps if perf else 0.0)
    inter = args.inter_node_gbps or (perf.inter_node_gbps if perf else 0.0)
    if not (intra and inter):
        raise ConfigError("--peak-tflops without a --gpu-type of the table needs the fabric: "
                          "pass --intra-node-gbps B and --inter-node-gbps B (GB/s per GPU, one "
                          "direction)")
    hbm = args.hbm_gbps or (perf.hbm_gbps if perf else 0.0)
    return Hardware(peak * 1e12, intra, inter, args.devices_per_node, hbm)


def _print_projection(job: Job, best: Projection, projection: Callable[[Job], Projection],
                      scaling: bool) -> None:
    """The recommended configuration's projected line, what its step is made of, and with
    ``scaling`` the same configuration weak-scaled to 8 ... 1,024 GPUs."""
    print(best.line())
    parts = [f"compute {best.compute_s:.3g}"] + (
        [f"bubble {best.bubble_s:.3g}"] if best.bubble_s else []) + [
        f"{name} {seconds:.3g}" for name, seconds in best.exposed_s.items() if seconds]
    print(f"  step {best.step_s:.3g} s on {best.devices} GPUs: {', '.join(parts)} (exposed)")
    if not scaling:
        return
    print(f"  {'GPUs':>6} {'global batch':>12} {'tok/s/dev':>9} {'MFU':>5} "
          f"{'device-h/B tokens':>17}")
    for devices in SCALES:
        try:
            scaled = at_scale(job, devices)
            p = projection(scaled)
        except ConfigError:
            continue
        print(f"  {devices:6,} {scaled.global_batch:12,} {p.tokens_per_s_per_device:9,.0f} "
              f"{p.mfu:5.3f} {p.device_hours_per_billion_tokens:17,.1f}")


def _adapters(args: argparse.Namespace, family: str) -> Adapters | None:
    """The LoRA adapters ``args`` ask for (None: every parameter trained); ConfigError for a
    negative rank, targets without a rank, or a family whose linear layers the anatomy does
    not know."""
    if args.lora_rank < 0:
        raise ConfigError(f"--lora-rank must be >= 0 (0: train every parameter), got "
                          f"{args.lora_rank}")
    if not args.lora_rank:
        if args.lora_targets:
            raise ConfigError("--lora-targets applies only to LoRA; pass --lora-rank R (e.g. 8) "
                              "or drop --lora-targets")
        return None
    if family not in FAMILIES:
        raise ConfigError(f"--lora-rank: the planner knows the linear layers of the "
                          f"{', '.join(FAMILIES)} families only; drop --lora-rank")
    return Adapters.of(args.lora_rank, args.lora_targets)


def _check_numbers(args: argparse.Namespace) -> None:
    """ConfigError for a count or size that is not positive (a shape's may be 0: the model's)."""
    for flag in ("global_batch", "devices_per_node", "nodes", "device_memory_gb",
                 "matmul_efficiency", "link_efficiency"):
        if not 0 < getattr(args, flag) < math.inf:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got "
                              f"{getattr(args, flag)}; pass a positive one")
    for flag in ("matmul_efficiency", "link_efficiency"):
        if getattr(args, flag) > 1:
            raise ConfigError(f"--{flag.replace('_', '-')} is a share of the peak, at most 1, "
                              f"got {getattr(args, flag)}; pass one in (0, 1]")
    for flag in ("peak_tflops", "intra_node_gbps", "inter_node_gbps", "hbm_gbps",
                 "collective_latency_us"):
        if not 0 <= getattr(args, flag) < math.inf:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 0, got "
                              f"{getattr(args, flag)}; pass a positive one (0: --gpu-type's)")
    for flag in ("layers", "heads", "hidden", "vocab", "context"):
        if getattr(args, flag) < 0:
            raise ConfigError(f"--{flag} must be positive, got {getattr(args, flag)}; "
                              f"pass a positive one or drop it (0: --model's)")


def torchx_command(args: argparse.Namespace, component: str, trainer_args: str) -> str:
    """The ``torchx run`` command that submits ``component`` with ``trainer_args`` on
    ``args.nodes`` x ``args.devices_per_node`` devices to ``args.scheduler``."""
    gpus = args.devices_per_node if args.device == "cuda" else 0
    if gpus:
        memory = (f"--gpu_type {args.gpu_type}" if args.gpu_type
                  else f"--device_memory_gb {args.device_memory_gb:g}")
        cpu, mem_mb = node_request(gpus, 0, 0)
        launch = f"--gpu {gpus} {memory} --cpu {cpu} --memMB {mem_mb}"
    else:  # each process gets its share of the node's memory
        mem_mb = math.ceil(args.device_memory_gb * 1024) * args.devices_per_node
        launch = f"--cpu {node_request(0, args.devices_per_node, 0)[0]} --memMB {mem_mb}"
    image = ""
    if args.scheduler == "kubernetes":
        image = f" --image {args.image or 'torchx-templates:' + ('cuda' if gpus else 'cpu')}"
    nodes = 1 if args.fault_tolerant else args.nodes  # -j is one replica group's
    return (f"torchx run -s {args.scheduler} {component} -j {nodes}x{args.devices_per_node}"
            f"{image} {launch} -- {trainer_args}")


if __name__ == "__main__":
    main()
