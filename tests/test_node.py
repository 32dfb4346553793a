"""The round loop end to end: rounds are recorded, training changes the weights, a run resumes.

The fast tests use `tiny-random` (a 2-layer random-weight Llama with the embedded model's
tokenizer, transformers sampler); the slow one runs the real embedded model with llama.cpp.
"""

from __future__ import annotations

import logging
import tomllib

import pytest
import torch

from sapo_core.batch import external_token_ids
from sapo_core.catalog import choose_model, load_catalogue
from sapo_core.config import NodeConfig
from sapo_core.contributions import receipt_totals
from sapo_core.evaluation import eval_within_share
from sapo_core.evaluator import eval_due
from sapo_core.hardware import detect_hardware
from sapo_core.hooks import Interrupted, NullHooks
from sapo_core.node import Node
from sapo_core.probe import Probe
from sapo_core.rollouts import Completion, Group
from sapo_core.store import RunStore
from sapo_core.tasks import TaskSet


def tiny_config(run_dir, **changes) -> NodeConfig:
    base = {
        "run_dir": str(run_dir),
        "model.name": "tiny-random",
        "swarm.enabled": False,
        "round.local_groups": 2,
        "round.external_groups": 0,
        "sampler.group_size": 4,
        "sampler.max_new_tokens": 12,
        "train.learning_rate": 1e-2,
        "eval.enabled": False,
        "swarm.likelihood_floor": 0.0,  # random weights find all text implausible; the floor is tested apart
    }
    base.update(changes)
    return NodeConfig().replace(**base)


class SolvedGroups:
    """A rollout source handing the node real questions with one right and three wrong answers.

    Random weights never solve a task, so this is how the fast tests get groups with reward
    variance; the node still regenerates nothing here, the swarm's own tests cover verification."""

    def __init__(self, tasks_cfg):
        self.tasks = TaskSet(tasks_cfg, seed=99)
        self.published = []
        self.receipts = []
        self.described = []

    def publish(self, round, groups, receipts=()):
        self.published.append((round, len(groups)))
        self.receipts.append(list(receipts))

    def gather(self, round, want, rng, need=None):
        out = []
        for q in self.tasks.sample_questions(round, want):
            texts = [f"Answer: {q.answer}", "Answer: 12345", "no idea", "Answer: -1"]
            comps = [Completion(text=t) for t in texts]
            for c, r in zip(comps, self.tasks.score(q, texts)):
                c.reward = r
            out.append(Group(question=q, completions=comps, source="peer-x", round=round, index=len(out)))
        return out

    def stats(self):
        return {"swarm/peers": 1.0}

    def describe(self, model=None, held_out=None):
        self.described.append((model, held_out))

    def receipts_for_us(self):
        # a peer says it trained on our group 0 of round 1 (as a DhtRolloutSource finds in records)
        return [("peer-y", 1, 0)]

    def close(self):
        pass


def trainable(node: Node) -> dict[str, torch.Tensor]:
    return node.policy.trainable_state_dict()


def test_rounds_are_recorded_and_resume_where_they_stopped(tmp_path, data_dir):
    cfg = tiny_config(tmp_path / "run", **{"round.external_groups": 1})
    source = SolvedGroups(cfg.tasks)
    node = Node(cfg, source=source)
    node.setup()
    before = trainable(node)
    m1 = node.run_round()
    m2 = node.run_round()
    after = trainable(node)
    node.close()
    assert node.next_round == 3
    for key in (
        "reward/mean",
        "time/sample",
        "time/update",
        "groups/local",
        "tokens/sampled",
        "time/round",
        "swarm/peers",
        "loss/policy",
        "train/grad_norm",
    ):
        assert key in m1 and key in m2, key
    assert m1["groups/local"] == 2 and m1["groups/external"] == 1 and m1["groups/trained"] >= 1
    assert source.published == [(1, 2), (2, 2)]
    # each round publishes receipts of the peer groups the round before trained on
    assert source.receipts[0] == [] and source.receipts[1] == [("peer-x", 1, 0)]
    assert m1["train/steps"] == 2
    assert any(not torch.equal(before[k], after[k]) for k in before)
    store = RunStore(tmp_path / "run" / "rounds.sqlite")
    assert [r.round for r in store.rounds()] == [1, 2]
    # the receipts naming us reach the store, each (peer, round, group) once
    assert receipt_totals(store) == {"receipts": 1, "peers": 1, "groups": 1}
    assert m1["swarm/stats_failed"] == 0
    store.close()

    resumed_source = SolvedGroups(cfg.tasks)
    again = Node(cfg, source=resumed_source)
    again.setup()
    assert again.next_round == 3
    resumed = trainable(again)
    assert all(torch.equal(after[k], resumed[k]) for k in after)
    again.run_round()
    again.close()
    # the receipts of round 2's training were checkpointed: the restarted node still names them
    assert resumed_source.receipts == [[("peer-x", 2, 0)]]
    store = RunStore(tmp_path / "run" / "rounds.sqlite")
    assert [r.round for r in store.rounds()] == [1, 2, 3]


def test_the_node_tells_the_swarm_its_model_and_each_held_out_figure(tmp_path, data_dir):
    changes = {"round.external_groups": 1, "eval.enabled": True, "eval.every_rounds": 2, "eval.max_share": 1.0}
    cfg = tiny_config(tmp_path / "run", **changes, **{"eval.questions": 2, "eval.samples": 2, "eval.greedy": False})
    source = SolvedGroups(cfg.tasks)
    node = Node(cfg, source=source)
    node.setup()
    rows = [node.run_round() for _ in range(2)]
    node.close()
    assert source.described[0] == ("tiny-random", None)
    n = len(node.tasks.datasets) * 2 * 2  # questions per dataset x samples
    # the base model before round 1, then after round 2 (eval.every_rounds)
    assert source.described[1:] == [
        (None, (0, rows[0]["eval/solve_rate"], n)),
        (None, (2, rows[1]["eval/solve_rate"], n)),
    ]
    again = SolvedGroups(cfg.tasks)
    node = Node(cfg, source=again)
    node.setup()  # a restart says the last figure again at once
    node.close()
    assert again.described == [("tiny-random", None), (None, (2, rows[1]["eval/solve_rate"], n))]


def test_zero_variance_groups_are_not_trained_on(tmp_path, data_dir):
    """Random weights never solve anything: every local group is flat, so nothing is trained."""
    node = Node(tiny_config(tmp_path / "run", **{"tasks.format_reward": 0.0}))
    node.setup()
    before = trainable(node)
    m = node.run_round()
    node.close()
    assert m["groups/local_with_signal"] == 0 and m["groups/trained"] == 0 and m["train/steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in trainable(node).items())


def test_an_interrupted_round_leaves_nothing_and_reruns(tmp_path, data_dir):
    class StopInUpdate(NullHooks):
        armed = False

        def progress(self, phase, done, total, **info):
            if phase == "update" and self.armed:
                raise Interrupted("stop")

    hooks = StopInUpdate()
    cfg = tiny_config(tmp_path / "run", **{"round.external_groups": 1})
    node = Node(cfg, hooks, source=SolvedGroups(cfg.tasks))
    node.setup()
    node.run_round()
    hooks.armed = True
    with pytest.raises(Interrupted):
        node.run_round()
    interrupted = node.next_round
    assert interrupted == 2
    node.close()
    store = RunStore(tmp_path / "run" / "rounds.sqlite")
    assert store.last_round() == interrupted - 1
    again = Node(cfg)
    again.setup()
    assert again.next_round == interrupted
    again.close()


def test_a_run_of_another_model_is_refused(tmp_path, data_dir):
    cfg = tiny_config(tmp_path / "run")
    node = Node(cfg)
    node.setup()
    node.run_round()
    node.close()
    other = Node(cfg.replace(**{"model.lora_rank": 8}))
    with pytest.raises(Exception, match="another --run-dir"):
        other.setup()
    other.close()


@pytest.mark.slow
def test_two_real_rounds_on_the_embedded_model_then_resume(tmp_path, data_dir, monkeypatch, caplog):
    """The embedded SmolLM2-135M, llama.cpp sampling (transformers where llama.cpp is absent)."""
    cfg = NodeConfig().replace(
        **{
            "run_dir": str(tmp_path / "run"),
            "swarm.enabled": False,
            "round.local_groups": 2,
            "round.external_groups": 0,
            "sampler.group_size": 4,
            "sampler.max_new_tokens": 48,
            "eval.questions": 2,  # the base model's evaluation before round 1: seconds, not minutes
            "eval.level_questions": 0,
        }
    )
    node = Node(cfg)
    node.setup()
    before = trainable(node)
    figures = [node.run_round(), node.run_round()]
    after = trainable(node)
    node.close()
    assert node.policy.model_id == "smollm2-135m-instruct"
    if any(f["train/steps"] for f in figures):
        assert any(not torch.equal(before[k], after[k]) for k in before)
    # the sampler's log-probs agree with the trainer's on the sampled tokens
    for f in figures:
        if "sampler/logprob_drift" in f:
            assert f["sampler/logprob_drift"] < 0.1
    store = RunStore(tmp_path / "run" / "rounds.sqlite")
    assert store.count() == 2
    store.close()
    # the run's record names the model 'auto' chose, for `sapo-node eval` and the export
    assert tomllib.loads((tmp_path / "run" / "config.toml").read_text())["model"]["name"] == "smollm2-135m-instruct"
    # a probe saying this machine is fast: 'auto' would now choose a bigger model (not downloadable
    # here, HF_HUB_OFFLINE), whose checkpoint check would refuse the run; the run keeps its model
    fast = Probe("this", "smollm2-135m-instruct", 134_515_008, node.threads, 5e3, 5e4, 20.0, 100.0, 0.5, 1.0, 0.0)
    monkeypatch.setattr("sapo_core.probe.load_probe", lambda *a, **k: fast)
    choice = choose_model(detect_hardware(), load_catalogue(), cfg, fast)
    assert choice.entry.id != "smollm2-135m-instruct"
    caplog.set_level(logging.INFO, logger="sapo_core")
    caplog.clear()  # the first start may have fallen back from a bigger choice itself (CI's did)
    again = Node(cfg)
    again.setup()
    assert again.next_round == 3
    again.close()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model:")]
    assert any("the model this run began with" in m for m in said), said
    assert not any("instead of" in m for m in said), said


class RaisingSource(SolvedGroups):
    """A rollout source whose gather (and optionally publish) raises, as a swarm layer with a bug
    that a peer's bytes trigger would (docs/swarm.md, 'Hostile peers')."""

    def __init__(self, tasks_cfg, publish_raises: bool = False):
        super().__init__(tasks_cfg)
        self.publish_raises = publish_raises

    def publish(self, round, groups, receipts=()):
        if self.publish_raises:
            raise ValueError("publish broke")
        super().publish(round, groups, receipts)

    def gather(self, round, want, rng, need=None):
        raise TypeError("cannot use a bytes pattern on a string-like object")


def test_a_gather_or_publish_that_raises_costs_the_round_its_sharing_not_the_round(tmp_path, data_dir, caplog):
    caplog.set_level(logging.INFO, logger="sapo_core")
    cfg = tiny_config(tmp_path / "run", **{"round.external_groups": 2})
    node = Node(cfg, source=RaisingSource(cfg.tasks, publish_raises=True))
    node.setup()
    m = node.run_round()
    node._source.publish_raises = False
    m2 = node.run_round()
    node.close()
    assert node.next_round == 3
    assert m["swarm/gather_failed"] == 1 and m["swarm/publish_raised"] == 1 and m["groups/external"] == 0
    assert m2["swarm/gather_failed"] == 1 and m2["swarm/publish_raised"] == 0
    assert m["swarm/peers"] == 1.0  # the source's own figures still recorded
    assert any(
        r.levelno == logging.ERROR and "gather failed" in r.getMessage() and "TypeError" in r.getMessage()
        for r in caplog.records
    )
    from sapo_core.store import STORE_NAME

    store = RunStore(tmp_path / "run" / STORE_NAME)
    assert store.has_round(1) and store.has_round(2)
    store.close()


def test_stopping_still_stops_inside_a_gather(tmp_path, data_dir):
    cfg = tiny_config(tmp_path / "run", **{"round.external_groups": 1})

    class StopInGather(SolvedGroups):
        def gather(self, round, want, rng, need=None):
            raise Interrupted()

    node = Node(cfg, source=StopInGather(cfg.tasks))
    node.setup()
    with pytest.raises(Interrupted):
        node.run_round()
    node.close()


def test_a_peer_completion_gets_our_stop_token_only_if_finished_and_not_cut(tmp_path, data_dir):
    cfg = tiny_config(tmp_path / "run", **{"round.external_groups": 1})
    node = Node(cfg, source=SolvedGroups(cfg.tasks))
    node.setup()
    try:
        eos, max_new = node.policy.tokenizer.eos_token_id, cfg.sampler.max_new_tokens
        short = node.policy.encode_completion("Answer: 4")
        assert external_token_ids(node.policy, Completion("Answer: 4", finished=True), max_new) == short + [eos]
        assert external_token_ids(node.policy, Completion("Answer: 4", finished=False), max_new) == short
        long_text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        ids = external_token_ids(node.policy, Completion(long_text, finished=True), max_new)
        assert len(ids) == max_new and eos not in ids  # cut: never told it stopped
        cut_ids = node.policy.encode_completion(long_text)[:max_new]
        verifiers = Completion("x", token_ids=cut_ids, finished=False)  # the verifier's ids
        assert external_token_ids(node.policy, verifiers, max_new) == cut_ids
    finally:
        node.close()


# --- held-out evaluation, seeds, checkpoint order, drift -------------------------------------------


def test_held_out_figures_come_before_round_one_every_n_rounds_and_at_the_end(tmp_path, data_dir, caplog):
    caplog.set_level(logging.INFO, logger="sapo_core")
    cfg = tiny_config(
        tmp_path / "run",
        **{
            "eval.enabled": True,
            "eval.questions": 2,
            "eval.samples": 2,
            "eval.every_rounds": 3,
            "eval.max_share": 1.0,
            "round.external_groups": 1,
        },
    )
    node = Node(cfg, source=SolvedGroups(cfg.tasks))
    node.setup()
    figures = [node.run_round(), node.run_round(final=True), node.run_round(), node.run_round()]
    node.close()
    with_eval = [i + 1 for i, m in enumerate(figures) if "eval/solve_rate" in m]
    assert with_eval == [1, 2, 3]  # the baseline in round 1, the last round of a run, every 3 rounds
    said = [m for m in caplog.messages if m.startswith("held-out:")]
    assert len(said) == 3 and "(the base model)" in said[0] and "gain" not in said[0]
    assert "gain " in said[1] and "(the base model)" not in said[1]
    for key in (
        "eval/solve_rate",
        "eval/solve_rate_base",
        "eval/gain",
        "eval/gain_ci_low",
        "eval/gain_ci_high",
        "eval/reward_mean",
        "eval/greedy_solve_rate",
        "eval/level_solve_rate",
        "eval/questions",
        "eval/samples",
        "eval/basic_arithmetic/solve_rate",
        "time/eval",
    ):
        assert key in figures[0] and key in figures[1], key
    assert figures[0]["eval/questions"] == 6 and figures[0]["eval/gain"] == 0.0
    store = RunStore(tmp_path / "run" / "rounds.sqlite")
    assert store.series("eval/solve_rate")[0] == [1, 2, 3]
    store.close()


def test_a_due_evaluation_waits_until_it_fits_in_its_share_of_the_node_s_time(tmp_path):
    assert eval_within_share(100.0, 900.0, 0.1) and not eval_within_share(100.0, 899.0, 0.1)
    assert eval_within_share(100.0, 0.0, 1.0)  # share 1: whenever every_rounds says
    cfg = NodeConfig().replace(**{"eval.every_rounds": 10, "eval.max_share": 0.1}).eval
    store = RunStore(tmp_path / "rounds.sqlite")

    def due(r):
        return eval_due(store, cfg, r)

    assert due(10) and not due(15)  # no evaluation yet: the schedule alone
    store.record_round(10, {"time/round": 20.0, "time/eval": 300.0}, 0.0)  # 300 s: wait 2700 s of rounds

    def rounds_until(end):
        for r in range(store.last_round() + 1, end):
            store.record_round(r, {"time/round": 60.0}, 0.0)

    rounds_until(20)
    assert not due(20)  # 9 rounds since, 540 s
    rounds_until(40)
    assert not due(40)  # 29 rounds, 1740 s: skipped to the next multiple of 10
    rounds_until(60)
    assert due(60) and not due(55)  # 49 rounds, 2940 s; 55 is off the schedule
    store.close()


def test_sampling_seeds_mix_in_the_node_identity(tmp_path, data_dir):
    from sapo_core.sampler.transformers import TransformersSampler

    seen = {}

    class Recording(TransformersSampler):
        def sample(self, prompts, seeds, params, hooks):
            seen.setdefault(self.tag, list(seeds))
            return super().sample(prompts, seeds, params, hooks)

    class Named(SolvedGroups):
        def __init__(self, tasks_cfg, node_id):
            super().__init__(tasks_cfg)
            self.node_id = node_id

    for tag in ("peer-a", "peer-b"):
        cfg = tiny_config(tmp_path / tag, **{"round.external_groups": 1, "eval.enabled": False})

        def factory(node, tag=tag):
            s = Recording(node.policy)
            s.tag = tag
            return s

        node = Node(cfg, source=Named(cfg.tasks, tag), sampler_factory=factory)
        node.setup()
        node.run_round()
        node.close()
    assert seen["peer-a"] and not set(seen["peer-a"]) & set(seen["peer-b"])


def test_the_checkpoint_holds_the_round_size_after_auto_scaling(tmp_path, data_dir):
    cfg = tiny_config(
        tmp_path / "run",
        **{
            "round.auto_scale": True,
            "round.target_round_seconds": 0.01,
            "round.local_groups": 2,
            "eval.enabled": False,
        },
    )
    node = Node(cfg)
    node.setup()
    node.run_round()  # far slower than 0.01 s: the round shrinks
    shrunk = dict(node.shape.__dict__)
    node.close()
    assert shrunk["local"] == 1
    again = Node(cfg)
    again.setup()
    assert again.shape.__dict__ == shrunk
    again.close()


@pytest.mark.slow
def test_drift_above_the_limit_falls_back_to_the_f16_export(tmp_path, data_dir):
    from sapo_core.sampler.llamacpp import llamacpp_available
    from sapo_core.sampler.resilient import DRIFT_LIMIT

    if not llamacpp_available()[0]:
        pytest.skip("llama.cpp is not installed")
    cfg = NodeConfig().replace(
        **{
            "run_dir": str(tmp_path / "run"),
            "swarm.enabled": False,
            "round.external_groups": 0,
            "sampler.quantization": "q8_0",
            "eval.enabled": False,
        }
    )
    node = Node(cfg)
    node.setup()
    try:
        q8 = node._sampler.inner
        assert not node._sampler.check_drift(DRIFT_LIMIT / 2)
        assert node._sampler.inner is q8
        assert node._sampler.check_drift(DRIFT_LIMIT * 3)
        assert node._sampler.inner is not q8 and node._sampler.cfg.quantization == "f16"
        assert node._sampler.status()["model_path"].endswith(".f16.gguf")
        assert node.cfg.sampler.quantization == "q8_0"  # the run's config is what it started with
    finally:
        node.close()


def test_dynamic_sampling_refills_the_round_with_groups_that_have_spread(tmp_path, data_dir):
    """round.refill_passes: while fewer than I of our groups have reward spread, as many new questions
    as are missing are drawn, at most refill_passes times; what trains is the groups with spread, the
    round's reward figures stay the first draw's. Which questions have spread is scripted (every
    third index), so the expected draws are computed here from the same question stream."""
    node = Node(tiny_config(tmp_path / "run", **{"round.local_groups": 3, "round.refill_passes": 2}))
    node.setup()

    def spread(q) -> bool:
        return q.id.index % 3 == 0

    node.tasks.score = lambda q, texts: [1.0 if spread(q) and i == 0 else 0.0 for i in range(len(texts))]
    expected_sampled, have = 0, sum(spread(q) for q in node.tasks.sample_questions(1, 3))
    first_have = have
    for part in (1, 2):
        missing = 3 - have
        if missing <= 0:
            break
        more = node.tasks.sample_questions(1, missing, part)
        expected_sampled += len(more)
        have += sum(spread(q) for q in more)
    m = node.run_round()
    node.close()
    assert m["groups/local_with_signal"] == first_have and m["groups/local"] == 3
    assert m["groups/refill_sampled"] == expected_sampled
    assert m["groups/trained"] == have == first_have + m["groups/refill_with_signal"]
    assert expected_sampled > 0  # the script leaves the first draw short: the refill is exercised


def test_a_node_asks_questions_with_spread_again_and_keeps_them_across_a_restart(tmp_path, data_dir):
    """tasks.reask_share = 0.5 at I = 4: round 1's questions all have spread (scripted), so round 2 asks
    two of them again beside two fresh ones, and its figures say so; the pool is in the checkpoint, so a
    restarted node asks the same ones as one that ran on."""
    cfg = tiny_config(tmp_path / "run", **{"round.local_groups": 4, "tasks.reask_share": 0.5})

    def started(cfg) -> Node:
        node = Node(cfg)
        node.setup()
        node.tasks.score = lambda q, texts: [1.0 if i == 0 else 0.0 for i in range(len(texts))]
        return node

    node = started(cfg)
    first = node.tasks.sample_questions(1, 4)
    m1 = node.run_round()
    assert m1["groups/reasked"] == 0 and len(node.tasks.reask) == 4
    node.close()
    resumed = started(cfg)
    assert set(resumed.tasks.reask.ids()) == {q.id for q in first}
    m2 = resumed.run_round()
    resumed.close()
    assert m2["groups/reasked"] == m2["groups/reasked_with_signal"] == 2 and m2["groups/local"] == 4
    assert resumed.tasks.reask.asked < {q.id for q in first}


@pytest.mark.parametrize("alone", [False, True])
def test_mixed_take_adopts_peers_questions_and_guides_where_we_fail(tmp_path, data_dir, alone):
    """swarm.take = mixed on the fake swarm: random weights get every adopted question wrong, so each
    of the J peers' groups comes back as our own all-wrong group plus the peer's right answer; those
    train (the guide's tokens shaped) and their receipts name the peer's groups. With
    train.guide_alone the update is given the two guides and none of our wrong completions."""
    cfg = tiny_config(
        tmp_path / "run", **{"round.external_groups": 2, "swarm.take": "mixed", "train.guide_alone": alone}
    )
    node = Node(cfg, source=SolvedGroups(cfg.tasks))
    node.setup()
    given, real_update = [], node.trainer.update

    def recording_update(seqs, hooks):  # the real update runs; we only read which sequences are guides
        given.append([s.guide for s in seqs])
        return real_update(seqs, hooks)

    node.trainer.update = recording_update
    m = node.run_round()
    assert given[0].count(True) == 2
    assert given[0].count(False) == (0 if alone else 2 * cfg.sampler.group_size)
    assert m["swarm/adopt_offered"] == 2 and m["swarm/adopt_guided"] == 2 and m["swarm/adopt_on_policy"] == 0
    assert m["groups/trained"] == 2 and m["train/guide_tokens"] > 0 and m["groups/external"] == 2
    m2 = node.run_round()
    node.close()
    assert node.source.receipts[-1] == [("peer-x", 1, 0), ("peer-x", 1, 1)]  # named in the next record
    assert m2["groups/trained"] == 2


def test_reference_guides_train_our_all_wrong_groups_and_never_leave_the_node(tmp_path, data_dir):
    """train.reference_guide beside the mixed take: random weights get every question wrong, so both
    of our own groups train with their reference answer as guide (scored by the real tasks), the two
    adopted peers' questions with the peer's; the receipts name only the peer's groups, and what we
    publish is our own completions, never a reference answer."""

    class Keeping(SolvedGroups):
        texts: list[list[str]] = []

        def publish(self, round, groups, receipts=()):
            self.texts.append([c.text for g in groups for c in g.completions])
            super().publish(round, groups, receipts)

    cfg = tiny_config(
        tmp_path / "run",
        **{"round.external_groups": 2, "swarm.take": "mixed", "train.reference_guide": True},
    )
    node = Node(cfg, source=Keeping(cfg.tasks))
    node.setup()
    m = node.run_round()
    m2 = node.run_round()
    references = {node.tasks.reference_text(q) for q in node.tasks.sample_questions(1, 2)}
    node.close()
    assert m["groups/reference_guided"] == 2 and m["swarm/adopt_guided"] == 2
    assert m["groups/trained"] == 4 and m["train/guide_tokens"] > 0 and m2["groups/trained"] == 4
    assert node.source.receipts[-1] == [("peer-x", 1, 0), ("peer-x", 1, 1)]
    assert len(Keeping.texts[0]) == 2 * 4 and not references & set(Keeping.texts[0])


def test_the_gather_is_told_what_our_own_groups_lack(tmp_path, data_dir):
    """swarm.choice = need: each gather gets, per topic (dataset and level), the need our own groups
    so far give: random weights get every question wrong, so every topic we sampled weighs 1; the
    questions adopted from peers count from the next round on."""

    class Recording(SolvedGroups):
        needs: list[dict] = []

        def gather(self, round, want, rng, need=None):
            self.needs.append(dict(need))
            return super().gather(round, want, rng)

    cfg = tiny_config(tmp_path / "run", **{"round.external_groups": 1, "swarm.take": "mixed", "swarm.choice": "need"})
    node = Node(cfg, source=Recording(cfg.tasks))
    node.setup()
    node.run_round()
    node.run_round()
    node.close()
    first, second = Recording.needs
    assert first and set(first.values()) == {1.0}
    assert set(first) <= set(second) and set(second.values()) == {1.0}
