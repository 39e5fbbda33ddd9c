"""The extended kubernetes scheduler's options: parsing, pod customisation, and bad input
refused in one line through the real ``torchx run`` before anything is submitted."""

from __future__ import annotations

import pytest
from torchx import specs

from components.errors import ComponentArgumentError
from components.schedulers.k8s import options as opt
from components.schedulers.k8s.pod import (
    PodOptions,
    check_fits,
    customize_pod,
    processes_per_pod,
    shm_quantity,
)
from components.schedulers.k8s.volcano import KubernetesScheduler, create_scheduler
from tests.support.k8s import REPO, dryrun_args
from tests.support.runs import torchx_cli


def test_kubernetes_entry_point_is_the_extended_scheduler():
    from torchx.schedulers import get_scheduler_factories

    scheduler = get_scheduler_factories()["kubernetes"]("test")
    assert isinstance(scheduler, KubernetesScheduler)
    opts = scheduler.run_opts()
    assert not opts.get("queue").is_required  # checked in one line by _submit_dryrun
    added = {"node_selector", "tolerations", "secret_env", "secret_volumes", "checkpoint_pvc",
             "shm_size", "image_pull_secrets", "read_only_root_fs", "node_shapes"}
    assert added <= dict(opts).keys()


def test_parsers_accept_the_documented_forms():
    k8s = "kubernetes"
    assert opt.parse_node_selector(
        k8s, ["node.kubernetes.io/instance-type:m5.2xlarge", "pool:"]) == {
        "node.kubernetes.io/instance-type": "m5.2xlarge", "pool": ""}
    assert opt.parse_tolerations(k8s, ["nvidia.com/gpu:NoSchedule", "team:ml:NoExecute"]) == [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule", "operator": "Exists"},
        {"key": "team", "effect": "NoExecute", "operator": "Equal", "value": "ml"}]
    assert opt.parse_secret_env(k8s, ["HF_TOKEN:hf-token:token", "s3-creds"]) == [
        opt.SecretEnv("hf-token", "HF_TOKEN", "token"), opt.SecretEnv("s3-creds")]
    assert opt.parse_secret_volumes(k8s, ["gcs-key:/var/run/gcs/"]) == [
        ("gcs-key", "/var/run/gcs")]
    assert opt.parse_pvc(k8s, "ckpt", "/out") == ("ckpt", "/out")
    assert opt.parse_pvc(k8s, "ckpt:/mnt/c", "/out") == ("ckpt", "/mnt/c")
    assert opt.parse_quantity(k8s, "shm_size", "2Gi") == 2 * 2**30
    assert opt.parse_quantity(k8s, "shm_size", "1.5G") == 1_500_000_000
    assert opt.parse_quantity(k8s, "shm_size", "4096M") == 4096 * 10**6
    assert opt.parse_node_shapes(k8s, ["8/32Gi", "96/1100Gi/8"]) == [
        opt.NodeShape(8.0, 32 * 2**30, 0), opt.NodeShape(96.0, 1100 * 2**30, 8)]
    assert opt.is_dns1123_label("a" * 63) and not opt.is_dns1123_label("a" * 64)


@pytest.mark.parametrize(("parse", "value", "fragment"), [
    (opt.parse_node_selector, ["zone=us-east"], "LABEL_KEY:LABEL_VALUE"),
    (opt.parse_node_selector, ["bad key:v"], "LABEL_KEY:LABEL_VALUE"),
    (opt.parse_tolerations, ["gpu:Sometimes"], "EFFECT one of"),
    (opt.parse_tolerations, ["a:b:c:NoSchedule"], "KEY:VALUE:EFFECT"),
    (opt.parse_secret_env, ["HF_TOKEN:hf-token"], "VAR:SECRET:KEY or SECRET"),
    (opt.parse_secret_env, ["1BAD:Upper_Case:key"], "VAR:SECRET:KEY or SECRET"),
    (opt.parse_secret_volumes, ["gcs-key"], "NAME:PATH"),
    (opt.parse_secret_volumes, ["gcs-key:relative/path"], "PATH absolute"),
    (lambda s, v: opt.parse_pvc(s, v[0], "/out"), ["Ckpt_Claim"], "DNS-1123 name"),
    (lambda s, v: opt.parse_quantity(s, "shm_size", v[0]), ["lots"], "positive quantity"),
    (lambda s, v: opt.parse_quantity(s, "shm_size", v[0]), ["0Gi"], "positive quantity"),
    (opt.parse_node_shapes, ["8cpu-32Gi"], "CPUS/MEMORY[/GPUS]"),
    (opt.parse_node_shapes, ["8/32GB"], "CPUS/MEMORY[/GPUS]"),
    (lambda s, v: opt.check_label(s, "namespace", v[0]), ["-ns"], "DNS-1123 label"),
])
@pytest.mark.parametrize("scheduler", ["kubernetes", "kubernetes_jobset"])
def test_parsers_refuse_bad_forms_in_one_line(parse, value, fragment, scheduler):
    """Each error starts with the name of the scheduler that parses (no renaming after)."""
    with pytest.raises(ComponentArgumentError, match=f"^{scheduler}: ") as info:
        parse(scheduler, value)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def _template(privileged: bool = False) -> dict:
    return {"metadata": {}, "spec": {
        "containers": [{"name": "ddp-0", "image": "i", "command": ["bash"],
                        "resources": {"limits": {"memory": "4096M"}},
                        "securityContext": {"privileged": True} if privileged else {},
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                                         {"name": "mount-0", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                    {"name": "mount-0", "persistentVolumeClaim": {"claimName": "data"}}],
        "nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}}


def test_customize_pod_refuses_what_it_cannot_serve():
    base = PodOptions("kubernetes", shm_size="1Gi", read_only_root_fs=False)
    with pytest.raises(ComponentArgumentError, match="^kubernetes: .*privileged container"):
        customize_pod(_template(privileged=True), base, 1)
    with pytest.raises(ComponentArgumentError, match="^kubernetes_jobset: two volumes mount at "
                       "/tmp"):
        customize_pod(_template(), PodOptions("kubernetes_jobset", shm_size="1Gi"), 1)
    with pytest.raises(ComponentArgumentError, match="exceeds the pod's memory limit 4096M"):
        customize_pod(_template(), PodOptions("kubernetes", shm_size="8Gi",
                                              read_only_root_fs=False), 1)
    with pytest.raises(ComponentArgumentError, match="contradicts .* named resource"):
        customize_pod(_template(), PodOptions(
            "kubernetes", shm_size="1Gi", read_only_root_fs=False,
            node_selector={"node.kubernetes.io/instance-type": "m5.large"}), 1)
    pod = customize_pod(_template(), base, 1)
    assert pod["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    assert _template()["spec"]["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}


@pytest.mark.parametrize(("args", "gpu", "processes"), [
    (["-c", "torchrun --nnodes 2 --nproc_per_node 8 --tee 3 -m trainers.ddp"], 8, 8),
    (["--nnodes", "2", "--nproc_per_node", "4", "-m", "trainers.ddp"], 0, 4),  # words of own
    (["--nproc-per-node=3", "-m", "trainers.ddp"], 0, 3),
    (["-c", "torchrun --nproc_per_node gpu -m trainers.ddp"], 8, 8),  # not a number: the GPUs
    (["-c", "python -m trainers.ddp 'unbalanced"], 0, 1),  # no torchrun: at least one
])
def test_processes_per_pod_reads_torchruns_nproc_per_node(args, gpu, processes):
    role = specs.Role(name="ddp", image="i", entrypoint="bash", args=args,
                      resource=specs.Resource(cpu=1, gpu=gpu, memMB=1024))
    assert processes_per_pod(role) == processes


def test_dev_shm_is_the_floor_plus_a_share_a_process_within_the_memory_limit():
    sizes = {}
    for processes in (1, 2, 8):
        pod = customize_pod(_template(), PodOptions("kubernetes", read_only_root_fs=False),
                            processes)
        sizes[processes] = pod["spec"]["volumes"][0]["emptyDir"]
    assert sizes[1] == {"medium": "Memory", "sizeLimit": "1536Mi"}
    assert sizes[2] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert sizes[8] == {"medium": "Memory", "sizeLimit": "4096M"}  # 5Gi > the limit, 4096M
    explicit = customize_pod(_template(), PodOptions("kubernetes", shm_size="3Gi",
                                                     read_only_root_fs=False), 8)
    assert explicit["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "3Gi"
    assert [shm_quantity(n) for n in (2**30, 3 * 2**29, 2**20 + 1)] == ["1Gi", "1536Mi", "2Mi"]


def test_check_fits_takes_any_node_that_holds_the_pod():
    shapes = opt.parse_node_shapes("kubernetes", ["8/32Gi", "96/1100Gi/8"])
    check_fits("kubernetes", "ddp", 64, 500_000, 8, shapes)
    check_fits("kubernetes", "ddp", 1e6, 1, 1, [])  # no shapes configured: nothing to check
    with pytest.raises(ComponentArgumentError, match="largest: 96 CPUs/1100Gi/8 GPUs"):
        check_fits("kubernetes", "ddp", 8, 4096, 9, shapes)


def test_job_name_that_cannot_be_a_pod_hostname_is_refused_on_every_submit():
    """Volcano names pods JOB-TASK-INDEX (also their host names): all must fit 63 characters
    with the longest id TorchX appends (14), whatever id this submit drew."""
    role = specs.Role(name="trainer", image="i", entrypoint="python", num_replicas=1,
                      resource=specs.Resource(cpu=1, gpu=0, memMB=2048))
    scheduler = create_scheduler("test")
    with pytest.raises(ComponentArgumentError, match=r"job name 'a{50}-\w+' can reach 65 "):
        scheduler.submit_dryrun(specs.AppDef(name="a" * 50, roles=[role]), {"queue": "q"})
    # TorchX's task is "trainer-0", its pod JOB-trainer-0-0: 36 + 1 + 14 + 12 = 63 fits.
    for _ in range(20):  # ids of 1 to 14 characters: the answer never depends on the draw
        with pytest.raises(ComponentArgumentError, match=r"pod hostname 'a{40}-\w+-trainer-0-0' "
                           r"can reach 67 characters.*shorten the app or role names"):
            scheduler.submit_dryrun(specs.AppDef(name="a" * 40, roles=[role]), {"queue": "q"})
        info = scheduler.submit_dryrun(specs.AppDef(name="a" * 36, roles=[role]), {"queue": "q"})
        assert info.request.resource["metadata"]["name"].startswith("a" * 36 + "-")


class _DryRunApi:
    """A CustomObjectsApi that records the job of each server-side dry run, or raises."""

    def __init__(self, error: Exception | None = None):
        self.bodies, self.error = [], error

    def create_namespaced_custom_object(self, **kwargs):
        assert kwargs["dry_run"] == "All" and kwargs["namespace"] == "team-a"
        if self.error is not None:
            raise self.error
        self.bodies.append(kwargs["body"])
        return kwargs["body"]


def test_validate_spec_asks_the_api_server_about_the_job_as_submitted(monkeypatch):
    """validate_spec (TorchX main's option; off by default here, on both versions) validates
    the hardened job, not TorchX's render before it; failures are one line."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import MaxRetryError

    role = specs.Role(name="trainer", image="i", entrypoint="python", num_replicas=2,
                      resource=specs.Resource(cpu=1, gpu=0, memMB=2048))
    app = specs.AppDef(name="job", roles=[role])
    cfg = {"queue": "q", "namespace": "team-a", "validate_spec": True}
    scheduler = create_scheduler("test")
    assert scheduler.run_opts().get("validate_spec").default is False  # dry runs need no cluster
    api = _DryRunApi()
    monkeypatch.setattr(scheduler, "custom_objects_api", lambda: api)
    info = scheduler.submit_dryrun(app, cfg)
    assert api.bodies == [info.request.resource]  # once, and the hardened job
    pod = api.bodies[0]["spec"]["tasks"][0]["template"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    refused = ApiException(status=422, reason="Unprocessable Entity")
    refused.body = '{"message": "queue q is closed"}'
    for error, message in [(refused, r"^kubernetes: the API server refuses the job \(422: queue "
                                     r"q is closed\); fix what it names, or pass -cfg "
                                     r"validate_spec=False"),
                           (MaxRetryError(None, "/"), r"^kubernetes: validate_spec: no Kubernetes "
                                                      r"API server answers \(MaxRetryError\)")]:
        monkeypatch.setattr(scheduler, "custom_objects_api", lambda e=error: _DryRunApi(e))
        with pytest.raises(ComponentArgumentError, match=message):
            scheduler.submit_dryrun(app, cfg)
    monkeypatch.setattr(scheduler, "custom_objects_api", lambda: pytest.fail("asked the server"))
    scheduler.submit_dryrun(app, {**cfg, "validate_spec": False})


# (-cfg, component options, the error's start). Each runs the real CLI with no .torchxconfig.
BAD_INPUT = [
    ("", [], "kubernetes: no Volcano queue given; pass -cfg queue="),
    ("queue=q,namespace=Team_A", [],
     "kubernetes: namespace='Team_A' is invalid: must be a DNS-1123 label"),
    ("queue=q,tolerations=gpu:Sometimes", [], "kubernetes: tolerations='gpu:Sometimes' is invalid"),
    ("queue=q,node_selector=zone", [], "kubernetes: node_selector='zone' is invalid"),
    ("queue=q,secret_env=HF_TOKEN:hf", [], "kubernetes: secret_env='HF_TOKEN:hf' is invalid"),
    ("queue=q,secret_volumes=key", [], "kubernetes: secret_volumes='key' is invalid"),
    ("queue=q,checkpoint_pvc=ckpt:out", [], "kubernetes: checkpoint_pvc='ckpt:out' is invalid"),
    ("queue=q", ["--mounts", "type=volume,src=ckpt"], "--mounts type=volume,src=ckpt: no dst="),
    ("queue=q", ["--mounts", "type=volume,src=Ckpt_1,dst=/data"],
     "kubernetes: --mounts src='Ckpt_1' is invalid"),
    ("queue=q", ["--mounts", "type=bind,src=/x,dst=/data"],
     "kubernetes: --mounts type=bind (/x) mounts a host path"),
    ("queue=q,node_shapes=8/32Gi", ["--cpu", "16"],
     "kubernetes: role ddp asks each pod for 16 CPUs"),
    ("queue=q", ["-h", "cpu.smal"], "-h cpu.smal: No named resource found for `cpu.smal`. Did"),
    ("queue=q,shm_size=8Gi", [], "kubernetes: shm_size=8Gi exceeds the pod's memory limit 4096M"),
]


@pytest.mark.parametrize(("cfg", "options", "start"), BAD_INPUT,
                         ids=[f"{i}-{b[2].split()[1 if b[2][0] == 'k' else 0]}"
                              for i, b in enumerate(BAD_INPUT)])
def test_torchx_run_refuses_bad_input_in_one_line(tmp_path, cfg, options, start):
    args = dryrun_args("ddp", "2x2", ("--model", "tiny"), cfg, path=REPO / "components/ddp.py")
    args[args.index("-j"):args.index("-j")] = options
    proc = torchx_cli(*args, cwd=tmp_path, env={"HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "=== SCHEDULER REQUEST ===" not in proc.stdout
    lines = proc.stderr.splitlines()
    (i,) = [i for i, line in enumerate(lines) if line.startswith(f" {start}")]
    assert lines[i - 1].startswith("Failed to run component") and i == len(lines) - 1
