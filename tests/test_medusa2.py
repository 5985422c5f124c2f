import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from decoder import medusa2, stages, train
from decoder.checkpoint import load_checkpoint, save_checkpoint
from decoder.corpus import sample_prompts
from decoder.heads import MedusaHeads
from decoder.lora import adapters_off, add_lora, lora_parameters, merged
from decoder.medusa import Decoder
from decoder.medusa2_build import build_medusa2, fingerprint
from decoder.model import LlamaConfig, Transformer
from decoder.runs import heldout_prompts
from decoder.tree import Drafting
from perfmodel.cli import run
from perfmodel.models.config import BUNDLED_MODEL, DRAFT_MODEL, MEDUSA2_MODEL
from tests.conftest import quick_copy

TINY = LlamaConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def medusa2_model(quick_trained, tmp_path_factory):
    """`decoder.train --quick`, then `decoder.train --medusa2 --quick` on it."""
    base, _ = quick_copy(quick_trained, tmp_path_factory, "base")
    out, work = tmp_path_factory.mktemp("medusa2"), tmp_path_factory.mktemp("medusa2-work")
    args = ["--medusa2", "--quick", "--model", str(base), "--out", str(out), "--work", str(work)]
    assert run(train.main, args) == 0
    return base, out, work


def adapted_tiny(seed: int = 0) -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    """A tiny model, its logits on some tokens before adapting, and the tokens; its
    adapters' B made non-zero, as training leaves them."""
    torch.manual_seed(seed)
    model = Transformer(TINY).eval()
    tokens = torch.randint(0, TINY.vocab_size, (3, 20))
    with torch.no_grad():
        before = model(tokens)
    add_lora(model, rank=4, alpha=8.0)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(std=0.05)
    return model, before, tokens


def test_adapters_off_is_the_original_model_exactly():
    model, before, tokens = adapted_tiny()
    with torch.no_grad():
        with adapters_off(model):
            off = model(tokens)
        on = model(tokens)
    assert torch.equal(off, before)  # bit for bit: the teacher is the original model
    assert (on - before).abs().max() > 1e-3  # the adapters do change the model when on
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in lora_parameters(model)}  # embeddings, norms, LM head frozen
    assert len(lora_parameters(model)) == 2 * 7 * TINY.num_hidden_layers


def test_merged_weights_compute_what_the_adapters_do():
    model, _, tokens = adapted_tiny(1)
    plain = merged(model)
    with torch.no_grad():
        torch.testing.assert_close(plain(tokens), model(tokens), rtol=1e-5, atol=1e-5)
    assert set(plain.state_dict()) == set(Transformer(TINY).state_dict())  # the checkpoint's own layout
    assert plain.lm_head.weight is plain.model.embed_tokens.weight  # still tied
    assert len(lora_parameters(model)) == 28  # the adapted model keeps its adapters


def test_the_teacher_term_starts_at_zero_and_only_adapters_and_heads_learn():
    torch.manual_seed(0)
    model = Transformer(TINY)
    heads = MedusaHeads(TINY.hidden_size, TINY.vocab_size, 3, lm_head=model.lm_head.weight.data)
    add_lora(model, rank=4, alpha=8.0)
    tokens = torch.randint(0, TINY.vocab_size, (2, 24))
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 8:] = True
    loss, kl, medusa, _ = medusa2.joint_loss(model, heads, tokens, mask, lam=0.2)
    assert kl.item() == 0.0  # B = 0: the adapted model starts as its teacher
    assert loss.item() == pytest.approx(0.2 * medusa.item())
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.normal_(std=0.05)
    loss, kl, _, _ = medusa2.joint_loss(model, heads, tokens, mask, lam=0.2)
    assert kl.item() > 0
    loss.backward()
    assert all(p.grad is not None for p in lora_parameters(model)) and all(
        p.grad is not None for p in heads.parameters()
    )
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for p in frozen)


def test_medusa2_writes_a_checkpoint_whose_card_matches_its_weights(medusa2_model):
    base, out, _ = medusa2_model
    ckpt, base_card = load_checkpoint(out), json.loads((base / "training.json").read_text())
    assert len(ckpt.heads) == 4 and ckpt.tokenizer is not None and len(ckpt.tree.paths) == 8
    card = ckpt.info
    figures = card["medusa2"]
    assert card["backbone"] == base_card["backbone"] and card["config"] == base_card["config"]
    assert card["heldout_head_accuracy"] == figures["medusa2_heldout_head_accuracy"]
    # The base card records its shipped (fp16) weights' figures, which Medusa-2 recomputes from the
    # checkpoint: equal, not close (an fp32 card once differed by one held-out token in 384).
    assert figures["medusa1_heldout_head_accuracy"] == base_card["heldout_head_accuracy"]
    assert figures["quality"]["heldout_loss_original"] == base_card["backbone"]["heldout_loss"]
    assert card["default_tree"]["nodes"] == base_card["default_tree"]["nodes"]
    assert [r["tree_tokens"] for r in figures["expected_tokens_per_step"]] == [9, 16, 64]
    assert figures["training"]["steps"] == 4 and figures["command"].startswith("python -m decoder.train --medusa2")
    assert set(figures["quality"]["greedy_agreement"]) >= {"tokens_identical", "continuations_identical"}
    # The heads trained: they are not the base's any more.
    base_heads = load_file(base / "medusa_lm_head.safetensors")
    assert any(not torch.equal(v, base_heads[k]) for k, v in load_file(out / "medusa_lm_head.safetensors").items())

    # The recorded accuracies are those of the weights shipped, on the Medusa-2 model's own continuations.
    config = stages.TrainConfig(**card["config"])
    _, heldout_texts, _ = stages.training_texts(config)
    documents = stages.encode(ckpt.tokenizer, heldout_texts)
    prompts = sample_prompts(documents, config.eval_prompts, config.distill_prompt_len, seed=config.seed + 2)
    own = stages.distill(ckpt.model, prompts, config.distill_new, print, "test")
    accuracy = stages.measure_accuracy(ckpt.model, ckpt.heads, own, config.distill_prompt_len)
    np.testing.assert_allclose(accuracy, figures["medusa2_heldout_head_accuracy"], atol=1e-4)


def test_heads_learn_at_four_times_the_backbone_rate(medusa2_model):
    _, _, work = medusa2_model
    state = torch.load(work / medusa2.STATE_FILE, weights_only=False)
    lora, heads = state["optimizer"]["param_groups"]
    assert heads["lr"] == pytest.approx(4 * lora["lr"]) and lora["lr"] > 0
    assert len(lora["params"]) == 2 * 7 * 2  # A and B of the 7 projections of the quick model's 2 layers
    assert len(heads["params"]) == len(list(MedusaHeads(64, 384, 4).parameters()))


def test_an_interrupted_run_resumes_to_the_same_weights(medusa2_model, tmp_path, monkeypatch):
    base, out, _ = medusa2_model
    schedule = medusa2.schedule

    def crash_at_step_3(step, total, config):
        if step == 3:
            raise RuntimeError("killed")
        return schedule(step, total, config)

    monkeypatch.setattr(medusa2, "schedule", crash_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        build_medusa2(medusa2.QUICK, base, tmp_path / "out", tmp_path / "work", "test", log=print)
    monkeypatch.setattr(medusa2, "schedule", schedule)
    messages = []
    build_medusa2(medusa2.QUICK, base, tmp_path / "out", tmp_path / "work", "test", log=messages.append)
    assert "medusa-2: resuming at step 2/4" in messages
    for name in ("model.safetensors", "medusa_lm_head.safetensors"):
        resumed, straight = load_file(tmp_path / "out" / name), load_file(out / name)
        assert all(torch.equal(resumed[k], straight[k]) for k in straight)


def test_a_base_checkpoint_without_heads_is_refused(medusa2_model, tmp_path, capsys):
    base, _, _ = medusa2_model
    ckpt = load_checkpoint(base)
    folder = tmp_path / "no-heads"
    save_checkpoint(folder, ckpt.model, None, ckpt.tokenizer, None, ckpt.info)
    config = json.loads((folder / "config.json").read_text())  # a plain Llama config.json, as HF writes it
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if not k.startswith("medusa")}))
    args = ["--medusa2", "--quick", "--model", str(folder), "--out", str(tmp_path / "out"), "--work", str(tmp_path)]
    assert run(train.main, args) == 1
    err = capsys.readouterr().err
    assert f"{folder} has no Medusa heads" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args", [["--medusa2", "--install"], ["--medusa2", "--steps", "5"], ["--model", "bundled"]], ids=str
)
def test_options_that_do_not_go_together_are_refused(args):
    with pytest.raises(SystemExit) as exc:
        train.main(args)
    assert exc.value.code == 2


def test_the_shipped_medusa2_model_is_the_bundled_one_jointly_trained_and_decodes_losslessly():
    ckpt = load_checkpoint("medusa2")
    assert ckpt.folder == MEDUSA2_MODEL
    # the models, the bundled one with its two EAGLE drafters (1.6 MB each: its own, and vLLM's layout for the
    # engine) and its draft model (1.0 MB), stay small enough to ship in the repository
    shipped = (BUNDLED_MODEL, MEDUSA2_MODEL, DRAFT_MODEL)
    assert sum(f.stat().st_size for d in shipped for f in d.iterdir()) < 28_000_000
    figures = ckpt.info["medusa2"]
    assert figures["base"]["sha1"] == fingerprint(BUNDLED_MODEL)  # rebuild it when the bundled model changes
    assert ckpt.info["heldout_head_accuracy"] == figures["medusa2_heldout_head_accuracy"]
    assert (
        len(ckpt.tree.paths)
        == ckpt.info["default_tree"]["nodes"]
        == load_checkpoint("bundled").info["default_tree"]["nodes"]
    )
    decoder = Decoder(ckpt)
    prompts = heldout_prompts(ckpt, 4, 48, seed=3)
    assert decoder.generate(prompts, 32, drafting=Drafting(ckpt.tree)).tokens == decoder.generate(prompts, 32).tokens
