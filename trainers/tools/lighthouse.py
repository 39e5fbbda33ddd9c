"""torchft's lighthouse for a fault-tolerant job: ``python -m trainers.tools.lighthouse --help``.

It holds the per-step quorum of the job's replica groups (``--fault-tolerant``) on ``--port``
until every group has trained to ``--steps``, then exits 0: the lighthouse role of
``components/fault_tolerant.py`` ends when its groups do, so the job succeeds with them. A
group's rank 0 reports so on ``--port`` + 1 (``POST /finished``,
:func:`trainers.runs.replica_groups.report_finished`; ``GET /finished`` lists the groups that
did, for a group that restarts after them); where the groups' runs are visible
here, their summaries in ``--output-dir`` count too (a lighthouse restarted after a group
reported; :func:`trainers.runs.replica_groups.groups_finished`, looked at every 2 s).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trainers.runs.log_setup import configure_logging
from trainers.runs.replica_groups import (
    FINISHED_PORT_OFFSET,
    LIGHTHOUSE_PORT,
    groups_finished,
)
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
                        help="how long a quorum that lacks groups which heartbeat but have not "
                             "asked waits for them before it goes on without them (never alone: "
                             "a quorum needs more than half the heartbeating groups); a killed "
                             "group's surviving ranks heartbeat while torchrun stops them (up to "
                             "30 s), so a long wait delays the restarted group's return")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                        help="silence after which a group is dead and leaves the quorum")
    return parser


def finished_server(port: int, steps: int) -> tuple[ThreadingHTTPServer, set[int]]:
    """An HTTP server on ``port`` (started in a thread) that records the groups that report
    having trained to ``steps`` (``POST /finished`` of ``{"group": I, "steps": N}``) and
    answers which did (``GET /finished``: ``{"steps": N, "finished": [I, ...]}``)."""
    finished: set[int] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            try:
                report = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                group, reached = int(report["group"]), int(report["steps"])
            except (TypeError, ValueError, KeyError):
                self.send_error(400, 'expected {"group": I, "steps": N}')
                return
            if self.path == "/finished" and reached == steps:
                finished.add(group)
            self.send_response(204)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/finished":
                self.send_error(404, "GET /finished only")
                return
            body = json.dumps({"steps": steps, "finished": sorted(finished)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # the groups' reports print below
            pass

    server = ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, finished


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
    reports, finished = finished_server(args.port + FINISHED_PORT_OFFSET, args.steps)
    print(f"lighthouse serving {args.groups} replica groups at {server.address()}", flush=True)
    run_dir = location(args.output_dir)
    try:
        while not (len(finished) >= args.groups
                   or groups_finished(run_dir, args.groups, args.steps)):
            time.sleep(2)
    finally:
        reports.shutdown()
        server.shutdown()
    print(f"every replica group trained {args.steps} steps: lighthouse stopped", flush=True)


if __name__ == "__main__":
    main()
