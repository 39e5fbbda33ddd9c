"""Training data and tokenizers from an object store, against moto's real S3 server
(tests/support/s3.py): token files read by ranged requests, text files, prefixes and globs
listed in the bucket, a tokenizer.json by URL; a run from the bucket matches the same data read
locally and resumes at the exact sample; checking a token file reads its header (and size),
locally and in the bucket; a URL that names nothing is refused in one line, nothing written."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.integration.test_data_sources import command, documents, word_level_tokenizer
from tests.support.processes import run_forked
from tests.support.runs import TINY, assert_close, losses, run_trainer
from trainers.config.parsing import parse_config
from trainers.core.batch_stream import BatchStream
from trainers.core.data import TokenFileDataset, tokenized_text
from trainers.core.distributed import DistEnv
from trainers.errors import ConfigError, MissingPathError
from trainers.formats.corpus import resolve_files, tokenize_corpus
from trainers.formats.data_source import text_source, token_array
from trainers.formats.token_file import (
    MAGIC_UINT16,
    PREFIX_BYTES,
    TOKEN_FILE_HEADER,
    read_header,
    write_token_file,
)
from trainers.formats.tokenizer import load_tokenizer
from trainers.models.huggingface import tiny_llama_config
from trainers.runs.storage import location
from trainers.tools.prepare_data import main as prepare_data


def upload(s3, key: str, data: bytes) -> str:
    location(s3.url(key)).write_bytes(data)
    return s3.url(key)


def write_corpus(root: Path) -> Path:
    """``root/corpus/``: a .jsonl and a .parquet file of documents in field ``body``."""
    docs = documents(40)
    (root / "corpus").mkdir()
    (root / "corpus" / "a.jsonl").write_text("".join(json.dumps({"body": d}) + "\n"
                                                     for d in docs[:20]))
    pq.write_table(pa.table({"body": docs[20:]}), root / "corpus" / "b.parquet")
    return root / "corpus"


def upload_tree(s3, root: Path, prefix: str) -> str:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            upload(s3, f"{prefix}/{path.relative_to(root)}", path.read_bytes())
    return s3.url(prefix)


def test_text_in_the_bucket_reads_like_the_same_files_on_disk(s3, tmp_path):
    corpus = write_corpus(tmp_path)
    (corpus / ".hidden").mkdir()
    (corpus / ".hidden" / "junk.jsonl").write_text("not json\n")
    url = upload_tree(s3, corpus, "corpus")
    names = [str(p) for p in resolve_files([url])]
    assert names == [s3.url("corpus/a.jsonl"), s3.url("corpus/b.parquet")]
    assert [str(p) for p in resolve_files([s3.url("**/*.parquet")])] == names[1:]
    tokenizer = load_tokenizer(upload(s3, "tok/words.json",
                                      word_level_tokenizer(tmp_path / "w.json", 4).read_bytes()))
    assert tokenizer.name == s3.url("tok/words.json") and tokenizer.vocab_size == 6
    bytes_tokenizer = load_tokenizer("bytes")
    tokenize_corpus(resolve_files([url]), "body", bytes_tokenizer, tmp_path / "remote.bin")
    tokenize_corpus(resolve_files([str(corpus)]), "body", bytes_tokenizer, tmp_path / "local.bin")
    assert (tmp_path / "remote.bin").read_bytes() == (tmp_path / "local.bin").read_bytes()
    # The run's cache lies under a URL --output-dir, keyed by the objects as they are now.
    args = ["--data", url, "--text-field", "body", "--output-dir", s3.url("run")]
    cache = text_source(parse_config(args, "ddp", [1]))[2]
    assert str(cache).startswith(s3.url("run/data/tokens-"))
    upload(s3, "corpus/a.jsonl", (corpus / "a.jsonl").read_bytes() + b'{"body": "more"}\n')
    assert text_source(parse_config(args, "ddp", [1]))[2] != cache


def test_a_token_file_in_the_bucket_is_written_whole_and_read_by_window(s3, tmp_path):
    ids = np.arange(1000) % 256
    write_token_file(location(s3.url("t.bin")), ids, 256)
    assert s3.keys() == ["t.bin"]  # no scratch object
    array = read_header(location(s3.url("t.bin")))
    assert (array.count, array.vocab_size) == (1000, 256)
    dataset = TokenFileDataset(array, 10, "train", 0.1)
    assert dataset[3][0].tolist() == ids[30:40].tolist()
    assert dataset[3][1].tolist() == ids[31:41].tolist()
    batch = dataset.__getitems__([3, 0, 7])  # what a DataLoader asks: concurrent requests
    assert [w.tolist() for w, _ in batch] == [ids[s:s + 10].tolist() for s in (30, 0, 70)]


def test_text_is_tokenized_once_into_a_url_output_dir_by_rank_0_alone(s3, tmp_path):
    """Every node shares a URL: rank 0 uploads the cache (one PUT, no scratch object), a
    node's local rank 0 that is not rank 0 writes nothing, and a later start finds it."""
    url = upload(s3, "corpus/a.jsonl", b'{"text": "abc"}\n' * 200)
    cfg = parse_config(["--data", url, "--output-dir", s3.url("run")], "ddp", [1])
    node_2 = DistEnv(rank=2, world_size=4, local_rank=0, device=torch.device("cpu"),
                     backend="gloo")
    puts = [r for r in recorded_requests(s3, lambda: pytest.raises(
        MissingPathError, tokenized_text, cfg, node_2), tmp_path) if r["method"] == "PUT"]
    assert puts == [] and s3.keys() == ["corpus/a.jsonl"]
    rank_0 = dataclasses.replace(node_2, rank=0)
    array = tokenized_text(cfg, rank_0)
    assert array.count == 200 * 3 + 199 and str(array.path).startswith(s3.url("run/data/"))
    assert s3.keys() == ["corpus/a.jsonl", array.path.path.split("/", 1)[1]]
    again = recorded_requests(s3, lambda: tokenized_text(cfg, rank_0), tmp_path)
    assert [r for r in again if r["method"] == "PUT"] == []


def sparse_file(path: Path, head: bytes, ids: int, last: int) -> Path:
    """``head``, then ``ids`` uint16 ids: zeros (a hole: reading them all would take minutes)
    and ``last``."""
    with open(path, "wb") as f:
        f.write(head)
        f.seek(len(head) + 2 * (ids - 1))
        f.write(np.array([last], dtype="<u2").tobytes())
    return path


WINDOW = 1 << 20
IDS = (1 << 14) * WINDOW + 1  # 16,384 windows of 2**20 ids and one: 32 GiB of uint16 ids


def test_checking_a_large_token_file_reads_its_header_and_size_only(tmp_path):
    header = MAGIC_UINT16 + (256).to_bytes(4, "little") + bytes(4)
    token_file = sparse_file(tmp_path / "big.bin", header, IDS, 1000)
    raw = sparse_file(tmp_path / "raw.bin", b"", IDS, 1000)
    out = str(tmp_path / "run")
    started = time.perf_counter()
    checked = [parse_config(["--data", str(token_file), "--output-dir", out], "ddp", [1]),
               parse_config(["--data", str(raw), "--token-dtype", "uint16", "--vocab-size", "256",
                             "--output-dir", out], "ddp", [1])]
    assert time.perf_counter() - started < 5
    assert not Path(out).exists()
    # The id beyond the vocabulary, in the last window, is caught when that window is read.
    refusals = [f"--data {token_file} holds id 1000 at token {IDS - 1:,}, beyond the vocabulary "
                "of 256 its header records; the file is damaged, rewrite it with `python -m "
                "trainers.tools.prepare_data`",
                f"--data {raw} holds id 1000, beyond --vocab-size 256; pass --vocab-size 1001 "
                "or more (or the right --token-dtype)"]
    for cfg, refusal in zip(checked, refusals, strict=True):
        dataset = TokenFileDataset(token_array(cfg), WINDOW, "val", 0.001)
        assert dataset[0][0].shape == (WINDOW,)
        with pytest.raises(ConfigError) as refused:
            dataset[len(dataset) - 1]
        assert str(refused.value) == refusal


def test_an_id_beyond_the_vocabulary_past_the_checked_prefix_stops_the_run_in_one_line(
        tmp_path):
    ids = np.zeros(PREFIX_BYTES // 2 + 100_000, dtype="<u2")
    ids[600_000] = 300  # in the training split, beyond the first MiB that the check reads
    ids.tofile(tmp_path / "raw.bin")
    cfg = parse_config(["--data", str(tmp_path / "raw.bin"), "--token-dtype", "uint16",
                        "--vocab-size", "256", "--output-dir", str(tmp_path / "run")], "ddp", [1])
    dataset = TokenFileDataset(token_array(cfg), 1000, "train", 0.01)
    stream = BatchStream(dataset, len(dataset), 0, 1, seed=0, num_workers=2)
    with pytest.raises(ConfigError) as refused:  # raised in a worker, one line here
        next(stream)
    assert str(refused.value) == (f"--data {tmp_path}/raw.bin holds id 300, beyond --vocab-size "
                                  "256; pass --vocab-size 301 or more (or the right "
                                  "--token-dtype)")


def recorded_requests(s3, action, folder: Path) -> list[dict]:
    """The requests moto's server received while ``action()`` ran (its request recorder, which
    keeps them in a file in the working directory: ``folder`` then)."""
    def call(path: str) -> bytes:
        method = "GET" if path.startswith("download") else "POST"
        request = urllib.request.Request(f"{s3.endpoint}/moto-api/recorder/{path}", method=method)
        return urllib.request.urlopen(request).read()

    with contextlib.chdir(folder):
        call("reset-recording")
        call("start-recording")
        try:
            action()
        finally:
            call("stop-recording")
        recorded = call("download-recording").decode()
    return [json.loads(line) for line in recorded.splitlines()]


def test_checking_a_token_file_in_the_bucket_requests_its_header_only(s3, tmp_path):
    ids = np.zeros(3 << 20, dtype=np.uint16)  # 6 MiB of ids
    write_token_file(location(s3.url("tokens.bin")), ids, 256)
    upload(s3, "raw.bin", ids.tobytes())
    runs = [["--data", s3.url("tokens.bin")],
            ["--data", s3.url("raw.bin"), "--token-dtype", "uint16", "--vocab-size", "256"]]
    for args, most in zip(runs, [TOKEN_FILE_HEADER, PREFIX_BYTES], strict=True):
        requests = recorded_requests(s3, lambda args=args: parse_config(
            [*args, "--output-dir", str(tmp_path / "run")], "ddp", [1]), tmp_path)
        reads = [r for r in requests if r["method"] == "GET" and args[1].rsplit("/", 1)[1]
                 in r["url"].split("?")[0]]
        assert reads, requests
        for read in reads:  # every read of the object is one range within the first bytes
            first, last = map(int, read["headers"]["Range"].removeprefix("bytes=").split("-"))
            assert last - first + 1 <= most and first < most, read["headers"]["Range"]
    assert not (tmp_path / "run").exists()


MISSING_BUCKET = "s3://no-such-bucket-28"
BAD_URLS = [  # (--data, what the trainers' and prepare_data's line says after the URL)
    ("nothing/*.jsonl", ": the glob matches no files; pass a pattern that matches .txt, .jsonl "
     "or .parquet files"),
    ("nothing/", ": no such file or directory; pass a text file, a directory or a glob of .txt, "
     ".jsonl or .parquet files"),
    ("missing.jsonl", ": no such file or directory; pass a text file"),
    ("missing.bin", ": no such file; make one with `python -m trainers.tools.prepare_data TEXT "
     "OUT.bin` or use synthetic"),
    (f"{MISSING_BUCKET}/corpus/*.jsonl",
     ": bucket no-such-bucket-28 does not exist (create it, or fix the URL)"),
    (f"{MISSING_BUCKET}/tokens.bin",
     ": bucket no-such-bucket-28 does not exist (create it, or fix the URL)"),
]


@pytest.mark.parametrize("key, says", BAD_URLS, ids=[key for key, _ in BAD_URLS])
def test_a_data_url_naming_nothing_is_refused_in_one_line(s3, tmp_path, capsys, key, says):
    upload(s3, "corpus/a.jsonl", b'{"text": "abc"}\n')
    url = key if key.startswith("s3://") else s3.url(key)
    with pytest.raises(ConfigError) as refused:
        parse_config(["--data", url, "--output-dir", str(tmp_path / "run")], "ddp", [1])
    assert str(refused.value).startswith(f"--data {url}{says}")
    if not url.endswith(".bin"):  # prepare_data reads text
        with pytest.raises(SystemExit) as exited:
            prepare_data([url, s3.url("out.bin")])
        line = capsys.readouterr().err
        assert exited.value.code == 2 and line.count("\n") == 1
        assert line.startswith(f"trainers.tools.prepare_data: error: source {url}{says}")
    assert s3.keys() == ["corpus/a.jsonl"] and not (tmp_path / "run").exists()


def test_a_missing_tokenizer_object_is_refused_in_one_line(s3, tmp_path):
    upload(s3, "a.txt", b"some text")
    missing = s3.url("tok/tokenizer.json")
    with pytest.raises(ConfigError, match=f"--tokenizer {missing}: no such file; pass bytes"):
        parse_config(["--data", s3.url("a.txt"), "--tokenizer", missing, "--output-dir",
                      str(tmp_path / "run")], "ddp", [1])


def test_the_trainer_command_refuses_a_glob_matching_nothing_in_one_line(s3, tmp_path):
    url = s3.url("corpus/*.jsonl")
    proc = run_forked("trainers.ddp", [*TINY, "--data", url, "--output-dir",
                                       str(tmp_path / "run")], timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"trainers.ddp: error: --data {url}: the glob matches no files; pass "
                           "a pattern that matches .txt, .jsonl or .parquet files\n")
    assert s3.keys() == [] and not (tmp_path / "run").exists()


# 16 sequences a step and a checkpoint at step 4, as tests/integration/test_data_sources.py.
RESUMABLE = [*TINY, "--batch-size", "16", "--steps", "6", "--checkpoint-every", "4"]


@pytest.mark.slow  # four tiny trainer runs
def test_data_from_the_bucket_trains_and_resumes_like_the_same_data_on_disk(s3, tmp_path):
    """A token file, and the text it was made of with a tokenizer.json trained on the bucket
    and written to it, read from the bucket: the same losses as the token file read from disk,
    and a resume continues at the exact sample (with DataLoader workers, each making its own
    connection)."""
    corpus = write_corpus(tmp_path)
    text_url, tokenizer_url = upload_tree(s3, corpus, "corpus"), s3.url("tokenizer.json")
    command("trainers.tools.train_tokenizer", text_url, "--text-field", "body", "--vocab-size",
            "300", "--output", tokenizer_url)
    runs = [*RESUMABLE, "--model", "hf:" + str(tiny_llama_config(tmp_path / "model", 300))]
    tokens = tmp_path / "tokens.bin"
    command("trainers.tools.prepare_data", str(corpus), str(tokens), "--tokenizer", tokenizer_url,
            "--text-field", "body")
    tokens_url = upload(s3, "tokens.bin", tokens.read_bytes())
    on_disk, bucket, resumed, text = (tmp_path / n for n in ("disk", "bucket", "again", "text"))
    run_trainer([*runs, "--data", str(tokens), "--output-dir", str(on_disk)])
    run_trainer([*runs, "--data", tokens_url, "--output-dir", str(bucket)])
    assert losses(bucket) == losses(on_disk)
    step_4 = str(bucket / "checkpoints" / "step_00000004")
    after_4 = {s: v for s, v in losses(on_disk).items() if s > 4}
    proc = run_trainer([*runs, "--data", tokens_url, "--output-dir", str(resumed),
                        "--num-workers", "2", "--resume", step_4])
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), after_4, rel=0)
    proc = run_trainer([*runs, "--data", text_url, "--text-field", "body", "--tokenizer",
                        tokenizer_url, "--output-dir", str(text), "--resume", step_4])
    assert "at step 4" in proc.stdout
    assert_close(losses(text), after_4, rel=0)
    cached = [p.read_bytes() for p in (text / "data").glob("tokens-*.bin")]
    assert cached == [tokens.read_bytes()]
