"""Memory anatomy per rank: ``python -m trainers.memory --model 1b --devices 8``.

Prints parameters, gradients, AdamW state, activations and gathered parameters per rank
under DDP and ZeRO-1/2/3, as :mod:`trainers.torchfree.memory_formulas` predicts them.
"""

from __future__ import annotations

from trainers.torchfree.config import OneLineParser, exit_on_config_error
from trainers.torchfree.errors import ConfigError
from trainers.torchfree.memory_formulas import anatomy_table
from trainers.torchfree.model_names import MODEL_HELP, model_shape


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="trainers.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1b", help=MODEL_HELP)
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=0, help="0: the model's context")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--devices", type=int, default=8, help="data-parallel ranks")
    with exit_on_config_error("trainers.memory"):
        args = parser.parse_args(argv)
        for flag in ("micro_batch", "devices"):
            if getattr(args, flag) < 1:
                raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got "
                                  f"{getattr(args, flag)}; pass a positive one")
        shape = model_shape(args.model)
        seq = args.seq_len or shape.max_seq_len
        if not 0 < seq <= shape.max_seq_len:
            raise ConfigError(f"--seq-len must be in 1..{shape.max_seq_len}, got {seq}; pass "
                              "one in that range or 0 (the model's context)")
    print(f"{args.model}: {shape.num_params() / 1e9:.2f}B parameters, micro-batch "
          f"{args.micro_batch} x {seq} tokens, {args.dtype}"
          + (", activation checkpointing" if args.activation_checkpointing else ""))
    print(anatomy_table(shape, args.micro_batch, seq, args.dtype, args.activation_checkpointing,
                        args.devices))

if __name__ == "__main__":
    main()
