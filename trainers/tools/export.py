"""A run's checkpoint as a Hugging Face directory: ``python -m trainers.tools.export RUN OUT``.

Writes config.json, model.safetensors, tokenizer.json and tokenizer_config.json, so that
``AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)`` load
the run offline. Works on a checkpoint of any trainer at any world size, in one process;
needs the ``hf`` extra (``pip install -e '.[hf]'``). RUN and OUT are local directories or
bucket URLs (``s3://bucket/runs/exp1``, through fsspec); an OUT in a bucket is written in a
scratch directory (``$TMPDIR``) first and uploaded file by file once the export is whole, so it
then holds also ``--model hf:OUT``'s directory.

A LoRA run (``--lora-rank``) exports its base as above plus its adapters in PEFT's format
(``adapter_config.json``, ``adapter_model.safetensors``: ``peft.PeftModel.from_pretrained``
loads them onto OUT's model); ``--merge`` folds them into the base weights instead and writes
no adapter files.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.options.model_names import model_shape
from trainers.options.paths import check_output, check_run
from trainers.runs.storage import RunPath, is_remote, location


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trainers.tools.export", description=__doc__.splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("run", help="a run directory or bucket URL (its --output-dir) or one "
                        "of its checkpoints/step_N directories")
    parser.add_argument("out", help="the directory or bucket URL to write (new or empty)")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="STEP",
                        help="the checkpoint of this step (default: the newest intact one)")
    parser.add_argument("--merge", action="store_true",
                        help="LoRA runs: fold the adapters into the base weights (W + B A * "
                        "alpha / rank) and write no adapter files")
    return parser


@contextlib.contextmanager
def _staged(out: RunPath) -> Iterator[Path]:
    """The local directory to write the export in: ``out`` itself, or for a bucket a scratch
    directory whose files are uploaded into ``out`` after the export is written whole."""
    if not is_remote(out):
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="export-") as scratch:
        yield Path(scratch)
        for file in sorted(Path(scratch).iterdir()):
            out.fs.put_file(str(file), (out / file.name).path)


def main(argv: Sequence[str] | None = None) -> None:
    with exit_on_config_error("trainers.tools.export"):
        args = _parser().parse_args(argv)
        run, out = location(args.run, "RUN"), location(args.out, "OUT")
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(f"{out} already exists and is not an empty directory; "
                              "pass a new or empty OUT")
        check_output(out, "", kind="directory")
        check_run(run)
        try:
            from trainers.models.lora import merge_adapters
            from trainers.tools.hf_export import (
                CONVERTERS,
                model_family,
                peft_adapter,
                write_adapter,
                write_tokenizer,
            )
            from trainers.tools.run_model import load_run_model
        except ImportError as err:
            raise ConfigError(f"exporting needs the hf extra ({err.name} is missing); "
                              "pip install -e '.[hf]'") from None
        model, config = load_run_model(run, args.checkpoint)
        convert = CONVERTERS[model_family(config)]
        lora = bool(config.get("lora_rank"))
        if args.merge and not lora:
            raise ConfigError(f"--merge folds a LoRA run's adapters in, but {run} trained "
                              "every parameter; drop --merge")
        if args.merge:
            merge_adapters(model)
        # Made before anything is written: an adapter without a counterpart is refused first.
        adapter = peft_adapter(model, config, str(out)) if lora and not args.merge else None
        with _staged(out) as folder:
            convert(model, config, folder)
            if adapter is not None:
                write_adapter(adapter, folder)
            write_tokenizer(config, folder,
                            config["seq_len"] or model_shape(config["model"]).max_seq_len)
    print(f"exported {run} ({config['model']}) to {out}")


if __name__ == "__main__":
    main()
