"""`sapo-bench training`: the GRPO update's speed, before and after this project's speed-ups, against
a plain forward+backward of the same model and batch; and the peak memory of a whole node.

Three updates run in one process on the same sequences, alternated `--repeats` times (medians
reported) so a noisy neighbour hits all alike:
- "fp32, all layers checkpointed": the update as it was before bf16 autocast and partial
  checkpointing (train.precision = fp32, train.checkpoint_share = 1);
- "default": the update as the node's defaults run it on this machine (bf16 autocast where the
  CPU has native bf16, half the layers checkpointed);
- "plain": what any fine-tuning step costs, at the default's precision and checkpointing: the
  model's own forward with labels (full logits, cross-entropy), backward, optimizer step. Ours
  adds the GRPO parts: old log-probs, ratios, clipping, chunked log-probs at completion positions.

- "candidate" (with `--candidate KEY=VALUE`, train.* keys, repeatable): the default update with
  those settings changed, alternated with the others; its tokens per CPU-second and seconds for
  the batch against the default's join the summary line. A cut that keeps the gradient
  (`train.checkpoint_share=0`, a larger `train.micro_batch_size`) is judged here and by the
  node's peak memory (`--set` the same values); one that changes it needs the recipe lab too.
  Its first step's gradient on the batch is set beside the default's, from the same weights: the
  cosine between them and the ratio of their norms (1 and 1 for a cut that keeps the gradient). An
  approximation of the gradient (`train.prompt_grad=false`) shows how far it moves the update
  before a lab run judges what that costs in held-out.

Goals: the default trains >= 2x the tokens per CPU-second of the fp32 update; >= 1.0x plain.
Tokens per CPU-second count the process's CPU time (all threads), so a faster wall clock bought
with more threads does not count.

The batch is shaped like a round: groups of G completions of one question (the node's G), so
they share their prompt. `--long-tail N` makes the first completion of each group N tokens long,
as a lab round's longest often is (the sampling limit), beside answers of a few tokens: a
layout that pads rows to the longest completion pays for it there. Ours packs each prompt once
per row (train.pack_prompts); plain, like rl-swarm's trainer, runs one row per completion.
Tokens/s counts the tokens each actually processed (compute efficiency); "same batch" compares
the seconds each took for the round's sequences, which is what packing changes.

The node's peak memory is measured on a real node process (`--node-rounds` rounds, the default
config, training alone) as the largest resident set of the process and its children (the
llama.cpp sampler runs in a child) sampled every 0.1 s; goal <= 2.5 GB. Its rounds also give the
sampler's log-prob drift from the trainer (goal <= 0.05 nats/token; bf16 moves it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sapo_core.bench.settings import add_set_argument
from sapo_core.control import vocabulary as K

if TYPE_CHECKING:
    import torch


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sequences", type=int, default=16, help="sequences in the batch")
    p.add_argument("--completion-tokens", type=int, default=128)
    p.add_argument(
        "--long-tail",
        type=int,
        default=0,
        metavar="TOKENS",
        help="the first completion of each group runs this many tokens instead (a lab round's longest "
        "often runs to the sampling limit, 128, while most answers are a few tokens); 0 = off",
    )
    p.add_argument("--repeats", type=int, default=3, help="alternated measurements of each")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = physical cores)")
    p.add_argument("--no-node", action="store_true", help="skip the node's peak memory")
    p.add_argument("--node-rounds", type=int, default=3, help="the node's rounds (peak memory, drift)")
    p.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="train.KEY=VALUE",
        help="measure the default update with these train settings changed too (repeatable)",
    )
    add_set_argument(p, "the node's peak-memory")


def _batch(policy, tasks, n: int, completion_tokens: int, group_size: int, long_tail: int = 0):
    """n sequences in groups of `group_size` sharing a question's prompt; random completions of
    `completion_tokens` tokens, the first of each group `long_tail` tokens where that is > 0."""
    import torch

    from sapo_core.trainer import TrainSequence

    g = torch.Generator().manual_seed(0)
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    seqs = []
    groups = max(1, -(-n // group_size))
    for q in tasks.sample_questions(1, groups):
        prompt = policy.encode_prompt(tasks.messages(q))
        for i in range(group_size):
            if len(seqs) == n:
                break
            length = long_tail if long_tail > 0 and i == 0 else completion_tokens
            completion = torch.randint(100, vocab - 1, (length,), generator=g).tolist()
            seqs.append(TrainSequence(prompt, completion, 1.0 if i % 2 else -1.0))
    return seqs


def _plain_step(policy, optimizer, seqs, micro: int, precision) -> int:
    """One optimizer step of ordinary causal-LM fine-tuning over `seqs`; returns tokens processed."""
    import torch

    from sapo_core.microbatch import make_micro_batches

    model = policy.model
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tokens = 0
    for mb in make_micro_batches(seqs, micro, policy.tokenizer.pad_token_id):
        labels = mb.input_ids.masked_fill(mb.attention == 0, -100)
        with precision.context("cpu"):
            out = model(input_ids=mb.input_ids, attention_mask=mb.attention, labels=labels)
        (out.loss.float() * (len(mb.targets) / max(1, sum(len(s.completion_ids) for s in seqs)))).backward()
        tokens += mb.n_tokens
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()
    return tokens


def measure_update(args: argparse.Namespace, candidate=None) -> dict[str, dict[str, float]]:
    """Median speeds of the updates over `args`' batch; `candidate` (a TrainConfig, or None) adds
    one more update."""
    import torch

    from sapo_core import paths
    from sapo_core.config import NodeConfig
    from sapo_core.hooks import NullHooks
    from sapo_core.modelfiles import embedded_gguf_path
    from sapo_core.policy import load_policy
    from sapo_core.tasks import TaskSet
    from sapo_core.trainer import Trainer, configure_checkpointing

    cfg = NodeConfig()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy(cfg.model, embedded_gguf_path(), paths.converted_models_dir(), model_id="embedded")
    tasks = TaskSet(cfg.tasks, seed=0)
    seqs = _batch(policy, tasks, args.sequences, args.completion_tokens, cfg.sampler.group_size, args.long_tail)
    default = dataclasses.replace(cfg.train, steps_per_round=1)
    before = dataclasses.replace(default, precision="fp32", checkpoint_share=1.0)
    # each trainer has its own optimizer; the learning rate only moves the LoRA weights a hair
    trainers = {"before": Trainer(policy, before), "default": Trainer(policy, default)}
    if candidate is not None:
        trainers["candidate"] = Trainer(policy, dataclasses.replace(candidate, steps_per_round=1))
    plain_opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-9)
    hooks = NullHooks()

    def ours(name: str, batch) -> tuple[float, float, float]:
        trainer = trainers[name]
        configure_checkpointing(policy.model, trainer.cfg)  # both share the model: set its layers
        wall, cpu = time.perf_counter(), time.process_time()
        out = trainer.update(batch, hooks)
        return out[K.TRAIN_TOKENS], time.perf_counter() - wall, time.process_time() - cpu

    def plain(batch) -> tuple[float, float, float]:
        configure_checkpointing(policy.model, default)
        wall, cpu = time.perf_counter(), time.process_time()
        n = _plain_step(policy, plain_opt, batch, cfg.train.micro_batch_size, trainers["default"].precision)
        return float(n), time.perf_counter() - wall, time.process_time() - cpu

    runs = {"before": lambda b: ours("before", b), "default": lambda b: ours("default", b), "plain": plain}
    if "candidate" in trainers:
        runs["candidate"] = lambda b: ours("candidate", b)
    for run in runs.values():
        run(seqs[:2])  # warm-up each path once
    seen: dict[str, list[tuple[float, float, float]]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            seen[name].append(run(seqs))
    out: dict[str, dict[str, float]] = {}
    for name, xs in seen.items():
        out[name] = {
            "tokens": xs[0][0],
            "seconds": statistics.median(x[1] for x in xs),
            "tok_per_s": statistics.median(x[0] / x[1] for x in xs),
            "tok_per_cpu_s": statistics.median(x[0] / x[2] for x in xs),
        }
    if "candidate" in trainers:
        cosine, norms = gradient_agreement(trainers["default"], trainers["candidate"], seqs)
        out["candidate"].update(grad_cosine=cosine, grad_norm_ratio=norms)
    out["setup"] = {
        "micro_batch": cfg.train.micro_batch_size,
        "threads": torch.get_num_threads(),
        "precision": trainers["default"].precision.why,
        "checkpoint_share": default.checkpoint_share if default.gradient_checkpointing else 0.0,
    }
    return out


def gradient_agreement(default, candidate, seqs) -> tuple[float, float]:
    """(cosine, ratio of norms) of `candidate`'s first-step gradient over `seqs` against `default`'s,
    both from the same weights; the two trainers share one policy."""
    import torch

    from sapo_core.trainer import configure_checkpointing

    out = []
    for trainer in (default, candidate):
        configure_checkpointing(trainer.policy.model, trainer.cfg)  # the layers as this trainer sets them
        out.append(update_gradient(trainer, seqs))
    (g0, n0), (g1, n1) = out
    cosine = torch.nn.functional.cosine_similarity(g0.double(), g1.double(), dim=0)  # fp32 rounds past 1
    return float(cosine), n1 / n0 if n0 > 0 else float("nan")


def update_gradient(trainer, seqs) -> tuple[torch.Tensor, float]:
    """(the flat gradient of `trainer`'s first optimizer step over `seqs`, its norm before clipping),
    the weights put back as they were, so that the next trainer's gradient starts from the same ones.
    Clipping scales the gradient in place, which leaves its direction (the cosine) as it was."""
    import torch

    from sapo_core.hooks import NullHooks

    params = trainer.policy.trainable_parameters()
    saved = [p.detach().clone() for p in params]
    version = trainer.policy.version
    figures = trainer.update(seqs, NullHooks())
    # a parameter the update left out (train.trained_layers) has no gradient: zero in the flat one
    grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    trainer.policy.version = version
    return grad, figures[K.TRAIN_GRAD_NORM]


def candidate_train(items: list[str]):
    """The default TrainConfig with `items` (train.KEY=VALUE) changed; SystemExit naming a key
    outside train or a value the config refuses."""
    from sapo_core.bench.settings import node_config

    other = [item for item in items if not item.strip().startswith("train.")]
    if other:
        raise SystemExit(f"--candidate {other[0]}: only train.* settings change the update")
    return node_config({}, items).train


def node_peak_memory(rounds: int, sets: list[str] = ()) -> tuple[float, float, list[float]]:
    """(peak GB of the node's process tree, seconds, each round's sampler drift) over `rounds`
    real rounds, training alone, the defaults changed by `sets` (KEY=VALUE)."""
    import psutil

    from sapo_core.store import RunStore

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SAPO_DATA_DIR=str(Path(tmp) / "data"))
        cmd = [
            sys.executable,
            "-m",
            "sapo_core.cli",
            "run",
            "--rounds",
            str(rounds),
            "--alone",
            "--quiet",
            "--run-dir",
            str(Path(tmp) / "run"),
            *(arg for item in sets for arg in ("--set", item)),
        ]
        t = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        root = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            try:
                rss = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
                peak = max(peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.1)
        if proc.returncode != 0:
            raise RuntimeError(f"the node failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        store = RunStore(Path(tmp) / "run" / "rounds.sqlite")
        try:
            drift = store.series(K.SAMPLER_LOGPROB_DRIFT)[1]
        finally:
            store.close()
        return peak / 1e9, time.time() - t, drift


def run(args: argparse.Namespace) -> int:
    import psutil

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {psutil.cpu_count(logical=False)} cores, load average {load:.1f}")
    # a wrong --candidate key fails here, before the model loads
    candidate = candidate_train(args.candidate) if args.candidate else None
    r = measure_update(args, candidate)
    setup = r["setup"]
    tail = f" (the first of each group {args.long_tail})" if args.long_tail > 0 else ""
    print(
        f"batch: {args.sequences} sequences of {args.completion_tokens} completion tokens{tail} in groups sharing a "
        f"prompt; ours processes {int(r['default']['tokens'])} tokens (prompts packed), plain "
        f"{int(r['plain']['tokens'])}; micro-batch {setup['micro_batch']}, {setup['threads']} thread(s), "
        f"median of {args.repeats}; default: {setup['precision']}, {setup['checkpoint_share']:.0%} of the layers "
        f"checkpointed"
    )
    names = {
        "before": "GRPO, fp32, all checkpointed",
        "default": "GRPO, the defaults",
        "plain": "plain fwd+bwd, as default",
    }
    if "candidate" in r:
        names["candidate"] = "GRPO, candidate"
        print(f"candidate: the defaults with {', '.join(args.candidate)}")
    for key, label in names.items():
        x = r[key]
        print(
            f"{label:30s} {x['tok_per_s']:7.1f} tok/s  {x['tok_per_cpu_s']:7.1f} tok/CPU-s  "
            f"{x['seconds']:6.1f} s for the batch"
        )
    speedup = r["default"]["tok_per_cpu_s"] / r["before"]["tok_per_cpu_s"]
    ratio = r["default"]["tok_per_s"] / r["plain"]["tok_per_s"]
    batch = r["plain"]["seconds"] / r["default"]["seconds"]
    summary = (
        f"training: default {r['default']['tok_per_cpu_s']:.0f} tok/CPU-s vs fp32 all-checkpointed "
        f"{r['before']['tok_per_cpu_s']:.0f}, {speedup:.2f}x; vs plain forward+backward {ratio:.2f}x per token, "
        f"same batch {batch:.1f}x faster"
    )
    result = {**r, "speedup": speedup, "ratio": ratio, "batch_speedup": batch}
    if "candidate" in r:
        c = r["candidate"]
        gain = c["tok_per_cpu_s"] / r["default"]["tok_per_cpu_s"]
        summary += (
            f"; candidate {c['tok_per_cpu_s']:.0f} tok/CPU-s, {gain:.2f}x default, same batch "
            f"{r['default']['seconds'] / c['seconds']:.2f}x faster, gradient cosine {c['grad_cosine']:.3f} "
            f"(norm {c['grad_norm_ratio']:.2f}x)"
        )
        result["candidate_gain"] = gain
    if not args.no_node:
        peak, secs, drift = node_peak_memory(args.node_rounds, args.set)
        worst = max(drift) if drift else float("nan")
        print(
            f"node peak memory   {peak:8.2f} GB over {args.node_rounds} round(s), {secs:.0f} s (process + children); "
            f"sampler drift per round " + ", ".join(f"{d:.3f}" for d in drift) + " nats/token"
        )
        summary += f"; node peak memory {peak:.2f} GB, drift max {worst:.3f}"
        result.update(node_peak_gb=peak, drift=drift)
    print(json.dumps(result))
    print(summary)
    return 0
