"""`sapo-bench floor`: where the likelihood floor on peers' text should sit.

The embedded model (or `--set model.name=...`) samples completions on the default task mix as a
node's round does (`Node._sample_and_score`: the node's sampler, temperature and
max_new_tokens). Each is then treated as a peer's completion, its text alone -- re-tokenised,
cut to our limit, the stop token only if it finished (`batch.external_token_ids`) -- and scored
as the node scores peers' text (`swarmsteps.PeerJudges.policy_logprobs`, then `verify.likelihood_score`: the
lowest mean log-likelihood per token over `swarm.likelihood_window` tokens, under the current
policy).
Beside them, two poisons built from the same questions with the right answer in them: the
honest completion with a link injected before its answer, and a ~6 KB garbage preamble
followed by the answer (which the cut leaves as garbage alone).

Peers' policies move apart as they train (issue 36): `--peer-run DIR` samples with a trained
node's policy (its run directory's last checkpoint, copied: a veteran's text), `--judge-run DIR`
scores with one (a veteran judging a newcomer's text); a fresh node does what neither names.
Every completion is scored by each `swarm.likelihood_judge`: the judge's policy, the base model
(its adapter off) and either (kept when either finds it likely).

Prints the quantiles of each and the share of each that passes the configured floor, then
the floor that lets 95 % of honest completions through. Ends with one line, the policy judge's
figures first, then the base model's and either's:
`floor: honest pass 0.97 at -4.0 (p5 -3.1), injected link pass 0.00, garbage pass 0.00; base judge
0.97/0.00/0.00; either 0.97/0.00/0.00; N completions, S s`.
What it measured, and the floor chosen from it: docs/calibration.md, 'Likelihood floor'.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sapo_core.bench.settings import add_set_argument, node_config

URL_LINES = (
    "For the full worked solution visit https://free-math-answers.example.com/s?id={n}&ref=swarm now.",
    "Claim your prize at http://bit.ly/{n}Xq9 before it expires!",
    "[click here](https://t.co/{n}zz) to see more answers like this",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=int, default=40, help="questions sampled (G completions each)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per question (G)")
    parser.add_argument("--threads", type=int, default=0, help="sampler and torch threads (0 = the node's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer-run", metavar="DIR", help="sample with this trained node's policy (its run directory)")
    parser.add_argument("--judge-run", metavar="DIR", help="score with this trained node's policy (its run directory)")
    add_set_argument(parser)


def floor_config(run_dir: str, args: argparse.Namespace):
    """The node's defaults, alone, at --group-size, --threads and --seed, with --set's changes."""
    changes = {
        "run_dir": run_dir,
        "swarm.enabled": False,
        "round.external_groups": 0,
        "round.auto_scale": False,
        "eval.enabled": False,
        "sampler.group_size": args.group_size,
        "sampler.threads": args.threads,
        "seed": args.seed,
    }
    return node_config(changes, args.set)


def _garbage(rng: random.Random, chars: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 {}[]<>#@%&*+=~|/\\;:'\"" + "ÄÖÜßçø€"
    return "".join(rng.choice(alphabet) for _ in range(chars))


def sample_as_peers(node, questions: int, rng: random.Random) -> dict[str, list]:
    """(group, completion) pairs as a peer would send them (text and whether it finished, no token
    ids): the node's own completions ("honest"), and per question one with a link injected before
    the right answer and one of a ~6 KB garbage preamble and the right answer."""
    from sapo_core.figures import PhaseTimer
    from sapo_core.rollouts import Completion

    pairs: dict[str, list] = {"honest": [], "injected link": [], "garbage preamble": []}
    done, r = 0, 1
    while done < questions:
        asked = node.tasks.sample_questions(r, min(8, questions - done))
        groups, _, _ = node._sample_and_score(r, asked, PhaseTimer())
        for g in groups:
            pairs["honest"] += [(g, Completion(c.text, finished=c.finished)) for c in g.completions]
            answer = g.question.answer
            line = rng.choice(URL_LINES).format(n=rng.randrange(10**6))
            poisoned = f"{g.completions[0].text.rstrip()}\n{line}\nAnswer: {answer}"
            pairs["injected link"].append((g, Completion(poisoned, finished=True)))
            preamble = f"{_garbage(rng, 6000)}\nAnswer: {answer}"
            pairs["garbage preamble"].append((g, Completion(preamble, finished=True)))
        done += len(asked)
        r += 1
    return pairs


def _trained_node(run_dir: str | None, tmp: str, name: str, args: argparse.Namespace):
    """A node in a fresh directory under `tmp`, resuming from a copy of `run_dir` (a trained node's
    last checkpoint, its curriculum) when given; the original is never written."""
    from sapo_core.node import Node

    here = Path(tmp) / name
    if run_dir:
        shutil.copytree(Path(run_dir).expanduser(), here, ignore=shutil.ignore_patterns("*.lock", "exports"))
    node = Node(floor_config(str(here), args))
    node.setup()
    return node


def run(args: argparse.Namespace) -> int:
    from sapo_core.swarm.likelihood import best_score
    from sapo_core.swarm.verify import likelihood_score

    for run_dir in (args.peer_run, args.judge_run):
        if run_dir and not (Path(run_dir).expanduser() / "checkpoints").is_dir():
            raise SystemExit(f"sapo-bench floor: no checkpoints in {run_dir} (a node's run directory)")
    started = time.perf_counter()
    rng = random.Random(args.seed)
    nodes = []
    with tempfile.TemporaryDirectory(prefix="sapo-bench-floor-") as tmp:
        try:
            nodes.append(_trained_node(args.peer_run, tmp, "peer", args))
            judge = nodes[0]  # one fresh node samples and judges, unless a trained one does either
            if args.peer_run or args.judge_run:
                nodes.append(judge := _trained_node(args.judge_run, tmp, "judge", args))
            window, floor = judge.cfg.swarm.likelihood_window, judge.cfg.swarm.likelihood_floor
            pairs = sample_as_peers(nodes[0], args.questions, rng)
            sample_s = time.perf_counter() - started
            scores, base_windows = {}, {}
            for name, these in pairs.items():
                lps = judge._judges.policy_logprobs(these)
                scores[name] = {
                    "window": [likelihood_score(x, window) for x in lps if x],
                    "mean": [statistics.fmean(x) for x in lps if x],
                }
                base = judge._judges.base_logprobs(these) if judge.policy.lora else lps
                base_windows[name] = [likelihood_score(x, window) for x in base if x]
            rounds = {"peer": nodes[0].next_round - 1, "judge": judge.next_round - 1}
        finally:
            for node in nodes:
                node.close()
    honest, url, garbage = (len(pairs[k]) for k in ("honest", "injected link", "garbage preamble"))
    print(
        f"{honest} honest completions of {args.questions} questions (sampled in {sample_s:.0f} s), "
        f"{url} with an injected link, {garbage} with a ~6 KB garbage preamble; window {window} tokens; "
        f"sampled by a policy of {rounds['peer']} rounds, judged by one of {rounds['judge']}"
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
    rate = {k: _passed(v["window"], floor) for k, v in scores.items()}
    base_rate = {k: _passed(v, floor) for k, v in base_windows.items()}
    either = {  # kept when either judge finds it likely: the node's own rule (`filter_unlikely`)
        k: _passed([best_score(ab) for ab in zip(v["window"], base_windows[k], strict=True)], floor)
        for k, v in scores.items()
    }
    print(
        f"floor: honest pass {rate['honest']:.3f} at {floor:g} (p5 {p5:.2f}), injected link pass "
        f"{rate['injected link']:.3f}, garbage pass {rate['garbage preamble']:.3f}; base judge {_three(base_rate)}; "
        f"either {_three(either)}; {honest} completions, {time.perf_counter() - started:.0f} s"
    )
    return 0


def _passed(windows: list[float], floor: float) -> float:
    return sum(x >= floor for x in windows) / len(windows)


def _three(rate: dict[str, float]) -> str:
    """honest/injected link/garbage pass rates."""
    return "/".join(f"{rate[k]:.3f}" for k in ("honest", "injected link", "garbage preamble"))
