"""Plot runs: ``python -m trainers.tools.plot RUN [RUN ...] [-o FILE.png]``.

Draws, against the step, the training and evaluation loss, the learning rate, tokens/s and
peak memory of every run directory given (from its ``metrics.jsonl``), one colour per run and
a legend from each run's ``config.json`` (the options in which the runs differ). A pipeline run
recorded with ``--record-timeline`` also gets its last step's timeline: when each stage ran
each micro-batch's forward and backward. Needs matplotlib (``pip install -e ".[plot]"``); the
figure (:mod:`trainers.runs.run_plot`) is written as a PNG (default:
``<first RUN>/plot.png``). A RUN or the output may be a bucket URL (``s3://bucket/runs/exp1``,
through fsspec).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.options.paths import check_output
from trainers.runs.run_plot import load_run, render
from trainers.runs.storage import RunPath, is_remote, location, write_bytes_atomic


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trainers.tools.plot", description=__doc__.split("\n\n")[1])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directories or bucket URLs (a trainer's --output-dir)")
    parser.add_argument("-o", "--output", default=None,
                        help="PNG file to write, a path or URL (default: <first RUN>/plot.png)")
    return parser


def main(argv: Sequence[str] | None = None) -> RunPath:
    """Plot the runs ``argv`` names; return the PNG written."""
    with exit_on_config_error("trainers.tools.plot"):
        args = build_parser().parse_args(argv)
        runs = [load_run(location(name, "RUN")) for name in args.runs]
        output = (location(args.output, "--output") if args.output
                  else runs[0].path / "plot.png")
        check_output(output, "--output")
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise ConfigError("matplotlib is not installed; pip install -e '.[plot]'") from None
        formats = FigureCanvasBase.get_supported_filetypes()
        if output.suffix and output.suffix[1:].lower() not in formats:
            raise ConfigError(f"--output {output}: matplotlib writes no {output.suffix} files; "
                              f"pass a .png (or {', '.join('.' + f for f in sorted(formats))})")
    image = render(runs, output.suffix[1:].lower() or "png")
    if is_remote(output):  # one PUT of the whole image
        write_bytes_atomic(output, image)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_bytes(image)
    print(f"wrote {output}")
    return output


def cli() -> None:
    """The ``ttx-plot`` console script: :func:`main` (a console script exits with what its
    function returns)."""
    main()


if __name__ == "__main__":
    main()
