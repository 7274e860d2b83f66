"""``strata embeddings JOB``: a compress-embeddings job's result, field by field (light: the CLI's REST client)."""

from __future__ import annotations

import argparse
import json
from typing import Any, ClassVar

from components.runtime.contract.plugins import Command


def _bytes(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def _number(value: Any, form: str = ".4f") -> str:
    return "-" if not isinstance(value, int | float) else format(value, form)


def render(answer: dict[str, Any]) -> list[str]:
    """The lines ``strata embeddings`` prints for the route's answer."""
    if answer.get("phase") is None:
        return ["no compression reported yet"]
    lines = [f"job {answer.get('job')} ({answer.get('state')}): {answer['phase']}; source {answer.get('source')} "
             f"({answer.get('artifact')}, {answer.get('workload') or 'user tables'})",
             f"embeddings {_bytes(answer.get('bytes_before'))} -> {_bytes(answer.get('bytes_after'))}: "
             f"{_number(answer.get('ratio'), '.1f')}x smaller (target {_number(answer.get('ratio_target'), 'g')}x), "
             f"clustering {_number(answer.get('clustering_s'), '.2f')} s"]
    if answer.get("auc_before") is not None:
        line = (f"AUC {_number(answer.get('auc_before'))} -> {_number(answer.get('auc_after'))}, log loss "
                f"{_number(answer.get('logloss_before'))} -> {_number(answer.get('logloss_after'))}")
        if answer.get("auc_finetuned") is not None:
            line += (f"; fine-tuned AUC {_number(answer['auc_finetuned'])}, log loss "
                     f"{_number(answer.get('logloss_finetuned'))}")
        lines.append(line)
    lines.append(f"{'FIELD':<16} {'FEATURES':>9} {'SEEN':>8} {'CLUSTERS':>9} {'BEFORE':>10} {'AFTER':>10} "
                 f"{'RATIO':>7} {'dAUC':>8}")
    for field in answer.get("fields", []):
        clusters = "full" if field.get("clusters") is None else str(field["clusters"])
        ratio = field.get("bytes_before", 0) / max(1, field.get("bytes_after") or 1)
        delta = "-" if field.get("delta_auc") is None else f"{field['delta_auc']:+.4f}"
        lines.append(f"{str(field.get('name'))[:16]:<16} {field.get('features', 0):>9} {field.get('seen', 0):>8} "
                     f"{clusters:>9} {_bytes(field.get('bytes_before')):>10} {_bytes(field.get('bytes_after')):>10} "
                     f"{ratio:>6.1f}x {delta:>8}")
    return lines


class EmbeddingsCommand(Command):
    name: ClassVar[str] = "embeddings"
    help: ClassVar[str] = "show a compress-embeddings job's result: ratio, AUC before and after, and each field"

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="the id of a compress-embeddings job")
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    def run(self, args: argparse.Namespace, client: Any) -> int:
        answer = client.get(f"jobs/{args.job}/compression/")
        if args.json:
            print(json.dumps(answer, indent=2))
        else:
            print("\n".join(render(answer)))
        return 0


__all__ = ["EmbeddingsCommand", "render"]
