"""``strata infer``: the serving plugin's CLI verb (light: grpc and numpy are imported only when it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from components.runtime.plugins import Command


class InferCommand(Command):
    """One Predict call to a running serve job's endpoint; prints ``{"outputs", "argmax"?}`` as JSON."""

    name: ClassVar[str] = "infer"
    help: ClassVar[str] = "send inputs to a running serve job's gRPC endpoint"

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="the serve job's id")
        parser.add_argument("--input", default="-", help="JSON file with a list of rows, or {\"inputs\": rows} "
                                                         "('-' for stdin)")
        parser.add_argument("--timeout", type=float, default=10.0, help="the request's deadline in seconds")

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
        from components.serving.client import ServingError, describe, predict  # grpc, numpy: only here

        try:
            # JSON has no float32 or int64: send the rows as the model's input type ([[0, 5, 16]] is floats for a
            # digits model, token ids for a language model).
            dtype = describe(job["endpoint"], timeout=args.timeout)["input_dtype"]
            outputs = predict(job["endpoint"], rows, dtype=dtype, timeout=args.timeout)
        except ServingError as error:
            raise RuntimeError(str(error)) from None
        answer = {"outputs": outputs.tolist()}
        if outputs.ndim == 2:  # class scores per row
            answer["argmax"] = outputs.argmax(axis=1).tolist()
        print(json.dumps(answer))
        return 0
