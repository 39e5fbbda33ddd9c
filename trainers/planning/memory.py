"""Memory anatomy per rank: ``python -m trainers.planning.memory --model 1b --devices 8``.

Prints parameters, gradients, AdamW state, activations and gathered parameters per rank
under DDP and ZeRO-1/2/3, as :mod:`trainers.sizing.memory_formulas` predicts them; with
``--tp`` and ``--pp`` those of a 3-D layout's heaviest stage (``--devices 16 --tp 2 --pp 2``:
ZeRO over 4 pipelines); with ``--lora-rank R`` (and ``--lora-targets``) those of a LoRA run:
the frozen base, no gradients or optimizer state but the adapters'.
"""

from __future__ import annotations

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.options.model_names import MODEL_HELP, model_shape
from trainers.sizing.memory_formulas import (
    FAMILIES,
    Adapters,
    adapter_params,
    anatomy_table,
)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="trainers.planning.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1b", help=MODEL_HELP)
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=0, help="0: the model's context")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--devices", type=int, default=8,
                        help="ranks: data parallel x --tp x --pp")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (the heaviest shown)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA: rank of the adapters (0: train every parameter)")
    parser.add_argument("--lora-targets", default="",
                        help="LoRA: comma-separated linear layers (default: the family's)")
    with exit_on_config_error("trainers.planning.memory"):
        args = parser.parse_args(argv)
        if args.lora_rank < 0:
            raise ConfigError(f"--lora-rank must be >= 0 (0: train every parameter), got "
                              f"{args.lora_rank}")
        for flag in ("micro_batch", "devices", "tp", "pp"):
            if getattr(args, flag) < 1:
                raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got "
                                  f"{getattr(args, flag)}; pass a positive one")
        if args.devices % (args.tp * args.pp):
            raise ConfigError(f"--tp {args.tp} x --pp {args.pp} does not divide --devices "
                              f"{args.devices}; pass degrees whose product divides it")
        shape = model_shape(args.model)
        if shape.n_layers % args.pp:
            raise ConfigError(f"--pp {args.pp} does not divide the {args.model} model's "
                              f"{shape.n_layers} blocks; pass a --pp that divides them")
        seq = args.seq_len or shape.max_seq_len
        if not 0 < seq <= shape.max_seq_len:
            raise ConfigError(f"--seq-len must be in 1..{shape.max_seq_len}, got {seq}; pass "
                              "one in that range or 0 (the model's context)")
        adapters = Adapters.of(args.lora_rank, args.lora_targets)
        lora = ""
        if adapters is not None:
            if shape.family not in FAMILIES:
                raise ConfigError(f"--lora-rank: the anatomy knows the linear layers of the "
                                  f"{', '.join(FAMILIES)} families only; drop --lora-rank")
            lora = (f", LoRA rank {args.lora_rank}: "
                    f"{adapter_params(shape, adapters)[0] / 1e6:.2f}M adapter parameters")
    print(f"{args.model}: {shape.num_params() / 1e9:.2f}B parameters, micro-batch "
          f"{args.micro_batch} x {seq} tokens, {args.dtype}"
          + (", activation checkpointing" if args.activation_checkpointing else "") + lora)
    print(anatomy_table(shape, args.micro_batch, seq, args.dtype, args.activation_checkpointing,
                        args.devices, args.tp, args.pp, adapters))

if __name__ == "__main__":
    main()
