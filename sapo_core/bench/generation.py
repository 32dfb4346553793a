"""`sapo-bench generation`: rollout tokens/s of our llama.cpp sampler against transformers.

In one process and one run, on the same model (the embedded SmolLM2-135M GGUF: transformers
de-quantizes it to float32, llama.cpp samples it at `--quantization`), the same questions
(the node's ReasoningGYM prompts through the chat template), G, max tokens and temperature:

1. the rl-swarm way: `model.generate` for one sequence, called G times per question;
2. HF batched: the project's transformers backend (all prompts x G in one `generate`);
3. ours: `LlamaCppSampler` (all sequences of all questions in one llama.cpp batch);
4. the transformers backend on a LoRA policy as a node trains it (its B matrices moved off
   zero), decoding through peft's LoRA layers ("wrapped") and from the merged copy the backend
   keeps on a GPU ("merged"), on `--device` (cuda: where llama.cpp has no GPU backend, the
   node's GPU sampler; `--skip-llamacpp` there).

Tokens are the completion tokens up to (not including) the end-of-sequence token. Also
reported: the process boundary's cost (one request round trip x decode steps, against the
sampling time) and the log-prob drift of our samples against transformers.

The defaults are one round of a node: I questions x G completions, the node's prompt and
limits. The untrained model answers the one-shot prompt in a handful of tokens, so per-call
costs (prompt prefill, one `generate` per completion) weigh more than per-token ones;
`--prompt plain` gets answers ten times longer, the regime of most RL rollouts. Ends with
`generation: ours N tok/s, rl-swarm way M tok/s, HF batched K tok/s, ratio R; LoRA merged X tok/s
vs wrapped Y tok/s (Z x), DEVICE`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sapo_core.config import RoundConfig, SamplerConfig, TaskConfig
from sapo_core.hooks import NullHooks
from sapo_core.modelfiles import embedded_gguf_path
from sapo_core.sampler.base import SamplingParams, sequence_seed
from sapo_core.tasks import PROMPTS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="", help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    # defaults: what one round of a node samples (I questions x G completions, the node's limits)
    parser.add_argument(
        "--questions",
        type=int,
        default=RoundConfig().local_groups,
        help="questions (each gets G completions; default: the node's I)",
    )
    parser.add_argument(
        "--group-size", type=int, default=SamplerConfig().group_size, help="completions per question, G"
    )
    parser.add_argument("--max-new-tokens", type=int, default=SamplerConfig().max_new_tokens)
    parser.add_argument("--temperature", type=float, default=SamplerConfig().temperature)
    parser.add_argument("--threads", type=int, default=0, help="threads for all three (0 = physical cores)")
    parser.add_argument(
        "--quantization",
        default=SamplerConfig().quantization,
        choices=["q8_0", "f16", "as-is"],
        help="weights llama.cpp samples from (sampler.quantization; default: the node's)",
    )
    parser.add_argument("--skip-rl-swarm", action="store_true", help="skip the slowest way (no ratio then)")
    parser.add_argument("--skip-llamacpp", action="store_true", help="skip ours (a machine without llama.cpp)")
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where the transformers rows decode (default cpu)"
    )
    parser.add_argument(
        "--prompt",
        default=TaskConfig().prompt,
        choices=sorted(PROMPTS),
        help="prompt style (tasks.prompt); 'plain' gets longer, reasoning answers",
    )
    parser.add_argument("--seed", type=int, default=0, help="question seed")
    parser.add_argument("--cache-dir", default="", help="model cache (default: the node's)")


def _count(ids: list[int], eos: set[int]) -> int:
    for i, t in enumerate(ids):
        if t in eos:
            return i
    return len(ids)


def _rl_swarm_way(policy, prompts: list[list[int]], g: int, max_new: int, temperature: float) -> tuple[int, float]:
    """rl-swarm's generation: one sequence per `generate` call, G calls per question."""
    import torch

    eos = set(policy.eos_ids)
    tokens, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for qi, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], device=policy.model.device)
            for j in range(g):
                torch.manual_seed(sequence_seed(qi, j))
                out = policy.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_new,
                    eos_token_id=list(eos),
                    pad_token_id=policy.tokenizer.pad_token_id,
                )
                tokens += _count(out[0, len(prompt) :].tolist(), eos)
    return tokens, time.perf_counter() - t0


def _timed_sample(sampler, prompts, seeds, params) -> tuple[list, int, float]:
    t0 = time.perf_counter()
    groups = sampler.sample(prompts, seeds, params, NullHooks())
    return groups, sum(len(s.token_ids) for grp in groups for s in grp), time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    # the same OpenMP waiting for torch as our sampler's child gets (see llamacpp.py): set before
    # torch loads its OpenMP runtime, so the comparison is not one of wait policies
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from sapo_core import paths
    from sapo_core.config import ModelConfig
    from sapo_core.policy import load_policy
    from sapo_core.sampler.llamacpp import physical_cores
    from sapo_core.sampler.transformers import TransformersSampler
    from sapo_core.tasks import TaskSet

    threads = args.threads or physical_cores()
    torch.set_num_threads(threads)
    gguf = Path(args.model) if args.model else embedded_gguf_path()
    cache = Path(args.cache_dir) if args.cache_dir else paths.cache_dir()
    t0 = time.perf_counter()
    policy = load_policy(ModelConfig(name=gguf.stem, lora=False), gguf, cache / "hf")
    policy.model.eval()
    print(f"model {gguf.name}: transformers float32 loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    tasks = TaskSet(TaskConfig(prompt=args.prompt), seed=args.seed)
    questions = tasks.sample_questions(0, args.questions)
    prompts = [policy.encode_prompt(tasks.messages(q)) for q in questions]
    seeds = list(range(len(prompts)))
    params = SamplingParams(n=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    print(
        f"{len(prompts)} questions ({', '.join(q.id.dataset for q in questions)}), prompt lengths "
        f"{[len(p) for p in prompts]} ({args.prompt}), G={params.n}, max {params.max_new_tokens} new tokens, "
        f"temperature {params.temperature}, {threads} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}",
        flush=True,
    )

    rows: dict[str, tuple[int, float]] = {}
    rtt, steps, drift = 0.0, 0, float("nan")
    if not args.skip_llamacpp:
        rtt, steps, drift = _ours(args, policy, prompts, seeds, params, threads, cache, rows)
    policy.model.to(args.device)
    _, n, dt = _timed_sample(TransformersSampler(policy), prompts, seeds, params)
    rows["HF batched generate"] = (n, dt)
    print(f"HF batched: {n} tokens in {dt:.1f}s = {n / dt:.0f} tok/s", flush=True)
    if not args.skip_rl_swarm:
        n, dt = _rl_swarm_way(policy, prompts, params.n, params.max_new_tokens, params.temperature)
        rows["rl-swarm way (generate x G)"] = (n, dt)
        print(f"rl-swarm way: {n} tokens in {dt:.1f}s = {n / dt:.0f} tok/s", flush=True)

    _lora_rows(args, gguf, cache, prompts, seeds, params, rows)
    _report(rows, rtt, steps, drift, args.device)
    return 0


def _ours(args, policy, prompts, seeds, params, threads, cache, rows) -> tuple[float, int, float]:
    """Our llama.cpp sampler's row; (round trip seconds, decode steps, log-prob drift)."""
    from sapo_core.config import SamplerConfig
    from sapo_core.sampler.guard import measure_round_trip
    from sapo_core.sampler.llamacpp import LlamaCppSampler, logprob_drift, trainer_logprobs

    t0 = time.perf_counter()
    sampler = LlamaCppSampler.create(policy, SamplerConfig(quantization=args.quantization, threads=threads), cache)
    print(
        f"llama.cpp sampler ready in {time.perf_counter() - t0:.1f}s: {Path(sampler.info['model_path']).name}",
        flush=True,
    )
    try:
        sampler.sample(prompts[:1], [99], SamplingParams(n=2, max_new_tokens=4), NullHooks())  # warm-up
        steps_before, prefill_before = sampler.stats["steps"], sampler.stats["prefill_seconds"]
        prompt_before, shared_before = sampler.stats["prompt_tokens"], sampler.stats["shared_prompt_tokens"]
        groups, n, dt = _timed_sample(sampler, prompts, seeds, params)
        rows["ours (llama.cpp, batched)"] = (n, dt)
        steps = sampler.stats["steps"] - steps_before
        prefill = sampler.stats["prefill_seconds"] - prefill_before
        rtt = measure_round_trip(sampler.worker)
        shared = sampler.stats["shared_prompt_tokens"] - shared_before
        print(
            f"ours: {n} tokens in {dt:.1f}s = {n / dt:.0f} tok/s (prompts and first tokens {prefill:.1f}s, "
            f"{shared} of {sampler.stats['prompt_tokens'] - prompt_before} prompt tokens taken from an earlier "
            f"prompt's cache; {steps} decode steps {dt - prefill:.1f}s)",
            flush=True,
        )
        ours_lp, hf_lp = [], []
        for prompt, grp in zip(prompts, groups):
            ours_lp += [s.logprobs for s in grp]
            hf_lp += trainer_logprobs(policy, prompt, [s.token_ids for s in grp], params.temperature)
        drift = logprob_drift(ours_lp, hf_lp)
    finally:
        sampler.close()

    return rtt, steps, drift


def _lora_rows(args, gguf: Path, cache: Path, prompts, seeds, params, rows) -> None:
    """The transformers backend on a LoRA policy: through peft's layers, and merged."""
    import torch

    from sapo_core.config import ModelConfig
    from sapo_core.policy import load_policy
    from sapo_core.sampler.transformers import TransformersSampler

    policy = load_policy(ModelConfig(name=gguf.stem), gguf, cache / "hf")
    with torch.no_grad():  # a trained adapter: B off zero, or the LoRA layers would add nothing
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 1e-3, generator=torch.Generator().manual_seed(0))
    policy.model.to(args.device)
    for label, merge in (("LoRA wrapped", False), ("LoRA merged", True)):
        sampler = TransformersSampler(policy, merge=merge)
        sampler.sample(prompts[:1], [99], SamplingParams(n=2, max_new_tokens=4), NullHooks())  # warm-up
        _, n, dt = _timed_sample(sampler, prompts, seeds, params)
        rows[label] = (n, dt)
        print(f"{label} ({args.device}): {n} tokens in {dt:.1f}s = {n / dt:.0f} tok/s", flush=True)
        sampler.close()


def _report(rows: dict[str, tuple[int, float]], rtt: float, steps: int, drift: float, device: str) -> None:
    """The table of (tokens, seconds) per way, the process boundary's share, the drift, and the
    summary line."""
    print()
    print(f"{'method':32s} {'tokens':>7s} {'seconds':>8s} {'tok/s':>7s}")
    for name, (n, dt) in rows.items():
        print(f"{name:32s} {n:7d} {dt:8.1f} {n / dt:7.1f}")
    tps = {k: n / max(dt, 1e-9) for k, (n, dt) in rows.items()}
    ours = tps.get("ours (llama.cpp, batched)")
    if ours:
        ours_dt = rows["ours (llama.cpp, batched)"][1]
        print(
            f"process boundary: {rtt * 1e6:.0f} us per request x {steps} decode steps = "
            f"{100 * rtt * steps / ours_dt:.2f}% of our sampling time"
        )
        print(f"log-prob drift of our samples against transformers: {drift:.4f} nats/token")
    rl = tps.get("rl-swarm way (generate x G)")
    hf = tps["HF batched generate"]
    merged, wrapped = tps["LoRA merged"], tps["LoRA wrapped"]
    ours_text = f"{ours:.0f}" if ours else "skipped"
    rl_text = f"{rl:.0f}" if rl else "skipped"
    ratio = f"{ours / rl:.1f}" if ours and rl else "n/a"
    print(
        f"generation: ours {ours_text} tok/s, rl-swarm way {rl_text} tok/s, HF batched {hf:.0f} tok/s, ratio {ratio}; "
        f"LoRA merged {merged:.0f} tok/s vs wrapped {wrapped:.0f} tok/s ({merged / wrapped:.2f}x), {device}"
    )
