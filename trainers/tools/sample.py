"""Generate text from a run's checkpoint: ``python -m trainers.tools.sample RUN --prompt TEXT``.

Works on a checkpoint of any trainer at any world size, in one process on the CPU: the model
is rebuilt from the run's config and given the checkpoint's weights
(:func:`trainers.tools.run_model.load_run_model`); text goes through the run's tokenizer.
RUN is a local directory or a bucket URL (``s3://bucket/runs/exp1``, read through fsspec).
Prints the prompt followed by the generated text.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.formats.tokenizer import BYTES, load_tokenizer
from trainers.options.model_names import model_shape
from trainers.options.paths import check_run
from trainers.runs.storage import location


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trainers.tools.sample", description=__doc__.splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("run", help="a run directory or bucket URL (its --output-dir) or one "
                        "of its checkpoints/step_N directories")
    parser.add_argument("--prompt", required=True,
                        help="text to continue; a prompt longer than the model's context "
                             "(the run's --seq-len) keeps only its last tokens")
    parser.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy (argmax)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="sample among the k most likely tokens only (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--stop-at-end", action="store_true",
                        help="stop at the tokenizer's end-of-text id, as a model fine-tuned on "
                             "instruction data ends its answers (docs/finetuning.md)")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="STEP",
                        help="the checkpoint of this step (default: the newest intact one)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    with exit_on_config_error("trainers.tools.sample"):
        args = _parser().parse_args(argv)
        if args.tokens <= 0:
            raise ConfigError(f"--tokens must be positive, got {args.tokens}; pass 1 or more")
        if not 0 <= args.temperature < math.inf:
            raise ConfigError(f"--temperature must be >= 0, got {args.temperature:g}; pass 0 "
                              "(greedy) or a positive number")
        if args.top_k < 0:
            raise ConfigError(f"--top-k must be >= 0, got {args.top_k}; pass 0 (all tokens) or "
                              "k")
        if not args.prompt:
            raise ConfigError("--prompt is empty; pass at least one character to continue")
        run = location(args.run, "RUN")
        check_run(run)
        import torch  # here: the checks above answer without loading torch

        from trainers.tools.generate import generate
        from trainers.tools.run_model import load_run_model

        model, config = load_run_model(run, args.checkpoint)
        codec = load_tokenizer(config.get("tokenizer", BYTES))
        shape = model_shape(config["model"])
        vocab = shape.vocab_size
        if codec.vocab_size > vocab:
            raise ConfigError(f"the run's tokenizer has {codec.vocab_size} ids, more than the "
                              f"model's vocabulary of {vocab}")
        prompt = codec.encode([args.prompt])[0].tolist()
        if not prompt:
            raise ConfigError(f"--prompt {args.prompt!r}: the run's tokenizer makes no ids of "
                              "it; pass other text")
        context = config["seq_len"] or shape.max_seq_len
        generator = torch.Generator().manual_seed(args.seed)
        new = generate(model, prompt[-context:], args.tokens, context, codec.vocab_size,
                       args.temperature, args.top_k, generator,
                       codec.end_of_text if args.stop_at_end else None)
    print(codec.decode(prompt + new))


if __name__ == "__main__":
    main()
