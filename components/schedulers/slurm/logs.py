"""``torchx log`` on Slurm: the replica's files ``slurm-<id>-<role>-<replica>.{out,err}`` in
the job's directory (found through ``.torchxslurmjobdirs`` in the directory the job was
submitted from) or, without one, in the current directory.

Stdout by default, where the trainers write (TorchX's default is stderr, where they write
nothing); ``combined`` gives stdout, then stderr (Slurm keeps them in two files). A file the job
never wrote is one line naming why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator

from torchx.schedulers.api import Scheduler, Stream, filter_regex, split_lines_iterator
from torchx.schedulers.local_scheduler import LogIterator

from components.schedulers.slurm.options import slurm_error
from components.schedulers.torchx_workarounds.slurm import job_dirs

_log = logging.getLogger(__name__)


def replica_log(scheduler: Scheduler, app_id: str, role_name: str, k: int, regex: str | None,
                should_tail: bool, streams: Stream | None) -> Iterable[str]:
    """The lines of replica ``k`` of the role (what ``Scheduler.log_iter`` returns);
    ``scheduler`` tells :class:`LogIterator` when the job has ended."""
    if streams is None:
        _log.info("slurm: showing stdout, where the trainers write; errors and tracebacks "
                  "are in stderr: --streams stderr")
    if streams == Stream.COMBINED:
        names = ["out", "err"]
    else:
        names = ["err" if streams == Stream.STDERR else "out"]
    dirs = job_dirs()
    paths = [os.path.join(dirs.get(app_id, ""), f"slurm-{app_id}-{role_name}-{k}.{ext}")
             for ext in names]
    lines: Iterable[str] = _file_lines(app_id, paths, scheduler, should_tail, app_id in dirs)
    lines = split_lines_iterator(lines)
    return filter_regex(regex, lines) if regex else lines


def _file_lines(app_id: str, paths: list[str], scheduler: Scheduler, should_tail: bool,
                known_dir: bool) -> Iterator[str]:
    """The files' lines one after the other (TorchX's LogIterator on each); a file the job never
    wrote is one line naming why."""
    for path in paths:
        try:
            yield from LogIterator(app_id, path, scheduler, should_tail=should_tail)
        except RuntimeError as err:
            if "finished without writing" not in str(err):
                raise
            if known_dir:
                batch_log = os.path.join(os.path.dirname(path), f"slurm-{app_id}.out")
                raise slurm_error(
                    f"job {app_id} wrote no {path}: it ended before that replica started;"
                    f" torchx status gives its state and {batch_log} its batch script's "
                    "log") from None
            raise slurm_error(
                f"no {path} in {os.getcwd()} and job {app_id} is not in its "
                ".torchxslurmjobdirs; run torchx log from the directory you submitted the job "
                "from") from None
