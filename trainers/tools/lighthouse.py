"""torchft's lighthouse for a fault-tolerant job: ``python -m trainers.tools.lighthouse --help``.

It holds the per-step quorum of the job's replica groups (``--fault-tolerant``) on ``--port``
until every group's summary in ``--output-dir`` says it trained to ``--steps``
(:func:`trainers.runs.replica_groups.groups_finished`, looked at every 2 s), then exits 0: the
lighthouse role of ``components/fault_tolerant.py`` ends when its groups do, so the job
succeeds with them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from trainers.runs.log_setup import configure_logging
from trainers.runs.replica_groups import LIGHTHOUSE_PORT, groups_finished
from trainers.runs.storage import location


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainers.tools.lighthouse",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, required=True, help="the job's replica groups")
    parser.add_argument("--min-replicas", type=int, default=1,
                        help="replica groups a quorum needs (the trainers' --min-replicas)")
    parser.add_argument("--steps", type=int, required=True, help="the trainers' --steps")
    parser.add_argument("--output-dir", required=True, help="the trainers' --output-dir")
    parser.add_argument("--port", type=int, default=LIGHTHOUSE_PORT, help="port to serve on")
    parser.add_argument("--join-timeout-ms", type=int, default=1000,
                        help="how long a quorum waits for groups that heartbeat but have not "
                             "asked to join (a restarting group) before it goes on without them")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                        help="silence after which a group is dead and leaves the quorum")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    configure_logging()  # before torchft's Rust logger starts: RUST_LOG=warn unless set
    from torchft._torchft import LighthouseServer

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.groups < 1 or not 1 <= args.min_replicas <= args.groups:
        parser.error(f"--min-replicas {args.min_replicas} must be between 1 and --groups "
                     f"{args.groups}")
    server = None
    for bind in (f"[::]:{args.port}", f"0.0.0.0:{args.port}"):  # IPv4 where there is no IPv6
        try:
            server = LighthouseServer(bind=bind, min_replicas=args.min_replicas,
                                      join_timeout_ms=args.join_timeout_ms, quorum_tick_ms=100,
                                      heartbeat_timeout_ms=args.heartbeat_timeout_ms)
            break
        except RuntimeError as err:
            error = err
    if server is None:
        parser.exit(1, f"cannot serve the lighthouse on port {args.port}: {error}\n")
    print(f"lighthouse serving {args.groups} replica groups at {server.address()}", flush=True)
    run_dir = location(args.output_dir)
    try:
        while not groups_finished(run_dir, args.groups, args.steps):
            time.sleep(2)
    finally:
        server.shutdown()
    print(f"every replica group trained {args.steps} steps: lighthouse stopped", flush=True)


if __name__ == "__main__":
    main()
