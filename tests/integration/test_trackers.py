"""``--tracker mlflow`` against a real MLflow server (SQLite store, started here) and
``--tracker wandb`` offline: the figures read back with each tracker's own client equal
metrics.jsonl, a run killed and resumed is one tracker run, and a server stopped mid-run
costs one warning and nothing of the run."""

from __future__ import annotations

import json
import signal
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Launched, run_forked, start, unused_port
from tests.support.runs import TINY, without

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

STEPS = ["--steps", "6", "--checkpoint-every", "3", "--no-async-checkpoint", "--resume", "auto"]
KEYS = ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_memory_bytes")
QUICK_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def _start_server(folder: Path) -> tuple[Launched, str]:
    """``mlflow server`` on a SQLite store in ``folder`` and a free port below the ephemeral
    range; waits for /health."""
    import urllib.request

    port = unused_port()
    proc = start(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{folder}/mlflow.db", "--default-artifact-root", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], label="mlflow-server")
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.popen.poll() is None, proc.describe("mlflow server exited")
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2):
                return proc, uri
        except OSError:
            time.sleep(0.2)
    raise AssertionError(proc.describe("mlflow server did not answer /health within 120 s"))


def _stop(proc: Launched) -> None:
    proc.stop(signal.SIGTERM)  # the server and its uvicorn worker
    proc.wait(30)


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> Iterator[str]:
    proc, uri = _start_server(tmp_path_factory.mktemp("mlflow"))
    yield uri
    _stop(proc)


def _records(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads,
                                      (run_dir / "metrics.jsonl").read_text().splitlines())}


def _killed_then_resumed(run_dir: Path, tracker: str, env: dict[str, str]) -> None:
    """The run killed after step 4 (its checkpoint is step 3), then run again to the end."""
    args = [*without(TINY, "--resume", "--steps"), *STEPS, "--output-dir", str(run_dir),
            "--tracker", tracker]
    killed = run_forked("trainers.ddp", args, env={**env, "TRAINERS_KILL_AT": "0:4"},
                        check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    ids = json.loads((run_dir / "trackers.json").read_text())
    resumed = run_forked("trainers.ddp", args, env=env)
    assert "warning: tracker" not in resumed.stdout
    assert json.loads((run_dir / "trackers.json").read_text()) == ids  # the same tracker run


@pytest.mark.slow
def test_mlflow_run_equals_metrics_jsonl_across_a_resume(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    _killed_then_resumed(tmp_path, "mlflow", {"MLFLOW_TRACKING_URI": mlflow_uri})
    run_id = json.loads((tmp_path / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(mlflow_uri)
    records = _records(tmp_path)
    assert sorted(records) == [1, 2, 3, 4, 5, 6]
    for key in KEYS:
        history = sorted(client.get_metric_history(run_id, key),
                         key=lambda m: (m.step, m.timestamp))
        latest = {m.step: m.value for m in history}  # steps 4's redone value comes last
        assert latest == {step: r[key] for step, r in records.items()}, key
    run = client.get_run(run_id)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert run.data.params["model"] == "tiny" and run.data.params["steps"] == "6"
    assert run.data.tags["run_dir"] == str(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert run.data.tags["git_commit"] == str(config["git"]["commit"])
    assert run.data.metrics["summary/final_loss"] == summary["final_loss"]
    assert (summary["resumed_from_step"], summary["steps_lost"]) == (3, 1)
    assert json.loads(Path(client.download_artifacts(run_id, "summary.json",
                                                     str(tmp_path))).read_text()) == summary
    plot = Path(client.download_artifacts(run_id, "plot.png", str(tmp_path / "artifacts")))
    assert plot.read_bytes() == (tmp_path / "plot.png").read_bytes()
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_server_stopped_mid_run_costs_one_warning(tmp_path):
    proc, uri = _start_server(tmp_path)
    run_dir = tmp_path / "run"
    # 40 steps: the run is stopped after its second and has 38 to go, each of which (and its
    # end's summary and artifacts) would report to the stopped server.
    trainer = start(
        [sys.executable, "-m", "trainers.ddp", *without(TINY, "--steps"), "--steps", "40",
         "--checkpoint-every", "0", "--output-dir", str(run_dir), "--tracker", "mlflow"],
        env={**QUICK_FAIL, "MLFLOW_TRACKING_URI": uri})
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and trainer.popen.poll() is None, \
            trainer.describe("logged no 2 steps")
        time.sleep(0.01)
    trainer.popen.send_signal(signal.SIGSTOP)  # holds the run while the server goes down
    _stop(proc)
    trainer.popen.send_signal(signal.SIGCONT)
    done = trainer.wait(300, check=True)
    out = done.stdout + done.stderr
    assert out.count("warning: tracker mlflow failed") == 1, out[-3000:]
    assert "training goes on without it" in out
    assert sorted(_records(run_dir)) == list(range(1, 41))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 40


def _wandb_records(path: Path) -> Iterator[object]:
    """The records of a ``.wandb`` file, decoded with W&B's own protobuf ``Record``: a 7-byte
    header (``:W&B``, magic, version), then LevelDB-log chunks in 32 KiB blocks (crc32c, length,
    type: 1 full, 2 first, 3 middle, 4 last). wandb 0.30 ships no Python reader of it."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):
            pos += left  # the block's zero padding
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _preempted_then_resumed(run_dir: Path, tracker: str, env: dict[str, str]) -> None:
    """The run preempted by SIGTERM once it has logged 3 steps (it saves the step it is at
    and exits 143), then run again to the end."""
    args = [*without(TINY, "--resume", "--steps"), "--steps", "40", "--checkpoint-every", "0",
            "--resume", "auto", "--output-dir", str(run_dir), "--tracker", tracker]
    cmd = [sys.executable, "-m", "trainers.ddp", *args]
    first = start(cmd, env=env)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline and first.popen.poll() is None, \
            first.describe("logged no 3 steps")
        time.sleep(0.01)
    first.popen.send_signal(signal.SIGTERM)
    stopped = first.wait(300)
    assert stopped.returncode == 128 + signal.SIGTERM, first.describe("not preempted")
    ids = json.loads((run_dir / "trackers.json").read_text())
    resumed = run_forked("trainers.ddp", args, env=env)
    assert "warning: tracker" not in resumed.stdout
    assert json.loads((run_dir / "trackers.json").read_text()) == ids  # the same tracker run


@pytest.mark.slow
def test_wandb_offline_run_equals_metrics_jsonl_across_a_preemption(tmp_path):
    _preempted_then_resumed(tmp_path, "wandb", {"WANDB_MODE": "offline",
                                                "WANDB_PROJECT": "t31", "WANDB_SILENT": "true"})
    run_id = json.loads((tmp_path / "trackers.json").read_text())["wandb"]
    files = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 2  # one per attempt, one run id
    logged: dict[int, dict[str, float]] = {}
    summary: dict[str, float] = {}
    for path in files:
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                logged[int(items.pop("_step"))] = items
            elif kind == "summary":
                summary.update({i.key: json.loads(i.value_json) for i in record.summary.update})
    records = _records(tmp_path)
    resumed_from = json.loads((tmp_path / "summary.json").read_text())["resumed_from_step"]
    assert sorted(logged) == sorted(records) == list(range(1, 41)) and 3 <= resumed_from < 40
    for step, record in records.items():
        assert {k: logged[step][k] for k in KEYS} == {k: record[k] for k in KEYS}, step
    assert summary["final_loss"] == json.loads((tmp_path / "summary.json").read_text())[
        "final_loss"]
    # each attempt keeps the plot as far as it got; the last one's is the run's
    kept = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/files/plot.png"))
    assert len(kept) == 2 and kept[-1].read_bytes() == (tmp_path / "plot.png").read_bytes()
