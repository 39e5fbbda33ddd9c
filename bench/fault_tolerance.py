"""What torchft's replica groups cost per step and what they save when a worker dies, against
plain DDP restarted from its checkpoint (docs/reliability.md, docs/benchmarks.md).

One run, on the CPU with gloo, the ``tiny`` model, the same global batch everywhere:

(a) Per-step overhead of the quorum: ``python -m trainers.ddp`` under torchrun on 4 ranks
    against ``components/fault_tolerant.py:fault_tolerant`` with 2 replica groups x 2 ranks
    and ``--min_replicas 2`` (both groups in every step), ``--checkpoint-every 0``. Two
    figures per run after the warm-up: the median ``step_time_s`` of ``metrics.jsonl`` (the
    trainer's own, which starts after the step's quorum: ``begin_step`` is outside it) and the
    median iteration, the time between the appearances of consecutive steps' records in
    ``metrics.jsonl`` (``--log-every 1``; polled every ``POLL_S``), which holds the quorum too.
(b) A worker SIGKILLed after step ``kill_at``: the fault_tolerant component (2 groups x 2,
    ``--min_replicas 1``; a worker of group 1 killed: the group restarts alone and heals from
    group 0, which keeps stepping) against ``components/ddp.py:ddp -j 1x4 --max_retries 1``
    (one worker killed: torchrun restarts all four, which resume from the checkpoint of
    ``--checkpoint-every``), each against the same run with no kill. The victim is found in
    ``/proc/*/cmdline``: ``trainers.ddp``, this run's ``--output-dir`` (and ``--replica-group
    1``), not torchrun, not a shell.
"""

import json
import os
import shlex
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import BenchError, median

NPROC = 4  # plain DDP's ranks; the replica groups' ranks together
GROUPS = 2
VICTIM_GROUP = 1
POLL_S = 0.005  # how often the watcher reads metrics.jsonl
OVERRIDES = {"batch_size": 4, "overhead_steps": 4, "warmup": 1, "rounds": 1, "steps": 4,
             "kill_at": 1, "checkpoint_every": 1}
QUICK = {"overhead_steps": 20, "warmup": 5, "rounds": 1, "steps": 60, "kill_at": 15,
         "checkpoint_every": 10, "timeout_s": 300.0}


@dataclass
class Plan:
    model: str = "tiny"
    batch_size: int = 16  # the global batch: 4 sequences a rank on 4 ranks
    overhead_steps: int = 200  # steps of each run of (a)
    warmup: int = 20  # leading steps of (a) left out
    rounds: int = 2  # (a): each of its two runs this many times, the order rotating
    steps: int = 800  # steps of each run of (b): the healthy group must not finish before
    # the killed one is back (a restart takes 10-20 s on a busy 2-core machine)
    kill_at: int = 150  # (b): the victim is killed once its run has logged this step
    checkpoint_every: int = 100  # (b): --checkpoint-every of every run (the groups' too)
    train_samples: int = 4096
    timeout_s: float = 900.0  # per run


def base_args(plan: Plan, steps: int) -> list[str]:
    """The trainer flags every run shares: no evaluation or trackers, a record every step,
    ``--peak-tflops`` so that no rank probes the peak."""
    return ["--model", plan.model, "--batch-size", str(plan.batch_size), "--grad-accum", "1",
            "--steps", str(steps), "--eval-every", "0", "--tracker", "none", "--log-every", "1",
            "--peak-tflops", "1", "--train-samples", str(plan.train_samples),
            "--val-samples", "64"]


def free_port_pair() -> int:
    """A free port whose next one is free too (the lighthouse and its finished reports)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        if port >= 65534:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port + 1))
            except OSError:
                continue
        return port


def fault_tolerant_cmd(run_dir: Path, min_replicas: int, args: Sequence[str]) -> list[str]:
    return ["torchx", "run", "-s", "local_cwd", "components/fault_tolerant.py:fault_tolerant",
            "--trainer", "ddp", "--groups", str(GROUPS), "--min_replicas", str(min_replicas),
            "-j", f"1x{NPROC // GROUPS}", "--lighthouse_port", str(free_port_pair()), "--",
            *args, "--output-dir", str(run_dir)]


def ddp_component_cmd(run_dir: Path, args: Sequence[str]) -> list[str]:
    return ["torchx", "run", "-s", "local_cwd", "components/ddp.py:ddp", "-j", f"1x{NPROC}",
            "--max_retries", "1", "--", *args, "--output-dir", str(run_dir)]


def workers(run_dir: Path, group: int | None) -> list[int]:
    """The trainer processes writing to ``run_dir`` (of replica group ``group`` if given): not
    their torchrun, not a shell."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = [w.decode(errors="replace")
                     for w in (entry / "cmdline").read_bytes().split(b"\0") if w]
        except OSError:
            continue
        if (len(words) < 3 or "trainers.ddp" not in words or str(run_dir) not in words
                or any("torchrun" in w or w.startswith("--nproc") for w in words)
                or Path(words[0]).name in ("bash", "sh")):
            continue
        if group is not None and not any(
                a == "--replica-group" and b == str(group)
                for a, b in zip(words, words[1:], strict=False)):
            continue
        pids.append(int(entry.name))
    return sorted(pids)


class Watcher(threading.Thread):
    """Stamps every new line of each ``metrics.jsonl`` (by its text: a restarted run rewrites
    the file) with the seconds since ``start``; with ``victim`` (a run directory, its replica
    group or None), SIGKILLs one of its workers once that run has logged step ``kill_at``."""

    def __init__(self, files: dict[str, Path], start: float, victim: Path | None = None,
                 group: int | None = None, kill_at: int = 0) -> None:
        super().__init__(daemon=True)
        self.files, self.start_time = files, start
        self.victim, self.group, self.kill_at = victim, group, kill_at
        self.events: dict[str, list[tuple[float, int]]] = {name: [] for name in files}
        self.kill: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = threading.Event()

    def poll(self) -> None:
        seen: dict[str, set[str]] = {name: set() for name in self.files}
        sizes: dict[str, int] = {}
        while not self.done.is_set():
            now = time.perf_counter() - self.start_time
            for name, path in self.files.items():
                try:
                    size = path.stat().st_size
                    if size == sizes.get(name):
                        continue
                    sizes[name] = size
                    text = path.read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    if line.endswith("}") and line not in seen[name]:
                        try:
                            step = json.loads(line)["step"]
                        except (ValueError, KeyError):  # a line being written
                            continue
                        seen[name].add(line)
                        self.events[name].append((now, step))
            if self.victim is not None and self.kill is None:
                logged = [s for _, s in self.events["victim"]]
                if logged and max(logged) >= self.kill_at:
                    self.kill_one(now, max(logged))
            time.sleep(POLL_S)

    def kill_one(self, now: float, logged: int) -> None:
        assert self.victim is not None
        pids = workers(self.victim, self.group)
        if not pids:
            self.error = f"no worker of {self.victim} (group {self.group}) to kill"
            self.kill = {}
            return
        os.kill(pids[-1], signal.SIGKILL)
        self.kill = {"pid": pids[-1], "candidates": len(pids), "t": now,
                     "after_step": logged}
        harness.progress(f"  SIGKILL of pid {pids[-1]} ({len(pids)} candidates) after step "
                         f"{logged}, {now:.1f}s into the run")

    def run(self) -> None:
        try:
            self.poll()
        except Exception as err:  # noqa: BLE001 (reported after the run)
            self.error = repr(err)


def watched(cmd: list[str], tag: str, scratch: Path, plan: Plan, files: dict[str, Path],
            victim: Path | None = None, group: int | None = None) -> dict[str, Any]:
    """Run ``cmd`` with a :class:`Watcher` on ``files``: its wall time, every record's
    appearance (``events``: name -> [[seconds, step]]) and the kill, if any."""
    watcher = Watcher(files, time.perf_counter(), victim, group, plan.kill_at)
    watcher.start()
    try:
        wall = harness.run_logged(cmd, scratch, tag, plan.timeout_s)
    finally:
        watcher.done.set()
        watcher.join()
    if watcher.error:
        raise BenchError(f"{tag}: {watcher.error}")
    if victim is not None and not watcher.kill:
        raise BenchError(f"{tag}: the run ended before step {plan.kill_at}; raise --steps")
    summaries = {name: json.loads((path.parent / "summary.json").read_text())
                 for name, path in files.items()}
    records = {name: [json.loads(line) for line in path.read_text().splitlines()
                      if line.endswith("}")] for name, path in files.items()}
    return {"tag": tag, "command": shlex.join(cmd), "wall_s": wall, "kill": watcher.kill,
            "events": watcher.events, "summaries": summaries, "records": records}


def kept(run: dict[str, Any]) -> dict[str, Any]:
    """What the results keep of a run: its command, wall time, kill and summaries (the
    per-step records and arrival times the figures come from stay in the run directories of
    ``--keep-runs``)."""
    return {k: v for k, v in run.items() if k not in ("events", "records")}


def iterations(events: list[tuple[float, int]], warmup: int) -> list[float]:
    """Seconds between the appearances of consecutive steps' records after the warm-up."""
    return [b[0] - a[0] for a, b in zip(events, events[1:], strict=False)
            if b[1] == a[1] + 1 and a[1] >= warmup]


def step_times(records: list[dict[str, Any]], warmup: int) -> list[float]:
    return [r["step_time_s"] for r in records if r["step"] > warmup]


def overhead(plan: Plan, scratch: Path) -> dict[str, Any]:
    """(a): plain DDP on 4 ranks and the replica groups with both in every quorum, ``rounds``
    times each, the order rotating; medians pooled over the rounds (and the two groups)."""
    args = [*base_args(plan, plan.overhead_steps), "--checkpoint-every", "0", "--resume", "none"]
    runs, pooled = [], {"ddp": ([], []), "ft": ([], [])}  # kind -> (step times, iterations)
    for r, kind in harness.rotations(["ddp", "ft"], plan.rounds):
        tag = f"ddp4-r{r}" if kind == "ddp" else f"ft-min2-r{r}"
        run_dir = scratch / tag
        if kind == "ddp":
            files = {"ddp": run_dir / "metrics.jsonl"}
            cmd = harness.launch("trainers.ddp", [*args, "--output-dir", str(run_dir)], NPROC)
        else:
            files = {f"group{g}": run_dir / f"replica_group_{g}" / "metrics.jsonl"
                     for g in range(GROUPS)}
            cmd = fault_tolerant_cmd(run_dir, GROUPS, args)
        result = watched(cmd, tag, scratch, plan, files)
        result["kind"], result["round"] = kind, r
        runs.append(result)
        for name in files:
            pooled[kind][0].extend(step_times(result["records"][name], plan.warmup))
            pooled[kind][1].extend(iterations(result["events"][name], plan.warmup))
    out: dict[str, Any] = {"runs": [kept(run) for run in runs]}
    for kind, (steps, iters) in pooled.items():
        out[f"{kind}_step_time_s"], out[f"{kind}_iteration_s"] = median(steps), median(iters)
        out[f"{kind}_measured_steps"] = len(steps)
    out["step_time_ratio"] = out["ft_step_time_s"] / out["ddp_step_time_s"]
    out["iteration_ratio"] = out["ft_iteration_s"] / out["ddp_iteration_s"]
    return out


def first_after(events: list[tuple[float, int]], t: float) -> tuple[float, int] | None:
    return next(((s, step) for s, step in events if s > t), None)


def kill_torchft(plan: Plan, scratch: Path, args: list[str]) -> dict[str, Any]:
    """(b), torchft: the unkilled run, then the run with a worker of group 1 killed."""
    out: dict[str, Any] = {}
    for tag, kill in (("ft-min1", False), ("ft-min1-kill", True)):
        run_dir = scratch / tag
        files = {f"group{g}": run_dir / f"replica_group_{g}" / "metrics.jsonl"
                 for g in range(GROUPS)}
        if kill:
            files["victim"] = files[f"group{VICTIM_GROUP}"]
        out[tag] = watched(fault_tolerant_cmd(run_dir, 1, args), tag, scratch, plan, files,
                           run_dir if kill else None, VICTIM_GROUP if kill else None)
    run = out["ft-min1-kill"]
    t_kill, after = run["kill"]["t"], run["kill"]["after_step"]
    healthy, victim = run["events"]["group0"], run["events"][f"group{VICTIM_GROUP}"]
    healthy_steps = [s for _, s in healthy]
    back = first_after(victim, t_kill)
    if back is None:
        raise BenchError("ft-min1-kill: the killed group logged no step after the kill")
    during = [(t, s) for t, s in healthy if t_kill < t <= back[0]]
    gaps = [b[0] - a[0] for a, b in zip(healthy, healthy[1:], strict=False)
            if a[0] >= t_kill - 1 and b[0] <= back[0]]
    summaries = run["summaries"]
    return {"runs": [kept(run) for run in out.values()], "killed_after_step": after,
            # the job's step counter is group 0's: a step it took twice would be redone
            "job_steps_redone": (len(healthy_steps) - len(set(healthy_steps))
                                 + summaries["group0"]["steps_lost"]),
            "healthy_steps_in_order": healthy_steps == list(range(1, plan.steps + 1)),
            "healthy_restarts": summaries["group0"]["restarts"],
            "killed_group_restarts": summaries[f"group{VICTIM_GROUP}"]["restarts"],
            "killed_group_back_at_step": back[1],
            # healed: back at the live group's step, not resumed from its own checkpoint
            "killed_group_healed": back[1] > after,
            "killed_group_skipped_steps": back[1] - after - 1,
            "healthy_steps_while_away": len(during),
            "killed_group_away_s": back[0] - t_kill,
            "healthy_longest_pause_s": max(gaps, default=0.0),
            "wall_s": run["wall_s"], "unkilled_wall_s": out["ft-min1"]["wall_s"],
            "wall_lost_s": run["wall_s"] - out["ft-min1"]["wall_s"]}


def kill_restart(plan: Plan, scratch: Path, args: list[str]) -> dict[str, Any]:
    """(b), today's way: plain DDP on 4 ranks under the ddp component, unkilled and killed."""
    out: dict[str, Any] = {}
    for tag, kill in (("ddp4-ckpt", False), ("ddp4-ckpt-kill", True)):
        run_dir = scratch / tag
        files = {"ddp": run_dir / "metrics.jsonl"}
        if kill:
            files["victim"] = files["ddp"]
        out[tag] = watched(ddp_component_cmd(run_dir, args), tag, scratch, plan, files,
                           run_dir if kill else None)
    run = out["ddp4-ckpt-kill"]
    t_kill, after = run["kill"]["t"], run["kill"]["after_step"]
    events = run["events"]["ddp"]
    back = first_after(events, t_kill)
    if back is None:
        raise BenchError("ddp4-ckpt-kill: no step after the kill")
    caught_up = next((t for t, s in events if t > t_kill and s > after), None)
    summary = run["summaries"]["ddp"]
    return {"runs": [kept(run) for run in out.values()], "killed_after_step": after,
            "job_steps_redone": summary["steps_lost"], "restarts": summary["restarts"],
            "resumed_from_step": summary["resumed_from_step"],
            "back_at_step": back[1], "away_s": back[0] - t_kill,
            "caught_up_s": None if caught_up is None else caught_up - t_kill,
            "wall_s": run["wall_s"], "unkilled_wall_s": out["ddp4-ckpt"]["wall_s"],
            "wall_lost_s": run["wall_s"] - out["ddp4-ckpt"]["wall_s"]}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    if not 0 < plan.warmup < plan.overhead_steps - 2:
        raise BenchError(f"--warmup {plan.warmup} must leave steps of --overhead-steps "
                         f"{plan.overhead_steps} to measure")
    if not plan.checkpoint_every < plan.kill_at < plan.steps // 2:
        raise BenchError(f"--kill-at {plan.kill_at} must lie after the first checkpoint "
                         f"(--checkpoint-every {plan.checkpoint_every}) and before half of "
                         f"--steps {plan.steps}")
    if plan.batch_size % NPROC:
        raise BenchError(f"--batch-size {plan.batch_size} must split over {NPROC} ranks")
    args = [*base_args(plan, plan.steps), "--checkpoint-every", str(plan.checkpoint_every)]
    return {"nproc": NPROC, "groups": GROUPS, "overhead": overhead(plan, scratch),
            "kill": {"torchft": kill_torchft(plan, scratch, args),
                     "restart": kill_restart(plan, scratch, args)}}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    ft = report["kill"]["torchft"]
    return [{"name": "torchft: the job (group 0) redid no step and never restarted",
             "pass": ft["job_steps_redone"] == 0 and ft["healthy_restarts"] == 0
             and ft["healthy_steps_in_order"], "value": ft["job_steps_redone"]},
            {"name": "restart: torchrun restarted the workers once",
             "pass": report["kill"]["restart"]["restarts"] == 1,
             "value": report["kill"]["restart"]["restarts"]}]


def markdown(rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(rows[0]) + " |",
                      "| " + " | ".join("---" for _ in rows[0]) + " |",
                      *("| " + " | ".join(row) + " |" for row in rows[1:])])


def table(report: dict[str, Any]) -> str:
    plan, ov = report["plan"], report["overhead"]

    def ms(value: float) -> str:
        return f"{value * 1e3:,.1f} ms"

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f} s"

    batch = (f"{plan['model']}, global batch {plan['batch_size']}, gloo, "
             f"{report['threads_per_process']} thread a process")
    first = markdown([
        ("run", "ranks", "median step_time_s", "median iteration (quorum included)"),
        ("DDP, torchrun", f"{NPROC}", ms(ov["ddp_step_time_s"]), ms(ov["ddp_iteration_s"])),
        ("torchft, min_replicas 2", f"{GROUPS} groups x {NPROC // GROUPS}",
         ms(ov["ft_step_time_s"]), ms(ov["ft_iteration_s"])),
        ("torchft / DDP", "", f"{ov['step_time_ratio']:.2f}x", f"{ov['iteration_ratio']:.2f}x")])
    ft, rs = report["kill"]["torchft"], report["kill"]["restart"]
    second = markdown([
        ("method", "killed after step", "steps redone by the job", "restarts",
         "steps on a partial batch", "killed part away", "healthy part's longest pause",
         "wall time", "unkilled", "wall time lost"),
        ("torchft, 2 groups x 2, min_replicas 1", str(ft["killed_after_step"]),
         str(ft["job_steps_redone"]), f"group 1: {ft['killed_group_restarts']}, group 0: "
         f"{ft['healthy_restarts']}", str(ft["killed_group_skipped_steps"]),
         s(ft["killed_group_away_s"]), s(ft["healthy_longest_pause_s"]), s(ft["wall_s"]),
         s(ft["unkilled_wall_s"]), s(ft["wall_lost_s"])),
        (f"restart from checkpoint, ddp 1x4, every {plan['checkpoint_every']}",
         str(rs["killed_after_step"]), str(rs["job_steps_redone"]), str(rs["restarts"]), "0",
         s(rs["away_s"]), s(rs["away_s"]), s(rs["wall_s"]), s(rs["unkilled_wall_s"]),
         s(rs["wall_lost_s"]))])
    return (f"(a) per-step overhead of the quorum, {plan['overhead_steps']} steps, warm-up "
            f"{plan['warmup']}, {plan['rounds']} round(s) ({batch})\n\n{first}\n\n"
            f"(b) one worker SIGKILLed, "
            f"{plan['steps']} steps, --checkpoint-every {plan['checkpoint_every']}\n\n{second}"
            f"\n\ntorchft: group 0 trained {ft['healthy_steps_while_away']} steps alone while "
            f"group 1 was away; group 1 came back at step {ft['killed_group_back_at_step']}. "
            f"restart: resumed from step {rs['resumed_from_step']}, back past step "
            f"{rs['killed_after_step']} {s(rs['caught_up_s'])} after the kill.")


def draw(report: dict[str, Any], images: Path) -> list[Path]:
    """Not a plot: the table as markdown beside the results JSON."""
    path = harness.RESULTS_DIR / f"fault_tolerance{'_quick' if report['quick'] else ''}.md"
    path.write_text(f"`{report['command']}` ({report['created']}, commit "
                    f"{report['host']['git_commit'][:7]}, load average at the start "
                    f"{report['host']['load_avg_at_start'][0]:.1f})\n\n{table(report)}\n")
    return [path]


if __name__ == "__main__":
    raise SystemExit(harness.main())
