"""Will it fit, and how to split it: ``python -m trainers.plan --model 7b --device-memory-gb 80``.

Prints the memory per rank of each configuration the planner (:mod:`trainers.spec.planner`)
prices, and the first of the decision guide's configurations that fits, as a ``torchx run``
command.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainers.spec.config import OneLineParser, exit_on_config_error
from trainers.spec.errors import ConfigError
from trainers.spec.models import MODEL_HELP, model_shape
from trainers.spec.planner import GIB, custom_shape, recommend, table
from trainers.spec.registry import TRAINERS


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineParser(prog="trainers.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="7b", help=MODEL_HELP)
    parser.add_argument("--seq-len", type=int, default=0, help="0: the model's context")
    parser.add_argument("--global-batch", type=int, default=256, help="sequences per step")
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--device-memory-gb", type=float, default=80.0)
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    shape_group = parser.add_argument_group("a shape of your own (overrides --model's)")
    for flag in ("layers", "heads", "hidden", "vocab", "context"):
        shape_group.add_argument(f"--{flag}", type=int, default=0)
    with exit_on_config_error("trainers.plan"):
        args = parser.parse_args(argv)
        for flag in ("global_batch", "devices_per_node", "nodes", "device_memory_gb"):
            if getattr(args, flag) <= 0:
                raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got "
                                  f"{getattr(args, flag)}")
        shape = custom_shape(model_shape(args.model), args.layers, args.heads, args.hidden,
                             args.vocab, args.context)
        seq = args.seq_len or shape.max_seq_len
        if not 0 < seq <= shape.max_seq_len:
            raise ConfigError(f"--seq-len must be in 1..{shape.max_seq_len}, got {seq}")
        devices = args.devices_per_node * args.nodes
        print(f"{args.model}: {shape.num_params() / 1e9:.2f}B parameters, {seq} tokens, "
              f"{args.dtype}, {args.nodes} x {args.devices_per_node} devices of "
              f"{args.device_memory_gb:g} GiB")
        print(table(shape, seq, args.dtype, devices, args.device))
        best = recommend(shape, seq, args.global_batch, args.devices_per_node, args.nodes,
                         int(args.device_memory_gb * GIB), args.dtype, args.device)
    print(f"\nrecommended: {best.describe()}: {best.peak_bytes / GIB:.1f} GiB per rank")
    print(f"  torchx run {TRAINERS[best.trainer].component} -j "
          f"{args.nodes}x{args.devices_per_node} -- --model {args.model} --batch-size "
          f"{args.global_batch} --dtype {args.dtype} {best.flags()}")

if __name__ == "__main__":
    main()
