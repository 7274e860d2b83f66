"""Rebuild ``corpus.txt``, the tiny-gpt training text, from CPython standard-library docstrings.

Run with the interpreter whose docstrings you want (the shipped file was built with CPython 3.11):
``python components/train/data/build_corpus.py``. The text is PSF-licensed; see ``NOTICE.md``.
"""

from __future__ import annotations

import importlib
import inspect
import string
from pathlib import Path

MODULES = """
    textwrap string collections itertools functools json re pathlib os shutil datetime calendar
    heapq bisect random statistics fractions decimal argparse logging subprocess threading queue
    contextlib dataclasses enum typing inspect difflib csv zipfile tarfile urllib.parse abc copy
    tempfile glob fnmatch operator sched base64 hashlib hmac secrets uuid weakref pprint reprlib
    shlex getopt configparser gettext locale codecs io struct array selectors socket ssl
    email.message http.client
""".split()
TARGET_BYTES = 200_000
ALLOWED = set(string.printable) - {"\t", "\r", "\x0b", "\x0c"}


def _clean(text: str) -> str:
    text = text.replace("\t", "    ")
    return "".join(ch for ch in text if ch in ALLOWED).strip()


def _docs(module_name: str):
    module = importlib.import_module(module_name)
    if module.__doc__:
        yield f"Module {module_name}", module.__doc__
    for name, member in sorted(vars(module).items()):
        if name.startswith("_") or getattr(member, "__module__", None) != module.__name__:
            continue
        if not (inspect.isclass(member) or inspect.isfunction(member)):
            continue
        if member.__doc__:
            yield f"{module_name}.{name}", member.__doc__
        if inspect.isclass(member):
            for attribute, value in sorted(vars(member).items()):
                if not attribute.startswith("_") and inspect.isfunction(value) and value.__doc__:
                    yield f"{module_name}.{name}.{attribute}", value.__doc__


def build() -> str:
    parts: list[str] = []
    size = 0
    seen: set[str] = set()
    for module_name in MODULES:
        for title, doc in _docs(module_name):
            body = _clean(inspect.cleandoc(doc))
            if len(body) < 40 or body in seen:
                continue
            seen.add(body)
            section = f"{title}\n\n{body}\n\n"
            parts.append(section)
            size += len(section)
            if size >= TARGET_BYTES:
                return "".join(parts)
    return "".join(parts)


if __name__ == "__main__":
    target = Path(__file__).with_name("corpus.txt")
    target.write_text(build(), encoding="ascii")
    print(f"wrote {target} ({target.stat().st_size} bytes)")
