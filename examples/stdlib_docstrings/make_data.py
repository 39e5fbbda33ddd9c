"""An instruction set built from this interpreter's standard library with ``ast``: docstrings to
code (``python -m examples.stdlib_docstrings.make_data TOKENIZER OUT_DIR``).

Every function (and method) with a docstring and at least one statement after it becomes one
``prompt_completion`` record, its lines taken from the source and dedented to the ``def``:

- prompt: the ``def name(args):`` line(s) and the docstring's lines, as written;
- completion: the rest of the function, i.e. its body after the docstring, comments included.

A record is kept only if the whole sample (prompt, completion and the end-of-text id, tokenized
as the trainers do) fits ``--seq-len + 1`` tokens, so nothing is cut. Held out for evaluation
are the modules of the stdlib's packages (``json/decoder.py``; never a top-level module such
as ``os.py``: those are what the stdlib_code pretraining demo read) whose dotted name's
SHA-256 is 0 modulo ``--holdout-every``; their records come last in
``OUT_DIR/instructions.jsonl``, and a record that equals a held-out one is dropped from
training. Test folders are skipped.

Writes ``instructions.jsonl`` and ``prompt.txt`` (the prompt of the held-out function
``--sample-function``, for ``trainers.tools.sample``), prints one line of counts to stderr and, on
stdout, the number of held-out records and the ``--val-fraction`` that holds out exactly them.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import sysconfig
import tokenize
from collections.abc import Iterator
from pathlib import Path

from trainers.errors import ConfigError
from trainers.formats.instruction_data import encode
from trainers.formats.tokenizer import TextTokenizer, load_tokenizer

SKIPPED_FOLDERS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
Record = dict[str, str]


def stdlib_modules(root: Path) -> Iterator[tuple[str, Path]]:
    """``(dotted name, path)`` of every ``.py`` file under ``root``, sorted, outside
    :data:`SKIPPED_FOLDERS`."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if not SKIPPED_FOLDERS.intersection(parts):
            yield ".".join(parts), path


def is_held_out(module: str, every: int) -> bool:
    """Whether ``module`` is evaluated on: a package's module whose name's SHA-256 is 0
    modulo ``every`` (top-level modules are the pretraining demo's corpus, never held out)."""
    digest = int(hashlib.sha256(module.encode()).hexdigest(), 16)
    return "." in module and digest % every == 0


def _dedented(lines: list[str], first: int, last: int, indent: int) -> str:
    """Lines ``first``..``last`` (1-based, inclusive) with ``indent`` leading characters taken
    off each line that starts with that much whitespace, newline-terminated."""
    cut = [line[indent:] if not line[:indent].strip() else line
           for line in lines[first - 1:last]]
    return "\n".join(cut) + "\n"


def function_records(source: str) -> Iterator[Record]:
    """A record per function of ``source`` with a docstring and a statement after it (on a
    later line than the docstring's end)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if ast.get_docstring(node) is None or len(node.body) < 2:
            continue
        doc_end = node.body[0].end_lineno
        assert doc_end is not None and node.end_lineno is not None
        if node.body[1].lineno <= doc_end:
            continue
        yield {"prompt": _dedented(lines, node.lineno, doc_end, node.col_offset),
               "completion": _dedented(lines, doc_end + 1, node.end_lineno, node.col_offset)}


def sample_tokens(record: Record, tokenizer: TextTokenizer) -> int:
    """The tokens of ``record``'s sample, as the trainers tokenize it (end-of-text included)."""
    ids, _ = encode([(record["prompt"], False), (record["completion"], True)], tokenizer)
    return len(ids)


def build(root: Path, tokenizer: TextTokenizer, seq_len: int,
          holdout_every: int) -> tuple[list[Record], list[Record], int]:
    """The training records, the held-out records (each fitting ``seq_len + 1`` tokens,
    deduplicated, none of training's equal to a held-out one) and the modules read."""
    train: list[Record] = []
    held: list[Record] = []
    modules = 0
    for module, path in stdlib_modules(root):
        with tokenize.open(path) as file:
            source = file.read()
        modules += 1
        target = held if is_held_out(module, holdout_every) else train
        target.extend(r for r in function_records(source)
                      if sample_tokens(r, tokenizer) <= seq_len + 1)
    held = list({json.dumps(r): r for r in held}.values())
    seen = {json.dumps(r) for r in held}
    train = [r for r in {json.dumps(r): r for r in train}.values() if json.dumps(r) not in seen]
    return train, held, modules


def main(argv: list[str] | None = None) -> None:
    """Parse, build, write; one line and exit 2 for a tokenizer that does not load, no
    training record, or no held-out ``--sample-function``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("tokenizer", help="the tokenizer.json the fine-tuning run reads")
    parser.add_argument("out", type=Path, help="folder for instructions.jsonl and prompt.txt")
    parser.add_argument("--seq-len", type=int, default=256,
                        help="the fine-tuning run's --seq-len (the model's context)")
    parser.add_argument("--holdout-every", type=int, default=8,
                        help="hold out about one package module in this many")
    parser.add_argument("--sample-function", default="close_fds",
                        help="the held-out function whose prompt prompt.txt holds")
    args = parser.parse_args(argv)
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        root = Path(sysconfig.get_paths()["stdlib"])
        train, held, modules = build(root, tokenizer, args.seq_len, args.holdout_every)
        prompt = next((r["prompt"] for r in held
                       if r["prompt"].startswith(f"def {args.sample_function}(")), None)
        if not train or prompt is None:
            raise ConfigError(f"{len(train)} training and {len(held)} held-out records "
                              f"(none is function {args.sample_function}); pass another "
                              "--sample-function or --holdout-every")
    except ConfigError as err:
        print(f"make_data: {err}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "instructions.jsonl", "w", encoding="utf-8") as file:
        file.writelines(json.dumps(r) + "\n" for r in train + held)
    (args.out / "prompt.txt").write_text(prompt, encoding="utf-8")
    tokens = sum(sample_tokens(r, tokenizer) for r in train + held)
    print(f"{modules} modules: {len(train)} training and {len(held)} held-out samples, "
          f"{tokens} tokens", file=sys.stderr)
    print(len(held), f"{(len(held) - 0.5) / (len(train) + len(held)):.9f}")


if __name__ == "__main__":
    main()
