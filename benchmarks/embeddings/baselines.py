"""The baselines Saec is measured against at the same embedding bytes: the hashing trick and QR embeddings.

Both replace a field's ``size``-row table with fewer rows, and both are drop-in embedding modules for
:class:`~components.embeddings.model.DLRM` (``ids -> (n, dim)`` vectors, ``table_bytes()``); neither stores a
per-feature index, so their bytes are their tables' alone.

- **The hashing trick** (:class:`HashedEmbedding`; Weinberger et al., ICML 2009): feature ``i`` reads row
  ``h(i) mod rows`` of one ``(rows, dim)`` table, ``h(x) = (a * x + b) mod p`` a seeded universal hash
  (Carter and Wegman) with ``p = 2**31 - 1``. Features that hash to one row share its vector, whatever they
  mean.
- **Quotient-remainder embeddings** (:class:`QREmbedding`; Shi, Mudigere, Naumov and Yang, "Compositional
  Embeddings Using Complementary Partitions for Memory-Efficient Recommendation Systems", KDD 2020): with
  ``buckets`` remainder rows, feature ``i`` reads row ``i mod buckets`` of a remainder table and row
  ``i // buckets`` of a quotient table of ``ceil(size / buckets)`` rows, and its vector is the two rows'
  element-wise product (the paper's multiplicative combiner). The two partitions are complementary: no two
  features share both rows, so every feature keeps a vector of its own from ``buckets + ceil(size / buckets)``
  rows, as few as about ``2 * sqrt(size)``.

:func:`hashed_rows_for` and :func:`qr_buckets_for` size a table to a byte budget, and :func:`baseline_model`
builds a :class:`~components.embeddings.model.DLRM` whose fields each fit their budget (a field whose full
table already fits keeps a :class:`~components.embeddings.model.FullEmbedding`).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from components.embeddings.model import DLRM, FullEmbedding

HASH_PRIME = 2**31 - 1  # a Mersenne prime: a * x < 2**62 for keys x < p, so the hash never overflows int64
BASELINES = ("hashing", "qr")


def _element_size() -> int:
    return torch.empty((), dtype=torch.get_default_dtype()).element_size()


class HashedEmbedding(nn.Module):
    """The hashing trick: feature ``i`` of a field of ``size`` features reads row ``h(i) mod rows`` of a
    ``(rows, dim)`` table, ``h(x) = (a * x + b) mod p`` with ``p = 2**31 - 1`` and ``1 <= a < p``,
    ``0 <= b < p`` drawn from ``seed``.

    Any int64 id is hashed: it first becomes the key ``id mod p`` (floor modulo, so ``0 <= key < p``; ids in
    ``[0, size)`` are their own keys for any ``size < p``). An id outside ``[0, size)`` thus gets a valid row,
    one it shares with some known features, as a served hashed model would answer. ``(a, b)`` are a persistent
    buffer, so a loaded state dict brings its hash along.
    """

    def __init__(self, size: int, rows: int, dim: int, seed: int = 0):
        super().__init__()
        if int(rows) < 1:
            raise ValueError(f"a hashed table needs at least one row, not {rows}")
        self.size, self.rows, self.dim, self.seed = int(size), int(rows), int(dim), int(seed)
        draw = random.Random(self.seed)
        a, b = draw.randrange(1, HASH_PRIME), draw.randrange(0, HASH_PRIME)
        self.register_buffer("coefficients", torch.tensor([a, b], dtype=torch.int64))
        self.weight = nn.Parameter(torch.empty(self.rows, self.dim))
        if not self.weight.is_meta:
            nn.init.normal_(self.weight, std=1.0 / math.sqrt(self.dim))

    def row_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The table row of each id (int64, same shape as ``ids``)."""
        keys = torch.remainder(ids.long(), HASH_PRIME)
        a, b = self.coefficients[0], self.coefficients[1]
        return torch.remainder(torch.remainder(a * keys + b, HASH_PRIME), self.rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(self.row_of(ids), self.weight)

    def table_bytes(self) -> int:
        return self.rows * self.dim * self.weight.element_size()

    def extra_repr(self) -> str:
        return f"size={self.size}, rows={self.rows}, dim={self.dim}, seed={self.seed}"


class QREmbedding(nn.Module):
    """Quotient-remainder compositional embedding (Shi et al., KDD 2020) with the multiplicative combiner.

    Feature ``i`` reads ``remainder[i mod buckets] * quotient[i // buckets]``; the quotient table has
    ``ceil(size / buckets)`` rows. An id outside ``[0, size)`` is first taken modulo ``size`` (floor modulo,
    so negative ids too land in ``[0, size)``) and reads that feature's vector.

    Initialisation: the remainder table is ``N(0, 1/dim)`` per element, as a
    :class:`~components.embeddings.model.FullEmbedding`, and the quotient table is ones plus ``N(0, 0.1**2)``
    noise, so every product starts at a full table's scale (the remainder rows, slightly modulated) and
    both tables get useful gradients from the first step (a product of two small random tables starts tiny,
    with tiny gradients, and trains slowly).
    """

    QUOTIENT_NOISE = 0.1

    def __init__(self, size: int, buckets: int, dim: int):
        super().__init__()
        if int(size) < 1 or not 1 <= int(buckets) <= int(size):
            raise ValueError(f"QR needs 1 <= buckets <= size, not buckets={buckets} for size={size}")
        self.size, self.buckets, self.dim = int(size), int(buckets), int(dim)
        self.quotients = -(-self.size // self.buckets)
        self.remainder = nn.Parameter(torch.empty(self.buckets, self.dim))
        self.quotient = nn.Parameter(torch.empty(self.quotients, self.dim))
        if not self.remainder.is_meta:
            nn.init.normal_(self.remainder, std=1.0 / math.sqrt(self.dim))
            nn.init.normal_(self.quotient, mean=1.0, std=self.QUOTIENT_NOISE)

    def rows_of(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(quotient_rows, remainder_rows)`` of each id (int64)."""
        keys = torch.remainder(ids.long(), self.size)
        return torch.div(keys, self.buckets, rounding_mode="floor"), torch.remainder(keys, self.buckets)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        quotient_rows, remainder_rows = self.rows_of(ids)
        return F.embedding(quotient_rows, self.quotient) * F.embedding(remainder_rows, self.remainder)

    def table_bytes(self) -> int:
        return (self.buckets + self.quotients) * self.dim * self.remainder.element_size()

    def extra_repr(self) -> str:
        return f"size={self.size}, buckets={self.buckets}, quotients={self.quotients}, dim={self.dim}"


def hashed_rows_for(bytes_budget: int, dim: int, element_size: int = 4) -> int:
    """The most rows of ``dim`` elements a hashed table may have within ``bytes_budget`` bytes; at least 1 (a
    budget below one row gets one row, which exceeds it)."""
    return max(1, int(bytes_budget) // (int(dim) * int(element_size)))


def qr_buckets_for(size: int, bytes_budget: int, dim: int, element_size: int = 4) -> int:
    """The remainder buckets ``b`` (``1 <= b <= size``) of the largest QR table of a ``size``-feature field
    that fits ``bytes_budget``: with room for ``R`` rows, the ``b`` whose ``b + ceil(size / b)`` rows is the
    most that is still ``<= R``, the largest such ``b`` on ties (a big remainder table and a small quotient
    table, the paper's setting: the hashing trick's table, each collision told apart by a quotient row).

    Taking the most rows that fit, rather than the smallest fitting ``b``, spends the budget:
    ``b + ceil(size / b)`` falls in big steps while ``b`` is small (``size = 1000``: 1001 rows at ``b = 1``,
    502 at ``b = 2``) but in steps of about one row once ``b > sqrt(size)``, so a budget of 800 rows gets
    ``b = 798`` (800 rows), not ``b = 2`` (502).

    QR has a minimum size, about ``2 * sqrt(size)`` rows near ``b = ceil(sqrt(size))``: a budget below it gets
    the ``b`` with the fewest rows (the largest such), which exceeds the budget. A budget of ``size + 1`` rows
    or more gets ``b = size`` (a one-row quotient table); a caller that can afford ``size`` rows should rather
    keep the full table, as :func:`baseline_model` does.
    """
    size, room = int(size), int(bytes_budget) // (int(dim) * int(element_size))
    if size < 1:
        raise ValueError(f"a field needs at least one feature, not {size}")
    buckets = np.arange(1, size + 1, dtype=np.int64)
    rows = buckets + -(-size // buckets)
    fitting = rows <= room
    if not fitting.any():
        fewest = rows.min()
        return int(buckets[rows == fewest].max())
    most = rows[fitting].max()
    return int(buckets[fitting & (rows == most)].max())


def baseline_model(kind: str, fields: list[dict[str, Any]], dim: int, hidden: int, budgets: list[int],
                   seed: int = 0) -> DLRM:
    """A :class:`~components.embeddings.model.DLRM` whose field ``f`` takes at most ``budgets[f]`` embedding
    bytes with the baseline ``kind``: ``"hashing"`` (:class:`HashedEmbedding`, field ``f`` hashed with seed
    ``seed * 1000 + f`` so the fields collide differently) or ``"qr"`` (:class:`QREmbedding`). A field whose
    full table (``size * dim`` elements) fits its budget keeps a
    :class:`~components.embeddings.model.FullEmbedding`.

    A budget below a baseline's smallest table (one hashed row; QR's ``~2 * sqrt(size)`` rows) gets that
    smallest table, which exceeds it; compare ``model.embedding_bytes()`` with the budgets to catch it. The
    model is built under ``torch.manual_seed(seed)`` in a forked RNG, so it is reproducible and the global RNG
    is untouched.
    """
    if kind not in BASELINES:
        raise ValueError(f"unknown baseline {kind!r}; known: {', '.join(BASELINES)}")
    if len(budgets) != len(fields):
        raise ValueError(f"{len(budgets)} budgets for {len(fields)} fields")
    element_size = _element_size()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        embeddings: list[nn.Module] = []
        for index, (field, budget) in enumerate(zip(fields, budgets, strict=True)):
            size = int(field["size"])
            if size * dim * element_size <= int(budget):
                embeddings.append(FullEmbedding(size, dim))
            elif kind == "hashing":
                embeddings.append(HashedEmbedding(size, hashed_rows_for(budget, dim, element_size), dim,
                                                  seed=seed * 1000 + index))
            else:
                embeddings.append(QREmbedding(size, qr_buckets_for(size, budget, dim, element_size), dim))
        return DLRM(fields, dim, hidden, embeddings=embeddings)


__all__ = ["BASELINES", "HASH_PRIME", "HashedEmbedding", "QREmbedding", "baseline_model", "hashed_rows_for",
           "qr_buckets_for"]
