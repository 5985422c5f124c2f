"""The committed model: the acceptance figures the README and the performance model rely on."""

import pytest

from decoder.checkpoint import load_checkpoint
from decoder.corpus import sample_prompts, split_corpus
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from decoder.tree import Drafting


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
        medusa = decoder.generate(chunk, 48, drafting=Drafting(ckpt.tree))
        assert medusa.tokens == plain.tokens


def test_default_tree_accepts_over_two_tokens_per_step(bundled):
    ckpt, decoder, prompts = bundled
    result = decoder.generate(prompts, 48, drafting=Drafting(ckpt.tree))
    steps = [a for row in result.accepted for a in row]
    assert sum(steps) / len(steps) >= 2.0


def test_the_bundled_assets_stay_small():
    ckpt = load_checkpoint("bundled")
    total = sum(f.stat().st_size for f in ckpt.folder.iterdir())
    assert total < 16_000_000
    assert ckpt.info["backbone"]["heldout_loss"] < 3.0 and len(ckpt.heads) == 4


def test_heldout_prompts_are_the_encoded_documents_and_each_call_owns_its_lists(bundled):
    ckpt, _, prompts = bundled
    _, heldout, _ = split_corpus()
    documents = [e.ids for e in ckpt.tokenizer.encode_batch(heldout)]
    assert prompts == sample_prompts(documents, 8, 48, seed=3)  # encoded once per process, the same prompts
    prompts[0].append(-1)
    assert heldout_prompts(ckpt, 8, 48, seed=3)[0][-1] != -1
