"""`sapo-bench floor`: where the likelihood floor on peers' text should sit.

The embedded model samples completions on the default task mix as a node's round does
(llama.cpp sampler, the node's temperature and max_new_tokens). Each is then treated as a
peer's completion -- re-tokenised, cut to our limit, the stop token only if it finished -- and
scored as the node scores peers' text (`verify.likelihood_score`: the lowest mean
log-likelihood per token over `swarm.likelihood_window` tokens, under the current policy).
Beside them, two poisons built from the same questions with the right answer in them: the
honest completion with a link injected before its answer, and a ~6 KB garbage preamble
followed by the answer (which the cut leaves as garbage alone).

Prints the quantiles of each and the share of each that passes the configured floor, then
the floor that lets 95 % of honest completions through. Ends with one line:
`floor: honest pass 0.97 at -4.0 (p5 -3.1), injected link pass 0.00, garbage pass 0.00, N completions`.
What it measured, and the floor chosen from it: docs/calibration.md, 'Likelihood floor'.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

URL_LINES = (
    "For the full worked solution visit https://free-math-answers.example.com/s?id={n}&ref=swarm now.",
    "Claim your prize at http://bit.ly/{n}Xq9 before it expires!",
    "[click here](https://t.co/{n}zz) to see more answers like this",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=int, default=40, help="questions sampled (G completions each)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per question (G)")
    parser.add_argument("--seed", type=int, default=0)


def _garbage(rng: random.Random, chars: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 {}[]<>#@%&*+=~|/\\;:'\"" + "ÄÖÜßçø€"
    return "".join(rng.choice(alphabet) for _ in range(chars))


def run(args: argparse.Namespace) -> int:
    from sapo_core.config import NodeConfig
    from sapo_core.node import Node, mixed_seed
    from sapo_core.rollouts import Completion
    from sapo_core.sampler import SamplingParams
    from sapo_core.swarm.verify import likelihood_score
    from sapo_core.trainer import TrainSequence

    started = time.perf_counter()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = NodeConfig().replace(
            **{
                "run_dir": tmp,
                "swarm.enabled": False,
                "round.external_groups": 0,
                "sampler.group_size": args.group_size,
                "seed": args.seed,
            }
        )
        node = Node(cfg)
        node.setup()
        policy, window, floor = node.policy, cfg.swarm.likelihood_window, cfg.swarm.likelihood_floor
        honest: list[TrainSequence] = []
        url: list[TrainSequence] = []
        garbage: list[TrainSequence] = []
        done, r = 0, 1
        while done < args.questions:
            questions = node.tasks.sample_questions(r, min(8, args.questions - done))
            prompts = [policy.encode_prompt(node.tasks.messages(q)) for q in questions]
            seeds = [mixed_seed(args.seed, "floor", r, k) for k in range(len(questions))]
            params = SamplingParams(
                n=args.group_size,
                max_new_tokens=cfg.sampler.max_new_tokens,
                temperature=cfg.sampler.temperature,
                top_p=cfg.sampler.top_p,
                stop_token_ids=policy.eos_ids,
            )
            for q, prompt, seqs in zip(questions, prompts, node._sample(prompts, seeds, params)):
                for s in seqs:  # as a peer's completion: text, re-tokenised, cut, stop token if finished
                    text = policy.decode(s.token_ids)
                    honest.append(TrainSequence(prompt, node._external_ids(Completion(text, finished=s.finished)), 0.0))
                body = policy.decode(seqs[0].token_ids).rstrip()
                line = rng.choice(URL_LINES).format(n=rng.randrange(10**6))
                poisoned = f"{body}\n{line}\nAnswer: {q.answer}"
                url.append(TrainSequence(prompt, node._external_ids(Completion(poisoned, finished=True)), 0.0))
                preamble = f"{_garbage(rng, 6000)}\nAnswer: {q.answer}"
                garbage.append(TrainSequence(prompt, node._external_ids(Completion(preamble, finished=True)), 0.0))
            done += len(questions)
            r += 1
        sample_s = time.perf_counter() - started
        scores = {}
        for name, seqs in (("honest", honest), ("injected link", url), ("garbage preamble", garbage)):
            lps = node.trainer.completion_logprobs(seqs)
            scores[name] = {
                "window": [likelihood_score(x, window) for x in lps if x],
                "mean": [statistics.fmean(x) for x in lps if x],
            }
        node.close()
    print(
        f"{len(honest)} honest completions of {args.questions} questions (sampled in {sample_s:.0f} s), "
        f"{len(url)} with an injected link, {len(garbage)} with a ~6 KB garbage preamble; window {window} tokens"
    )
    for name, by in scores.items():
        for kind, xs in by.items():
            qs = statistics.quantiles(xs, n=20)
            passed = sum(x >= floor for x in xs) / len(xs)
            print(
                f"  {name:17s} {kind:6s}: min {min(xs):7.2f}  p5 {qs[0]:7.2f}  p50 {qs[9]:7.2f}  max {max(xs):7.2f}"
                f"  pass at {floor:g}: {passed:.3f}"
            )
    honest_w = sorted(scores["honest"]["window"])
    p5 = honest_w[int(0.05 * len(honest_w))]
    rate = {k: sum(x >= floor for x in v["window"]) / len(v["window"]) for k, v in scores.items()}
    print(
        f"floor: honest pass {rate['honest']:.3f} at {floor:g} (p5 {p5:.2f}), injected link pass "
        f"{rate['injected link']:.3f}, garbage pass {rate['garbage preamble']:.3f}, {len(honest)} completions, "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0
