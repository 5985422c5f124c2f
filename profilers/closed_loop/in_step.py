"""Where the decoder's step spends its time, operator by operator, measured inside the step
itself, beside the price of the same operators timed alone (the closed loop's sweep).

The closed loop prices a step as the sum of its operators, each timed alone between the
decoding batches, plus one host overhead calibrated on the plain step. Where a tree step comes
out short, this says which operator loses time inside the step: every module of the decoder
(each projection, norm, the LM head, the Medusa heads) is timed by forward hooks while the
step runs, and what lies between them is attributed by difference: the attention module
less its projections (RoPE, the KV write, attention itself), the MLP less its projections
(the activation and product), the forward pass less every module (the mask, the residual
adds, positions), the candidates part less the heads. A hook costs the step a little time
itself; its cost per call is measured here and taken out of the part it lands in.

    python -m perfmodel.validate --device cpu --in-step

prints, per tree size, each operator's milliseconds per step in the step and priced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn

# The decoder's modules by the operator of the cost model they run (perfmodel.models.operators).
MODULE_OPS = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "norm": "norm",
    "embed_tokens": "embed",
    "lm_head": "lm_head",
}
ATTENTION, MLP = "self_attn", "mlp"
# What a part measured by difference holds, in the cost model's operators: the price it is
# held against is theirs summed.
REST_OPS = {
    "attention (rope, kv write, sdpa)": ("rope", "kv_write", "sdpa", "qk", "pv"),
    "mlp (act)": ("act",),
    "forward rest (mask, residual)": ("mask", "residual"),
    "candidates": ("candidates",),
    "verification": ("verify",),
    "kv_update": ("kv_move",),
}
PRICED_AS = {"norm": ("norm", "final_norm"), **REST_OPS}  # the final norm is a norm module too
HOST = "host (calibrated)"


@dataclass
class HookClock:
    """Seconds per module role while the hooks are on, and the calls they timed."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    _started: list[int] = field(default_factory=list)

    def attach(self, module: nn.Module, role: str) -> list:
        def start(*_):
            self._started.append(time.perf_counter_ns())

        def stop(*_):
            self.seconds[role] = self.seconds.get(role, 0.0) + (time.perf_counter_ns() - self._started.pop()) * 1e-9
            self.calls[role] = self.calls.get(role, 0) + 1

        return [module.register_forward_pre_hook(start), module.register_forward_hook(stop)]

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def module_roles(decoder) -> list[tuple[nn.Module, str]]:
    """Every module the step's operators run in, with its role (an op, or a parent whose
    children are taken out of it)."""
    out = []
    for name, module in decoder.model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in MODULE_OPS:
            out.append((module, MODULE_OPS[last]))
        elif last in (ATTENTION, MLP):
            out.append((module, last))
    if decoder.heads is not None:
        out.append((decoder.heads, "medusa_heads"))
    return out


def hook_cost_s(repeats: int = 2000) -> float:
    """What a pair of hooks adds to one module call: an identity module called with and
    without them."""
    module = nn.Identity()
    x = torch.zeros(1)

    def seconds() -> float:
        started = time.perf_counter()
        for _ in range(repeats):
            module(x)
        return (time.perf_counter() - started) / repeats

    bare = min(seconds() for _ in range(3))
    handles = HookClock().attach(module, "probe")
    hooked = min(seconds() for _ in range(3))
    for handle in handles:
        handle.remove()
    return max(0.0, hooked - bare)


def in_step_ops(clock: HookClock, parts: dict[str, float], steps: int, hook_s: float) -> dict[str, float]:
    """Seconds per step of each operator (and each part measured by difference) from one
    run's hook clock and its step parts (decoder.result.STEP_PARTS seconds, whole run). A
    part measured by difference loses the time of what is timed inside it and the hooks'
    own cost there (hook_s a call)."""
    seconds = {role: s / steps for role, s in clock.seconds.items()}
    calls = {role: n / steps for role, n in clock.calls.items()}

    def inside(*roles: str) -> float:
        return sum(seconds.get(r, 0.0) + calls.get(r, 0.0) * hook_s for r in roles)

    out = {role: s for role, s in seconds.items() if role not in (ATTENTION, MLP)}
    out["attention (rope, kv write, sdpa)"] = seconds.get(ATTENTION, 0.0) - inside("q", "k", "v", "o")
    out["mlp (act)"] = seconds.get(MLP, 0.0) - inside("gate", "up", "down")
    forward = (ATTENTION, MLP, "norm", "embed", "lm_head")
    out["forward rest (mask, residual)"] = parts["forward"] / steps - inside(*forward)
    out["candidates"] = parts["candidates"] / steps - inside("medusa_heads")
    out["verification"] = parts["verification"] / steps
    out["kv_update"] = parts["kv_update"] / steps
    return out


def in_step_profile(decoder, prompts, settings: dict, new_tokens: int, rounds: int = 3, **kwargs) -> pd.DataFrame:
    """(kind, size, op, in_step_s) rows: each setting decoded `rounds` times with the hooks
    on, each op's fastest round kept (a shared machine only ever adds time)."""
    clock = HookClock()
    handles = [h for module, role in module_roles(decoder) for h in clock.attach(module, role)]
    hook_s = hook_cost_s()
    rows = []
    try:
        for (kind, size), setting in settings.items():
            best: dict[str, float] = {}
            for _ in range(rounds):
                clock.reset()
                result = decoder.generate(prompts, new_tokens, **kwargs, **setting)
                ops = in_step_ops(clock, result.times, result.steps, hook_s)
                best = {k: min(v, best.get(k, np.inf)) for k, v in ops.items()}
            rows += [{"tree_kind": kind, "tree_size": size, "op": op, "in_step_s": s} for op, s in best.items()]
    finally:
        for handle in handles:
            handle.remove()
    return pd.DataFrame(rows).assign(hook_s=hook_s)


def beside_priced(profile: pd.DataFrame, priced: dict[tuple[str, int], dict[str, float]]) -> pd.DataFrame:
    """The in-step profile beside the price of the same operators: `priced` maps (kind,
    size) to perfmodel's op_times (seconds per step by op name) with the host overhead as
    HOST. Each role is held against the ops PRICED_AS says it holds (itself by default)."""
    rows = []
    for (kind, size), part in profile.groupby(["tree_kind", "tree_size"], sort=False):
        prices = priced[kind, size]
        for r in part.itertuples():
            price = sum(prices.get(op, 0.0) for op in PRICED_AS.get(r.op, (r.op,)))
            rows.append({"tree_kind": kind, "tree_size": size, "op": r.op, "in_step_s": r.in_step_s, "priced_s": price})
        rows.append(
            {"tree_kind": kind, "tree_size": size, "op": HOST, "in_step_s": np.nan, "priced_s": prices.get(HOST, 0.0)}
        )
    out = pd.DataFrame(rows)
    out["difference_s"] = out["in_step_s"] - out["priced_s"]
    return out
