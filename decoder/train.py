"""python -m decoder.train: reproduce the bundled model, its tokenizer and its Medusa heads.

Stages (intermediate results kept in --work, so an interrupted run resumes):
1. tokenizer: byte-level BPE trained on the standard library's source (decoder.corpus);
2. backbone: a small Llama trained from scratch on the training files;
3. self-distillation: the backbone continues prompts from the training files (greedy);
4. Medusa-1 heads: backbone frozen, loss sum_k 0.8^k CE(head k, token t+k+1) on the
   backbone's own continuations;
5. head accuracies a_k^(i) on held-out continuations, and the paper's greedy tree built
   from them as the default tree.
The backbone is rounded to the fp16 it ships in as soon as it is trained, and the heads
before they are measured: every later stage and every figure recorded is that of the
weights shipped, so a reader recomputing them from the checkpoint gets the same numbers.
The result (fp16 weights, ~11 MB) is written in the Hugging Face layout with the heads
in the reference layout, plus training.json with the costs and figures of each stage and
checksums.sha256. It replaces the output folder whole (decoder.checkpoint.replacing);
an existing checkpoint there is replaced only with --force, or when confirmed at a terminal.

--medusa2 runs Medusa-2 on such a checkpoint instead (decoder.medusa2): LoRA on the
backbone trained jointly with the heads, on the original model's continuations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from decoder import medusa2
from decoder.checkpoint import BUNDLED, folder_in_the_way, load_checkpoint, replacing, save_checkpoint
from decoder.corpus import EOS, sample_prompts
from decoder.eagle_train import QUICK_EAGLE, EagleConfig, build_eagle
from decoder.heads import MedusaHeads, medusa_loss
from decoder.model import Transformer
from decoder.stages import (
    QUICK,
    TrainConfig,
    as_shipped,
    cosine_batches,
    distill,
    encode,
    heldout_loss,
    measure_accuracy,
    training_texts,
)
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.base.outputs import writable_dir
from perfmodel.cli import Parser, options, positive_int, run


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_backbone(config: TrainConfig, stream: np.ndarray, work: Path, log) -> tuple[Transformer, dict]:
    """Train (or resume training) the backbone on random windows of the token stream."""
    model_config = config.model_config(eos=config_eos(work))
    torch.manual_seed(config.seed)
    model = Transformer(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(config.seed)
    state_file, step, losses, spent = work / "backbone.pt", 0, [], 0.0
    if state_file.exists():
        state = torch.load(state_file, weights_only=False)
        if state["config"] == dataclasses.asdict(config):
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            rng.bit_generator.state = state["rng"]
            step, losses, spent = state["step"], state["losses"], state["seconds"]
            log(f"backbone: resuming at step {step}/{config.steps}")
    from tqdm import tqdm

    bar = tqdm(total=config.steps, initial=step, unit="step", disable=None, file=sys.stderr)
    started = time.perf_counter() - spent
    model.train()
    while step < config.steps:
        starts = rng.integers(0, len(stream) - config.seq_len - 1, size=config.batch)
        batch = torch.from_numpy(np.stack([stream[s : s + config.seq_len + 1] for s in starts]).astype(np.int64))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        step += 1
        bar.update()
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        if step % 100 == 0 or step == config.steps:
            state = dict(
                config=dataclasses.asdict(config),
                model=model.state_dict(),
                optimizer=optimizer.state_dict(),
                rng=rng.bit_generator.state,
                step=step,
                losses=losses,
                seconds=time.perf_counter() - started,
            )
            torch.save(state, state_file.with_suffix(".tmp"))
            state_file.with_suffix(".tmp").replace(state_file)  # a kill never corrupts the resume point
    bar.close()
    model.eval()
    return model, {
        "steps": step,
        "tokens": step * config.batch * config.seq_len,
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(float(np.mean(losses[-50:])), 4),
    }


def config_eos(work: Path) -> int:
    return read_json(work / "meta.json", "training work record")["eos"]


def train_heads(
    model: Transformer, sequences: torch.Tensor, prompt_len: int, config: TrainConfig, log
) -> tuple[MedusaHeads, dict]:
    """Medusa-1: backbone frozen, heads trained on its hidden states and continuations."""
    torch.manual_seed(config.seed)
    with torch.inference_mode():
        hidden = torch.cat([model.hidden(sequences[i : i + 256]) for i in range(0, len(sequences), 256)])
    heads = MedusaHeads(config.hidden_size, config.vocab_size, config.medusa_heads, lm_head=model.lm_head.weight.data)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=config.head_lr, weight_decay=0.0)
    target_mask = torch.zeros_like(sequences, dtype=torch.bool)
    target_mask[:, prompt_len:] = True  # learn the model's own continuations, not the prompt text
    started, steps = time.perf_counter(), 0
    schedule = cosine_batches(
        optimizer, config.head_lr, len(sequences), config.head_batch, config.head_epochs, config.seed
    )
    for epoch, batches in schedule:
        for idx in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = heads(hidden[idx].clone())
            loss, accuracy = medusa_loss(logits, sequences[idx], target_mask=target_mask[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
        log(
            f"heads: epoch {epoch + 1}/{config.head_epochs}, loss {float(loss.detach()):.3f}, top-1 accuracy "
            f"{[round(float(a), 3) for a in accuracy]}"
        )
    heads.eval()
    return heads, {
        "steps": steps,
        "sequences": len(sequences),
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(float(loss.detach()), 4),
    }


def build(config: TrainConfig, out: Path, work: Path, log=print) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    card: dict = {
        "config": dataclasses.asdict(config),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    t0 = time.perf_counter()
    train_texts, heldout_texts, corpus = training_texts(config)
    card["corpus"] = corpus

    tokenizer_file = work / "tokenizer.json"
    meta = work / "meta.json"
    if (
        tokenizer_file.exists()
        and meta.exists()
        and read_json(meta, "training work record").get("config") == dataclasses.asdict(config)
    ):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    else:
        tokenizer = train_tokenizer(train_texts, config.vocab_size)
        tokenizer.save(str(tokenizer_file))
        (work / "meta.json").write_text(
            json.dumps({"config": dataclasses.asdict(config), "eos": tokenizer.token_to_id(EOS)})
        )
    eos = tokenizer.token_to_id(EOS)
    train_docs, heldout_docs = encode(tokenizer, train_texts), encode(tokenizer, heldout_texts)
    stream = np.array([t for doc in train_docs for t in (*doc, eos)], dtype=np.int32)
    card["tokenizer"] = {
        "vocab_size": tokenizer.get_vocab_size(),
        "train_tokens": int(len(stream)),
        "heldout_tokens": sum(map(len, heldout_docs)),
        "chars_per_token": round(corpus["train_bytes"] / len(stream), 2) if not config.max_files else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    log(f"tokenizer: {card['tokenizer']}")

    model, card["backbone"] = train_backbone(config, stream, work, log)
    model = as_shipped(model)
    card["backbone"]["parameters"] = sum(p.numel() for p in model.parameters())
    card["backbone"]["heldout_loss"] = round(heldout_loss(model, heldout_docs, config), 4)
    log(f"backbone: {card['backbone']}")

    t0 = time.perf_counter()
    train_prompts = sample_prompts(train_docs, config.distill_prompts, config.distill_prompt_len, seed=config.seed)
    sequences = distill(model, train_prompts, config.distill_new, log, "self-distillation")
    heldout_prompts = sample_prompts(heldout_docs, config.eval_prompts, config.distill_prompt_len, seed=config.seed + 2)
    heldout_sequences = distill(model, heldout_prompts, config.distill_new, log, "held-out continuations")
    card["distillation"] = {
        "sequences": len(sequences),
        "tokens": int(sequences.numel()),
        "seconds": round(time.perf_counter() - t0, 1),
    }

    heads, card["heads"] = train_heads(model, sequences, config.distill_prompt_len, config, log)
    heads = as_shipped(heads)
    card["heads"]["parameters"] = sum(p.numel() for p in heads.parameters())
    accuracy = measure_accuracy(model, heads, heldout_sequences, config.distill_prompt_len)
    tree = greedy_tree(accuracy, config.tree_nodes)
    card["heldout_head_accuracy"] = np.round(accuracy, 4).tolist()
    card["default_tree"] = {
        "nodes": len(tree.paths),
        "depth": tree.depth,
        "expected_tokens_per_step": round(expected_acceptance(tree, accuracy), 3),
    }
    log(
        f"heads: held-out top-1 accuracy per head {np.round(accuracy[:, 0], 3).tolist()}; default tree "
        f"{card['default_tree']}"
    )
    with replacing(out) as staging:
        save_checkpoint(staging, model, heads, tokenizer, tree, card)
        card["assets_bytes"] = sum(f.stat().st_size for f in staging.iterdir())
        (staging / "training.json").write_text(json.dumps(card, indent=1))
    return card


DEFAULT_OUT = Path("perf-reports") / "trained"
DEFAULT_WORK = Path("perf-reports") / "train-work"
MEDUSA2_OUT = Path("perf-reports") / "trained-medusa2"
MEDUSA2_WORK = Path("perf-reports") / "medusa2-work"


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.train", description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group()
    options.out(target, f"{DEFAULT_OUT}; {MEDUSA2_OUT} with --medusa2", what="the checkpoint folder", value=DEFAULT_OUT)
    target.add_argument(
        "--install", action="store_true", help=f"replace the bundled model ({BUNDLED}) with the one trained"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the checkpoint already in the output folder (or the bundled one, with --install) without "
        "asking; without it, a terminal is asked and anything else refused",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=DEFAULT_WORK,
        metavar="DIR",
        help=f"intermediate results, for resuming (default %(default)s; {MEDUSA2_WORK} with --medusa2)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="random seed of data order and initial weights (default %(default)s)",
    )
    p.add_argument("--steps", type=positive_int, help="backbone training steps (default 2000; 16 x 256 tokens each)")
    p.add_argument(
        "--quick", action="store_true", help="a tiny model on 30 files in about a minute, to try the pipeline"
    )
    p.add_argument(
        "--medusa2",
        action="store_true",
        help="Medusa-2 instead: LoRA on the backbone trained jointly with the heads of a Medusa-1 checkpoint (--model)"
        ", on the original model's continuations; with --quick, a few sequences for one epoch",
    )
    p.add_argument(
        "--eagle",
        action="store_true",
        help="train an EAGLE drafter (decoder.eagle) for a checkpoint (--model) on its own continuations and write the "
        f"checkpoint with it (default {EAGLE_OUT}; --install: into the bundled model); with --quick, a few sequences",
    )
    options.model(p, needs_weights=True)
    return p


EAGLE_OUT = Path("perf-reports") / "trained-eagle"


def eagle_main(parser: Parser, args) -> int:
    if args.steps or args.medusa2:
        parser.error("--eagle trains the drafter alone: --steps and --medusa2 do not apply")
    config = dataclasses.replace(QUICK_EAGLE if args.quick else EagleConfig(), seed=args.seed)
    out = BUNDLED if args.install else (EAGLE_OUT if args.out == DEFAULT_OUT else args.out)
    checkpoint = load_checkpoint(args.model or "bundled")
    if out.resolve() != checkpoint.folder.resolve():
        check_output(out, args.work, args.force)
    started = time.perf_counter()
    card = build_eagle(checkpoint, out, config, quick_corpus=args.quick)
    heads = card.get("medusa_heads_parameters")
    beside = f" (the Medusa heads: {heads:,})" if heads else ""
    print(
        f"wrote {out} in {time.perf_counter() - started:.0f} s: EAGLE drafter of {card['parameters']:,} parameters"
        f"{beside}, held-out top-1 {card['heldout_top1']}"
    )
    return 0


def check_output(out: Path, work: Path, force: bool) -> None:
    """Before any training: the output and work folders can be written, and a checkpoint
    already at `out` is replaced only when asked to (--force) or confirmed at a terminal."""
    writable_dir(work, "work folder")
    writable_dir(out.parent, "folder of the checkpoint")
    reason = folder_in_the_way(out)
    if reason is None:
        return
    if not out.is_dir():
        raise PerfkitError(f"{reason}: give a folder for the checkpoint")
    if not (out / "config.json").is_file():
        raise PerfkitError(f"{out} is not a checkpoint folder (no config.json); choose a new or empty folder")
    if force:
        return
    if sys.stdin.isatty():
        try:
            answer = input(f"{reason}: replace it with the model trained? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return
        raise PerfkitError(f"{out} left as it was (answer y to replace it, or add --force)")
    raise PerfkitError(f"{reason}; add --force to replace it (nothing was trained)")


def medusa2_main(parser: Parser, args, argv: list[str] | None) -> int:
    if args.install:
        parser.error("--install replaces the bundled Medusa-1 model; write Medusa-2 with --out DIR")
    if args.steps:
        parser.error("--steps sets the backbone's steps; --medusa2 trains for the epochs of its config")
    config = dataclasses.replace(medusa2.QUICK if args.quick else medusa2.Medusa2Config(), seed=args.seed)
    out = MEDUSA2_OUT if args.out == DEFAULT_OUT else args.out
    work = MEDUSA2_WORK if args.work == DEFAULT_WORK else args.work
    command = shlex.join(["python", "-m", "decoder.train", *(sys.argv[1:] if argv is None else argv)])
    check_output(out, work, args.force)
    started = time.perf_counter()
    card = medusa2.build_medusa2(config, args.model or "bundled", out, work, command)
    figures = card["medusa2"]
    default = next(
        r for r in figures["expected_tokens_per_step"] if r["tree_tokens"] == card["default_tree"]["nodes"] + 1
    )
    quality = figures["quality"]
    print(
        f"wrote {out} ({card['assets_bytes'] / 1e6:.1f} MB) in {time.perf_counter() - started:.0f} s: expected tokens "
        f"per step with a {default['tree_tokens']}-token tree {default['medusa1']} (Medusa-1) -> {default['medusa2']} "
        f"(Medusa-2); held-out loss {quality['heldout_loss_original']} -> {quality['heldout_loss_medusa2']}; greedy "
        f"tokens identical to the original's {quality['greedy_agreement']['tokens_identical']:.1%}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # model=None in the namespace survives parsing unless --model is given (argparse fills in
    # only missing defaults): an explicit --model bundled without --medusa2 is refused too.
    args = parser.parse_args(argv, namespace=argparse.Namespace(model=None))
    if args.eagle:
        return eagle_main(parser, args)
    if args.medusa2:
        return medusa2_main(parser, args, argv)
    if args.model is not None:
        parser.error(
            "--model picks the checkpoint --medusa2 or --eagle starts from; without them a model is trained anew"
        )
    config = QUICK if args.quick else TrainConfig()
    config = dataclasses.replace(config, seed=args.seed, **({"steps": args.steps} if args.steps else {}))
    out = BUNDLED if args.install else args.out
    check_output(out, args.work, args.force)
    started = time.perf_counter()
    card = build(config, out, args.work)
    print(f"wrote {out} ({card['assets_bytes'] / 1e6:.1f} MB) in {time.perf_counter() - started:.0f} s")
    if not args.install:
        print(f"use it with --model {out}; --install puts it in place of the bundled model")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
