"""Every component is one ``def`` that hands all of its arguments to the shared launcher."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import types
import typing
import warnings

import pytest

from components import launch
from tests.support.processes import run_command
from tests.support.runs import REPO
from trainers.options.trainer_table import TRAINERS


def _launcher_parameters() -> list[inspect.Parameter]:
    """The launch options every trainer component passes on (``run_args``, with a default, is
    for components that add words only the node's shell knows)."""
    return [p for p in inspect.signature(launch.trainer_app).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty]


def _hints(function: typing.Callable) -> dict[str, typing.Any]:
    """Annotations by parameter, with ``Optional[Dict[...]]`` (which TorchX's component linter
    needs) and ``dict[...] | None`` made alike."""
    def normal(hint: typing.Any) -> typing.Any:
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return frozenset(normal(a) for a in args)
        if args:
            return typing.get_origin(hint), tuple(normal(a) for a in args)
        return hint

    return {k: normal(v) for k, v in typing.get_type_hints(function).items()}


@pytest.mark.parametrize("name", list(TRAINERS))
def test_the_signature_is_the_launchers(name: str):
    component = getattr(importlib.import_module(f"components.{name}"), name)
    params = list(inspect.signature(component).parameters.values())
    assert params[0].kind is inspect.Parameter.VAR_POSITIONAL
    launcher = _launcher_parameters()
    assert [p.name for p in params[1:]] == [p.name for p in launcher]
    hints, launcher_hints = _hints(component), _hints(launch.trainer_app)
    for param in params[1:]:
        assert hints[param.name] == launcher_hints[param.name], param.name
    for line_start in (f"        {p.name}: " for p in launcher):  # documented for --help
        assert line_start in launch.LAUNCH_ARGS


@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_argument_reaches_the_launcher(name: str):
    """The body is ``return trainer_app("<name>", script_args, <param>=<param>, ...)``."""
    tree = ast.parse((REPO / "components" / f"{name}.py").read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    call = function.body[-1].value
    assert isinstance(call, ast.Call) and call.func.id == "trainer_app"
    assert [ast.literal_eval(call.args[0]), call.args[1].id] == [name, "script_args"]
    passed = {k.arg: k.value.id for k in call.keywords}
    assert passed == {p.name: p.name for p in _launcher_parameters()}


def _resource(app) -> tuple[int, int, int]:
    (role,) = app.roles
    return role.resource.cpu, role.resource.gpu, role.resource.memMB


def test_nodes_ask_for_resources_by_their_gpus():
    from components.ddp import ddp
    from components.errors import ComponentArgumentError

    assert _resource(ddp("--model", "tiny")) == (2, 0, 4096)  # a CPU node
    assert _resource(ddp("--model", "tiny", j="2x8", gpu=8, gpu_type="h100")) == (
        64, 8, 262144)  # 8 CPUs and 32 GiB per GPU
    assert _resource(ddp("--model", "tiny", j="1x4", gpu=4, gpu_type="l4", cpu=40,
                         memMB=100000)) == (40, 4, 100000)
    # a named resource's GPUs are the node's: 8 on a p4d, so 8 processes
    app = ddp("--model", "tiny", j="1x8", h="aws_p4d.24xlarge", gpu_type="a100-40gb")
    assert _resource(app) == (96, 8, 1132416)
    with pytest.raises(ComponentArgumentError, match="4 processes per node with --gpu 8"):
        ddp("--model", "tiny", j="1x4", h="aws_p4d.24xlarge", gpu_type="a100-40gb")


def test_torchx_builtins_lists_every_component_beside_torchxs_own():
    """pyproject.toml's torchx.components entry points: one per trainer of the table, and
    TorchX's own components (registering any replaces its list) still there."""
    from tests.support.runs import torchx_cli

    proc = torchx_cli("builtins")
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = {line.split(". ", 1)[1].strip() for line in proc.stdout.splitlines()
              if ". " in line}
    assert listed >= {*TRAINERS, "tune", "dist.ddp", "utils.echo"}
    assert not listed & {"launch_options", "trainer_app", "_search_args"}
    dry = torchx_cli("run", "--dryrun", "fsdp", "-j", "1x2", "--", "--model", "tiny")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "trainers.fsdp" in dry.stdout and "'name': 'fsdp'" in dry.stdout


def test_the_appdef_is_a_torchrun_role_with_torchxs_macros():
    """What TorchX's dist.ddp (0.7.0) and dist.torchrun (main) write, plus torchrun's in-place
    restarts and the trainers' preemption signals: the same AppDef on both (.ci/run runs this
    module on TorchX main too), built without a warning."""
    from torchx.specs import RetryPolicy, VolumeMount

    from components.fsdp import fsdp

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        app = fsdp("--model", "tiny", j="1:2x2", env={"OMP_NUM_THREADS": "1"}, max_retries=3,
                   rdzv_port=29511, mounts=["type=volume", "src=claim", "dst=/data"])
    (role,) = app.roles
    assert (app.name, role.name, role.image, role.entrypoint) == (
        "fsdp", "fsdp", launch.DEFAULT_IMAGE, "bash")
    assert role.args == ["-c", (
        "torchrun --max_restarts 3 --rdzv_backend c10d "
        "--rdzv_endpoint $${${rank0_env}:=localhost}:29511 --rdzv_id '${app_id}' --nnodes 1:2 "
        "--nproc_per_node 2 --tee 3 --role '' -m trainers.fsdp --model tiny "
        "--output-dir 'outputs/${app_id}'")]
    assert role.env == {
        "OMP_NUM_THREADS": "1", "TORCHX_TRACKING_EXPERIMENT_NAME": "default-experiment",
        "TORCHX_TRACKING_RUN_NAME": "fsdp", "LOGLEVEL": os.getenv("LOGLEVEL", "WARNING"),
        "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "PET_SHUTDOWN_TIMEOUT": "900"}
    assert (role.min_replicas, role.num_replicas, role.max_retries, role.retry_policy) == (
        1, 2, 3, RetryPolicy.APPLICATION)
    assert role.port_map == {"c10d": 29511}
    assert role.mounts == [VolumeMount(src="claim", dst_path="/data", read_only=False)]


def test_one_node_rendezvouses_on_a_free_port_of_its_own():
    (role,) = launch.torchrun_app("trainers.ddp", "--steps", "3", j="2").roles
    assert role.num_replicas == 1
    assert role.args[-1] == (
        "torchrun --max_restarts 0 --rdzv_backend c10d --rdzv_endpoint localhost:0 --rdzv_id "
        "'${app_id}' --nnodes 1 --nproc_per_node 2 --tee 3 --role '' -m trainers.ddp --steps 3")
    assert role.port_map == {"c10d": 0}
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (2, 0, 4096)


def test_a_word_with_spaces_reaches_the_trainer_as_one_argument(tmp_path):
    """The bash script is rendered from a list of words: bash hands them back unchanged."""

    words = ["--data", str(tmp_path / "my corpus"), "--note", "it's $HOME"]
    (role,) = launch.torchrun_app("trainers.ddp", *words, j="1x1").roles
    script = role.args[-1].replace("torchrun ", "printf '%s\\n' ", 1)
    out = run_command(["bash", "-c", script], check=True)
    assert out.stdout.splitlines()[-len(words):] == words
