"""`sapo-bench tasks`: the untrained model's reward per task, prompt style and extraction.

Whether GRPO can learn at all depends on the base model solving *some* questions, in
*some* groups and not all (a group with equal rewards teaches nothing). This samples G
completions for a few questions of each dataset at one level with llama.cpp's high-level
`Llama` (one sequence at a time), scores the same completions with each answer-extraction
variant, and prints per (dataset, prompt, extraction): mean reward, share fully right,
share of groups with any reward variance, share of groups with a full solve and a miss
("mixed": the groups that teach the most), share of completions stating an explicit answer
(the asked format), mean completion length. The last line names
the prompt and extraction with the most mixed groups. `--save` keeps the completions so
`--load` can re-score them (new extraction rules) without sampling again.

Sampling follows the node's defaults (temperature 1, no top-k/top-p/min-p cut), with one
seed per completion derived from (question, sample).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

from sapo_core.config import LEVEL_NAMES, PAPER_SPECIALTIES, TaskConfig
from sapo_core.modelfiles import embedded_gguf_path
from sapo_core.rewards import answer_shape, clean_answer, explicit_answer, extract_answer
from sapo_core.rollouts import Question, QuestionId
from sapo_core.sampler.base import sequence_seed
from sapo_core.tasks import PROMPTS, TaskSet, build_messages, regenerate, score_one


def _last_line(text: str, question: Question) -> str | None:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return (clean_answer(lines[-1]) or None) if lines else None


# name -> (completion text, question) -> answer
EXTRACTIONS: dict[str, Callable[[str, Question], str | None]] = {
    "strict": lambda text, q: explicit_answer(text),  # an explicit Answer:/boxed/tag only
    "last_line": _last_line,
    "lenient": lambda text, q: extract_answer(text),  # explicit, else last line / '= x'
    "typed": lambda text, q: extract_answer(text, answer_shape(q.id.dataset, q.entry)),  # what `score` does
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="", help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--datasets",
        default="basic_arithmetic,fraction_simplification,calendar_arithmetic",
        help="comma-separated datasets, or 'all' for the paper's nine",
    )
    parser.add_argument(
        "--prompts", default="answer_line,one_shot,worked", help="comma-separated prompt styles: " + ", ".join(PROMPTS)
    )
    parser.add_argument("--system-prompt", default="", help="system prompt (empty: the chat template's default)")
    parser.add_argument("--level", default="easy", choices=LEVEL_NAMES)
    parser.add_argument("--questions", type=int, default=4, help="questions per dataset (each gets G completions)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per question, G")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1 is kind to a busy machine)")
    parser.add_argument("--seed", type=int, default=1234, help="question seed")
    parser.add_argument("--save", default="", help="write the completions to this JSON file")
    parser.add_argument("--load", default="", help="re-score completions from a --save file instead of sampling")


def _sample(args: argparse.Namespace) -> list[dict]:
    from llama_cpp import Llama

    llm = Llama(
        model_path=args.model or str(embedded_gguf_path()),
        n_ctx=4096,
        n_threads=args.threads,
        n_batch=512,
        verbose=False,
    )
    print(
        f"model {os.path.basename(llm.model_path)}, level {args.level}, {args.questions} questions x "
        f"G={args.group_size}, max {args.max_tokens} tokens, temperature 1",
        flush=True,
    )
    datasets = list(PAPER_SPECIALTIES) if args.datasets == "all" else args.datasets.split(",")
    records = []
    for dataset in datasets:
        cfg = TaskConfig(weights={dataset: 1.0}, difficulty=args.level, curriculum=False)
        questions = TaskSet(cfg, seed=args.seed).sample_questions(round=0, n=args.questions)
        for prompt in args.prompts.split(","):
            for qi, q in enumerate(questions):
                msgs = build_messages(q, prompt, args.system_prompt)
                texts, tokens = [], []
                for s in range(args.group_size):
                    out = llm.create_chat_completion(
                        messages=msgs,
                        max_tokens=args.max_tokens,
                        temperature=1.0,
                        top_p=1.0,
                        top_k=0,
                        min_p=0.0,
                        repeat_penalty=1.0,
                        seed=sequence_seed(qi, s),
                    )
                    texts.append(out["choices"][0]["message"]["content"] or "")
                    tokens.append(out["usage"]["completion_tokens"])
                records.append(
                    {
                        "id": [q.id.dataset, q.id.config_digest, q.id.seed, q.id.index],
                        "prompt": prompt,
                        "texts": texts,
                        "tokens": tokens,
                    }
                )
            print(f"  sampled {dataset} / {prompt}", flush=True)
    return records


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.load:
        with open(args.load, encoding="utf-8") as f:
            records = json.load(f)
    else:
        records = _sample(args)
        if args.save:
            with open(args.save, "w", encoding="utf-8") as f:
                json.dump(records, f, ensure_ascii=False, indent=0)
    elapsed = time.perf_counter() - started

    cells: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        cells.setdefault((rec["id"][0], rec["prompt"]), []).append(rec)
    print(
        f"\n{'dataset':<24} {'prompt':<12} {'extract':<10} {'reward':>7} {'solved':>7} {'groups±':>8} "
        f"{'mixed':>6} {'stated':>7} {'tokens':>7}"
    )
    mixed_by_choice: dict[tuple[str, str], list[float]] = {}
    for (dataset, prompt), recs in cells.items():
        questions = [regenerate(QuestionId(*r["id"])) for r in recs]
        tokens = statistics.fmean(t for r in recs for t in r["tokens"])
        stated = statistics.fmean(explicit_answer(t) is not None for r in recs for t in r["texts"])
        for name, extract in EXTRACTIONS.items():
            scores = [[score_one(q, extract(t, q)) for t in r["texts"]] for q, r in zip(questions, recs)]
            flat = [x for g in scores for x in g]
            varied = sum(max(g) - min(g) > 1e-9 for g in scores) / len(scores)
            mixed = sum(any(x >= 1 for x in g) and any(x < 1 for x in g) for g in scores) / len(scores)
            mixed_by_choice.setdefault((prompt, name), []).append(mixed)
            print(
                f"{dataset:<24} {prompt:<12} {name:<10} {statistics.fmean(flat):>7.3f} "
                f"{sum(x >= 1 for x in flat) / len(flat):>7.3f} {varied:>8.2f} {mixed:>6.2f} "
                f"{stated:>7.2f} {tokens:>7.1f}"
            )
    (prompt, name), mixed = max(mixed_by_choice.items(), key=lambda kv: statistics.fmean(kv[1]))
    n_tokens = sum(sum(r["tokens"]) for r in records)
    print(
        f"best: prompt {prompt} + extraction {name}: {statistics.fmean(mixed):.2f} of groups mixed "
        f"(mean over {len(mixed)} datasets); sampled {n_tokens} tokens"
        + ("" if args.load else f" in {elapsed:.0f} s ({n_tokens / max(elapsed, 1e-9):.0f} tok/s)")
    )
    return 0
