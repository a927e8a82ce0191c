"""A shipped real English text for experiments on a real model: chapters of the Python Language Reference.

`engine/data/python_reference.txt` (113,024 characters; about 24K SmolLM2 tokens, so it fills an 8K context with
room to spare) is the plain-text rendering of three chapters of the Python 3.11 Language Reference, under the PSF
License (engine/data/LICENSE-PSF.txt); engine/data/README.md records how it was extracted. Read with
`importlib.resources`, so it works from a wheel as well as from the source tree.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

CORPUS_FILE = "python_reference.txt"


@functools.lru_cache(maxsize=1)
def corpus_text() -> str:
    """The whole shipped text (UTF-8, ``\\n`` line ends, 113,024 characters). Cached: it is small and immutable."""
    return resources.files("engine").joinpath("data", CORPUS_FILE).read_text(encoding="utf-8")


def corpus_tokens(tokenizer: Tokenizer, n: int) -> torch.Tensor:
    """The first `n` tokens of `corpus_text()`.

    Args:
        tokenizer: e.g. `LoadedModel.tokenizer` (engine/weights.py).
        n: number of tokens, >= 1.

    Returns:
        int64 [n] on the CPU, no BOS prepended.

    Raises:
        ValueError: if n < 1 or the text encodes to fewer than n tokens.
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    ids = tokenizer.encode(corpus_text())
    if len(ids) < n:
        raise ValueError(f"n={n} tokens requested but {CORPUS_FILE} encodes to only {len(ids)} tokens")
    return torch.tensor(ids[:n], dtype=torch.int64)
