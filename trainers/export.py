"""Export a run's checkpoint as a Hugging Face model directory: ``python -m trainers.export RUN
OUT``.

Writes config.json, model.safetensors, tokenizer.json and tokenizer_config.json, so that
``AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)`` load
the run offline. Works on a checkpoint of any trainer at any world size, in one process;
needs the ``hf`` extra (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from trainers.torchfree.config import OneLineParser, exit_on_config_error
from trainers.torchfree.errors import ConfigError
from trainers.torchfree.model_names import model_shape
from trainers.torchfree.paths import check_output, check_run


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trainers.export", description=__doc__.splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("run", type=Path, help="a run directory (its --output-dir) or one of "
                        "its checkpoints/step_N directories")
    parser.add_argument("out", type=Path, help="the directory to write (new or empty)")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="STEP",
                        help="the checkpoint of this step (default: the newest intact one)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    with exit_on_config_error("trainers.export"):
        args = _parser().parse_args(argv)
        if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
            raise ConfigError(f"{args.out} already exists and is not an empty directory; "
                              "pass a new or empty OUT")
        check_output(args.out, "", kind="directory")
        check_run(args.run)
        try:
            from trainers.core.hf_export import CONVERTERS, model_family, write_tokenizer
            from trainers.core.run_model import load_run_model
        except ImportError as err:
            raise ConfigError(f"exporting needs the hf extra ({err.name} is missing); "
                              "pip install -e '.[hf]'") from None
        model, config = load_run_model(args.run, args.checkpoint)
        convert = CONVERTERS[model_family(config)]
        args.out.mkdir(parents=True, exist_ok=True)
        convert(model, config, args.out)
        write_tokenizer(config, args.out,
                        config["seq_len"] or model_shape(config["model"]).max_seq_len)
    print(f"exported {args.run} ({config['model']}) to {args.out}")


if __name__ == "__main__":
    main()
