"""Data sources: raw .bin arrays, text files, directories and globs (.txt, .jsonl, .parquet)
with the bytes tokenizer or a tokenizer.json; the text cache; uint32 token files; the
tokenizer-training and prepare_data commands; each source trains and resumes exactly."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from tests.support.processes import run_forked
from tests.support.runs import TINY, assert_close, losses, run_trainer
from trainers.config.parsing import parse_config
from trainers.core.data import TokenFileDataset
from trainers.errors import ConfigError
from trainers.formats.corpus import resolve_files, tokenize_corpus
from trainers.formats.data_source import text_source
from trainers.formats.token_file import MAGIC_UINT16, read_header
from trainers.formats.tokenizer import BYTES_END_OF_TEXT, load_tokenizer
from trainers.models.huggingface import tiny_llama_config

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def documents(count: int, seed: int = 0) -> list[str]:
    """``count`` short documents of words, deterministic in ``seed``."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "."
            for _ in range(count)]


def write_corpus(root: Path, kind: str) -> Path:
    """A corpus of ``kind`` (txt directory, jsonl file, parquet file) of ~12k characters."""
    docs = documents(40)
    if kind == "txt":
        for i in range(4):
            (root / "txt").mkdir(exist_ok=True)
            (root / "txt" / f"part{i}.txt").write_text("\n".join(docs[i * 10:(i + 1) * 10]))
        return root / "txt"
    if kind == "jsonl":
        path = root / "docs.jsonl"
        path.write_text("".join(json.dumps({"body": d, "n": i}) + "\n" for i, d in enumerate(docs)))
        return path
    path = root / "docs.parquet"
    pq.write_table(pa.table({"body": docs}), path)
    return path


def command(module: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_forked(module, args, check=check)


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer.json of at most 300 ids (every byte and a few merges), trained
    by trainers.tools.train_tokenizer."""
    root = tmp_path_factory.mktemp("tok")
    corpus = write_corpus(root, "txt")
    out = root / "tokenizer.json"
    proc = command("trainers.tools.train_tokenizer", str(corpus), "--vocab-size", "300",
                   "--output", str(out))
    assert "byte-level BPE" in proc.stdout and 257 < load_tokenizer(str(out)).vocab_size <= 300
    return out


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> str:
    """``--model`` of a tiny Llama whose 300 ids hold :func:`small_tokenizer`'s."""
    return "hf:" + str(tiny_llama_config(tmp_path_factory.mktemp("model"), vocab_size=300))


def test_train_tokenizer_round_trips_any_text(tmp_path):
    corpus = write_corpus(tmp_path, "jsonl")
    out = tmp_path / "bpe.json"
    command("trainers.tools.train_tokenizer", str(corpus), "--text-field", "body", "--vocab-size",
            "300", "--output", str(out))
    tokenizer = Tokenizer.from_file(str(out))
    assert 257 < tokenizer.get_vocab_size() <= 300  # the corpus may run out of merges
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    text = "alpha beta gamma, héllo wörld ✓\n\ttabs"  # bytes the corpus never held, too
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned
    assert load_tokenizer(str(out)).end_of_text == 0


def test_bytes_tokenizer_separates_documents_by_0xff(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ab"}\n\n{"text": "cd"}\n')
    target = tmp_path / "out.bin"
    assert tokenize_corpus([path], "text", load_tokenizer("bytes"), target) == 5
    ids = read_header(target).open().tolist()
    assert ids == [ord("a"), ord("b"), BYTES_END_OF_TEXT, ord("c"), ord("d")]


def test_a_long_txt_file_is_one_document(tmp_path, monkeypatch):
    monkeypatch.setattr("trainers.formats.corpus._TXT_BLOCK", 8)  # many pieces, no separator
    text = "line one\nline two\nline three\n" * 5
    (tmp_path / "a.txt").write_text(text)
    target = tmp_path / "out.bin"
    tokenize_corpus([tmp_path / "a.txt"], "text", load_tokenizer("bytes"), target)
    assert bytes(read_header(target).open().tolist()) == text.encode()


def word_level_tokenizer(path: Path, size: int) -> Path:
    """A WordLevel tokenizer.json of ``size`` words w0..w{size-1} and <|endoftext|>."""
    vocab = {f"w{i}": i for i in range(size)} | {"[UNK]": size, "<|endoftext|>": size + 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return path


def test_a_corpus_the_tokenizer_makes_no_ids_of_leaves_the_target_as_it_was(tmp_path):
    path = word_level_tokenizer(tmp_path / "words.json", 4)
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.normalizer = normalizers.Replace(Regex(r"[\s\S]"), "")  # every character removed
    tokenizer.save(str(path))
    (tmp_path / "a.txt").write_text("w1 w2 w3\n")
    target = tmp_path / "out.bin"
    target.write_bytes(b"an earlier token file")
    with pytest.raises(ConfigError, match=r"makes no ids of .*a\.txt; pass a tokenizer"):
        tokenize_corpus([tmp_path / "a.txt"], "text", load_tokenizer(str(path)), target)
    assert target.read_bytes() == b"an earlier token file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out.bin", "words.json"]


def test_prepare_data_writes_uint32_for_a_large_vocabulary(tmp_path):
    tokenizer = word_level_tokenizer(tmp_path / "words.json", 70_000)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "w69999 w1 w65536"}) + "\n"
                      + json.dumps({"text": "w2 w70000"}) + "\n")
    target = tmp_path / "out.bin"
    proc = command("trainers.tools.prepare_data", str(corpus), str(target), "--tokenizer",
                   str(tokenizer))
    assert "wrote 6 tokens" in proc.stdout and "uint32" in proc.stdout
    assert "tokenized 1/1 files, 6 tokens" in proc.stderr
    array = read_header(target)
    assert array.dtype == np.dtype("<u4") and array.vocab_size == 70_002
    assert array.open().tolist() == [69999, 1, 65536, 70_001, 2, 70_000]
    dataset = TokenFileDataset(array, 2, "train", 0.4)
    assert dataset[0][0].tolist() == [69999, 1] and dataset[1][0].tolist() == [65536, 70_001]


def test_old_uint16_token_files_still_read(tmp_path):
    path = tmp_path / "old.bin"
    ids = np.arange(300, dtype="<u2")
    path.write_bytes(MAGIC_UINT16 + np.array([256, 0], dtype="<u4").tobytes() + ids.tobytes())
    array = read_header(path)
    assert array.dtype == np.dtype("<u2") and array.vocab_size == 256
    assert array.open().tolist() == ids.tolist()


def test_prepare_data_reads_a_glob_of_mixed_files(tmp_path):
    (tmp_path / "a.txt").write_text("abc")
    (tmp_path / "b.txt").write_text("de")
    target = tmp_path / "out.bin"
    command("trainers.tools.prepare_data", str(tmp_path / "*.txt"), str(target))
    assert read_header(target).open().tolist() == [97, 98, 99, BYTES_END_OF_TEXT, 100, 101]


def test_the_text_cache_is_keyed_by_the_files_and_tokenizer(tmp_path, small_tokenizer,
                                                            bpe_model):
    corpus = write_corpus(tmp_path, "txt")
    args = ["--model", bpe_model, "--data", str(corpus), "--output-dir", str(tmp_path / "run")]
    first = text_source(parse_config(args, "ddp", [1]))[2]
    assert text_source(parse_config(args, "ddp", [1]))[2] == first
    other = text_source(parse_config([*args, "--tokenizer", str(small_tokenizer)], "ddp", [1]))
    assert other[2] != first
    part = corpus / "part0.txt"
    os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 10**9))
    assert text_source(parse_config(args, "ddp", [1]))[2] != first
    assert first.parent == tmp_path / "run" / "data"


def test_hidden_files_of_a_directory_are_skipped(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "junk.bin").write_bytes(b"1")
    assert resolve_files([str(tmp_path)]) == [tmp_path / "a.txt"]


def raw_bin(root: Path) -> Path:
    """A nanoGPT-style raw uint16 array of bytes-like ids (below 256)."""
    rng = np.random.default_rng(0)
    path = root / "train.bin"
    rng.integers(0, 256, 6000, dtype=np.uint16).tofile(path)
    return path


SOURCES = {
    "raw-bin": lambda root, tok, model: ["--data", str(raw_bin(root)), "--token-dtype",
                                         "uint16", "--vocab-size", "256"],
    "txt-dir-bytes": lambda root, tok, model: ["--data", str(write_corpus(root, "txt"))],
    "jsonl-tokenizer-json": lambda root, tok, model: [
        "--data", str(write_corpus(root, "jsonl")), "--text-field", "body", "--tokenizer", str(tok),
        "--model", model],
    "parquet-glob": lambda root, tok, model: [
        "--data", str(write_corpus(root, "parquet").parent / "*.parquet"), "--text-field", "body"],
}
# 16 sequences a step; a corpus of a few thousand tokens gives ~3-6 steps an epoch, so a
# resume at step 4 is mid-epoch or just past an epoch's end.
RESUMABLE = [*TINY, "--batch-size", "16", "--steps", "6", "--checkpoint-every", "4"]


@pytest.mark.slow  # two trainer runs each (seconds), like tests/integration/test_parity.py
@pytest.mark.parametrize("source", list(SOURCES))
def test_each_source_trains_and_resumes_exactly(tmp_path, small_tokenizer, bpe_model, source):
    data = SOURCES[source](tmp_path, small_tokenizer, bpe_model)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer([*RESUMABLE, *data, "--output-dir", str(whole)])
    # Resumed with two DataLoader workers: the same sequences as the run that had none.
    proc = run_trainer([*RESUMABLE, *data, "--output-dir", str(resumed), "--num-workers", "2",
                        "--resume", str(whole / "checkpoints" / "step_00000004")])
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(whole).items() if s > 4})
    assert all(np.isfinite(v) for v in losses(whole).values())
    cached = list((whole / "data").glob("tokens-*.bin")) if source != "raw-bin" else []
    assert len(cached) == (0 if source == "raw-bin" else 1)


@pytest.mark.slow
def test_a_text_source_resumes_at_another_data_parallel_size(tmp_path):
    """Tokenized by rank 0 while rank 1 waits, then resumed on one rank from a new cache."""
    data = ["--data", str(write_corpus(tmp_path, "jsonl")), "--text-field", "body"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer([*RESUMABLE, *data, "--output-dir", str(whole)], nproc=2)
    proc = run_trainer([*RESUMABLE, *data, "--output-dir", str(resumed), "--resume",
                        str(whole / "checkpoints" / "step_00000004")])
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(whole).items() if s > 4})


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    """pyarrow is in .[parquet], not a core dependency: a .parquet --data without it is refused
    in one line naming the extra, before anything runs."""
    corpus = write_corpus(tmp_path, "parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError) as refused:
        parse_config(["--data", str(corpus), "--text-field", "body", "--output-dir",
                      str(tmp_path / "run")], "ddp", [1])
    assert str(refused.value) == (f"{corpus}: reading Parquet needs pyarrow, which is not "
                                  "installed; pip install -e '.[parquet]', or pass .txt or "
                                  ".jsonl files")
