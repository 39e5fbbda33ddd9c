"""A pytest plugin: one end-to-end run of each component through ``torchx run -s local_cwd``
(40 steps of the tiny model on one node), made when a test first asks for it and shared by the
whole pytest run. The component tests check what the runs wrote; the sample and export tests
read their checkpoints against the one-process run of the same arguments."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import shared_launches
from tests.support.runs import run_trainer, torchx_cli

# Each component: its -j and its own trainer options (fsdp ZeRO-2, tensor parallel with
# sequence parallel, interleaved stages). Two processes at most: on 2 cores a third and fourth
# rank cost more start-up than they prove (the data-parallel x tensor-parallel mesh trains as one
# process does in test_parity_sharded.py, and as a component on two Slurm nodes).
COMPONENTS: dict[str, tuple[str, list[str]]] = {
    "ddp": ("1x2", []),
    "fsdp": ("1x2", ["--reshard-after-forward", "false"]),
    "tensor_parallel": ("1x2", ["--tp", "2", "--sequence-parallel"]),
    "pipeline": ("1x2", ["--pp", "2", "--schedule", "interleaved1f1b", "--virtual-stages", "2"]),
    "model_parallel": ("1x1", ["--devices", "cpu,cpu"]),
}


def by_component() -> list:
    """COMPONENTS as pytest parameters: ddp's run in README's tier, the others' in the slow
    tier (each a torchx run of its own: minutes on 2 cores)."""
    return [name if name == "ddp" else pytest.param(name, marks=pytest.mark.slow)
            for name in COMPONENTS]


E2E_ARGS = ["--model", "tiny", "--steps", "40", "--batch-size", "16", "--eval-every", "20"]


class ComponentRuns:
    """``runs[component]``: the run directory of the component's job (run on first use);
    ``runs.output(component)``: that ``torchx run``; ``runs.reference``: the one-process
    ``python -m trainers.ddp`` run of the same arguments."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._procs: dict[str, subprocess.CompletedProcess[str]] = {}
        self._reference: Path | None = None

    def output(self, component: str) -> subprocess.CompletedProcess[str]:
        if component not in self._procs:
            j, options = COMPONENTS[component]
            with shared_launches(f"component run {component}"):
                self._procs[component] = torchx_cli(
                    "run", "-s", "local_cwd", f"components/{component}.py:{component}", "-j",
                    j, "--", *E2E_ARGS, "--output-dir", str(self.root / component), *options)
        return self._procs[component]

    def __getitem__(self, component: str) -> Path:
        proc = self.output(component)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return self.root / component

    @property
    def reference(self) -> Path:
        if self._reference is None:
            self._reference = self.root / "one-process"
            with shared_launches("component run reference"):
                run_trainer([*E2E_ARGS, "--output-dir", str(self._reference)])
        return self._reference


@pytest.fixture(scope="session")
def component_runs(tmp_path_factory) -> ComponentRuns:
    return ComponentRuns(tmp_path_factory.mktemp("components"))
