"""Issue 22, the reference decoder at run time: `--tree auto` calibrations that a busy
machine or other weights made, the batch and context a run really had, where the
calibration cache goes, typical acceptance's choice among equally long paths, random draws
on any device, and the reference trees' names."""

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

import decoder.tree_calibration as tree_calibration_module
from decoder import generate, measure
from decoder.acceptance import AcceptanceConfig, next_token, rejection, typical
from decoder.auto_tree import auto_tree
from decoder.calibration_cache import calibration_for, model_key
from decoder.checkpoint import Checkpoint, load_checkpoint
from decoder.medusa import Decoder
from decoder.model import LlamaConfig, Transformer
from decoder.runs import heldout_prompts
from decoder.tree import Drafting, resolve_tree, tree_buffers
from decoder.tree_calibration import CALIBRATION_ATTEMPTS
from perfmodel.acceptance.trees import Tree
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.measured.store import HOME_VARIABLE

# The calibration auto_tree asks for in these tests: batch 1, 16-token prompts, 8 new tokens.
BATCH, CONTEXT, NEW = 1, 16, 8


@pytest.fixture(scope="module")
def bundled():
    ckpt = load_checkpoint("bundled")
    return ckpt, Decoder(ckpt)


def write_cache(ckpt, decoder, step_s: dict[int, float], **extra) -> None:
    """A cached calibration where auto_tree looks for it."""
    calibration = calibration_for(ckpt, decoder, BATCH, CONTEXT, NEW)
    calibration.path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"step_s": {str(n): v for n, v in step_s.items()}, "batch_efficiency": {str(n): 1.0 for n in step_s}}
    calibration.path.write_text(json.dumps({calibration.key: entry | extra}))


class Calls:
    """Stands in for the minutes-long calibration: records that it ran and returns a profile
    with the given plain step, rising with the tree."""

    def __init__(self, plain_s: float):
        self.plain_s, self.count = plain_s, 0

    def __call__(self, decoder, ckpt, batch, context, new_tokens, accuracy, log=print, sizes=None):
        self.count += 1
        log("calibrating (stand-in)")
        step_s = {1: self.plain_s, 2: 2 * self.plain_s, 4: 2.2 * self.plain_s}
        return {"step_s": step_s, "batch_efficiency": dict.fromkeys(step_s, 1.0)}


def run_auto(ckpt, decoder, **kwargs) -> str:
    said = []
    choice, _ = auto_tree(decoder, ckpt, BATCH, CONTEXT, NEW, log=said.append, **kwargs)
    assert choice is None or choice.size in (1, 2, 4)  # None: no kept calibration backs a choice
    return "\n".join(said)


def test_a_cached_calibration_whose_step_falls_as_the_tree_grows_is_measured_again(bundled, monkeypatch):
    ckpt, decoder = bundled
    calls = Calls(1e-3)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    # what a loaded CPU stored: a 4-token step at half the 2-token one (the probe is real: whatever this
    # machine's plain step now, the fall alone condemns it)
    write_cache(ckpt, decoder, {1: 1e-3, 2: 2e-3, 4: 1e-3})
    said = run_auto(ckpt, decoder)
    # measured again; twice where the stand-in's plain step is implausible beside this machine's real probe
    assert 1 <= calls.count <= CALIBRATION_ATTEMPTS
    assert "not using the tree calibration" in said and "a step of 4 tokens took 1 ms, less than the 2 ms of 2" in said


def test_a_cached_plain_step_far_above_this_machines_is_measured_again(bundled, monkeypatch):
    ckpt, decoder = bundled
    calls = Calls(1e-3)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    # rising with the tree as it should, but 100 s a step: far above the real probe's, however busy the machine
    write_cache(ckpt, decoder, {1: 100.0, 2: 150.0, 4: 170.0})
    said = run_auto(ckpt, decoder)
    # measured again; twice where the stand-in's plain step is implausible beside this machine's real probe
    assert 1 <= calls.count <= CALIBRATION_ATTEMPTS
    assert "not using the tree calibration" in said and "this machine's now" in said


@pytest.mark.parametrize("probe_ms, used", [(1.0, True), (0.9, True), (0.6, False), (2.0, True)])
def test_the_cached_plain_step_is_held_against_the_probe(probe_ms, used, bundled, monkeypatch):
    ckpt, decoder = bundled
    calls = Calls(1e-3)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    # a probe of fixed time: the rule under test, not this machine's load
    monkeypatch.setattr(tree_calibration_module, "probe_plain_step", lambda *_: probe_ms * 1e-3, raising=False)
    write_cache(ckpt, decoder, {1: 1e-3, 2: 2e-3, 4: 2.2e-3}, measured_at=time.time() - 7200)
    said = run_auto(ckpt, decoder)
    path = calibration_for(ckpt, decoder, BATCH, CONTEXT, NEW).path
    assert calls.count == (0 if used else CALIBRATION_ATTEMPTS)  # 1 ms against a 0.6 ms probe, twice
    if used:
        assert f"using the tree calibration {path}" in said and "2 h old" in said and "--recalibrate" in said
        # a machine slower now than when calibrated keeps the calibration, and says why this run is slow
        assert ("slower now than when calibrated" in said) == (probe_ms > 1.5)
    else:
        assert "1.7x this machine's now" in said


def test_recalibrate_measures_again_and_keeps_a_plausible_result(bundled, monkeypatch):
    ckpt, decoder = bundled
    calls = Calls(1e-3)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    monkeypatch.setattr(tree_calibration_module, "probe_plain_step", lambda *_: 1e-3, raising=False)
    write_cache(ckpt, decoder, {1: 1e-3, 2: 2e-3, 4: 2.2e-3}, measured_at=time.time() - 7200)
    said = run_auto(ckpt, decoder, recalibrate=True)
    assert calls.count == 1 and "kept the tree calibration" in said
    path = calibration_for(ckpt, decoder, BATCH, CONTEXT, NEW).path
    assert list(json.loads(path.read_text()).values())[0]["measured_at"] > time.time() - 60
    assert "using the tree calibration" in run_auto(ckpt, decoder) and calls.count == 1


def test_a_new_calibration_that_disagrees_with_the_probe_is_neither_kept_nor_used(bundled, monkeypatch):
    ckpt, decoder = bundled
    calls = Calls(5e-3)  # the machine slowed 5x while it calibrated
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    monkeypatch.setattr(tree_calibration_module, "probe_plain_step", lambda *_: 1e-3, raising=False)
    said = run_auto(ckpt, decoder)
    assert "is neither kept nor used" in said and "no speedup predicted" in said  # issue 56, item 8
    assert not calibration_for(ckpt, decoder, BATCH, CONTEXT, NEW).path.exists()


def test_the_calibration_cache_is_keyed_by_the_weights_content(tmp_path):
    source = load_checkpoint("bundled").folder
    folders = []
    for name in ("a", "b"):
        folder = tmp_path / name / "model"
        shutil.copytree(source, folder)
        (folder / "checksums.sha256").unlink(missing_ok=True)  # the weights of b change on purpose
        folders.append(folder)
    weights = folders[1] / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
    save_file(tensors, str(weights))
    assert weights.stat().st_size == (folders[0] / "model.safetensors").stat().st_size
    keys = [model_key(load_checkpoint(folder)) for folder in folders]
    assert keys[0] != keys[1]
    assert model_key(load_checkpoint(folders[0])) == keys[0]


@pytest.mark.parametrize("where", ["home is a file", "cache folder is a file"])
def test_an_unwritable_cache_is_an_error_before_calibrating(where, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    if where == "home is a file":
        home.write_text("not a folder")
        named = str(home)
    else:
        home.mkdir()
        (home / "tree-calibration").write_text("in the way")
        named = str(home / "tree-calibration")
    monkeypatch.setenv(HOME_VARIABLE, str(home))
    calls = Calls(1e-3)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    assert run(generate.main, ["--prompt", "def f(", "--max-new-tokens", "4", "--tree", "auto"]) == 1
    err = capsys.readouterr().err.strip()
    assert calls.count == 0
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and named in err


def test_measure_records_the_batch_it_ran(tmp_path, capsys):
    out = tmp_path / "acc.json"
    args = ["--prompts", "2", "--batch", "100000", "--prompt-len", "16", "--new-tokens", "4"]
    assert run(measure.main, [*args, "--sizes", "1", "2", "--tree", "chain-1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["batch"] == 2 and record["prompts"] == 2
    assert "--batch 100000 is more than the 2 prompts" in capsys.readouterr().err


@pytest.mark.parametrize("new_tokens", ["100000000", "4096"])
def test_generating_past_the_models_context_is_refused_at_once(new_tokens, capsys):
    started = time.perf_counter()
    assert run(generate.main, ["--prompt", "def f(", "--max-new-tokens", new_tokens, "--no-medusa"]) == 1
    err = capsys.readouterr().err.strip()
    assert time.perf_counter() - started < 30
    assert len(err.splitlines()) == 1 and "context of 4096 tokens" in err and f"--max-new-tokens {new_tokens}" in err


def test_measure_refuses_prompts_and_responses_past_the_context(tmp_path, capsys):
    args = ["--prompts", "1", "--prompt-len", "4090", "--new-tokens", "100", "--sizes", "1", "--tree", "chain-1"]
    assert run(measure.main, [*args, "--out", str(tmp_path / "acc.json")]) == 1
    assert "context of 4096 tokens" in capsys.readouterr().err
    assert not (tmp_path / "acc.json").exists()


def test_the_decoder_refuses_a_request_past_the_context():
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)  # fmt: skip
    decoder = Decoder(Checkpoint(None, config, Transformer(config), None, None, None, {}))
    assert len(decoder.generate([[1, 2]], 30).tokens[0]) == 30
    with pytest.raises(PerfkitError, match="context of 32 tokens .* max_new_tokens <= 30 fits"):
        decoder.generate([[1, 2]], 31)


def typical_step(tree: Tree, candidates: list[int], parent_logits: dict[int, dict[int, float]], vocab: int = 8):
    """typical() on one tree step whose logits at each listed token favour the given tokens."""
    logits = torch.full((tree.size, vocab), -10.0)
    for token, favoured in parent_logits.items():
        for candidate, value in favoured.items():
            logits[token, candidate] = value
    buffers = tree_buffers(tree, tree.depth, tree.max_rank + 1)
    return typical(torch.tensor(candidates), logits, buffers, AcceptanceConfig("typical", temperature=1.0))


def test_typical_acceptance_keeps_the_most_likely_of_the_longest_paths():
    # two one-token paths, both accepted: token 5 (p 0.62) over token 3 (p 0.38), though 3 comes first
    path, _ = typical_step(Tree(((0,), (1,))), [1, 3, 5], {0: {3: 2.0, 5: 2.5}})
    assert path == [0, 2]
    # length still comes first: the longer path through the less likely token wins
    path, _ = typical_step(Tree(((0,), (1,), (0, 0))), [1, 3, 5, 6], {0: {3: 2.0, 5: 2.5}, 1: {6: 3.0}})
    assert path == [0, 1, 3]


class OnAnAccelerator(torch.Tensor):
    """Tensors that behave as on CUDA where it matters here: torch.multinomial refuses a CPU
    generator for them, as CUDA does; .cpu() gives a plain CPU tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        on_device = any(isinstance(a, cls) for a in args)
        if func in (torch.multinomial, torch.Tensor.multinomial) and on_device and generator is not None:
            if generator.device.type == "cpu":
                raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")
        result = super().__torch_function__(func, types, args, kwargs)
        if func is torch.Tensor.cpu and isinstance(result, cls):
            return result.as_subclass(torch.Tensor)
        return result


def test_random_draws_work_when_the_tensors_are_on_another_device_than_the_generator():
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="device type for generator"):  # the stand-in acts as CUDA does
        torch.multinomial(torch.ones(4).as_subclass(OnAnAccelerator), 1, generator=generator)
    config = AcceptanceConfig("rejection", temperature=1.0)
    logits = torch.randn(8, generator=torch.Generator().manual_seed(1))
    on_device = logits.as_subclass(OnAnAccelerator)
    assert next_token(on_device, config, torch.Generator().manual_seed(0)) == next_token(
        logits, config, torch.Generator().manual_seed(0)
    )
    tree = Tree(((0,), (1,)))
    step_logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    buffers = tree_buffers(tree, 1, 2)
    candidates = torch.tensor([0, 6, 7])  # drafts the model finds unlikely: rejected, then a draw from the rest
    draws = [
        rejection(candidates, x, buffers, config, torch.Generator().manual_seed(3))
        for x in (step_logits.as_subclass(OnAnAccelerator), step_logits)
    ]
    assert draws[0] == draws[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rejection_sampling_decodes_on_cuda(bundled):
    ckpt, _ = bundled
    cuda = Decoder(load_checkpoint("bundled"), device="cuda")
    prompts = heldout_prompts(ckpt, 2, 16, seed=0)
    config = AcceptanceConfig("rejection", seed=5)
    result = cuda.generate(prompts, 8, drafting=Drafting(resolve_tree("mc-sim-7b-63", ckpt)), acceptance=config)
    assert [len(t) for t in result.tokens] == [8, 8]
    assert [len(t) for t in cuda.generate(prompts, 8, acceptance=config).tokens] == [8, 8]


def test_the_reference_trees_go_by_their_own_names(bundled):
    ckpt, _ = bundled
    stage2, mc_sim = resolve_tree("vicuna-7b", ckpt), resolve_tree("mc-sim-7b-63", ckpt)
    assert resolve_tree("vicuna-7b-stage2", ckpt) == stage2
    assert stage2.size == mc_sim.size == 64 and stage2 != mc_sim
    assert len(set(stage2.paths) & set(mc_sim.paths)) == 55
    # FasterDecoding/Medusa, medusa/model/medusa_choices.py: mc_sim_7b_63 goes wider where stage 2 goes deeper
    assert set(mc_sim.paths) - set(stage2.paths) == {
        (0, 0, 9), (0, 6, 0), (0, 7, 0), (1, 5), (1, 6), (2, 2), (8, 0), (9, 0)
    }  # fmt: skip
    assert mc_sim.depth == 4 and sum(len(p) == 4 for p in mc_sim.paths) == 2
