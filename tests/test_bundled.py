"""The committed model: the acceptance figures the README and the performance model rely on."""

import pytest

from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts


@pytest.fixture(scope="module")
def bundled():
    ckpt = load_checkpoint("bundled")
    return ckpt, Decoder(ckpt), heldout_prompts(ckpt, 8, 48, seed=3)


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_medusa_reproduces_greedy_decoding_on_heldout_prompts(bundled, batch):
    ckpt, decoder, prompts = bundled
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        plain = decoder.generate(chunk, 48)
        medusa = decoder.generate(chunk, 48, tree=ckpt.tree)
        assert medusa.tokens == plain.tokens


def test_default_tree_accepts_over_two_tokens_per_step(bundled):
    ckpt, decoder, prompts = bundled
    result = decoder.generate(prompts, 48, tree=ckpt.tree)
    steps = [a for row in result.accepted for a in row]
    assert sum(steps) / len(steps) >= 2.0


def test_the_bundled_assets_stay_small():
    ckpt = load_checkpoint("bundled")
    total = sum(f.stat().st_size for f in ckpt.folder.iterdir())
    assert total < 16_000_000
    assert ckpt.info["backbone"]["heldout_loss"] < 3.0 and len(ckpt.heads) == 4
