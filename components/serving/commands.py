"""``strata infer``: the serving plugin's CLI verb (light: grpc and numpy are imported only when it runs)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from components.runtime.contract.plugins import Command

CLI_TOKEN_SECONDS = 600  # a token strata infer issues for itself works this long
TOKEN_WAIT_S = 15.0  # how long it waits for the endpoint to learn a token it just issued


class InferCommand(Command):
    """One Predict call to a running serve job's endpoint; prints ``{"outputs", "argmax"?}`` as JSON."""

    name: ClassVar[str] = "infer"
    help: ClassVar[str] = "send inputs to a running serve job's gRPC endpoint"

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="the serve job's id")
        parser.add_argument("--input", default="-", help="JSON file with a list of rows, or {\"inputs\": rows} "
                                                         "('-' for stdin)")
        parser.add_argument("--timeout", type=float, default=10.0, help="the request's deadline in seconds")
        parser.add_argument("--deployment-token", default=None,
                            help="the job's deployment token (default: $STRATA_SERVING_TOKEN; without one, a "
                                 "token that works for 10 minutes is issued for this call)")
        parser.add_argument("--tls-ca", default=None, help="CA certificate (PEM file) of an endpoint that serves TLS "
                                                           "(default: $STRATA_SERVING_TLS_CA)")

    def run(self, args: argparse.Namespace, client: Any) -> int:
        job = client.get(f"jobs/{args.job}/")
        if job["kind"] != "serve":
            raise ValueError(f"job {args.job} is a {job['kind']} job; only serve jobs answer inference requests")
        if not job.get("endpoint"):
            raise RuntimeError(f"job {args.job} is {job['state']} and has no endpoint yet")
        source = sys.stdin.read() if args.input == "-" else Path(args.input).read_text()
        try:
            data = json.loads(source)
        except json.JSONDecodeError as error:
            raise ValueError(f"{args.input} is not JSON: {error}") from None
        rows = data.get("inputs") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"{args.input} must hold a non-empty list of rows, or {{\"inputs\": [...]}}")
        from components.serving.client import (  # grpc, numpy: only here
            TOKEN_ENV,
            ServingError,
            describe,
            predict,
        )

        token = args.deployment_token or os.environ.get(TOKEN_ENV, "").strip() or None
        if token is None and (job.get("spec") or {}).get("auth", "token") == "token":
            token = client.post(f"jobs/{args.job}/tokens/", {"name": "strata infer",
                                                            "expires_in_s": CLI_TOKEN_SECONDS})["token"]
            # The endpoint re-reads its job's tokens every few seconds: wait for it to know this one.
            started = time.monotonic()
            while True:
                try:
                    describe(job["endpoint"], timeout=args.timeout, token=token, tls_ca=args.tls_ca)
                    break
                except ServingError as error:
                    if error.code.name != "UNAUTHENTICATED" or time.monotonic() - started > TOKEN_WAIT_S:
                        raise RuntimeError(str(error)) from None
                    time.sleep(0.25)
        try:
            # JSON has no float32 or int64: send the rows as the model's input type ([[0, 5, 16]] is floats for a
            # digits model, token ids for a language model).
            dtype = describe(job["endpoint"], timeout=args.timeout, token=token, tls_ca=args.tls_ca)["input_dtype"]
            outputs = predict(job["endpoint"], rows, dtype=dtype, timeout=args.timeout, token=token,
                              tls_ca=args.tls_ca)
        except ServingError as error:
            raise RuntimeError(str(error)) from None
        answer = {"outputs": outputs.tolist()}
        if outputs.ndim == 2:  # class scores per row
            answer["argmax"] = outputs.argmax(axis=1).tolist()
        print(json.dumps(answer))
        return 0
