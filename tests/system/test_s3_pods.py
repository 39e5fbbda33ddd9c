"""A multi-pod Kubernetes job with its run on object storage and no volume: the Volcano Job
that ``torchx run --dryrun -s kubernetes`` renders with ``--output-dir s3://...`` and no
``checkpoint_pvc``, its pods run as containers (tests/support/pod_runner.py) against moto's S3
server (tests/support/s3.py), one pod stopped mid-run, the job restarted by its policies and
resumed from the bucket, ending where an uninterrupted run ends: the pods exit on the SIGTERM of
their eviction (within the rendered grace period), having saved the step they were in.

The pods run on the host's network, where the server listens (127.0.0.1); the credentials
reach them as the Secret named by ``secret_env`` would (its keys as environment, added here
because the local runner has no Secrets), and the rendered job names only the Secret.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.pod_runner import HOST_NETWORK, Eviction, run_pods
from tests.support.runs import TINY, assert_same_run, run_trainer, torchx_cli, without
from tests.support.volcano_local import pods, scheduler_request
from tests.system.test_images import IMAGE, engine  # noqa: F401 (the engine fixture)
from trainers.runs.storage import location

STEPS = 60
TRAIN = [*without(TINY, "--steps", "--resume", "--log-every"), "--steps", str(STEPS),
         "--log-every", "4", "--checkpoint-every", "10", "--resume", "auto"]


def _render(bucket_url: str, tmp: Path) -> dict:
    """The rendered Volcano Job (2 pods of 1 process), run outside the repository: its
    .torchxconfig names a checkpoint_pvc."""
    proc = torchx_cli(
        "run", "--dryrun", "-s", "kubernetes", "--workspace", "", "-cfg",
        "queue=default,termination_grace_s=60,secret_env=s3-credentials",
        str(Path(__file__).resolve().parents[2] / "components/ddp.py") + ":ddp", "-j", "2x1",
        "--image", IMAGE, "--max_retries", "1", "--env", "OMP_NUM_THREADS=1", "--",
        *TRAIN, "--output-dir", bucket_url, cwd=tmp, env={"HOME": str(tmp)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return scheduler_request(proc.stdout)


@pytest.mark.slow
def test_job_without_a_volume_resumes_from_the_bucket(engine, s3, tmp_path):  # noqa: F811
    has_s3fs = subprocess.run([engine, "run", "--rm", IMAGE, "python", "-c", "import s3fs"],
                              capture_output=True, timeout=120)
    assert has_s3fs.returncode == 0, f"{IMAGE} has no s3fs: rebuild it (images/build cpu)"
    url = s3.url("run")
    secret = f"pod-secret-{uuid.uuid4().hex}"  # any key works with moto; this one is traced
    job = _render(url, tmp_path)
    rendered = json.dumps(job)
    assert secret not in rendered and "persistentVolumeClaim" not in rendered
    assert '"secretRef": {"name": "s3-credentials"}' in rendered
    name = job["metadata"]["name"]
    credentials = {**s3.env, "AWS_SECRET_ACCESS_KEY": secret}
    job_pods = [dataclasses.replace(pod, env={**pod.env, **credentials}) for pod in pods(job)]

    def mid_run() -> bool:  # a committed checkpoint in the bucket
        return any(k.endswith("/manifest.json") for k in s3.keys("run/checkpoints/"))

    result = run_pods(engine, job_pods, job["spec"]["maxRetry"], HOST_NETWORK,
                      tmp_path / "claims", eviction=Eviction(f"{name}-ddp-1-0", mid_run))
    logs = "\n".join(pod.logs[-3000:] for run in result.runs for pod in run)
    assert (result.phase, result.retries, len(result.runs)) == ("Completed", 1, 2), logs
    first = "\n".join(pod.logs for pod in result.runs[0])
    saved = re.search(r"preempted by SIGTERM after step (\d+): saved", first)
    assert saved is not None and 10 <= int(saved[1]) < STEPS, logs
    assert all(pod.exit_code != 0 for pod in result.runs[0]), logs
    stop_s = result.stopped_at - result.evicted_at
    assert stop_s < 60, stop_s  # the pods exited on SIGTERM, not at SIGKILL after 60 s

    run_dir = tmp_path / "from-bucket"
    store = location(url)
    store.fs.get(store.path, str(run_dir), recursive=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == int(saved[1]) and summary["steps_lost"] <= 1, summary
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    for written in ("config.json", "metrics.jsonl", "console.log"):
        assert (run_dir / written).stat().st_size > 0, written
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log"):
            assert secret not in path.read_text(errors="replace"), path

    reference = tmp_path / "uninterrupted"
    run_trainer([*TRAIN, "--output-dir", str(reference)], nproc=2)
    assert_same_run(run_dir, reference, tmp_path)
    print(f"stopped after step {saved[1]}, steps lost {summary['steps_lost']}; pods exited "
          f"{stop_s:.1f} s and were running again {result.restarted_at - result.evicted_at:.1f} "
          "s after the SIGTERM")
