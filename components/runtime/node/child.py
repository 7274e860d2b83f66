"""Entry point of an attempt's child process: ``python -m components.runtime.node.child`` with a JSON payload on
stdin. Runs one worker (rank) of one attempt through the component registry.

Exit codes: 0 the component returned; 1 it raised; 3 it stopped early because it was asked to; 4 it raised an
error retrying cannot fix (:class:`components.runtime.contract.project.UserError`, an ImportError of the entrypoint).

A team's project (a code bundle) runs with its working directory first on ``sys.path`` (``payload["workdir"]``),
added after the runtime's own packages are imported, so a project's module cannot stand in for them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

from components.runtime.shared.protocol import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USER_ERROR

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_STOPPED", "EXIT_USER_ERROR", "main"]


def _watch_parent(context) -> None:
    """Exit when the worker that started us dies, so no orphan keeps a device busy."""
    parent = os.getppid()
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            context.request_stop()
            time.sleep(5.0)
            os._exit(EXIT_STOPPED)


def _limit_cuda_memory(payload: dict) -> None:
    device = payload["device"]
    if device and device["kind"] == "cuda" and device["share"] < 1.0:
        import torch

        # Real enforcement on a shared GPU: the caching allocator refuses to grow past the share.
        torch.cuda.set_per_process_memory_fraction(device["share"], 0)


def main() -> int:
    payload = json.loads(sys.stdin.read())
    from components.runtime.client.remote import context_from_payload
    from components.runtime.contract.registry import load_component

    device = payload["device"]
    if payload.get("workdir"):
        sys.path.insert(0, str(payload["workdir"]))
    # CUDA_VISIBLE_DEVICES was narrowed to the granted device, so it is cuda:0 in here.
    context = context_from_payload(payload, narrowed=True, start=False)
    devices = context.devices
    signal.signal(signal.SIGTERM, lambda *_: context.request_stop())
    signal.signal(signal.SIGINT, lambda *_: context.request_stop())
    threading.Thread(target=_watch_parent, args=(context,), daemon=True).start()
    context.start()
    code = EXIT_OK
    try:
        _limit_cuda_memory(payload)
        component = load_component(payload["kind"])
        context.log(f"attempt {payload['number']} rank {payload['rank']} starting on "
                    f"{devices[0].kind + ':' + str(device['index']) if devices else 'cpu'}")
        component.run(context)
        if context.should_stop():
            code = EXIT_STOPPED
    except BaseException as error:  # report every failure, including KeyboardInterrupt/SystemExit from user code
        from components.runtime.contract.project import UserError
        from components.runtime.node.command import CommandFailed

        if not isinstance(error, UserError | CommandFailed):  # the program's own stderr already explains those
            context.log("".join(traceback.format_exception(error)).rstrip(), level="error")
        print(f"{error.__class__.__name__}: {error}", file=sys.stderr, flush=True)
        code = EXIT_USER_ERROR if isinstance(error, UserError) else EXIT_FAILED
    finally:
        context.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
