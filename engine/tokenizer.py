"""SmolLM2's byte-level BPE tokenizer, rebuilt in memory from GGUF metadata with the `tokenizers` package.

The GGUF carries ``tokenizer.ggml.tokens`` (id -> token string in GPT-2's byte-to-unicode alphabet), ``merges``
(``"a b"`` pairs in priority order) and ``token_type`` (3 = control, e.g. ``<|im_start|>``). Rebuilt pipeline,
following llama.cpp's ``smollm`` pre-tokenizer rule (docs/sources.md §8):

    text -> [Digits(individual_digits=True)] -> ByteLevel(regex split, no prefix space) -> BPE -> ids
    ids  -> ByteLevel decoder -> text

Control tokens are added as special tokens, so their literal text in the input (as in a chat prompt) maps to one id.
No BOS is prepended (``tokenizer.ggml.add_bos_token`` is false for SmolLM2). No file or network access.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

# SmolLM2's chat template (GGUF ``tokenizer.chat_template``) opens with this system turn when the conversation has
# none of its own.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class Tokenizer:
    """Text <-> token ids for a GPT-2-style byte-level BPE vocabulary (SmolLM2's, see module docstring)."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        control_ids: Sequence[int],
        bos_id: int,
        eos_id: int,
        digits_individually: bool = True,
    ) -> None:
        """Build the tokenizer in memory (about 0.3-3 s for SmolLM2's 49K tokens and 49K merges).

        Args:
            tokens: token strings, index = id.
            merges: ``"left right"`` merge rules, highest priority first.
            control_ids: ids of control tokens (GGUF token_type 3); matched whole in the input, never split.
            bos_id: beginning-of-sequence id (SmolLM2: 1, ``<|im_start|>``).
            eos_id: end-of-sequence id (SmolLM2: 2, ``<|im_end|>``, the end of a chat turn).
            digits_individually: split every digit into its own pre-token first (llama.cpp ``smollm`` rule).

        Raises:
            ValueError: if an id is outside [0, len(tokens)) or a merge is not two space-separated parts.
        """
        n = len(tokens)
        for name, i in [("bos_id", bos_id), ("eos_id", eos_id)] + [("control id", i) for i in control_ids]:
            if not 0 <= i < n:
                raise ValueError(f"{name}={i} must be in [0, {n})")
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
        if bad is not None:
            raise ValueError(f"merge {bad!r} must be two space-separated tokens")
        tok = _HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.pre_tokenizer = (
            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
            if digits_individually
            else byte_level
        )
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control_ids])
        self._tok = tok
        self.bos_id, self.eos_id = bos_id, eos_id
        self.bos_token, self.eos_token = tokens[bos_id], tokens[eos_id]
        self.vocab_size = n

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS added); control-token strings in `text` become their single ids."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, control tokens included as their strings (so ``decode(encode(s)) == s``)."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def chat_prompt(self, user_text: str, system: str | None = DEFAULT_SYSTEM_PROMPT) -> str:
        """One user turn in SmolLM2's chat template, ready for the assistant's reply.

        ``<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user_text}<|im_end|>\\n<|im_start|>assistant\\n``;
        the system turn is the template's default unless `system` says otherwise, and is left out for None.
        """
        head = "" if system is None else f"<|im_start|>system\n{system}<|im_end|>\n"
        return f"{head}<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"
