"""A character corpus every Python installation ships: the standard library's own source.

Nothing is downloaded. The selection and the split follow one fixed rule, so an installation
gives the same corpus on every run (another Python version's files, and so its corpus, may
differ a little):

* the files: :data:`STDLIB_FILES`, in that order, those that exist under the running
  interpreter's ``sysconfig`` ``stdlib`` path;
* the documents: each file's paragraphs (text between blank lines), stripped, cut into
  consecutive pieces of at most ``context + 1`` characters; pieces under
  :data:`MIN_CHARS` characters are dropped. Paragraphs of code vary from one line to whole
  functions, so documents range from 16 to ``context + 1`` characters and a worker's compute
  varies with its data, as eager-SGD §2.1's video lengths make it vary;
* the split: document i (counted over all files) is held out when i % 10 == 9, and the test
  split keeps the first ``n_test`` of those.

Characters are tokens: 0 pads, 1 stands for any character outside printable ASCII, 2 is the
newline and 3 + (c - 32) the printable character c (:data:`VOCAB` = 98 in all).
"""

from __future__ import annotations

import functools
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tailtrain.errors import UsageError
from tailtrain.tasks.data import Dataset

#: standard-library modules present in every CPython since 3.11
STDLIB_FILES = (
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py",
    "fractions.py", "functools.py", "heapq.py", "inspect.py", "random.py", "shlex.py",
    "statistics.py", "string.py", "textwrap.py", "tokenize.py", "typing.py", "uuid.py",
    "json/decoder.py", "json/encoder.py", "collections/__init__.py",
)  # fmt: skip
MIN_CHARS = 16
PAD, OTHER, NEWLINE = 0, 1, 2
VOCAB = 3 + 95
#: a target of -1 is ignored by the loss (padding)
IGNORE = -1


@dataclass(frozen=True)
class TokenDataset(Dataset):
    """Documents as (N, context) next-character pairs: inputs padded with :data:`PAD`,
    targets with :data:`IGNORE`, each document a prefix of its row."""

    def trim(self, x: torch.Tensor) -> torch.Tensor:
        """Drop the trailing positions that are padding in every document of ``x`` (..., T),
        so that a batch costs time in proportion to its longest document."""
        if x.numel() == 0:
            return x
        longest = int((x != PAD).reshape(-1, x.shape[-1]).any(0).sum())  # rows are prefixes
        return x[..., : max(1, longest)]


def stdlib_documents(context: int) -> list[str]:
    """Every document of the corpus, in order (see the module docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return list(_documents(str(root), context))


@functools.lru_cache(maxsize=4)
def _documents(root: str, context: int) -> tuple[str, ...]:
    docs = []
    for name in STDLIB_FILES:
        path = Path(root) / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for paragraph in re.split(r"\n[ \t]*\n", text):
            paragraph = paragraph.strip("\n")
            for start in range(0, len(paragraph), context + 1):
                piece = paragraph[start : start + context + 1]
                if len(piece.strip()) >= MIN_CHARS:
                    docs.append(piece)
    if not docs:
        raise UsageError(f"no standard-library sources under {root}: the corpus needs them")
    return tuple(docs)


def encode_chars(text: str) -> np.ndarray:
    """Token ids of ``text`` (see the module docstring)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    tokens = np.where((codes >= 32) & (codes < 127), codes - 29, OTHER)
    return np.where(codes == 10, NEWLINE, tokens)


def decode_chars(tokens: np.ndarray) -> str:
    """Text of token ids (padding dropped; :data:`OTHER` shown as ``?``)."""
    chars = {NEWLINE: "\n", OTHER: "?"}
    return "".join(chars.get(int(t), chr(int(t) + 29)) for t in tokens if t != PAD)


def stdlib_corpus(
    context: int = 128, n_train: int | None = None, n_test: int = 256
) -> TokenDataset:
    """The corpus as a :class:`TokenDataset`: ``n_train`` train documents (all when None)
    and the first ``n_test`` held-out ones."""
    docs = stdlib_documents(context)
    test = [d for i, d in enumerate(docs) if i % 10 == 9][:n_test]
    train = [d for i, d in enumerate(docs) if i % 10 != 9][:n_train]
    x_tr, y_tr = _pairs(train, context)
    x_te, y_te = _pairs(test, context)
    return TokenDataset(x_tr, y_tr, x_te, y_te, n_classes=None)


def _pairs(docs: list[str], context: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.full((len(docs), context), PAD, dtype=np.int64)
    y = np.full((len(docs), context), IGNORE, dtype=np.int64)
    for i, doc in enumerate(docs):
        tokens = encode_chars(doc)
        x[i, : len(tokens) - 1] = tokens[:-1]
        y[i, : len(tokens) - 1] = tokens[1:]
    return torch.from_numpy(x), torch.from_numpy(y)
