"""One decoding step of the reference decoder run for tracing: a weightless decoder of a
cost-model preset on the meta device, its step (the eager loop's or the static step's) run
part by part under a recorder (decoder.trace_recorder).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from decoder.acceptance import ACCEPT, AcceptanceConfig
from decoder.checkpoint import Checkpoint
from decoder.heads import MedusaHeads
from decoder.medusa import ROOT_ONLY, Decoder, commit_path
from decoder.model import KVCache, LlamaConfig, Transformer
from decoder.static_step import Execution, StaticStep
from decoder.trace_ops import META, TORCH_DTYPES, weight_storages
from decoder.trace_recorder import HostLists, StepRecorder, module_calls
from decoder.tree import Drafting, TreeBuffers, tree_buffers
from perfmodel.acceptance.trees import Tree, greedy_tree, max_nodes
from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import HEAD_TOP_K


def llama_config(model: ModelConfig) -> LlamaConfig:
    """The decoder's config for a cost-model preset (shapes only: RoPE and norm constants
    are the defaults, which change no kernel)."""
    return LlamaConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        max_position_embeddings=model.max_context or LlamaConfig.max_position_embeddings,
        tie_word_embeddings=model.tie_word_embeddings,
        medusa_num_heads=model.medusa_heads,
    )


def weightless_decoder(
    model: ModelConfig, dtype: torch.dtype, medusa: bool, attention: AttentionCode = AttentionCode.SDPA
) -> Decoder:
    """A Decoder over a model (and, for Medusa, heads) built on meta: shapes, no weights; its
    cached steps' attention run as `attention` (perfmodel.base.attention_code)."""
    config = llama_config(model)
    with torch.device(META):
        transformer = Transformer(config).to(dtype).eval().with_attention(attention)
        heads = MedusaHeads(config.hidden_size, config.vocab_size, model.medusa_heads).to(dtype) if medusa else None
    return Decoder(Checkpoint(None, config, transformer, heads, None, None, {}), str(META))


def head_accuracy(heads: int, topk: int) -> np.ndarray:
    """Head accuracies falling with depth and rank (a_k^(i) = 0.6^(k+1) / (i+1)): only the
    tree's shape depends on them, and any node count up to the complete tree is reachable."""
    return 0.6 ** np.arange(1, heads + 1)[:, None] / np.arange(1, topk + 1)[None, :]


def step_tree(candidates: int, heads: int, topk: int) -> Tree:
    """The static tree of a step: the root alone, or the greedy tree of `candidates` tokens."""
    if candidates == 1:
        return ROOT_ONLY
    return greedy_tree(head_accuracy(heads, topk), candidates - 1)


def check_step(model: ModelConfig, batch: int, context: int, candidates: int, dtype: str, acceptance: str) -> None:
    for name, value in (("batch", batch), ("context", context), ("tree size", candidates)):
        if not is_count(value):
            raise PerfkitError(f"{name} must be an integer >= 1, got {value!r}")
    if dtype not in TORCH_DTYPES:
        raise PerfkitError(f"the decoder runs {', '.join(TORCH_DTYPES)}; got dtype {dtype!r}")
    if acceptance not in ACCEPT:
        raise PerfkitError(f"unknown acceptance {acceptance!r}; choose one of: {', '.join(ACCEPT)}")
    if candidates > 1:
        if model.medusa_heads < 1:
            raise PerfkitError(f"{model.name} has no Medusa heads: only tree size 1 (plain decoding) can be traced")
        largest = max_nodes(model.medusa_heads, HEAD_TOP_K) + 1
        if candidates > largest:
            raise PerfkitError(
                f"tree size {candidates} is more than {model.name}'s {model.medusa_heads} Medusa heads x "
                f"top-{HEAD_TOP_K} allow: at most {largest} tokens"
            )
    model.check_context(context, candidates)


def run_step(
    decoder: Decoder,
    recorder: StepRecorder,
    static: TreeBuffers,
    batch: int,
    context: int,
    acceptance: str,
    sequences: int | None = None,
) -> None:
    """One iteration of Decoder.generate's loop, part by part, on a cache of `context`
    tokens per sequence; the verification and commit of the first `sequences` sequences
    only (None: all), each sequence's rows tagged ("sequence", part, b)."""
    config, dtype = decoder.model.config, next(decoder.model.parameters()).dtype
    topk = HEAD_TOP_K if decoder.heads is not None else 1
    cache = KVCache(config, batch, context + 2 * static.size + 1, META, dtype)
    recorder.cold |= {t.untyped_storage()._cdata for t in (cache.k, cache.v)}
    lengths, roots = [context] * batch, [0] * batch
    last_hidden = torch.empty(batch, config.hidden_size, device=META, dtype=dtype)
    accept, settings = ACCEPT[acceptance], AcceptanceConfig(scheme=acceptance)
    generator = torch.Generator().manual_seed(0)  # on the host, as generate's
    looped = range(batch if sequences is None else min(sequences, batch))
    with torch.inference_mode(), HostLists(), recorder, module_calls(recorder, decoder.model.model.layers):
        with recorder.phase("candidates"):
            buffers, candidates = decoder._candidates(roots, last_hidden, static, 0, topk)
        with recorder.phase("forward"):
            hidden, logits = decoder._tree_forward(candidates, buffers, lengths, cache)
        verdicts = []
        with recorder.phase("verification"):
            for b in looped:
                with recorder.tagged(("sequence", "verification", b)):
                    verdicts.append(accept(candidates[b], logits[b], buffers[b], settings, generator))
        with recorder.phase("kv_update"):
            for b, (path, _) in zip(looped, verdicts):
                with recorder.tagged(("sequence", "kv_update", b)):
                    commit_path(cache, lengths, b, path, hidden, last_hidden, candidates)


def run_static_step(
    decoder: Decoder,
    recorder: StepRecorder,
    static: TreeBuffers,
    batch: int,
    context: int,
    acceptance: str,
    cache_layers: int | None = None,
    fused: bool = True,
) -> None:
    """One static step (decoder.static_step) part by part, every sequence at `context` cached
    tokens, the cache allocated as generate allocates it (the step attends over all of it).
    cache_layers: the layers the KV cache holds (default: the decoder's). A decoder of fewer
    layers then runs its own over their slices of it, and the step's KV move, one gather and
    one scatter across every layer at once, moves what the whole model's would. fused: the
    step's forward pass is decoder.fused's, as every static regime runs it (False: the
    reference model's, as the static step ran before it)."""
    topk = HEAD_TOP_K if decoder.heads is not None else 1
    settings = AcceptanceConfig(scheme=acceptance)
    max_len = context + 2 * static.size + 1
    before = weight_storages((decoder.model,))
    drafting, execution = Drafting(topk=topk), Execution(Launch.STATIC, fused)
    step = StaticStep(decoder, static, batch, max_len, settings, drafting, execution, None)
    # The fused forward joined q/k/v and gate/up (decoder.fused.joined_weight): the weights are
    # read cold where they now live, and the storages they left are freed (their ids reused)
    recorder.cold = (recorder.cold - before) | weight_storages((decoder.model,))
    layers = step.forward_pass.layers if fused else decoder.model.model.layers
    if cache_layers is not None:
        config = dataclasses.replace(decoder.model.config, num_hidden_layers=cache_layers)
        step.buffers.cache = KVCache(config, batch, max_len, META, step.buffers.cache.k.dtype)
    step.buffers.lengths.fill_(context)
    recorder.cold |= {t.untyped_storage()._cdata for t in (step.buffers.cache.k, step.buffers.cache.v)}
    with torch.inference_mode(), HostLists(), recorder, module_calls(recorder, layers):
        with recorder.phase("candidates"):
            candidates = step.candidates()
        with recorder.phase("forward"):
            hidden, logits = step.forward(candidates)
        with recorder.phase("verification"):
            verdict = step.verify(candidates, logits)
        with recorder.phase("kv_update"):
            step.commit(candidates, hidden, verdict)


def record_step(
    decoder: Decoder,
    batch: int,
    context: int,
    candidates: int,
    acceptance: str,
    sequences: int | None,
    execution: Execution,
    cache_layers: int | None = None,
) -> StepRecorder:
    """The recorder of one step of `decoder` (built for the step: with heads for a tree), as
    the eager loop runs it or, for a static launch regime, as the static step does (over a KV
    cache of `cache_layers` layers where given, its forward fused unless the execution's
    `fused` is False: run_static_step)."""
    medusa = candidates > 1
    heads, topk = (len(decoder.heads), HEAD_TOP_K) if medusa else (0, 1)
    static = tree_buffers(step_tree(candidates, heads, topk), heads, topk, str(META))
    recorder = StepRecorder("medusa" if medusa else "plain", weight_storages((decoder.model, decoder.heads)))
    if execution.launch.static:
        run_static_step(decoder, recorder, static, batch, context, acceptance, cache_layers, execution.fused)
    else:
        run_step(decoder, recorder, static, batch, context, acceptance, sequences)
    return recorder
