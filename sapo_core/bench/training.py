"""`sapo-bench training`: the GRPO update's tokens/s against a plain forward+backward of the same
model and batch, and the peak memory of a whole node on the embedded model.

Both updates run in one process on the same sequences, micro-batches and checkpointing
setting, alternated `--repeats` times (medians reported) so a noisy neighbour hits both alike.
"Plain" is what any fine-tuning step costs: the model's own forward with labels (full logits,
cross-entropy), backward, optimizer step. Ours adds the GRPO parts: old log-probs, ratios,
clipping, chunked log-probs at completion positions only. The goal is ours >= 0.85 x plain.

The batch is shaped like a round: groups of G completions of one question (the node's
G), so they share their prompt. Ours packs each prompt once per row (train.pack_prompts);
plain, like rl-swarm's trainer, runs one row per completion. Tokens/s counts the tokens each
actually processed (compute efficiency); "same batch" compares the seconds each took for
the round's sequences, which is what packing changes.

The node's peak memory is measured on a real node process (one round, the default config,
training alone) as the largest resident set of the process and its children (the llama.cpp
sampler runs in a child) sampled every 0.1 s; goal <= 2.5 GB.
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


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sequences", type=int, default=16, help="sequences in the batch")
    p.add_argument("--completion-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="alternated measurements of each")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = physical cores)")
    p.add_argument("--no-node", action="store_true", help="skip the node's peak memory")
    p.add_argument("--node-rounds", type=int, default=1)


def _batch(policy, tasks, n: int, completion_tokens: int, group_size: int):
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
            completion = torch.randint(100, vocab - 1, (completion_tokens,), generator=g).tolist()
            seqs.append(TrainSequence(prompt, completion, 1.0 if i % 2 else -1.0))
    return seqs


def _plain_step(policy, optimizer, seqs, micro: int) -> int:
    """One optimizer step of ordinary causal-LM fine-tuning over `seqs`; returns tokens processed."""
    import torch

    from sapo_core.trainer import _make_micro_batches

    model = policy.model
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tokens = 0
    for mb in _make_micro_batches(seqs, micro, policy.tokenizer.pad_token_id):
        labels = mb.input_ids.masked_fill(mb.attention == 0, -100)
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention, labels=labels)
        (out.loss * (len(mb.targets) / max(1, sum(len(s.completion_ids) for s in seqs)))).backward()
        tokens += mb.n_tokens
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()
    return tokens


def measure_update(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from sapo_core import paths
    from sapo_core.config import NodeConfig
    from sapo_core.hooks import NullHooks
    from sapo_core.modelfiles import embedded_gguf_path
    from sapo_core.policy import load_policy
    from sapo_core.tasks import TaskSet
    from sapo_core.trainer import Trainer

    cfg = NodeConfig()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy(cfg.model, embedded_gguf_path(), paths.cache_dir() / "hf", model_id="embedded")
    seqs = _batch(policy, TaskSet(cfg.tasks, seed=0), args.sequences, args.completion_tokens, cfg.sampler.group_size)
    trainer = Trainer(policy, dataclasses.replace(cfg.train, steps_per_round=1))
    plain_opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-9)
    hooks = NullHooks()
    trainer.update(seqs[:2], hooks)  # warm-up both paths once
    _plain_step(policy, plain_opt, seqs[:2], cfg.train.micro_batch_size)
    ours, plain, ours_s, plain_s = [], [], [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = trainer.update(seqs, hooks)
        ours_s.append(time.perf_counter() - t)
        ours.append(out["train/tokens"] / ours_s[-1])
        t = time.perf_counter()
        n = _plain_step(policy, plain_opt, seqs, cfg.train.micro_batch_size)
        plain_s.append(time.perf_counter() - t)
        plain.append(n / plain_s[-1])
    return {
        "ours": statistics.median(ours),
        "plain": statistics.median(plain),
        "ours_seconds": statistics.median(ours_s),
        "plain_seconds": statistics.median(plain_s),
        "plain_tokens": float(n),
        "micro_batch": cfg.train.micro_batch_size,
        "checkpointing": cfg.train.gradient_checkpointing,
        "tokens": out["train/tokens"],
    }


def node_peak_memory(rounds: int) -> tuple[float, float]:
    """(peak GB of the node's process tree, seconds) over `rounds` real rounds, training alone."""
    import psutil

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
        return peak / 1e9, time.time() - t


def run(args: argparse.Namespace) -> int:
    import psutil

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {psutil.cpu_count(logical=False)} cores, load average {load:.1f}")
    r = measure_update(args)
    ratio = r["ours"] / r["plain"]
    print(
        f"batch: {args.sequences} sequences of {args.completion_tokens} completion tokens in groups sharing a "
        f"prompt; ours processes {int(r['tokens'])} tokens (prompts packed), plain {int(r['plain_tokens'])}; "
        f"micro-batch {r['micro_batch']}, gradient checkpointing {'on' if r['checkpointing'] else 'off'}, "
        f"median of {args.repeats}"
    )
    print(f"GRPO update        {r['ours']:8.1f} tok/s  {r['ours_seconds']:6.1f} s for the batch")
    print(f"plain fwd+bwd      {r['plain']:8.1f} tok/s  {r['plain_seconds']:6.1f} s for the batch")
    speedup = r["plain_seconds"] / r["ours_seconds"]
    summary = (
        f"training: ours {r['ours']:.0f} tok/s, plain forward+backward {r['plain']:.0f} tok/s, ratio {ratio:.2f}; "
        f"same batch ours {r['ours_seconds']:.1f} s, plain {r['plain_seconds']:.1f} s, {speedup:.1f}x faster"
    )
    result = {**r, "ratio": ratio, "batch_speedup": speedup}
    if not args.no_node:
        peak, secs = node_peak_memory(args.node_rounds)
        print(f"node peak memory   {peak:8.2f} GB over {args.node_rounds} round(s), {secs:.0f} s (process + children)")
        summary += f"; node peak memory {peak:.2f} GB"
        result["node_peak_gb"] = peak
    print(json.dumps(result))
    print(summary)
    return 0
