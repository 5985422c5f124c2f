import json

import numpy as np
import pytest
import torch

from decoder.acceptance import AcceptanceConfig, rejection, typical
from decoder.checkpoint import load_checkpoint, save_checkpoint
from decoder.heads import MedusaHeads, medusa_loss
from decoder.medusa import dynamic_tree
from decoder.model import KVCache, Transformer
from decoder.tree import Drafting, tree_buffers
from perfmodel.acceptance.reference_trees import VICUNA_7B_TREE
from perfmodel.acceptance.trees import Tree, expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError
from tests.distilled import CONFIG, PROMPTS


def test_design_example_two_by_three_tree():
    tree = Tree(tuple((i,) for i in range(2)) + tuple((i, j) for i in range(2) for j in range(3)))
    buffers = tree_buffers(tree, heads=2, topk=3)
    assert tree.size == 9 and buffers.depths.tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert (buffers.retrieve >= 0).all() and buffers.retrieve.shape == (6, 3)  # 6 root-to-leaf paths
    assert {tuple(r) for r in buffers.retrieve.tolist()} == {
        (0, 1 + i, 3 + 3 * i + j) for i in range(2) for j in range(3)
    }
    mask = buffers.mask
    for node in range(3, 9):
        parent = 1 + (node - 3) // 3
        assert mask[node].nonzero().flatten().tolist() == [0, parent, node]
    assert buffers.node_head.tolist() == [-1, 0, 0, 1, 1, 1, 1, 1, 1]
    assert buffers.node_rank.tolist() == [-1, 0, 1, 0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize(
    "tree, heads, topk, message",
    [
        (VICUNA_7B_TREE, 3, 10, "tree is 4 deep but the model has 3 Medusa heads"),
        (VICUNA_7B_TREE, 4, 5, "uses rank 9 \\(top-10\\) but candidates come from top-5"),
    ],
)
def test_trees_beyond_the_heads_are_refused(tree, heads, topk, message):
    with pytest.raises(PerfkitError, match=message):
        tree_buffers(tree, heads, topk)


def test_a_tree_needs_every_parent():
    with pytest.raises(PerfkitError, match="has no parent"):
        Tree(((0,), (1, 0)))


def test_greedy_tree_follows_the_node_values():
    accuracy = np.array([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1]])
    tree = greedy_tree(accuracy, 3)
    assert tree.paths == ((0,), (1,), (0, 0))  # chosen by value: (0,) 0.6, (0, 0) 0.3, (1,) 0.2
    assert expected_acceptance(tree, accuracy) == pytest.approx(1 + 0.6 + 0.2 + 0.3)


def test_dynamic_tree_keeps_the_most_likely_paths():
    probs = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.5, 0.4, 0.1, 0.0]])
    tree = dynamic_tree(probs, nodes=4, topk=3)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1))  # 0.7, 0.2, 0.35, 0.28


def test_logits_match_transformers_llama(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    hf_config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1234.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
    )
    reference = transformers.LlamaForCausalLM(hf_config).eval()
    reference.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_checkpoint(tmp_path).model
    tokens = torch.randint(0, 96, (2, 21))
    with torch.no_grad():
        expected = reference(tokens).logits
        torch.testing.assert_close(ours(tokens), expected, atol=1e-5, rtol=1e-4)
        # And through the KV cache, one token at a time, as decoding runs.
        cache = KVCache(ours.config, 2, 32)
        steps = []
        for t in range(tokens.shape[1]):
            slot = torch.full((2, 1), t)
            steps.append(ours(tokens[:, t : t + 1], positions=slot, cache=cache, slots=slot, mask=None, kv_len=t + 1))
        torch.testing.assert_close(torch.cat(steps, 1), expected, atol=1e-5, rtol=1e-4)


def test_heads_in_the_reference_layout_load(tmp_path):
    model = Transformer(CONFIG)
    heads = MedusaHeads(32, 48, 3, num_layers=1)
    save_checkpoint(tmp_path, model, None)
    torch.save(heads.state_dict(), tmp_path / "medusa_lm_head.pt")  # the reference's file
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "medusa_num_heads": 3, "medusa_num_layers": 1}))
    loaded = load_checkpoint(tmp_path, dtype=torch.float32)
    assert len(loaded.heads) == 3 and set(heads.state_dict()) == {
        "0.0.linear.weight",
        "0.0.linear.bias",
        "0.1.weight",
        "1.0.linear.weight",
        "1.0.linear.bias",
        "1.1.weight",
        "2.0.linear.weight",
        "2.0.linear.bias",
        "2.1.weight",
    }
    torch.testing.assert_close(loaded.heads[2][1].weight, heads[2][1].weight, atol=0, rtol=0)


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_medusa_is_greedy_decoding(decoder, batch):
    prompts = PROMPTS[:batch]
    plain = decoder.generate(prompts, 40)
    for kwargs in (
        {"drafting": Drafting(VICUNA_7B_TREE)},
        {"drafting": Drafting(Tree.breadth_first(20, 3))},
        {"drafting": Drafting(dynamic_nodes=12)},
    ):
        medusa = decoder.generate(prompts, 40, **kwargs)
        assert medusa.tokens == plain.tokens
        assert medusa.steps < plain.steps  # it did accept more than one token per step
    assert all(len(t) == 40 for t in plain.tokens)


@pytest.mark.parametrize("launch", ["eager", "static"])
def test_cache_after_accepting_paths_equals_a_full_recompute(decoder, launch):
    result = decoder.generate(PROMPTS, 30, drafting=Drafting(VICUNA_7B_TREE), launch=launch)
    assert max(max(a) for a in result.accepted) > 1
    for b, prompt in enumerate(PROMPTS):
        sequence = prompt + result.tokens[b]
        fresh = KVCache(CONFIG, 1, len(sequence) + 1)
        with torch.inference_mode():
            decoder._prefill([sequence], fresh)
        n = len(sequence)
        assert result.cache_lengths[b] >= n
        torch.testing.assert_close(result.cache.k[:, b, :, :n], fresh.k[:, 0, :, :n], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result.cache.v[:, b, :, :n], fresh.v[:, 0, :, :n], atol=1e-5, rtol=1e-4)


def test_rejection_sampling_keeps_the_models_distribution():
    # Root with children proposing tokens 2 and 0; child 1 (token 2) has a child (token 1).
    tree = Tree(((0,), (1,), (0, 0)))
    buffers = tree_buffers(tree, heads=2, topk=2)
    candidates = torch.tensor([3, 2, 0, 1])
    logits = torch.log(
        torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    )
    config = AcceptanceConfig("rejection", temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    first, second_after_2 = np.zeros(4), np.zeros(4)
    trials = 20000
    for _ in range(trials):
        path, next_root = rejection(candidates, logits, buffers, config, generator)
        emitted = [int(candidates[i]) for i in path[1:]] + [next_root]
        first[emitted[0]] += 1
        if emitted[0] == 2:
            second_after_2[emitted[1]] += 1
    np.testing.assert_allclose(first / trials, [0.1, 0.2, 0.3, 0.4], atol=0.012)
    np.testing.assert_allclose(second_after_2 / second_after_2.sum(), [0.25, 0.25, 0.25, 0.25], atol=0.02)


def test_typical_acceptance_threshold():
    tree = Tree(((0,), (1,)))
    buffers = tree_buffers(tree, heads=1, topk=2)
    # Confident root distribution: H small, threshold = min(0.09, 0.3 exp(-H)).
    logits = torch.log(torch.tensor([[0.85, 0.1, 0.05], [1 / 3] * 3, [1 / 3] * 3]))
    config = AcceptanceConfig("typical", temperature=1.0)
    path, _ = typical(torch.tensor([0, 2, 1]), logits, buffers, config)
    assert path == [0, 2]  # token 1 (p=0.1) passes; token 2 (p=0.05) would not
    path, root = typical(torch.tensor([0, 2, 2]), logits, buffers, config)
    assert path == [0] and root == 0


def test_medusa_loss_targets_k_plus_one_ahead():
    tokens = torch.tensor([[5, 6, 7, 8, 9]])
    logits = torch.full((2, 1, 5, 10), -10.0)
    for t in range(5):
        for k in range(2):
            if t + k + 2 < 5:
                logits[k, 0, t, tokens[0, t + k + 2]] = 10.0
    loss, accuracy = medusa_loss(logits, tokens)
    assert loss < 1e-3 and accuracy.tolist() == [1.0, 1.0]


def test_bad_input(decoder, tmp_path):
    with pytest.raises(PerfkitError, match="empty prompt"):
        decoder.generate([[1, 2], []], 5)
    with pytest.raises(PerfkitError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    save_checkpoint(tmp_path, Transformer(CONFIG), None)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(PerfkitError, match="missing checkpoint file: no \\*.safetensors"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(PerfkitError, match="missing checkpoint file .*config.json"):
        load_checkpoint(tmp_path)


def test_interleaved_decoding_gives_every_setting_every_prompt_in_every_round(decoder):
    from decoder.runs import decode_batches, decode_interleaved

    tree = greedy_tree(np.full((4, 10), 0.3), 6)
    settings = {"plain": {}, "tree": {"drafting": Drafting(tree)}}
    results = decode_interleaved(decoder, PROMPTS, 2, 10, settings, rounds=2)
    plain = decode_batches(decoder, PROMPTS, 2, 10)
    assert set(results) == {"plain", "tree"}
    assert results["plain"].tokens == plain.tokens * 2  # both rounds, prompts in order
    assert results["tree"].tokens == plain.tokens * 2  # greedy Medusa stays lossless
    assert results["tree"].steps < results["plain"].steps and results["plain"].decode_s > 0
    with pytest.raises(PerfkitError, match="rounds must be >= 1"):
        decode_interleaved(decoder, PROMPTS, 2, 10, settings, rounds=0)
