"""A job whose trainer names object-store URLs, submitted through every scheduler of this
repository: the dry run renders without reaching the bucket, and the submit checks it first
(:mod:`components.schedulers.submit`), refusing in one line with nothing submitted when the
bucket is missing, the credentials are absent, the endpoint is unreachable, s3fs is not
installed or the scheme is unknown. Against moto's S3 server (``tests/support/s3.py``).

Each scheduler is its registered entry point (pyproject.toml), asked for a dry run and then to
schedule it (what ``Runner.schedule`` and ``Scheduler.submit`` do); the runner's
``run_component`` and the ``torchx run`` CLI are checked on local_cwd and kubernetes.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import sys
from pathlib import Path

import pytest
from torchx.runner import get_runner

from components.ddp import ddp
from components.errors import ComponentArgumentError
from components.schedulers.submit import SubmitChecks
from tests.support.processes import run_command
from tests.support.runs import REPO, torchx_cli

DDP = f"{REPO}/components/ddp.py:ddp"
SCHEDULERS = ("local_cwd", "local_docker", "slurm", "kubernetes", "kubernetes_jobset")
TRAIN = ["--model", "tiny", "--steps", "2", "--batch-size", "4"]
MISSING = "no-such-bucket-7a1c"
# How every refusal at submit ends.
REFUSED = ("; nothing was submitted (if only the job's nodes can reach the store, pass "
           "--check_paths False)")


def _factory(name: str):
    (entry,) = importlib.metadata.entry_points(group="torchx.schedulers", name=name)
    return entry.load()


def _cfg(name: str, tmp: Path) -> dict[str, object]:
    """What each scheduler needs to render the job (no cluster, no Docker engine)."""
    return {"slurm": {"job_dir": str(tmp / "jobs")}, "kubernetes": {"queue": "q"},
            "kubernetes_jobset": {"local_queue": "q"}}.get(name, {})


@pytest.fixture(autouse=True)
def fresh_clients(tmp_path, monkeypatch):
    """New object-store clients for each test (s3fs caches them with the credentials and
    endpoint of the environment they were made in), no kube config, and Slurm's tools on PATH
    answering the pre-flight with one partition of 2 nodes (``sinfo`` with nothing); ``sbatch``
    only records a call."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's retries: seconds on a closed port
    tools = tmp_path / "slurm-bin"
    tools.mkdir()
    (tools / "scontrol").write_text(
        "#!/bin/sh\necho PartitionName=debug Default=YES TotalNodes=2 MaxTime=UNLIMITED\n")
    (tools / "sinfo").write_text("#!/bin/sh\nexit 1\n")  # TorchX then asks no memory
    (tools / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/sbatch-called\nexit 1\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    yield
    s3fs.S3FileSystem.clear_instance_cache()
    assert not (tmp_path / "sbatch-called").exists()
    assert not list((tmp_path / "jobs").glob("*"))  # Slurm's job directory is never made


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refusals(output_dir: str, tmp: Path) -> dict[str, str]:
    """Each scheduler's one-line refusal to schedule its (rendered) dry run of ddp writing to
    ``output_dir``."""
    app = ddp("--output-dir", output_dir, *TRAIN, j="2x1")
    said = {}
    for name in SCHEDULERS:
        scheduler = _factory(name)("test")
        info = scheduler.submit_dryrun(app, _cfg(name, tmp))
        with pytest.raises(ComponentArgumentError) as refused:
            scheduler.schedule(info)
        said[name] = str(refused.value)
    return said


def test_every_scheduler_submits_through_the_store_check():
    for name in SCHEDULERS:
        scheduler = type(_factory(name)("test"))
        assert scheduler.schedule is SubmitChecks.schedule, name


def test_a_missing_bucket_is_refused_at_submit_by_every_scheduler(s3, tmp_path):
    url = f"s3://{MISSING}/run"
    assert _refusals(url, tmp_path) == {
        name: f"{name}: --output-dir {url}: bucket {MISSING} does not exist (create it, or fix "
              "the URL)" + REFUSED for name in SCHEDULERS}


def test_dry_runs_never_reach_the_bucket_and_submits_say_it_is_unreachable(
        s3, tmp_path, monkeypatch):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    said = _refusals(s3.url("run"), tmp_path)
    for name, message in said.items():
        assert message == (f"{name}: --output-dir {s3.url('run')}: the endpoint is unreachable "
                           f"(check AWS_ENDPOINT_URL and the network: {endpoint})" + REFUSED)


def test_check_paths_false_leaves_the_store_to_the_job(tmp_path, monkeypatch):
    """A bucket only the cluster reaches (a private endpoint, a workload identity): with
    ``--check_paths False`` the submit does not reach it (here: no endpoint at all)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    app = ddp("--output-dir", f"s3://{MISSING}/run", *TRAIN, j="2x1", check_paths=False)
    scheduler = _factory("kubernetes")("test")
    info = scheduler.submit_dryrun(app, {"queue": "q"})
    with pytest.raises(Exception) as failed:  # the submit itself: no cluster here
        scheduler.schedule(info)
    assert not isinstance(failed.value, ComponentArgumentError), failed.value


def test_no_credentials_is_refused_through_the_runner(s3, tmp_path, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    args = ["-j", "1x1", "--", *TRAIN, "--data", s3.url("tokens.bin"),
            "--output-dir", str(tmp_path / "run")]
    with get_runner() as runner, pytest.raises(ComponentArgumentError) as refused:
        runner.run_component(DDP, args, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
    assert str(refused.value) == (
        f"local_cwd: --data {s3.url('tokens.bin')}: no credentials (set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role)" + REFUSED)
    assert not (tmp_path / "logs").exists() and not (tmp_path / "run").exists()


def test_the_runner_submits_to_kubernetes_only_after_the_check(s3):
    with get_runner() as runner:
        info = runner.dryrun_component(DDP, ["-j", "2x1", "--", *TRAIN, "--output-dir",
                                             f"s3://{MISSING}/run"], "kubernetes",
                                       cfg={"queue": "q"}, workspace=None)
        with pytest.raises(ComponentArgumentError, match=f"bucket {MISSING} does not exist"):
            runner.schedule(info)


def test_torchx_run_refuses_a_missing_bucket_in_one_line(s3, tmp_path):
    proc = torchx_cli("run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}", DDP,
                      "-j", "1x1", "--", *TRAIN, "--output-dir", f"s3://{MISSING}/run",
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1] == (f" local_cwd: --output-dir s3://{MISSING}/run: bucket {MISSING} does "
                         "not exist (create it, or fix the URL)" + REFUSED), lines
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(("value", "message"), [
    ("s3://runs/exp", "--output-dir s3://runs/exp: s3:// needs the s3fs package; pip install "
                      "-e '.[s3]'"),
    ("foo://x/exp", "--output-dir foo://x/exp: unknown storage scheme foo://; pass a local path "
                    "or an s3:// (gs://, az://) URL"),
], ids=["s3fs-not-installed", "unknown-scheme"])
def test_torchx_run_dryrun_refuses_what_no_store_can_serve(tmp_path, value, message):
    """Even a dry run: the scheme is the component's to check, with no bucket reached. s3fs
    is hidden from the CLI's interpreter by a ``sitecustomize`` (``import s3fs`` fails): a new
    interpreter, not one forked from the preloaded process."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['s3fs'] = None\n")
    proc = run_command([sys.executable, "-m", "torchx.cli.main", "run", "--dryrun", "-s",
                        "kubernetes", "--workspace", "", "-cfg", "queue=q", DDP, "-j", "2x1",
                        "--", *TRAIN, "--output-dir", value],
                       env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f" trainers.ddp: {message}"
    assert "SCHEDULER REQUEST" not in proc.stdout and "Traceback" not in proc.stderr


def test_dryrun_renders_a_bucket_run_with_secrets_by_reference_only(s3, tmp_path, monkeypatch):
    """``torchx run --dryrun -s kubernetes`` renders a multi-pod job writing to the bucket with
    no claim and an unreachable endpoint; the credentials reach the pods as secretKeyRefs
    (``secret_env``), and no secret value of the submitting environment is in the job."""
    secret = "s3cr3t-VALUE-never-rendered"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    keys = ("AWS_ACCESS_KEY_ID:s3-credentials:AWS_ACCESS_KEY_ID;"
            "AWS_SECRET_ACCESS_KEY:s3-credentials:AWS_SECRET_ACCESS_KEY")
    # run outside the repository: its .torchxconfig names a checkpoint_pvc
    proc = torchx_cli("run", "--dryrun", "-s", "kubernetes", "--workspace", "", "-cfg",
                      f"queue=q,secret_env={keys}", DDP, "-j", "2x1", "--", *TRAIN,
                      "--output-dir", s3.url("run"), cwd=tmp_path, env={"HOME": str(tmp_path)},
                      timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert secret not in proc.stdout + proc.stderr
    assert proc.stdout.count("secretKeyRef") == 4  # 2 variables x 2 pods
    assert "persistentVolumeClaim" not in proc.stdout


@pytest.mark.slow
def test_torchx_run_on_local_cwd_passes_the_check_and_the_job_writes_to_the_bucket(
        s3, tmp_path, monkeypatch):
    """The job inherits the submitting environment's credentials and endpoint; none of the
    secret lands in what the run writes."""
    secret = "local-secret-value-91b2"  # moto takes any key; this one is traced
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    proc = torchx_cli("run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}", DDP,
                      "-j", "1x1", "--", *TRAIN, "--tensorboard", "false", "--eval-every", "0",
                      "--output-dir", s3.url("run"), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = s3.keys("run/")
    assert {"run/config.json", "run/metrics.jsonl", "run/console.log",
            "run/summary.json"} <= set(keys), keys
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint)
    for key in keys:
        if key.endswith((".json", ".jsonl", ".log")):
            body = client.get_object(Bucket=s3.name, Key=key)["Body"].read()
            assert secret.encode() not in body, key
    assert not (tmp_path / "outputs").exists()


def test_an_hf_model_in_a_missing_bucket_is_refused_at_submit(s3, tmp_path):
    model = f"hf:s3://{MISSING}/tiny-llama"
    app = ddp("--model", model, "--steps", "2", "--batch-size", "4", "--output-dir",
              str(tmp_path / "run"), j="1x1")
    scheduler = _factory("local_cwd")("test")
    with pytest.raises(ComponentArgumentError) as refused:
        scheduler.schedule(scheduler.submit_dryrun(app, {}))
    assert str(refused.value) == (f"local_cwd: --model {model}: bucket {MISSING} "
                                  "does not exist (create it, or fix the URL)" + REFUSED)


def test_local_paths_beside_a_bucket_are_still_checked_by_the_component(tmp_path):
    """The component leaves the bucket to the submit, not the local --output-dir beside it."""
    with pytest.raises(ComponentArgumentError, match="/proc cannot be written"):
        ddp("--data", f"s3://{MISSING}/data/*.txt", "--output-dir", "/proc/run", *TRAIN,
            j="1x1")
