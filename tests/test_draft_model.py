"""The bundled model's draft model: trained by the project's own command as a checkpoint of
its own, and its greedy chains verified as an engine verifies them."""

from __future__ import annotations

import json

import pytest
import torch

from decoder.chains import accepted_count, draft_model_path_lengths
from decoder.checkpoint import load_checkpoint
from decoder.draft_train import draft_for
from decoder.medusa import Decoder
from decoder.train import main as train_main
from perfmodel.base.errors import PerfkitError

PROMPTS = [[5, 17, 300, 42, 8, 99, 1000, 7], [64, 3, 3, 3, 250, 11, 12, 13]]


def test_training_writes_a_one_layer_model_of_the_targets_vocabulary(tmp_path):
    out = tmp_path / "draft"
    assert train_main(["--draft-model", "--quick", "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    draft, target = load_checkpoint(out), load_checkpoint("bundled")
    assert draft.config.num_hidden_layers == 1 and draft.config.vocab_size == target.config.vocab_size
    assert draft.tokenizer is not None and draft.heads is None
    card = json.loads((out / "training.json").read_text())["draft"]
    assert card["parameters"] == sum(p.numel() for p in draft.model.parameters())
    assert card["target"] == "bundled" and 0 <= card["heldout_top1"] <= 1


def test_the_shipped_draft_is_a_small_model_of_the_bundled_ones_vocabulary():
    draft, target = load_checkpoint(draft_for("bundled")), load_checkpoint("bundled")
    assert draft.config.vocab_size == target.config.vocab_size
    assert sum(p.numel() for p in draft.model.parameters()) * 5 < sum(p.numel() for p in target.model.parameters())


def test_a_chain_is_accepted_up_to_its_first_mismatch_and_the_continuations_end():
    sequence = [1, 2, 3, 4, 5, 6]
    assert accepted_count([4, 5, 9, 6], sequence, 2) == 2
    assert accepted_count([9], sequence, 2) == 0
    assert accepted_count([5, 6, 7], sequence, 3) == 2  # the continuation ends after 6


def continued(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    tokens = Decoder(load_checkpoint("bundled")).generate(prompts, new_tokens).tokens
    return [p + t for p, t in zip(prompts, tokens)]


def test_the_target_drafting_for_itself_is_accepted_whole():
    sequences = continued(PROMPTS, 21)
    lengths = draft_model_path_lengths(Decoder(load_checkpoint("bundled")), sequences, len(PROMPTS[0]), 4)
    # 20 tokens after the prefill's: four chains of 4 + the root, the last cut at the end
    assert lengths == [[5, 5, 5, 5], [5, 5, 5, 5]]


def test_the_draft_models_paths_cover_the_continuation():
    sequences = continued(PROMPTS, 40)
    draft = Decoder(load_checkpoint(draft_for("bundled"), dtype=torch.float32))
    for path in draft_model_path_lengths(draft, sequences, len(PROMPTS[0]), 4):
        assert all(1 <= n <= 5 for n in path) and sum(path) in (39, 40)  # the last step's own token may run past


def test_a_model_without_a_draft_is_one_line_naming_the_ones_that_have_one():
    with pytest.raises(PerfkitError, match=r"no draft model for llama-7b: the shipped ones draft for bundled"):
        draft_for("llama-7b")
