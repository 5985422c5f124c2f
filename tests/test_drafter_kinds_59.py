"""Issue 59, item 1 (every drafter): EAGLE-3's head, a checkpoint's MTP module, a draft model
from its own config.json and n-gram lookup, each priced at one point with drafting and
verification apart; their bad input refused in one line."""

from __future__ import annotations

import json

import pytest

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.draft_weights import DraftWeights
from perfmodel.models.checkpoints_dir import CHECKPOINTS
from perfmodel.models.config import load_model
from perfmodel.models.drafter_config import drafter_model
from perfmodel.planning.deployment import resolve
from perfmodel.planning.drafter_point import DraftedShape, drafter_point, point_drafter, with_draft_steps
from reports.commands.speedup import main as speedup

EAGLE3_HEAD = CHECKPOINTS / "eagle3-llama3.1-8b"
MIMO = CHECKPOINTS / "mimo-7b-rl"
VICUNA_68M = CHECKPOINTS / "vicuna-68m"


def full_steps(model, device="h100-sxm"):
    (deployment,) = resolve(model, device)
    return deployment.steps(["full"])


def ops_of(weights: DraftWeights, first: bool) -> list[str]:
    shard = load_model("llama-3-8b")
    return [item.op for item in weights.pass_ops(shard, "full", first=first) for _ in range(item.count)]


def test_eagle3_fuses_three_features_on_its_first_pass_only_and_reads_2h_in_its_qkv():
    first, later = ops_of(DraftWeights(DrafterKind.EAGLE3), True), ops_of(DraftWeights(DrafterKind.EAGLE3), False)
    assert first.count("eagle3_fc") == 1 and "eagle3_fc" not in later
    assert first.count("eagle3_qkv") == later.count("eagle3_qkv") == 1
    assert "qkv" not in first and "eagle_fc" not in first
    mtp = ops_of(DraftWeights(DrafterKind.MTP), False)
    assert mtp.count("eagle_fc") == 1 and mtp.count("qkv") == 1  # eh_proj, then the target's own layer


def test_eagle3s_reduced_vocabulary_makes_its_drafting_cheaper_than_a_full_vocabulary_head():
    target = load_model("llama-3-8b")
    steps = full_steps(target)
    own = drafter_model(EAGLE3_HEAD, DrafterKind.EAGLE3, target)
    assert own.vocab_size == 32_000 and own.num_layers == 1
    shape = DraftedShape.of(None, 3)
    reduced = drafter_point(steps, point_drafter(DrafterKind.EAGLE3, target, own), shape, 1, 512, 2.8).iloc[0]
    whole = drafter_point(steps, point_drafter(DrafterKind.EAGLE3, target), shape, 1, 512, 2.8).iloc[0]
    assert reduced["draft_passes"] == whole["draft_passes"] == 3
    assert reduced["verify_ms"] == pytest.approx(whole["verify_ms"])  # the same 4 tokens verified
    # 3 LM heads over 32,000 rows, not 128,256: at batch 1 each pass reads 0.8 GB less
    assert 0.3 < whole["draft_ms"] - reduced["draft_ms"] < 3 * whole["draft_ms"] / 3
    assert reduced["draft_ms"] + reduced["verify_ms"] == pytest.approx(reduced["step_ms"])


def test_an_mtp_module_drafts_a_chain_of_the_targets_own_layers():
    target = load_model(MIMO)
    assert target.mtp_layers == 1
    steps = full_steps(target)
    one = drafter_point(steps, point_drafter(DrafterKind.MTP, target), DraftedShape.of(None, 1), 1, 512, 1.8).iloc[0]
    three = drafter_point(steps, point_drafter(DrafterKind.MTP, target), DraftedShape.of(None, 3), 1, 512, 2.4).iloc[0]
    assert (one["draft_passes"], three["draft_passes"]) == (1, 3)
    # the module is run again for each further draft: three passes cost about three times one
    assert three["draft_ms"] == pytest.approx(3 * one["draft_ms"], rel=0.05)
    # one pass is about one layer of the 36 and the LM head: well under a tenth of the step
    assert one["draft_ms"] < one["plain_step_ms"] / 10


def test_a_draft_model_from_its_config_drafts_with_its_own_steps():
    target = load_model("vicuna-7b")
    own = drafter_model(VICUNA_68M, DrafterKind.DRAFT, target)
    steps, draft_steps = full_steps(target), full_steps(own)
    drafter = with_draft_steps(point_drafter(DrafterKind.DRAFT, target, own), draft_steps)
    row = drafter_point(steps, drafter, DraftedShape.of(None, 4), 2, 512, 2.3).iloc[0]
    by_hand = 4 * float(draft_steps["full"].step_time(2, 512, 1))
    assert row["draft_ms"] == pytest.approx(by_hand * 1e3)
    assert "vicuna-68m" in row["latency_model"]


def test_ngram_drafting_is_the_hosts_measured_lookup(capsys):
    assert speedup(["--gpu", "h100-sxm", "--model", "vicuna-7b", "--step", "full", "--drafter", "ngram",
                    "--chain", "3", "--acceleration", "1.8", "--batch", "4"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "the host's lookup of 3 token(s)" in out and "measured on" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "vicuna-7b", "--drafter", "mtp", "--chain", "1"], "declares no MTP module"),
        (["--model", "vicuna-7b", "--drafter", "eagle3"], "priced at one point"),
        (["--model", "vicuna-7b", "--drafter", "draft", "--draft-config", str(VICUNA_68M)], "--draft-config prices"),
        (["--model", "llama-3-8b", "--drafter", "draft", "--chain", "2", "--draft-config", str(VICUNA_68M)],
         "is not the target's 128,256"),
        (["--model", "vicuna-7b", "--drafter", "eagle3", "--chain", "2", "--draft-config", str(EAGLE3_HEAD)],
         "vocab_size 128,256 is not the target's 32,000"),
        (["--model", str(MIMO), "--drafter", "mtp", "--chain", "2", "--draft-config", str(VICUNA_68M)],
         "mtp has no config of its own"),
    ],
)  # fmt: skip
def test_bad_drafter_input_is_one_line(argv, words):
    point = [] if "eagle3" in argv and "--chain" not in argv else ["--acceleration", "1.5"]
    if "--draft-config prices" == words:
        point = []
    with pytest.raises(PerfkitError, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        speedup(["--gpu", "h100-sxm", "--step", "full", *argv, *point])
    assert "\n" not in str(caught.value)


def test_a_head_of_another_hidden_size_is_refused(tmp_path):
    config = json.loads((EAGLE3_HEAD / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"hidden_size": 5120, "vocab_size": 32000}))
    with pytest.raises(PerfkitError, match="hidden_size 5120 is not the target's 4096"):
        drafter_model(tmp_path, DrafterKind.EAGLE3, load_model("vicuna-7b"))


def test_the_best_chain_per_batch_follows_from_per_position_rates(capsys):
    from perfmodel.planning.chain_choice import best_chains

    target = load_model("llama-3-8b")
    steps = full_steps(target)
    rows = best_chains(steps, point_drafter(DrafterKind.EAGLE3, target), (0.6, 0.3, 0.1), 128, (1, 256, 1024))
    one, some, many = (rows.iloc[i] for i in range(3))
    # batch 1 reads the weights either way: a second draft accepted 30% of the time pays, a
    # third at 10% does not
    assert (one["chain"], one["acceleration"]) == (2, pytest.approx(1.9))
    # 256 sequences make the extra tokens cost compute: one draft is the most that pays
    assert (some["chain"], some["acceleration"]) == (1, pytest.approx(1.6)) and one["speedup"] > some["speedup"] > 1
    # at 1,024 sequences no chain pays
    assert not many["speculate"] and many["chain"] == 0 and many["speedup"] == 1
    assert speedup(["--gpu", "h100", "--model", "llama-3-8b", "--step", "full", "--drafter", "eagle3",
                    "--position-rates", "0.8", "0.6", "0.4", "--best-chain", "--context", "1024"]) == 0  # fmt: skip
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("  full: b=1 K=3") and "b=256 K=" in line


def test_the_best_chain_needs_the_rates_alone():
    with pytest.raises(PerfkitError, match="--best-chain searches the chains the per-position rates cover"):
        speedup(["--gpu", "h100", "--model", "llama-3-8b", "--drafter", "eagle3", "--best-chain", "--chain", "2"])


def test_sglangs_tree_parameters_are_eagle_2s_expansion_of_their_steps_and_top_k():
    from perfmodel.planning.engine_tree import engine_tree

    tokens, tree = engine_tree(["speculative-num-steps=3", "eagle_topk=4", "num_draft_tokens=8"])
    assert (tokens, tree.depth, tree.top_k) == (8, 3, 4)
    target = load_model("llama-3-8b")
    shape = DraftedShape.of_engine(["num_steps=3", "eagle_topk=4", "num_draft_tokens=8"])
    row = drafter_point(full_steps(target), point_drafter(DrafterKind.EAGLE3, target), shape, 1, 512, 3.1).iloc[0]
    assert (row["draft_passes"], row["tokens_verified"]) == (3, 8)
    assert row["shape"] == "an engine's 8-token tree (3 steps of top-4)"


@pytest.mark.parametrize(
    "values, words",
    [
        (["num_steps=3", "topk=4", "num_draft_tokens=8"], "'topk=4': not a tree parameter"),
        (["num_steps=3", "eagle_topk=1", "num_draft_tokens=8"], "so 2 to 4 are verified"),
        (["num_steps=3", "eagle_topk=4"], "give num_draft_tokens too"),
        (["num_steps=0", "eagle_topk=4", "num_draft_tokens=8"], "num_steps is a whole number >= 1"),
    ],
)
def test_an_unknown_or_impossible_engine_tree_is_one_line(values, words):
    from perfmodel.planning.engine_tree import engine_tree

    with pytest.raises(PerfkitError, match=words.replace("(", r"\(")):
        engine_tree(values)


@pytest.mark.parametrize("regime", ["graph", "eager"])
def test_in_a_launch_regime_each_draft_pass_is_the_heads_own_traced_step(regime):
    import dataclasses

    from perfmodel.base.launch import Launch
    from perfmodel.latency.eagle import eagle_step
    from reports.point_steps import point_steps

    (deployment,) = resolve("llama-7b", "h100")
    traced = point_steps(deployment, ["traced"], regime=regime)["traced"]
    step = eagle_step(traced)
    assert step.pass_step.regime is Launch(regime) and step.pass_step.model.num_layers == 1
    # the head's step launches every kernel a layer, its norms and its LM head run: more than
    # its operators priced alone, and each pass is one such step (6 passes of EAGLE-2's tree)
    alone = dataclasses.replace(step, pass_step=None)
    assert float(step.draft_time(1, 512, 26)) > float(alone.draft_time(1, 512, 26))
    one_pass = float(step.pass_step.step_time(1, 512, 1))
    assert float(step.draft_time(1, 512, 26)) > 6 * one_pass


def test_eagle_1s_static_tree_drafts_each_depths_nodes_once_with_its_cache():
    import numpy as np

    from perfmodel.acceptance.reference_trees import reference_tree
    from perfmodel.latency.eagle import StaticTreeDraft

    tree = reference_tree("mc_sim_7b_63")
    cached = StaticTreeDraft((tree,), window=0, cached=True)
    passes = cached.passes(64)
    at_depth = np.bincount(tree.depths)
    assert [int(p.tokens) for p in passes] == [1, *(int(n) for n in at_depth[1 : tree.depth])]
    # without a cache every pass runs every node down to its depth again: more tokens in all
    uncached = StaticTreeDraft((tree,), window=0).passes(64)
    assert sum(int(p.tokens) for p in uncached) > sum(int(p.tokens) for p in passes)
    assert [int(p.expanded) for p in passes] == [int(p.expanded) for p in uncached]
    with pytest.raises(PerfkitError, match="runs no window of accepted positions, got 8"):
        StaticTreeDraft((tree,), window=8, cached=True)
    with pytest.raises(PerfkitError, match="unknown reference tree 'mc_sim_7b_64'"):
        reference_tree("mc_sim_7b_64")


METRICS_PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="llama-3-8b"} {drafts}
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="llama-3-8b"} {tokens}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama-3-8b",position="0"} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama-3-8b",position="1"} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama-3-8b",position="2"} {p2}
"""


def page(tmp_path, name, drafts, accepted):
    text = METRICS_PAGE
    for key, value in {"drafts": drafts, "tokens": 3 * drafts, **dict(zip(("p0", "p1", "p2"), accepted))}.items():
        text = text.replace("{" + key + "}", f"{value:.1f}")
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_vllm_metrics_page_gives_the_per_position_rates(tmp_path, capsys):
    from reports.metrics_rates import metrics_rates

    after = page(tmp_path, "after.txt", 1500, (1100, 800, 520))
    before = page(tmp_path, "before.txt", 500, (300, 200, 120))
    assert metrics_rates([after]) == pytest.approx((1100 / 1500, 800 / 1500, 520 / 1500))
    # two pages: the load's own counts, the growth between them
    assert metrics_rates([after, before]) == pytest.approx((0.8, 0.6, 0.4))
    argv = ["--gpu", "h100", "--model", "llama-3-8b", "--step", "full", "--drafter", "eagle3", "--metrics"]
    assert speedup([*argv, str(after), str(before)]) == 0
    out = capsys.readouterr().out
    assert "--metrics: per-position acceptance 0.800 0.600 0.400" in out and "acceleration 2.8" in out
    idle = page(tmp_path, "idle.txt", 0, (0, 0, 0))
    with pytest.raises(PerfkitError, match="no drafts counted"):
        metrics_rates([idle])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--draft-config", str(VICUNA_68M), "--chain", "2"], "--draft-config shapes a drafter outside the step"),
        (["--engine-tree", "num_steps=2", "eagle_topk=2", "num_draft_tokens=4"], "--engine-tree shapes a drafter"),
    ],
)
def test_medusa_refuses_a_drafters_config_or_tree_rather_than_ignoring_it(argv, words):
    with pytest.raises(PerfkitError, match=words):
        speedup(["--gpu", "h100", "--model", "vicuna-7b", "--step", "full", *argv, "--acceleration", "1.5"])


def test_an_unreadable_metrics_page_or_unknown_device_is_one_line(tmp_path):
    from reports.commands.published_check import main as published_check
    from reports.metrics_rates import metrics_rates

    with pytest.raises(PerfkitError, match=r"--metrics .*nothing.txt: cannot read it") as caught:
        metrics_rates([tmp_path / "nothing.txt"])
    assert "\n" not in str(caught.value)
    (tmp_path / "three.txt").write_text("x")
    with pytest.raises(PerfkitError, match="takes one page, or two"):
        metrics_rates([tmp_path / "three.txt"] * 3)
    with pytest.raises(PerfkitError, match="unknown device 'h1000'"):
        published_check(["--gpu", "h1000", "--regime", "full"])
