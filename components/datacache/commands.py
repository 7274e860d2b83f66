"""``strata datasets``: list, show, register and delete datasets (light: argparse and the CLI's REST client)."""

from __future__ import annotations

import argparse
import json
from typing import Any, ClassVar

from components.runtime.contract.plugins import Command


def _size(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


class DatasetsCommand(Command):
    name: ClassVar[str] = "datasets"
    help: ClassVar[str] = "list, show, register or delete datasets (and see which nodes cache them)"

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("action", nargs="?", default="list", choices=("list", "show", "register", "delete"))
        parser.add_argument("name", nargs="?", help="the dataset (show, register, delete)")
        parser.add_argument("--path", help="register: where the data is on the nodes (absolute)")
        parser.add_argument("--upload", metavar="DATA_SET",
                            help="register: one of your team's uploaded data sets instead (strata data upload)")
        parser.add_argument("--format", choices=("image-folder", "npz"),
                            help="register: a directory of one sub-directory per class, or an .npz with x and y")
        parser.add_argument("--size", type=int, help="register: the side, in pixels, images are resized to")
        parser.add_argument("--channels", type=int, choices=(1, 3), help="register: 1 (grey) or 3 (colour)")
        parser.add_argument("--no-augment", action="store_true", help="register: no augmentation")
        parser.add_argument("--description", default="", help="register: a line about the data")
        parser.add_argument("--team", help="the team (a slug) when you belong to several")
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    def run(self, args: argparse.Namespace, client: Any) -> int:
        if args.action != "list" and not args.name:
            raise ValueError(f"strata datasets {args.action} needs a dataset name")
        params = {"team": args.team} if args.team else None
        if args.action == "list":
            answer = client.get("datasets/")
            if args.json:
                print(json.dumps(answer, indent=2))
                return 0
            print(f"{'NAME':<20} {'TEAM':<12} {'FORMAT':<15} {'PIPELINE':<17} CACHED ON")
            for item in answer["results"]:
                pipelines = item.get("pipelines") or []
                pipeline = pipelines[0]["id"] if pipelines else "-"
                cached = ", ".join(f"{c['node']} ({c['entries']} entries, {_size(c['bytes'])})"
                                   for p in pipelines for c in p.get("cached_on", [])) or "-"
                print(f"{item['name']:<20} {item.get('team') or 'built-in':<12} {item.get('format', '-'):<15} "
                      f"{pipeline:<17} {cached}")
            for cache in (answer.get("summary") or {}).get("caches", []):
                rate = "-" if cache["hit_rate"] is None else f"{cache['hit_rate'] * 100:.0f}%"
                print(f"cache on {cache['node']}: {_size(cache['bytes'])} of {_size(cache['budget'])}, "
                      f"{cache['entries']} entries, hit rate {rate} ({cache['hits']} hits, {cache['misses']} misses), "
                      f"{cache['evictions']} evictions, {cache['corrupt']} corrupt dropped")
            return 0
        if args.action == "show":
            print(json.dumps(client.get(f"datasets/{args.name}/", params=params), indent=2))
            return 0
        if args.action == "delete":
            client.delete(f"datasets/{args.name}/", params=params)
            print(f"deleted dataset {args.name}")
            return 0
        body: dict[str, Any] = {"name": args.name, "description": args.description}
        if args.path and args.upload:
            raise ValueError("strata datasets register takes --path or --upload, not both")
        if args.path:
            body["source"] = {"path": args.path}
        elif args.upload:
            body["source"] = {"upload": args.upload}
        for field in ("format", "size", "channels"):
            if getattr(args, field) is not None:
                body[field] = getattr(args, field)
        if args.no_augment:
            body["augment"] = None
        if args.team:
            body["team"] = args.team
        created = client.post("datasets/", body)
        pipeline = (created.get("pipelines") or [{}])[0].get("id", "-")
        source = created.get("source") or {}
        where = f"at {source['path']}" if "path" in source else \
            f"on uploaded data set {source.get('upload')} ({str(source.get('digest'))[:12]})"
        print(f"registered dataset {created['name']} ({created['format']} {where}), pipeline {pipeline}")
        return 0
