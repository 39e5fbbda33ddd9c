"""The cluster pre-flight: run options checked against the cluster before anything is submitted.

The partition exists, the time limit parses and fits the partition's, the job's nodes fit the
partition, the job directory can be written, ``signal_grace`` lies below the time limit, the
account and QoS are the user's. Each failure is one line that names the fix
(:func:`components.schedulers.slurm.options.slurm_error`). Without Slurm's tools on this host
(``scontrol``, ``sacctmgr``) the checks that need them are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from torchx.specs import CfgVal

from components.schedulers.slurm.job_dir import check_writable
from components.schedulers.slurm.options import slurm_error, time_limit_seconds
from components.schedulers.slurm.requeue import check_signal_grace


def slurm_user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "root"


def preflight(cfg: Mapping[str, CfgVal], nodes: int) -> None:
    """Raise ComponentArgumentError for options this cluster cannot run a job of ``nodes``
    nodes with."""
    limit = cfg.get("time")
    seconds = float("inf")
    if limit is not None:
        try:
            seconds = time_limit_seconds(str(limit))
        except ValueError:
            raise slurm_error(
                f"time={limit} is not a Slurm time limit; use minutes (30), "
                "HH:MM:SS (2:00:00) or D-HH:MM:SS (1-12:00:00)") from None
    grace = cfg.get("signal_grace")
    if grace is not None:
        check_signal_grace(int(grace), seconds, f"time={limit}")
    job_dir = cfg.get("job_dir")
    if job_dir is not None:
        check_writable(str(job_dir))
    partitions = _partitions()
    if partitions is not None:
        _check_partition(partitions, cfg.get("partition"), nodes, limit, seconds,
                         None if grace is None else int(grace))
    _check_association(cfg.get("account"), cfg.get("qos"))


def _partitions() -> dict[str, dict[str, str]] | None:
    """``scontrol show partition`` as {name: fields}; None where Slurm's tools are absent."""
    if shutil.which("scontrol") is None:
        return None
    proc = subprocess.run(["scontrol", "show", "partition", "-o"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise slurm_error(
            f"cannot reach the Slurm controller ({proc.stderr.strip()}); "
            "check that slurmctld is up with `scontrol ping`")
    parts = {}
    for line in proc.stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = fields
    return parts


def _associations(user: str) -> list[tuple[str, set[str]]] | None:
    """The user's (account, allowed QoS) pairs from slurmdbd; None without sacctmgr."""
    if shutil.which("sacctmgr") is None:
        return None
    proc = subprocess.run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}",
                           "format=account,qos"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    pairs = []
    for line in proc.stdout.splitlines():
        account, _, qos = line.partition("|")
        pairs.append((account, set(filter(None, qos.split(",")))))
    return pairs


def _check_partition(partitions: dict[str, dict[str, str]], name: CfgVal, nodes: int,
                     limit: CfgVal, seconds: float, grace: int | None) -> None:
    """The partition (or the default one) exists, has the nodes, and allows the time
    limit; without a limit Slurm applies the partition's own default (DefaultTime, else
    MaxTime), which a ``signal_grace`` must then lie below."""
    if name is None:
        default = [p for p, f in partitions.items() if f.get("Default") == "YES"]
        if not default:
            raise slurm_error(
                "the cluster has no default partition; pass -cfg partition=<one of "
                f"{', '.join(sorted(partitions))}>")
        name = default[0]
    fields = partitions.get(str(name))
    if fields is None:
        raise slurm_error(
            f"partition={name} does not exist; pass -cfg partition=<one of "
            f"{', '.join(sorted(partitions))}>")
    total = int(fields.get("TotalNodes", "0"))
    if nodes > total:
        raise slurm_error(
            f"the job needs {nodes} nodes (one per replica) but partition {name} has "
            f"{total}; lower the nodes in -j (e.g. -j {total}xN) or pick a bigger partition")
    max_time = fields.get("MaxTime", "UNLIMITED")
    if limit is not None and seconds > time_limit_seconds(max_time):
        raise slurm_error(
            f"time={limit} exceeds partition {name}'s limit {max_time}; "
            f"pass -cfg time=<at most {max_time}>")
    if grace is not None and limit is None:
        field = "DefaultTime" if fields.get("DefaultTime", "NONE") != "NONE" else "MaxTime"
        check_signal_grace(grace, time_limit_seconds(fields.get(field, "UNLIMITED")),
                           f"partition {name}'s {field} {fields.get(field, 'UNLIMITED')}, "
                           "as no -cfg time is given")


def _check_association(account: CfgVal, qos: CfgVal) -> None:
    """The account is one of the user's, and the QoS one the user (in that account) may use."""
    if account is None and qos is None:
        return
    assoc = _associations(slurm_user())
    if assoc is None:
        return
    if account is not None:
        accounts = sorted({a for a, _ in assoc})
        if account not in accounts:
            raise slurm_error(
                f"account={account} is not one of user {slurm_user()}'s accounts; pass "
                f"-cfg account=<one of {', '.join(accounts) or '(none)'}>")
    if qos is not None:
        allowed = sorted(set().union(*(q for a, q in assoc
                                       if account is None or a == account)))
        if qos not in allowed:
            raise slurm_error(
                f"qos={qos} is not allowed for user {slurm_user()}"
                f"{f' in account {account}' if account else ''}; pass -cfg qos=<one of "
                f"{', '.join(allowed) or '(none)'}>")
