"""decoder.trace: the kernels of one decoding step, traced from the decoder's own step on the
meta device: which GEMMs and attention calls it makes, at what shapes, what else it launches,
and where the host waits."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import decoder.trace
from decoder.acceptance import SCHEMES
from decoder.medusa import STEP_PARTS
from decoder.trace import StepTracer, kernel_summary, main, trace_step, trace_unrolled
from decoder.trace_ops import NO_KERNEL
from decoder.trace_recorder import TraceRow
from perfmodel.base.launch import Launch
from perfmodel.cli import run
from perfmodel.latency.kinds import HOST_ONLY_KINDS, KINDS, TRACE_KINDS, kernel_rows
from perfmodel.latency.traced import TRACE_COLUMNS
from perfmodel.models.config import load_model
from tests.helpers import one_line_error

LLAMA_7B = load_model("llama-7b")
BUNDLED = load_model("bundled")  # 4 layers, grouped-query attention (8 query heads, 4 KV heads)
H, FF, V, LAYERS = 4096, 11008, 32000, 32  # llama-7b: hidden, intermediate, vocabulary, layers
# One layer's linear layers in the order the decoder calls them, as (k, n): q, k, v, o, gate, up, down.
LAYER_GEMMS = [(H, H), (H, H), (H, H), (H, H), (H, FF), (H, FF), (FF, H)]
VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "select", "unsqueeze", "permute", "detach"}


@pytest.fixture(scope="module")
def plain() -> pd.DataFrame:
    return trace_step(LLAMA_7B, 1, 512, 1)


@pytest.fixture(scope="module")
def medusa() -> pd.DataFrame:
    return trace_step(LLAMA_7B, 2, 512, 64)


def gemm_shapes(trace: pd.DataFrame) -> list[tuple[int, int, int]]:
    rows = trace[trace["kind"] == "gemm"]
    return list(zip(rows["m"], rows["k"], rows["n"]))


def test_rows_are_kernels_in_dispatch_order(plain, medusa):
    assert tuple(f.name for f in dataclasses.fields(TraceRow)) == TRACE_COLUMNS
    for trace, step in ((plain, "plain"), (medusa, "medusa")):
        assert tuple(trace.columns) == TRACE_COLUMNS
        assert set(trace["step"]) == {step}
        assert trace["index"].tolist() == list(range(len(trace)))
        assert set(trace["kind"]) <= set(TRACE_KINDS)
        assert not trace.attrs["unclassified"], trace.attrs["unclassified"]  # every op of a llama step is known
        assert not {a.split(".")[0] for a in kernel_rows(trace)["aten"]} & VIEWS  # views launch no kernel
        views = trace[trace["kind"] == "view"]
        assert {a.split(".")[0] for a in views["aten"]} <= VIEWS | NO_KERNEL
        host_only = trace[trace["kind"].isin(HOST_ONLY_KINDS)]
        assert (host_only["call"] == "").all() and (host_only[["bytes", "flops"]] == 0).all().all()
        order = trace["part"].map(STEP_PARTS.index)
        assert order.is_monotonic_increasing  # the step's parts, one after the other


def test_a_plain_step_runs_every_layer_and_the_lm_head_on_one_token(plain):
    shapes = gemm_shapes(plain)
    assert len(shapes) == LAYERS * 7 + 1 == 225
    assert shapes == [(1, k, n) for k, n in LAYER_GEMMS] * LAYERS + [(1, H, V)]  # no Medusa head
    gemms = plain[plain["kind"] == "gemm"]
    assert set(gemms["part"]) == {"forward"} and set(gemms["aten"]) == {"mm"} and set(gemms["batch"]) == {1}
    assert (gemms["flops"] == 2 * gemms["m"] * gemms["n"] * gemms["k"]).all()
    # Its candidate is the root the host chose: one host-to-device copy, nothing else.
    candidates = kernel_rows(plain[plain["part"] == "candidates"])
    assert candidates[["aten", "kind", "shapes"]].values.tolist() == [["_to_copy", "copy", "[1] host->device"]]
    down = gemms.iloc[6]
    assert down["bytes"] == 2 * (1 * FF + FF * H + 1 * H) and down["shapes"] == "[1,11008]x[11008,4096]"


def test_attention_is_one_row_per_layer_over_the_cache_and_the_new_token(plain):
    attention = plain[plain["kind"] == "attention"]
    assert len(attention) == LAYERS
    row = attention.iloc[0]
    assert (row["batch"], row["heads"], row["kv_heads"], row["q_len"], row["kv_len"], row["head_dim"]) == (
        1,
        32,
        32,
        1,
        513,
        128,
    )
    assert row["flops"] == 4 * 32 * 1 * 513 * 128
    assert row["bytes"] == 2 * (32 * 128 + 2 * 32 * 513 * 128 + 32 * 128)  # q, k, v read, out written
    # Its math fallback on meta is not traced as kernels of its own.
    assert not {"bmm", "_softmax", "baddbmm"} & set(plain["aten"])


def test_a_medusa_step_adds_the_heads_and_runs_the_layers_on_every_candidate(medusa):
    shapes = gemm_shapes(medusa)
    heads = medusa[(medusa["kind"] == "gemm") & (medusa["part"] == "candidates")]
    # Each head: its ResBlock's linear (with a bias) then its projection to the vocabulary, on the last hidden state.
    assert list(zip(heads["aten"], heads["m"], heads["k"], heads["n"])) == [("addmm", 2, H, H), ("mm", 2, H, V)] * 4
    layers = shapes[len(heads) :]
    assert layers == [(2 * 64, k, n) for k, n in LAYER_GEMMS] * LAYERS + [(2 * 64, H, V)]
    attention = medusa[medusa["kind"] == "attention"]
    assert len(attention) == LAYERS
    assert set(zip(attention["batch"], attention["q_len"], attention["kv_len"])) == {(2, 64, 512 + 64)}


def test_the_host_waits_only_to_verify_and_commit(medusa):
    syncs = medusa[medusa["kind"] == "host_sync"]
    assert (syncs["part"] == "verification").sum() >= 2  # at least one read per sequence
    assert set(syncs["part"]) <= {"verification", "kv_update"}  # never inside the forward pass
    assert set(syncs["aten"]) <= {"_local_scalar_dense", "_to_copy"}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_acceptance_scheme_traces_with_the_same_forward_pass(scheme, medusa):
    trace = trace_step(LLAMA_7B, 2, 512, 64, acceptance=scheme)
    assert not trace.attrs["unclassified"]
    forward = ["aten", "m", "n", "k", "q_len", "kv_len", "bytes"]
    assert trace[trace["part"] == "forward"][forward].equals(medusa[medusa["part"] == "forward"][forward])
    assert (trace[trace["part"] == "verification"]["kind"] == "host_sync").any()


def test_bytes_count_what_a_kernel_touches(plain):
    # A KV cache write reads the new keys and their slots and writes as many elements,
    # not the whole cache layer (513+ slots).
    write = plain[plain["aten"] == "scatter_.src"].iloc[0]
    keys = 32 * 1 * 128 * 2
    assert write["bytes"] == keys + 8 + keys  # the slot index is (1, 1) int64, expanded over heads and head_dim
    # The embedding reads one row of the table and writes it, plus the token index.
    embed = plain[plain["aten"] == "embedding"].iloc[0]
    assert embed["bytes"] == 2 * H * 2 + 8 and embed["kind"] == "indexing"


def test_kinds_follow_what_the_operator_does(plain):
    kernels = plain[plain["kind"] != "host_sync"]
    kind = dict(zip(kernels["aten"], kernels["kind"]))
    assert kind["embedding"] == kind["scatter_.src"] == kind["gather"] == "indexing"
    assert kind["mean.dim"] == kind["argmax"] == kind["cumprod"] == "reduction"
    assert kind["cat"] == kind["copy_"] == kind["stack"] == kind["_to_copy"] == "copy"
    assert kind["silu"] == kind["rsqrt"] == kind["mul.Tensor"] == kind["arange"] == "elementwise"
    # Reads by the host: an int() of a device scalar, a .tolist() (a copy to the host).
    syncs = plain[plain["kind"] == "host_sync"]
    assert set(syncs["aten"]) == {"_local_scalar_dense", "_to_copy"}


def test_a_70b_step_traces_with_grouped_query_attention():
    trace = trace_step(load_model("llama-2-70b"), 1, 512, 64)
    attention = trace[trace["kind"] == "attention"]
    assert len(attention) == 80 and set(attention["kv_heads"]) == {8} and set(attention["heads"]) == {64}
    assert (trace["kind"] == "gemm").sum() == 80 * 7 + 1 + 2 * 4


def test_kernel_summary_totals_every_kind_of_each_step(plain, medusa):
    both = pd.concat([plain, medusa], ignore_index=True)
    summary = kernel_summary(both)
    assert list(zip(summary["step"], summary["kind"])) == [(s, k) for s in ("plain", "medusa") for k in KINDS]
    gemm = summary[(summary["step"] == "plain") & (summary["kind"] == "gemm")].iloc[0]
    assert gemm["kernels"] == 225 and gemm["flops"] == plain.loc[plain["kind"] == "gemm", "flops"].sum()
    assert summary["kernels"].sum() == len(kernel_rows(both)) and summary["bytes"].sum() == both["bytes"].sum()


def test_the_hosts_own_work_is_in_the_trace_module_calls_and_views(plain):
    modules = plain[plain["kind"] == "module"]["aten"].value_counts().to_dict()
    # every layer's modules, once per layer, and the model's own: the embedding, final norm and LM head
    assert modules == {
        "Linear": LAYERS * 7 + 1,
        "RMSNorm": LAYERS * 2 + 1,
        "DecoderLayer": LAYERS,
        "Attention": LAYERS,
        "MLP": LAYERS,
        "Embedding": 1,
    }
    views = plain[plain["kind"] == "view"]
    # a linear layer's transpose is inside F.linear (C++), not an op the host dispatches from Python
    assert "t" not in set(views["aten"]) and len(views) > LAYERS * 10


def test_the_command_writes_both_steps(tmp_path, capsys):
    out = tmp_path / "trace.csv"
    argv = ["--model", "llama-7b", "--context", "128", "--tree-size", "8", "--dtype", "bf16", "--csv", str(out)]
    assert main(argv) == 0
    table = pd.read_csv(out)
    assert tuple(table.columns) == TRACE_COLUMNS
    assert list(dict.fromkeys(table["step"])) == ["plain", "medusa"]
    assert set(table.loc[table["kind"] == "gemm", "dtype"]) == {"bf16"}
    medusa_attention = table[(table["step"] == "medusa") & (table["kind"] == "attention")]
    assert set(medusa_attention["q_len"]) == {8}
    shown = capsys.readouterr().out
    assert "plain step" in shown and "medusa step" in shown and "traced in" in shown
    assert "gemm      225" in shown  # the plain step's kernel count of that kind


@pytest.mark.parametrize(
    "batch, context, size, dtype, fragments",
    [
        (0, 512, 1, "fp16", ["batch must be an integer >= 1", "0"]),
        (1, 0, 1, "fp16", ["context must be an integer >= 1"]),
        (1, 512, 0, "fp16", ["tree size must be an integer >= 1"]),
        (1, 512, 20000, "fp16", ["tree size 20000", "4 Medusa heads", "at most 11111"]),
        (1, 2040, 64, "fp16", ["context 2040 + tree size 64", "2048"]),
        (1, 512, 1, "fp8", ["'fp8'", "fp16, bf16, fp32"]),
    ],
)
def test_bad_steps_are_one_line_errors(batch, context, size, dtype, fragments):
    one_line_error(lambda: trace_step(LLAMA_7B, batch, context, size, dtype), *fragments)


def test_a_model_without_heads_traces_only_plain_steps():
    headless = dataclasses.replace(LLAMA_7B, medusa_heads=0)
    one_line_error(lambda: trace_step(headless, 1, 512, 8), "no Medusa heads")


def test_the_command_refuses_bad_values_in_one_line_before_tracing(tmp_path, capsys):
    out = tmp_path / "trace.csv"
    assert run(main, ["--tree-size", "20000", "--csv", str(out)]) == 1
    shown = capsys.readouterr()
    assert shown.err.count("\n") == 1 and "at most 11111" in shown.err
    assert shown.out == "" and not out.exists()  # the plain step was not traced first
    with pytest.raises(SystemExit) as exit_:
        main(["--batch", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


# -- one layer and one sequence, repeated ------------------------------------------------------


@pytest.mark.parametrize(
    "model, batch, context, size",
    [
        (LLAMA_7B, 1, 512, 1),
        (LLAMA_7B, 3, 100, 64),
        (BUNDLED, 1, 128, 1),
        (BUNDLED, 4, 77, 10),
        (BUNDLED, 2, 300, 64),
    ],
    ids=["llama-7b-plain", "llama-7b-tree64-b3", "bundled-plain", "bundled-tree10-b4", "bundled-tree64-b2"],
)
def test_the_repeated_trace_is_the_unrolled_one_row_for_row(model, batch, context, size):
    fast = trace_step(model, batch, context, size)
    unrolled = trace_unrolled(model, batch, context, size)
    pd.testing.assert_frame_equal(fast, unrolled)  # same rows, same order, same values and dtypes
    assert fast.attrs == unrolled.attrs
    attention = fast[fast["kind"] == "attention"]
    assert len(attention) == model.num_layers  # every layer is there, not the one traced


@pytest.mark.parametrize(
    "model, batch, context, size",
    [(BUNDLED, 1, 128, 1), (BUNDLED, 3, 77, 10), (LLAMA_7B, 2, 300, 64)],
    ids=["bundled-plain", "bundled-tree10-b3", "llama-7b-tree64-b2"],
)
def test_the_static_steps_one_layer_trace_is_the_unrolled_one_row_for_row(model, batch, context, size):
    # one layer over the whole model's KV cache: the layer's rows repeated, the KV move of every layer
    fast = trace_step(model, batch, context, size, launch=Launch.STATIC)
    unrolled = trace_unrolled(model, batch, context, size, launch=Launch.STATIC)
    pd.testing.assert_frame_equal(fast, unrolled)
    assert fast.attrs == unrolled.attrs
    assert len(fast[fast["kind"] == "attention"]) == model.num_layers


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_verifies_each_sequence_as_the_first(scheme):
    # typical and rejection sampling draw from one host generator, sequence after sequence
    fast = trace_step(BUNDLED, 3, 64, 16, acceptance=scheme)
    pd.testing.assert_frame_equal(fast, trace_unrolled(BUNDLED, 3, 64, 16, acceptance=scheme))
    verification = fast[fast["part"] == "verification"]
    assert len(verification) % 3 == 0 and (verification["kind"] == "host_sync").any()


def test_a_sweeps_tracer_traces_each_point_once(monkeypatch):
    expected = trace_step(BUNDLED, 2, 256, 8)
    recorded, built = [], []
    record, build = decoder.trace.record_step, decoder.trace.weightless_decoder
    monkeypatch.setattr(decoder.trace, "record_step", lambda *a, **k: recorded.append(a[1:4]) or record(*a, **k))
    monkeypatch.setattr(decoder.trace, "weightless_decoder", lambda *a: built.append(a) or build(*a))
    tracer = StepTracer()
    first = tracer(BUNDLED, 2, 256, 8, "fp16")
    pd.testing.assert_frame_equal(first, expected)
    first.loc[0, "bytes"] = -1  # the caller's copy
    again = tracer(BUNDLED, 2, 256, 8, "fp16")
    assert again.loc[0, "bytes"] >= 0 and again.attrs == {"unclassified": []}
    tracer(BUNDLED, 2, 256, 16, "fp16")
    tracer(BUNDLED, 2, 256, 1, "fp16")
    assert recorded == [(2, 256, 8), (2, 256, 16), (2, 256, 1)]  # the repeated point was not traced again
    assert [(model.num_layers, medusa) for model, _, medusa, *_ in built] == [(1, True), (1, False)]  # one per kind


def test_a_sweeps_tracer_may_trace_past_the_trained_context():
    # simulation (c) runs llama-7b (2048 tokens) to 8192: its shapes are traced as any other's
    one_line_error(lambda: trace_step(LLAMA_7B, 1, 4096, 8), "context 4096 + tree size 8", "2048")
    one_line_error(lambda: StepTracer()(LLAMA_7B, 1, 4096, 8, "fp16"), "context 4096 + tree size 8")
    trace = StepTracer(beyond_context=True)(LLAMA_7B, 1, 4096, 8, "fp16")
    pd.testing.assert_frame_equal(trace, trace_step(dataclasses.replace(LLAMA_7B, max_context=None), 1, 4096, 8))
    assert set(trace.loc[trace["kind"] == "attention", "kv_len"]) == {4096 + 8}
