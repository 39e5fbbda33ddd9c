"""Time limits and preemption on Slurm: the ``signal_grace`` run option of the slurm scheduler.

With ``-cfg signal_grace=N`` every heterogeneous component asks for ``--signal=B:USR1@N`` (TorchX
already asks for ``--requeue``): Slurm sends SIGUSR1 to the batch shell N seconds before the
job's time limit (up to 60 s earlier: Slurm checks time limits every 30 s), and an operator
sends the same with ``scancel --batch --signal=USR1 <id>``. The job script (:data:`TRAPS`,
:data:`WAIT_FOR_SRUN` and :data:`REQUEUE`, placed by :mod:`components.schedulers.slurm.script`)
runs srun in the background so that its trap runs at once, forwards the signal once to srun
(whose slurmstepd signals every process of the step: torchrun, which forwards it again, and the
trainers, which finish their step, save it and exit ``128 + 10``), waits for the tasks, and
requeues the job (``scontrol requeue``). The job keeps its id, so its next attempt runs in the
same job directory and resumes from that checkpoint (``--resume auto`` in ``outputs/<id>``).

``B:`` (the batch shell only) because the script must know the job was signalled, to requeue it;
without ``B:`` Slurm signals the tasks only and the script sees a failed srun. SIGTERM (scancel,
``scontrol requeue``, preemption, the time limit itself) reaches every task from Slurm directly,
with KillWait (or the partition's GraceTime) to save before SIGKILL, so the trap for it only
keeps the script waiting while they save; it does not requeue (Slurm requeues a preempted job
itself, and a cancelled or timed-out one must not be).
"""

from __future__ import annotations

from components.schedulers.slurm.options import slurm_error

SIGNAL = "USR1"
MAX_GRACE = 65535  # sbatch --signal: sig_time is 0..65535 seconds
EARLY = 60  # s: Slurm may send the signal up to this much before the grace (sbatch(1))

# Before srun: the traps (SIGUSR1 is forwarded to srun once it runs; SIGTERM only waits).
TRAPS = f"""preempted=
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
# After srun's arguments: srun in the background, waited for (a trap interrupts ``wait``).
WAIT_FOR_SRUN = """ &
srun_pid=$!
if [ -n "$preempted" ]; then forward; fi  # signalled before srun started
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; done
wait "$srun_pid"
"""
# Once srun has ended: requeue a job that was signalled and did not finish.
REQUEUE = """if [ -n "$preempted" ] && [ "$exitcode" -ne 0 ]; then
    echo "torchx: job $SLURM_JOB_ID saved on $preempted; requeued at $(date -u +%H:%M:%S)" \
         "to resume from there"
    scontrol requeue "$SLURM_JOB_ID"
    exit "$exitcode"
fi
"""


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
        raise slurm_error(
            f"signal_grace={grace} is not between 1 and {MAX_GRACE} seconds (sbatch "
            "--signal's range); pass e.g. signal_grace=300")
    if grace + EARLY >= seconds:
        raise slurm_error(
            f"signal_grace={grace} is not below the job's time limit ({source}, "
            f"{seconds:.0f} s) less the {EARLY} s by which Slurm may signal early; pass "
            f"-cfg signal_grace=<at most {max(int(seconds) - EARLY - 1, 0)}> or a longer "
            "-cfg time")
