"""Reading a run or a model from a bucket (moto's S3 server, a real HTTP endpoint): a run
uploaded to ``s3://`` samples, exports and plots exactly as its local directory does, ``--model
hf:s3://`` builds and trains the model its local directory gives, and what cannot be read is
refused in one line.

The run is trained once, locally, and uploaded into each test's bucket with fsspec, as a user
copies a run with ``aws s3 sync``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from tests.integration.test_bad_input_models import CASES, bad_hf_dirs
from tests.support.runs import TINY, losses, one_line_error, run_trainer
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError
from trainers.runs import run_plot
from trainers.runs.checkpoint_files import MANIFEST
from trainers.runs.storage import location
from trainers.tools import export, plot, sample

STEP_4 = "checkpoints/step_00000004"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """A one-process tiny run with checkpoints at steps 2 and 4, evaluated at step 4."""
    run = tmp_path_factory.mktemp("run")
    run_trainer([*TINY, "--steps", "4", "--checkpoint-every", "2", "--eval-every", "4",
                 "--output-dir", str(run)])
    return run


def upload(local: Path, url: str) -> str:
    """``local`` (a directory) copied to ``url``; returns ``url``."""
    fsspec.filesystem("s3").put(str(local), url, recursive=True)
    return url


def _out(capsys, module: Any, *argv: str) -> str:
    module.main([*argv])
    return capsys.readouterr().out


def _exported(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_bucket_run_samples_and_exports_as_its_local_directory(local_run, s3, tmp_path,
                                                                 capsys):
    pytest.importorskip("transformers")
    url = upload(local_run, s3.url("runs/exp1"))
    for args in (["--temperature", "0"], ["--temperature", "1.5", "--top-k", "20", "--seed", "3"],
                 ["--checkpoint", "2", "--seed", "5"]):
        argv = ["--prompt", "héllo", "--tokens", "8", *args]
        assert _out(capsys, sample, url, *argv) == _out(capsys, sample, str(local_run), *argv)
    argv = ["--prompt", "ab", "--tokens", "8"]
    assert _out(capsys, sample, f"{url}/{STEP_4}", *argv) == _out(capsys, sample, url, *argv)

    _out(capsys, export, str(local_run), str(tmp_path / "local"))
    assert _out(capsys, export, url, str(tmp_path / "from-bucket")).strip() == \
        f"exported {url} (tiny) to {tmp_path / 'from-bucket'}"
    expected = _exported(tmp_path / "local")
    assert set(expected) == {"config.json", "model.safetensors", "tokenizer.json",
                             "tokenizer_config.json"}
    assert _exported(tmp_path / "from-bucket") == expected
    _out(capsys, export, url, s3.url("models/exp1"))  # OUT in the bucket too
    fs = fsspec.filesystem("s3")
    assert {name: fs.cat_file(f"{s3.name}/models/exp1/{name}") for name in expected} == expected
    assert s3.keys("models/") == [f"models/exp1/{name}" for name in sorted(expected)]
    assert "already exists and is not an empty directory" in one_line_error(
        capsys, export, url, s3.url("models/exp1"))


def test_a_step_without_its_manifest_is_no_checkpoint_in_a_bucket(local_run, s3, capsys):
    """An upload cut short before step 4's manifest: sampling reads step 2, as locally."""
    url = upload(local_run, s3.url("runs/cut"))
    fsspec.filesystem("s3").rm(f"{s3.name}/runs/cut/{STEP_4}/{MANIFEST}")
    argv = ["--prompt", "ab", "--tokens", "8", "--temperature", "0"]
    assert _out(capsys, sample, url, *argv) == _out(capsys, sample, str(local_run), *argv,
                                                    "--checkpoint", "2")
    assert "no checkpoint there; pass a run directory" in one_line_error(
        capsys, sample, f"{url}/{STEP_4}", *argv)


def test_a_bucket_run_plots_as_its_local_directory(local_run, s3, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    url = upload(local_run, s3.url("runs/exp1"))
    here, there = run_plot.load_run(local_run), run_plot.load_run(location(url))
    assert (there.metrics, there.config, there.timeline) == (here.metrics, here.config,
                                                             here.timeline)
    assert run_plot.labels([there]) == run_plot.labels([here]) == ["ddp --model tiny"]
    drawn = [[(tuple(line.get_xdata()), tuple(line.get_ydata())) for ax in
              run_plot.draw([run]).get_axes() for line in ax.get_lines()] for run in (here, there)]
    assert drawn[0] == drawn[1] and len(drawn[0]) == len(run_plot.PANELS) + 1  # + eval dots
    out = plot.main([url, "-o", str(tmp_path / "plot.png")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(plot.main([url])) == f"{url}/plot.png"  # by default next to its metrics
    assert fsspec.filesystem("s3").cat_file(f"{s3.name}/runs/exp1/plot.png")[:4] == b"\x89PNG"


@pytest.mark.parametrize("module", [sample, export, plot])
def test_what_is_not_a_run_in_a_bucket_is_one_line(s3, tmp_path, capsys, module):
    extra = {sample: ["--prompt", "a"], export: [str(tmp_path / "out")], plot: []}[module]
    missing = f"s3://no-such-{s3.name}/runs/exp1"
    assert f"RUN {missing}: bucket no-such-{s3.name} does not exist (create it, or fix " \
           "the URL)" in one_line_error(capsys, module, missing, *extra)
    nothing = s3.url("runs/none")
    expected = "holds no metrics.jsonl" if module is plot else "no checkpoint there"
    assert expected in one_line_error(capsys, module, nothing, *extra)
    assert f"RUN foo://{s3.name}/x: unknown storage scheme foo://" in one_line_error(
        capsys, module, f"foo://{s3.name}/x", *extra)
    assert not (tmp_path / "out").exists() and s3.keys() == []


def _hf_refusal(name: str) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_config(["--model", name, "--steps", "2", "--output-dir", "unused"], "ddp")
    return str(refused.value)


def test_an_hf_directory_in_a_bucket_is_checked_by_its_headers_in_one_line(s3, tmp_path):
    bad_hf_dirs(tmp_path)
    url = upload(tmp_path / "models", s3.url("models"))
    for case in CASES:
        folder = f"{url}/{case.name}"
        assert _hf_refusal(f"hf:{folder}") == f"--model hf:{folder}: " + case.error.format(
            dir=folder)
    assert _hf_refusal(f"hf:{url}/empty") == (
        f"--model hf:{url}/empty: {url}/empty/config.json does not exist; pass hf: and a "
        "bucket prefix holding a Hugging Face config.json")
    missing = f"s3://no-such-{s3.name}/m"
    assert _hf_refusal(f"hf:{missing}") == (
        f"--model hf:{missing}: bucket no-such-{s3.name} does not exist (create it, or fix the "
        "URL)")


def test_a_dry_run_never_reads_a_buckets_model(tmp_path):
    """A component's checks of ``hf:s3://`` need no bucket (none exists here, and no server
    is reached); only the scheme is checked."""
    from components.checks import check_trainer

    args = ["--model", "hf:s3://no-such-bucket/m", "--output-dir", str(tmp_path / "run")]
    cfg, cpu_memory = check_trainer("ddp", args, nodes=range(1, 2), nproc=2, gpus=0,
                                    node_mb=8192, env=None, check_paths=True,
                                    device_memory_gb=0, gpu_type=None)
    assert cpu_memory is None  # a bucket's model is priced by nobody before it is read
    assert cfg.model == "hf:s3://no-such-bucket/m"
    with pytest.raises(ConfigError, match="unknown storage scheme foo://"):
        parse_config(["--model", "hf:foo://b/m"], "ddp", check_paths=True, reach_stores=False)


@pytest.fixture
def hf_model(tmp_path) -> Path:
    """A tiny Llama saved by transformers in three safetensors shards, with a tokenizer."""
    transformers = pytest.importorskip("transformers")
    from trainers.models.huggingface import tiny_llama_config
    from trainers.tools.hf_export import byte_tokenizer

    folder = tiny_llama_config(tmp_path / "tiny-llama")
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(folder))
    model.save_pretrained(folder, max_shard_size="400KB")
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    assert len(list(folder.glob("*.safetensors"))) == 3
    return folder


@pytest.mark.slow
def test_hf_model_in_a_bucket_builds_and_trains_as_its_local_directory(hf_model, s3,
                                                                       tmp_path, monkeypatch):
    """Built from the bucket, the model reads each tensor's bytes once and nothing more than
    the files' headers besides; it is the local directory's model, and trains alike."""
    from trainers.models import build_model, huggingface
    from trainers.options import model_names

    url = upload(hf_model, s3.url("models/tiny-llama"))
    assert model_names.model_shape(f"hf:{url}") == model_names.model_shape(f"hf:{hf_model}")
    fetched: list[tuple[str, int, int]] = []

    def counted(path, start, end):
        fetched.append((path.name, start, end))
        return model_names.read_range(path, start, end)

    monkeypatch.setattr(huggingface, "read_range", counted)
    here, there = (build_model(f"hf:{folder}", seed=0).eval() for folder in (hf_model, url))
    files = sorted(hf_model.glob("*.safetensors"))
    data = sum(f.stat().st_size - model_names.safetensors_header(f)[1] for f in files)
    assert sum(end - start for _, start, end in fetched) == data
    assert len(set(fetched)) == len(fetched) == len(there.state_dict())
    for (name, a), b in zip(here.state_dict().items(), there.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(here(tokens), there(tokens))
    args = ["--steps", "2", "--batch-size", "8", "--eval-every", "0", "--checkpoint-every", "0",
            "--log-every", "1", "--tensorboard", "false", "--device", "cpu", "--peak-tflops", "1",
            "--seq-len", "32", "--train-samples", "64"]
    for name, folder in (("local", hf_model), ("bucket", url)):
        run_trainer(["--model", f"hf:{folder}", *args, "--output-dir", str(tmp_path / name)])
    assert losses(tmp_path / "bucket") == losses(tmp_path / "local")
    assert json.loads((tmp_path / "bucket/config.json").read_text())["options"]["model"] == \
        f"hf:{url}"
