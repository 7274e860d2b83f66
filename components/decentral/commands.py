"""``strata peer join JOB_ID --token T``: add this machine to a running swarm as a volunteer peer (light parser;
``run`` imports torch and hivemind, so the machine needs ``strata[node]``)."""

from __future__ import annotations

import argparse
import os
from typing import Any, ClassVar

from components.runtime.contract.plugins import Command


class PeerCommand(Command):
    name: ClassVar[str] = "peer"
    help: ClassVar[str] = "join a decentralized-train job's swarm from this machine (strata peer join JOB --token T)"
    needs_server: ClassVar[bool] = False  # a volunteer holds a job token, not an API token

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="peer_action", required=True)
        join = actions.add_parser("join", help="train with the swarm until the job ends or the token is revoked")
        join.add_argument("job", help="the job's id")
        join.add_argument("--token", dest="job_token", default=os.environ.get("STRATA_JOB_TOKEN"),
                          help="one of the job's access tokens (strata job-token create JOB); or $STRATA_JOB_TOKEN")
        join.add_argument("--server", dest="server_url", default=None,
                          help="the control plane's URL (default: $STRATA_URL or the CLI's config file)")
        join.add_argument("--name", default="", help="how the swarm shows this peer (default: the host name)")
        join.add_argument("--gpus", type=float, default=0.0, help="GPUs this peer brings (counted in the quota)")
        join.add_argument("--host", default="127.0.0.1",
                          help="the address this peer listens on, reachable by the other peers (never 0.0.0.0 "
                               "unless you say so)")
        join.add_argument("--steps", type=int, default=None, help="local steps to train (default: the job's)")
        join.add_argument("--workdir", default=None, help="where to keep local state (default: a temporary folder)")

    def run(self, args: argparse.Namespace, client: Any) -> int:
        if not args.job_token:
            raise ValueError("a job token is needed: --token T (create one with: strata job-token create JOB)")
        url = args.server_url or os.environ.get("STRATA_URL")
        if not url:
            from strata.cli.config import ConfigError, client_settings

            try:
                url, _ = client_settings(None, "unused")
            except ConfigError as error:
                raise ValueError(f"no control plane URL: pass --server URL or set STRATA_URL ({error})") from None
        return join_swarm(url, args.job, args.job_token, name=args.name, gpus=args.gpus, host=args.host,
                          steps=args.steps, workdir=args.workdir)


def join_swarm(url: str, job: str, token: str, *, name: str = "", gpus: float = 0.0, host: str = "127.0.0.1",
               steps: int | None = None, workdir: str | None = None) -> int:
    """Join, train until done or told to stop, leave. The exit code: 0 unless the swarm could not be joined."""
    import socket
    import tempfile
    from pathlib import Path

    from components.decentral.component import peer_config
    from components.decentral.peer import PeerIO, SwarmPeer
    from components.runtime.client.participant import ParticipantSession

    name = name or socket.gethostname().split(".")[0][:40] or "volunteer"
    with ParticipantSession(url, job, token, name=name, gpus=gpus, info={"host": host}, workdir=workdir) as ctx:
        payload = ctx.payload or {}
        initial = list(payload.get("initial_peers") or [])
        if not initial:
            raise RuntimeError(f"job {job} has no live peer to join yet (its rank 0 has not reported); retry shortly")
        spec = dict(ctx.spec)
        if steps:
            spec["steps"] = int(steps)

        class VolunteerIO(PeerIO):
            def log(self, message: str) -> None:
                ctx.log(message)

            def metrics(self, values: dict[str, float], step: int) -> None:
                ctx.metrics(values, step)

            def should_stop(self) -> bool:
                return ctx.should_stop()

            def credential(self, subject: str) -> dict[str, Any]:
                return ctx.identity.credential(subject)

        config = peer_config(spec, job=str(job), name=f"volunteer-{name}", public_key=str(ctx.public_key),
                             rank=None, host=host, volunteer=True)
        folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="strata-peer-"))
        peer = SwarmPeer(config, VolunteerIO(), initial_peers=initial, workdir=folder)
        try:
            peer.start()
            summary = peer.run()
        finally:
            peer.close()
        stopped = f" (stopped: {ctx.reason})" if ctx.should_stop() and ctx.reason else ""
        print(f"peer {config.name}: {summary['steps']} steps, held-out loss {summary['test_loss']:.3f}, "
              f"{summary['rounds_ok']} averaging rounds{stopped}")
    return 0
