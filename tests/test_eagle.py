"""The EAGLE drafter: trained by the project's own command, lossless under greedy verification,
exact in distribution under rejection sampling, and refused where it cannot run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from decoder.acceptance import AcceptanceConfig
from decoder.checkpoint import Checkpoint, load_checkpoint
from decoder.eagle import EAGLE_FILE, EagleDrafter
from decoder.eagle_batch import DraftPlan, Window, draft_batch
from decoder.eagle_tree import DynamicDraft, draft_tree, dynamic_eagle_tree
from decoder.medusa import Decoder
from decoder.model import Transformer
from decoder.train import main as train_main
from decoder.tree import Drafting, resolve_tree
from perfmodel.acceptance.trees import Tree
from perfmodel.base.errors import PerfkitError
from tests.distilled import CONFIG

# the decoder tests' tiny model with an 8-token vocabulary: sampled distributions converge in a few thousand draws
TINY = dataclasses.replace(CONFIG, vocab_size=8)
TREE = Tree(((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The bundled model with a drafter from `decoder.train --eagle --quick` (a few seconds)."""
    out = tmp_path_factory.mktemp("eagle") / "ckpt"
    work = tmp_path_factory.mktemp("eagle-work")
    assert train_main(["--eagle", "--quick", "--out", str(out), "--work", str(work)]) == 0
    return load_checkpoint(out)


def test_training_writes_the_drafter_with_its_budget_beside_the_heads(trained):
    assert trained.eagle is not None and (trained.folder / EAGLE_FILE).is_file()
    card = json.loads((trained.folder / "training.json").read_text())["eagle"]
    drafter_params = sum(p.numel() for p in trained.eagle.parameters())
    assert card["parameters"] == drafter_params
    assert card["medusa_heads_parameters"] == sum(p.numel() for p in trained.heads.parameters())
    assert 0 <= card["heldout_top1"] <= 1
    # the checkpoint keeps everything else: heads, tokenizer, tree, and checksums that verify
    assert trained.heads is not None and trained.tokenizer is not None and trained.tree is not None


def test_greedy_eagle_decoding_is_lossless(trained):
    decoder = Decoder(trained)
    prompts = [trained.tokenizer.encode(t).ids for t in ("def parse_args(argv):\n", "import os\n\nclass A:\n")]
    plain = decoder.generate(prompts, 48)
    eagle = decoder.generate(prompts, 48, drafting=Drafting(resolve_tree("default", trained), drafter="eagle"))
    assert eagle.tokens == plain.tokens
    assert eagle.steps < 48  # it drafts more than the root somewhere
    assert all(n >= 1 for row in eagle.accepted for n in row)
    # the static step drafts the same trees from its history kept as tensors
    static = decoder.generate(
        prompts, 48, drafting=Drafting(resolve_tree("default", trained), drafter="eagle"), launch="static"
    )
    assert static.tokens == plain.tokens and static.path_lengths == eagle.path_lengths


def test_eagle_2_dynamic_trees_are_lossless_trees_of_the_budget(trained):
    decoder = Decoder(trained)
    prompts = [trained.tokenizer.encode(t).ids for t in ("def parse_args(argv):\n", "import os\n\nclass A:\n")]
    plain = decoder.generate(prompts, 32)
    eagle = decoder.generate(prompts, 32, drafting=Drafting(dynamic_nodes=12, drafter="eagle"))
    assert eagle.tokens == plain.tokens and set(eagle.tree_sizes) == {13}
    torch.manual_seed(2)
    model, drafter = Transformer(TINY).eval(), EagleDrafter(TINY).eval()
    with torch.no_grad():
        feature = model.hidden(torch.tensor([[1, 2, 3]]))[0, -1]
        draft = DynamicDraft(nodes=6, depth=3, topk=3)
        tree, tokens = dynamic_eagle_tree(
            drafter, model.model.embed_tokens, model.lm_head, 5, feature, ([], []), 3, draft
        )
    assert tree.size == 7 and tree.depth <= 3 and tree.max_rank < 3 and len(tokens) == 7 and tokens[0] == 5
    # the drafted tokens are those the static drafting of the same tree gives
    with torch.no_grad():
        static = draft_tree(drafter, model.model.embed_tokens, model.lm_head, tree, 5, feature, ([], []), 3)
    assert static.tolist() == tokens.tolist()


@pytest.mark.parametrize("launch", ["eager", "static"])
def test_rejection_sampling_with_eagle_drafts_keeps_the_models_distribution(launch):
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked distributions: few samples tell them apart
    decoder = Decoder(Checkpoint(None, TINY, model, None, None, None, {}, EagleDrafter(TINY).eval()))
    prompt = [1, 2, 3]
    counts, trials = np.zeros((TINY.vocab_size, TINY.vocab_size)), 0
    for seed in range(12):
        result = decoder.generate(
            [prompt] * 200,
            2,
            Drafting(TREE, drafter="eagle"),
            acceptance=AcceptanceConfig("rejection", 1.0, seed=seed),
            launch=launch,
        )
        for first, second in (tokens[:2] for tokens in result.tokens):
            counts[first, second] += 1
            trials += 1
    first = counts.sum(1).argmax()  # the commonest first token; its second token's distribution
    with torch.no_grad():
        logits = model(torch.tensor([prompt + [int(first)]]))[0, -1]
    expected = torch.softmax(logits.float(), -1).numpy()
    observed = counts[first] / counts[first].sum()
    assert counts[first].sum() > 600
    np.testing.assert_allclose(observed, expected, atol=0.05)


def test_a_drafted_tree_follows_its_parents_ranks():
    torch.manual_seed(1)
    model = Transformer(TINY).eval()
    drafter = EagleDrafter(TINY).eval()
    with torch.no_grad():
        feature = model.hidden(torch.tensor([[1, 2, 3]]))[0, -1]
        tokens = draft_tree(drafter, model.model.embed_tokens, model.lm_head, TREE, 5, feature, ([], []), 3)
        first = model.lm_head(
            drafter(feature[None, None], model.model.embed_tokens(torch.tensor([[5]])), torch.tensor([[3]]))
        )
    ranked = first[0, 0].topk(2).indices.tolist()
    assert tokens[0] == 5 and tokens[1:3].tolist() == ranked  # depth 1: ranks 0 and 1 of the root's draft


def test_a_batch_drafts_each_sequence_as_it_drafts_alone():
    """Windows of different lengths left-padded, each parent read by the LM head once: every
    sequence's tree is the one drafting it alone gives."""
    torch.manual_seed(3)
    model = Transformer(CONFIG).eval()
    drafter = EagleDrafter(CONFIG).eval()
    tree = Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)))
    plan = DraftPlan.of(tree)
    # what the performance model prices per pass: (nodes run, nodes expanded)
    assert tree.draft_passes == ((1, 1), (4, 2), (7, 2))
    assert [(len(r), len(e)) for r, e in zip(plan.runs, plan.expanded)] == list(tree.draft_passes)
    with torch.no_grad():
        hidden = model.hidden(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]))[0]
        histories = [([], []), ([hidden[1]], [3]), ([hidden[2], hidden[3], hidden[4]], [4, 5, 6])]
        roots, features, positions = torch.tensor([5, 6, 7]), hidden[[0, 2, 5]], torch.tensor([3, 4, 6])
        window = Window.of(histories, features, positions)
        batched = draft_batch(
            drafter, model.model.embed_tokens, model.lm_head, plan, roots, features, positions, window
        )
        alone = [
            draft_tree(drafter, model.model.embed_tokens, model.lm_head, tree, int(r), f, h, int(p))
            for r, f, h, p in zip(roots, features, histories, positions)
        ]
    assert batched.tolist() == [t.tolist() for t in alone]


def test_eagle_is_refused_where_it_cannot_run(trained):
    decoder = Decoder(trained)
    with pytest.raises(PerfkitError, match="unknown drafter 'heads'; choose one of: medusa, eagle"):
        decoder.generate([[1, 2]], 4, drafting=Drafting(TREE, drafter="heads"))
    bare = Decoder(Checkpoint(None, trained.config, trained.model, trained.heads, None, None, {}))
    with pytest.raises(PerfkitError, match="has no EAGLE drafter .*python -m decoder.train --eagle"):
        bare.generate([[1, 2]], 4, drafting=Drafting(TREE, drafter="eagle"))


def test_measure_and_generate_draft_the_default_tree_with_eagle_when_no_tree_is_named(tmp_path, capsys):
    """The bundled checkpoint records its heads' accuracies, so the heads' default is --tree auto
    (priced for the heads); with --drafter eagle and no --tree, EAGLE drafts the default tree."""
    from decoder.generate import main as generate_main
    from decoder.measure import main as measure_main

    out = tmp_path / "eagle.json"
    argv = ["--drafter", "eagle", "--acceptance", "greedy", "--prompts", "2", "--new-tokens", "8", "--sizes", "1", "4"]
    assert measure_main([*argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["drafter"] == "eagle" and record["tree"]["name"] == "default" and record["auto"] is None
    assert record["lossless"] is True and record["mean_accepted_tokens"] > 1 and record["per_depth_acceptance"]
    assert generate_main(["--prompt", "def f(x):", "--drafter", "eagle", "--max-new-tokens", "8"]) == 0
    assert "--tree auto" not in capsys.readouterr().err
