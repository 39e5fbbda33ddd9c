"""Where a fault-tolerant job's replica groups meet and write (``--fault-tolerant``).

The groups meet at torchft's lighthouse, named by a URL (:func:`lighthouse_address`); each
writes its own run under ``<output-dir>/replica_group_<i>`` (:func:`group_run_dir`: a group's
checkpoints are its ranks' shards, so groups never share a directory). The job is done when
every group trained to the last step, which is when the lighthouse may stop: each group's
rank 0 tells it so on the port beside the lighthouse's (:func:`report_finished`; pods share
no disk), and where the groups' runs are visible to it (one file system, a bucket) their
summaries say so too (:func:`groups_finished`: a lighthouse restarted after a group
reported). A group that starts after another reported having finished, or finds itself in a
quorum without it later (the lighthouse drops a group some seconds after its last heartbeat,
and a group reports before it stops heartbeating), has no live group to heal from and nothing
left to train: it stops (:func:`finished_groups`, :class:`RunFinishedElsewhere`) rather than
train the whole run again alone. Plain Python
without torch: components check the address before anything is scheduled.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from urllib.parse import urlsplit

from trainers.errors import ConfigError
from trainers.runs.storage import RunPath

# torchft's lighthouse port (torchft_lighthouse --bind [::]:29510 in its documentation).
LIGHTHOUSE_PORT = 29510
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
# The finished groups report on the port after the lighthouse's (its role maps both).
FINISHED_PORT_OFFSET = 1

log = logging.getLogger(__name__)


def lighthouse_address(given: str) -> tuple[str, str, int]:
    """The lighthouse's URL, host and port: ``given`` (``--lighthouse``), else
    ``$TORCHFT_LIGHTHOUSE``, else ``http://localhost:29510``; ConfigError unless it is
    ``http://HOST:PORT``."""
    url = given or os.environ.get(LIGHTHOUSE_ENV, "") or f"http://localhost:{LIGHTHOUSE_PORT}"
    where = "--lighthouse" if given else (LIGHTHOUSE_ENV if os.environ.get(LIGHTHOUSE_ENV)
                                          else "the default lighthouse")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port:
        raise ConfigError(f"{where} {url!r} is not a lighthouse URL; pass --lighthouse "
                          f"http://HOST:PORT, e.g. http://localhost:{LIGHTHOUSE_PORT}")
    return url, parts.hostname, port


def group_run_dir(run_dir: RunPath, group: int) -> RunPath:
    """Replica group ``group``'s run directory inside the job's ``run_dir``."""
    return run_dir / f"replica_group_{group}"


def groups_finished(run_dir: RunPath, groups: int, steps: int) -> bool:
    """Whether each of the ``groups`` replica groups of the job writing to ``run_dir`` has a
    summary of a run to ``steps`` steps that no preemption cut short."""
    for group in range(groups):
        path = group_run_dir(run_dir, group) / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        if summary.get("steps") != steps or summary.get("preempted"):
            return False
    return True


def finished_url(lighthouse: str) -> str:
    """Where a group that trained to the last step reports, beside ``lighthouse`` (its URL)."""
    _, host, port = lighthouse_address(lighthouse)
    return f"http://{host}:{port + FINISHED_PORT_OFFSET}/finished"


def finished_groups(lighthouse: str) -> list[int]:
    """The replica groups that told the lighthouse of ``lighthouse`` (its URL) they trained to
    the job's last step (``GET /finished`` beside it); none where it does not answer."""
    try:
        with urllib.request.urlopen(finished_url(lighthouse), timeout=5) as answer:
            return sorted(int(group) for group in json.load(answer)["finished"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


class RunFinishedElsewhere(Exception):
    """This replica group started after ``finished`` (other groups) trained the job's last
    step: there is no live group to heal from and nothing left to train."""

    def __init__(self, group: int, finished: list[int], steps: int) -> None:
        names = ", ".join(str(g) for g in finished)
        super().__init__(
            f"replica group {group} stops: replica group {names} already trained the job's "
            f"{steps} steps (the job's model is in its run directory, replica_group_{finished[0]}"
            f"); nothing is left to train or to heal from")


def report_finished(lighthouse: str, group: int, steps: int, seconds: float = 3.0) -> bool:
    """Tell the lighthouse of ``lighthouse`` (its URL) that replica group ``group`` is done with
    the job of ``steps`` steps (it trained them, or found another group had), retrying for
    ``seconds``; whether it answered. The lighthouse served this group until its last step, so
    one that does not answer has stopped already (it saw every group's summary) or is
    restarting (the summaries stop it): this only warns."""
    body = json.dumps({"group": group, "steps": steps}).encode()
    url = finished_url(lighthouse)
    deadline = time.monotonic() + seconds
    while True:
        try:
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5):
                return True
        except OSError as err:
            if time.monotonic() >= deadline:
                log.warning("could not tell the lighthouse at %s that replica group %d "
                            "finished: %s", url, group, err)
                return False
            time.sleep(1)
