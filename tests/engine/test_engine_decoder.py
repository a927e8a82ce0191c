"""The offloaded decoder: full budget equals the dense decoder, recall stays within budget, blocks are conserved."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.kv_cache import SparsePolicy  # noqa: E402
from engine.model import DecoderConfig, DenseDecoder, init_weights, tiny_cpu_config  # noqa: E402
from engine.pipeline import OffloadedDecoder  # noqa: E402
from engine.timing import Timer  # noqa: E402

PROMPT_LENGTHS = (37, 64, 50)
BLOCK = 8


@pytest.fixture(scope="module")
def model():
    config = tiny_cpu_config()
    return config, init_weights(config, seed=0)


def _prompts(vocab_size: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=gen) for n in PROMPT_LENGTHS]


def _decoder(model, budget_tokens=10_000, **kwargs):
    config, weights = model
    policy = SparsePolicy(block_size=BLOCK, sink_tokens=BLOCK, recent_tokens=2 * BLOCK, budget_tokens=budget_tokens)
    kwargs = {"num_device_blocks": 64, "num_host_blocks": 48, **kwargs}
    return OffloadedDecoder(config, weights, policy, **kwargs)


def _run(decoder, dense, prompts, steps):
    """Greedy decode through both decoders from the offloaded one's tokens; return max |logit diff|."""
    caches, tokens = [], []
    for i, prompt in enumerate(prompts):
        logits = decoder.add_request(i, prompt)
        dense_logits, kv = dense.prefill(prompt)
        torch.testing.assert_close(logits, dense_logits)
        caches.append(kv)
        tokens.append(int(logits.argmax()))
    worst = 0.0
    for _ in range(steps):
        t = torch.tensor(tokens)
        got = decoder.decode_step(list(range(len(prompts))), t)
        want, caches = dense.decode(t, caches)
        worst = max(worst, float((got - want).abs().max()))
        tokens = got.argmax(-1).tolist()
    return worst


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("io", ["per_fragment", "gather_scatter"])
@pytest.mark.parametrize("selection", ["solohead", "headwise"])
def test_full_budget_decode_equals_dense_decoder(model, selection, io, prefetch):
    decoder = _decoder(model, selection=selection, io=io, prefetch=prefetch)
    dense = DenseDecoder(*model)
    # 16 steps cross block boundaries, so blocks leave the recent window and are offloaded mid-run.
    assert _run(decoder, dense, _prompts(model[0].vocab_size), steps=16) < 1e-4
    assert decoder.recall_table()["fragments"].sum() > 0


@pytest.mark.parametrize("selection", ["solohead", "headwise"])
def test_recall_never_exceeds_budget_blocks(model, selection):
    config = model[0]
    decoder = _decoder(model, budget_tokens=2 * BLOCK + 3, selection=selection)
    for i, prompt in enumerate(_prompts(config.vocab_size)):
        decoder.add_request(i, prompt)
    for _ in range(3):
        decoder.decode_step([0, 1, 2], torch.tensor([1, 2, 3]))
    recalls = decoder.recall_table()
    per_request = 2 * (config.num_kv_heads if selection == "headwise" else 1)
    assert set(recalls["fragments"]) == {3 * per_request}
    assert len(recalls) == 3 * config.num_layers


def test_blocks_conserved_across_tiers_while_decoding(model):
    decoder = _decoder(model, selection="headwise")
    cache = decoder.cache
    for i, prompt in enumerate(_prompts(model[0].vocab_size)):
        decoder.add_request(i, prompt)
    for _ in range(BLOCK + 1):
        decoder.decode_step([0, 1, 2], torch.tensor([4, 5, 6]))
        for pool in (cache.device_pool, cache.host_pool):
            owned = cache.table.ids_in(pool.tier)
            assert owned == {i for i in range(pool.num_blocks) if not pool.allocator.is_free(i)}
        for r, length in cache.lengths.items():
            assert cache.table.num_blocks(r) == -(-length // BLOCK)
    for r in list(cache.lengths):
        decoder.remove_request(r)
    assert cache.device_pool.allocator.num_free == 64 and cache.host_pool.allocator.num_free == 48


def test_add_request_without_room_returns_none_and_stores_nothing(model):
    decoder = _decoder(model, num_host_blocks=2)
    assert decoder.add_request(0, torch.arange(64)) is None
    assert decoder.cache.device_pool.allocator.num_free == 64 and decoder.cache.host_pool.allocator.num_free == 2
    assert decoder.cache.table.requests == []


def test_too_small_device_pool_raises_with_numbers(model):
    decoder = _decoder(model, num_device_blocks=4)
    assert decoder.add_request(0, torch.arange(40)) is not None  # 1 sink + 2 recent blocks resident
    for _ in range(2):  # a retry finds the same state: prepare_step is idempotent within a step
        with pytest.raises(RuntimeError, match="device pool has 1 free of 4 blocks, needs 3 for a recall arena"):
            decoder.decode_step([0], torch.tensor([1]))
    assert decoder.cache.table.num_blocks(0) == 6


def test_timer_records_every_layer_of_every_step(model):
    decoder = _decoder(model, timer=Timer("cpu"))
    decoder.add_request(0, torch.arange(40))
    for _ in range(2):
        decoder.decode_step([0], torch.tensor([1]))
    table = decoder.timer.table()
    layers = table[table["name"] == "layer"]
    assert len(layers) == 2 * model[0].num_layers and bool((table["seconds"] > 0).all())
    assert set(table["name"]) == {"step", "layer", "select", "recall"}


def test_unknown_selection_and_bad_config_raise_value_error(model):
    with pytest.raises(ValueError, match="selection='random'"):
        _decoder(model, selection="random")
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        DecoderConfig(2, 64, 6, 4, 16, 128, 100)
    with pytest.raises(ValueError, match="recent_tokens=4 must be a non-negative multiple of block_size=8"):
        SparsePolicy(8, 0, 4, 64)


def test_preparing_a_step_twice_does_not_leak_the_arena(model):
    decoder = _decoder(model)
    decoder.add_request(0, torch.arange(40))
    cache = decoder.cache
    cache.prepare_step([0])
    free = cache.device_pool.allocator.num_free
    cache.finish_step(cache.prepare_step([0]))
    assert cache.device_pool.allocator.num_free == free + 3  # the 1 x 3 arena came back once, not twice lost
    with pytest.raises(ValueError, match="request_id=0 is already stored"):
        decoder.add_request(0, torch.arange(8))
