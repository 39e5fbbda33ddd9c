"""The ``fault_tolerant`` component: ``torchx run components/fault_tolerant.py:fault_tolerant
--groups 2 -j 1x2 -- --model tiny``: torchft's lighthouse and replica groups of the DDP or FSDP
trainer as roles of one job (docs/reliability.md)."""

from typing import Dict, List, Optional

from torchx import specs
from torchx.specs import macros

from components.errors import ComponentArgumentError
from components.launch import (
    DEFAULT_IMAGE,
    ShellExpanded,
    launch_options,
    node_range,
    trainer_app,
    with_output_dir,
)
from components.schedulers.slurm.script import COLOCATED
from trainers.config.parsing import parse_config
from trainers.runs.replica_groups import FINISHED_PORT_OFFSET, LIGHTHOUSE_PORT

# The trainers whose replicas a replica group can hold (their table entries serve the options).
TRAINERS = ("ddp", "fsdp")
# What the lighthouse role asks for: it only answers quorum requests.
# (Kubernetes requests memMB less TorchX's 1024 MB reserve: 1 GB.)
LIGHTHOUSE_RESOURCE = specs.Resource(cpu=1, gpu=0, memMB=2048)


@launch_options
def fault_tolerant(
    *script_args: str,
    trainer: str = "ddp",
    groups: int = 2,
    min_replicas: int = 1,
    lighthouse_port: int = LIGHTHOUSE_PORT,
    j: str = "1x2",
    image: str = DEFAULT_IMAGE,
    cpu: int = 0,
    gpu: int = 0,
    memMB: int = 0,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 3,
    rdzv_port: int = 0,
    mounts: Optional[List[str]] = None,
    check_paths: bool = True,
    device_memory_gb: float = 0.0,
    gpu_type: Optional[str] = None,
) -> specs.AppDef:
    """Fault-tolerant data parallelism with torchft: replica groups that keep training when one
    of them dies (``python -m trainers.ddp|fsdp --fault-tolerant``).

    The job's first role is torchft's lighthouse (``python -m trainers.tools.lighthouse``),
    which holds every step's quorum of the groups alive and stops once every group has
    reported having trained to --steps; then one role per replica group, each a torchrun of
    ``-j 1xN`` ranks of the trainer on one node. A group that loses a rank restarts alone
    (torchrun's in-place restarts, then its role's retries: ``max_retries`` each) and heals
    from a live group's weights while the others keep stepping. Each group writes its run to
    ``<output-dir>/replica_group_<i>``; ``--batch-size`` is the global batch of all groups.

    Args:
        script_args: trainer arguments, e.g. ``--model small --steps 200 --batch-size 64``
        trainer: ddp (each rank a whole replica) or fsdp (the model sharded inside a group)
        groups: replica groups, each a role of its own (one node of -j 1xN ranks)
        min_replicas: groups a step needs to commit (1: train on with any group alive)
        lighthouse_port: the port the lighthouse serves on (the first role's node; the groups
            report having finished on the next one)
    """
    if trainer not in TRAINERS:
        raise ComponentArgumentError(f"--trainer {trainer}: replica groups hold the ddp or fsdp "
                                     "trainer; pass --trainer ddp or --trainer fsdp")
    if groups < 1:
        raise ComponentArgumentError(f"--groups {groups}: pass 1 or more replica groups")
    if not 1 <= min_replicas <= groups:
        raise ComponentArgumentError(
            f"--min_replicas {min_replicas} must be between 1 and the {groups} --groups (more "
            "could never commit a step); pass --min_replicas 1 to train on with any group alive")
    if not 1 <= lighthouse_port < 65535:
        raise ComponentArgumentError(f"--lighthouse_port {lighthouse_port}: not a TCP port; pass "
                                     f"1-65534 (the next one is its too), e.g. {LIGHTHOUSE_PORT}")
    if node_range(j)[1] != 1:
        raise ComponentArgumentError(f"-j {j}: a replica group is one node here (-j 1xN); add "
                                     "nodes as more --groups")
    given = [a for a in script_args if a.split("=")[0] in (
        "--fault-tolerant", "--replica-groups", "--replica-group", "--min-replicas",
        "--lighthouse")]
    if given:
        raise ComponentArgumentError(f"{given[0].split('=')[0]} is set by the component; drop it "
                                     "(use --groups, --min_replicas and --lighthouse_port)")
    # The lighthouse is the first role's first node: TorchX's rank0_env names it on every node.
    url = f"http://{{}}:{lighthouse_port}"
    lighthouse = ShellExpanded(url.format(f"$${{{macros.rank0_env}:=localhost}}"))
    roles = []
    for group in range(groups):
        ft_args = ["--fault-tolerant", "--replica-groups", str(groups),
                   "--replica-group", str(group), "--min-replicas", str(min_replicas)]
        app = trainer_app(trainer, (*script_args, *ft_args), j=j, image=image, cpu=cpu, gpu=gpu,
                          memMB=memMB, h=h, env=env, max_retries=max_retries,
                          rdzv_port=rdzv_port, mounts=mounts, check_paths=check_paths,
                          device_memory_gb=device_memory_gb, gpu_type=gpu_type,
                          run_args=["--lighthouse", lighthouse])
        role = app.roles[0]
        role.name = f"replica_group_{group}"
        # a lost group restarts alone (Kubernetes: its task or Job; the lighthouse and the
        # other groups keep running), never the job
        role.retry_policy = specs.RetryPolicy.REPLICA
        roles.append(role)
    # The groups' --steps and --output-dir (checked above), for the lighthouse to stop after.
    cfg = parse_config([*with_output_dir(script_args), *ft_args], trainer,
                       world_sizes=[node_range(j)[2]], check_paths=False, reach_stores=False)
    lighthouse_role = specs.Role(
        name="lighthouse", image=image, entrypoint="python",
        args=["-m", "trainers.tools.lighthouse", "--groups", str(groups),
              "--min-replicas", str(min_replicas), "--steps", str(cfg.steps),
              "--output-dir", cfg.output_dir, "--port", str(lighthouse_port)],
        env=dict(env or {}), resource=LIGHTHOUSE_RESOURCE,
        port_map={"lighthouse": lighthouse_port,
                  "finished": lighthouse_port + FINISHED_PORT_OFFSET},
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        mounts=roles[0].mounts,
        # Slurm: a step on the first group's node, not a node of its own (script.py)
        metadata={COLOCATED: True})
    return specs.AppDef(name="fault_tolerant", roles=[lighthouse_role, *roles])
