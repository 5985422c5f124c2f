"""Which code a decoding step's attention runs: what a published harness ran is a fact of its
rows (perfmodel.measured.published_speculation's `model_code`), and the reference decoder runs
either (decoder.model.Attention), so a step is traced as the harness ran it.

- sdpa: one fused kernel, torch's scaled_dot_product_attention, as Hugging Face transformers'
  Llama runs it by default (transformers >= 4.36 with torch >= 2.1.1) and the decoder does.
- matmul: attention written out, as Medusa's and EAGLE's own `modeling_llama_kv.py` write it:
  q k^T by torch.matmul, scaled, the mask added, a softmax in float32 cast back, and a second
  matmul; several kernels per layer instead of one, each issued by the host.
"""

from __future__ import annotations

from enum import StrEnum


class AttentionCode(StrEnum):
    SDPA = "sdpa"
    MATMUL = "matmul"
