"""`sapo-node try`: one question answered by the base model and by the trained one, side by side,
each with its reward when the question comes from the tasks (a typed question has no reference
answer, so no reward).

The app's Try it tab runs this as a child process (`--json`) because the app never imports torch.
Both answers are greedy, so the difference is the training's, not the dice's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from sapo_core import paths


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", help="the run whose model answers (default: the data directory's default run)")
    p.add_argument("--round", type=int, help="use this round's checkpoint (default: the newest kept)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--question", help="the question to ask (default: draw one from the run's tasks)")
    g.add_argument("--seed", type=int, help="seed of the drawn question (default: random)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="longest answer (default: the run's)")
    p.add_argument("--json", action="store_true", help="print one JSON object (for the app)")


def _generate(policy: Any, messages: list[dict[str, str]], max_new: int, use_adapter: bool) -> str:
    import torch

    ids = torch.tensor([policy.encode_prompt(messages)])
    model = policy.model
    ctx = model.disable_adapter() if (policy.lora and not use_adapter) else _null()
    with torch.no_grad(), ctx:
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=list(policy.eos_ids),
            pad_token_id=policy.tokenizer.pad_token_id,
            use_cache=True,
        )
    return policy.decode(out[0, ids.shape[1] :].tolist()).strip()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def answer(run_dir: Path, at_round: int | None, question: str | None, seed: int | None, max_new: int) -> dict[str, Any]:
    """{question, dataset, reference, round, base: {text, reward}, trained: {text, reward}, seconds}."""
    from sapo_core.downloads import terminal_download
    from sapo_core.export import load_trained
    from sapo_core.tasks import TaskSet

    t0 = time.perf_counter()
    trained = load_trained(run_dir, at_round, terminal_download("sapo-node try"))
    policy, cfg = trained.policy, trained.cfg
    policy.model.config.use_cache = True
    tasks = TaskSet(cfg.tasks, seed=cfg.seed)
    max_new = max_new or cfg.sampler.max_new_tokens
    if question:
        q, messages = (
            None,
            ([{"role": "system", "content": cfg.tasks.system_prompt}] if cfg.tasks.system_prompt else [])
            + [{"role": "user", "content": question}],
        )
    else:
        seed = random.randrange(1 << 30) if seed is None else seed
        q = tasks.sample_questions(seed, 1)[0]
        messages = tasks.messages(q)
    out: dict[str, Any] = {
        "question": question or q.text,
        "dataset": q.id.dataset if q else None,
        "reference": q.answer if q else None,
        "round": trained.round,
    }
    for name, adapter in (("base", False), ("trained", True)):
        text = _generate(policy, messages, max_new, adapter)
        out[name] = {"text": text, "reward": tasks.score(q, [text])[0] if q else None}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(args: argparse.Namespace) -> int:
    from sapo_core.config import ConfigError
    from sapo_core.export import ExportFailed

    run_dir = Path(args.run_dir).expanduser() if args.run_dir else paths.default_run_dir()
    try:
        out = answer(run_dir, args.round, args.question, args.seed, args.max_new_tokens)
    except (ExportFailed, ConfigError) as e:
        if args.json:
            print(json.dumps({"error": str(e)}), flush=True)
        print(f"sapo-node try: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out), flush=True)
        return 0
    where = f" ({out['dataset']})" if out["dataset"] else ""
    print(f"Question{where}: {out['question']}")
    if out["reference"] is not None:
        print(f"Reference answer: {out['reference']}")
    for name in ("base", "trained"):
        r = out[name]["reward"]
        label = "base model" if name == "base" else f"trained (round {out['round']})"
        print(f"\n--- {label}{'' if r is None else f', reward {r:.2f}'} ---\n{out[name]['text']}")
    return 0
