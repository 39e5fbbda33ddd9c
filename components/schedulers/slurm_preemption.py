"""Time limits and preemption on Slurm: the ``signal_grace`` run option of our slurm scheduler.

With ``-cfg signal_grace=N`` every heterogeneous component asks for ``--signal=B:USR1@N`` (TorchX
already asks for ``--requeue``): Slurm sends SIGUSR1 to the batch shell N seconds before the
job's time limit (up to 60 s earlier: Slurm checks time limits every 30 s), and an operator
sends the same with ``scancel --batch --signal=USR1 <id>``. The job script
(:func:`requeue_on_signal`) runs srun in the background so that its trap runs at once, forwards
the signal once to srun (whose slurmstepd signals every process of the step: torchrun, which
forwards it again, and the trainers, which finish their step, save it and exit ``128 + 10``),
waits for the tasks, and requeues the job (``scontrol requeue``). The job keeps its id, so its
next attempt runs in the same job directory and resumes from that checkpoint (``--resume auto``
in ``outputs/<id>``).

``B:`` (the batch shell only) because the script must know the job was signalled, to requeue it;
without ``B:`` Slurm signals the tasks only and the script sees a failed srun. SIGTERM (scancel,
``scontrol requeue``, preemption, the time limit itself) reaches every task from Slurm directly,
with KillWait (or the partition's GraceTime) to save before SIGKILL, so the trap for it only
keeps the script waiting while they save; it does not requeue (Slurm requeues a preempted job
itself, and a cancelled or timed-out one must not be).
"""

from __future__ import annotations

from components.errors import ComponentArgumentError

SIGNAL = "USR1"
MAX_GRACE = 65535  # sbatch --signal: sig_time is 0..65535 seconds
EARLY = 60  # s: Slurm may send the signal up to this much before the grace (sbatch(1))

# TorchX's job script runs the job's one srun in the foreground between these two lines, where
# a trap runs only after srun has ended; 0.7.0 and main write the same.
_SRUN_START = "\nset +e\nsrun "
_SRUN_END = "\nexitcode=$?\n"
_RESULT = '\necho "job exited with code $exitcode"\n'

_TRAPS = f"""preempted=
forwarded=
srun_pid=
forward() {{  # forward the batch shell's SIG{SIGNAL} to srun, once
    if [ -z "$preempted" ]; then preempted=SIG{SIGNAL}; fi
    if [ -n "$srun_pid" ] && [ -z "$forwarded" ]; then
        forwarded=1
        echo "torchx: SIG{SIGNAL} at $(date -u +%H:%M:%S): forwarded to the tasks, which save"
        kill -{SIGNAL} "$srun_pid"
    fi
}}
trap forward {SIGNAL}
trap 'echo "torchx: SIGTERM: Slurm signals every task itself; waiting for them to save"' TERM
"""
_WAIT = """ &
srun_pid=$!
if [ -n "$preempted" ]; then forward; fi  # signalled before srun started
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; done
wait "$srun_pid"
exitcode=$?
"""
_REQUEUE = """
if [ -n "$preempted" ] && [ "$exitcode" -ne 0 ]; then
    echo "torchx: job $SLURM_JOB_ID saved on $preempted; requeued at $(date -u +%H:%M:%S)" \
         "to resume from there"
    scontrol requeue "$SLURM_JOB_ID"
    exit "$exitcode"
fi"""


def sbatch_signal(grace: int) -> str:
    """The ``--signal`` value of a job whose batch shell is told ``grace`` s before its end."""
    return f"B:{SIGNAL}@{grace}"


def check_signal_grace(grace: int, seconds: float, source: str) -> None:
    """Raise ComponentArgumentError unless ``grace`` seconds fit sbatch's range and, with the
    60 s by which Slurm may signal early, lie below the job's time limit of ``seconds``
    (``inf``: none known), which ``source`` names (``time=30``, or the partition's limit).
    A grace that is not is signalled at (or before) the attempt's start: it would train
    nothing, and requeue itself for ever."""
    if not 1 <= grace <= MAX_GRACE:
        raise ComponentArgumentError(
            f"slurm: signal_grace={grace} is not between 1 and {MAX_GRACE} seconds (sbatch "
            "--signal's range); pass e.g. signal_grace=300")
    if grace + EARLY >= seconds:
        raise ComponentArgumentError(
            f"slurm: signal_grace={grace} is not below the job's time limit ({source}, "
            f"{seconds:.0f} s) less the {EARLY} s by which Slurm may signal early; pass "
            f"-cfg signal_grace=<at most {max(int(seconds) - EARLY - 1, 0)}> or a longer "
            "-cfg time")


def requeue_on_signal(script: str) -> str:
    """TorchX's job script, changed so that SIGUSR1 to the batch shell is forwarded to the
    tasks, and the job requeued once they have saved and exited (see the module docstring).
    A job that finished anyway (srun exited 0) is not requeued."""
    for anchor in (_SRUN_START, _SRUN_END, _RESULT):
        if script.count(anchor) != 1:
            raise RuntimeError(f"slurm: no single {anchor!r} in TorchX's sbatch script:\n{script}")
    script = script.replace(_SRUN_START, "\n" + _TRAPS + _SRUN_START.lstrip("\n"), 1)
    script = script.replace(_SRUN_END, _WAIT, 1)
    return script.replace(_RESULT, _REQUEUE + _RESULT, 1)
