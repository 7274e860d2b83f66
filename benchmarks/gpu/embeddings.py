"""gpu-check part ``embeddings``: ``strata bench embeddings`` with its ``device`` (training and evaluation on the
device; clustering runs on the host), one seed.

On the GPU: the quick synthetic CTR set (the ratio ladder, the same-bytes comparison with hashing and QR
embeddings, clustering times). Not ``ctr-large``: its figure is the clustering time, which runs on the host either
way (``strata bench embeddings --device cuda`` measures it when there is time). Dry: the synthetic set shrunk through the
benchmark's size constants (fields of at most 300 features, 1,500 rows, a two-step ladder, one epoch, 5 fine-tuning
steps). The benchmark's own common document is copied in (figures and details).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

DRY_CONSTANTS = {"QUICK_SIZES": (300, 50, 5), "QUICK_ROWS": (1500, 500), "FINETUNE_STEPS": 5}
DRY = {"datasets": ("ctr-synthetic",), "seeds": 1}
GPU = {"datasets": ("ctr-synthetic",), "seeds": 1}


def run(rec) -> None:
    from benchmarks.embeddings import bench
    from benchmarks.gpu.check import _as_figure

    sizes = rec.size(DRY, GPU)
    rec.detail("sizes", {"datasets": list(sizes["datasets"]), "seeds": sizes["seeds"],
                         **({"constants": DRY_CONSTANTS} if rec.dry else {})})
    if rec.dry:
        for name, value in DRY_CONSTANTS.items():
            if not hasattr(bench, name):
                rec.lack(f"benchmarks.embeddings.bench.{name} (a dry-run size) is gone: the dry run is larger")
            setattr(bench, name, value)
        bench.LADDERS = {**bench.LADDERS, "ctr-synthetic": (10, 20)}
        bench.EPOCHS = {**bench.EPOCHS, "ctr-synthetic": 1}
    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-embeddings-") as directory:
        output = Path(directory) / "embeddings.json"
        done = rec.step("bench", bench.main, quick=True, output=str(output), seeds=sizes["seeds"],
                        datasets=sizes["datasets"], device=rec.device)
        if done is None:
            return
        doc = json.loads(output.read_text())
    rec.details["bench"] = {"details": doc.get("details"), "settings": doc.get("settings")}
    for key, item in doc["figures"].items():
        rec.figure(_as_figure(key, item))
