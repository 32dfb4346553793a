"""Questions: exact regeneration from an id (also in a fresh process), rejection of unknown
ids with the right reason, deterministic sampling, prompts, scoring and the curriculum hook."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from sapo_core.config import LEVEL_NAMES, PAPER_SPECIALTIES, PROMPT_STYLES, ConfigError, TaskConfig
from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.tasks import (
    EXAMPLE_SEED,
    KNOWN_CONFIGS,
    LEVELS,
    MAX_INDEX,
    MAX_SEED,
    PROMPTS,
    TaskSet,
    UnknownQuestion,
    config_digest,
    one_shot_example,
    regenerate,
)

ALL_NINE = TaskConfig(weights={d: 1.0 for d in PAPER_SPECIALTIES})


def qid(dataset: str, level: int = 0, seed: int = 11, index: int = 12345) -> QuestionId:
    return QuestionId(dataset, config_digest(dataset, LEVELS[dataset][level]), seed, index)


# --- ids and regeneration ---------------------------------------------------------------


def test_config_digest_ignores_key_order_and_sequence_type():
    a = config_digest("bf", {"x": 1, "ops": ["+", "-"]})
    assert a == config_digest("bf", {"ops": ("+", "-"), "x": 1})
    assert a != config_digest("bf", {"x": 2, "ops": ["+", "-"]})
    assert a != config_digest("arc_1d", {"x": 1, "ops": ["+", "-"]})
    assert len(a) == 16 and int(a, 16) >= 0


def test_every_level_has_its_own_digest_and_builds():
    assert len(KNOWN_CONFIGS) == sum(len(levels) for levels in LEVELS.values())
    for dataset in PAPER_SPECIALTIES:
        for level in range(len(LEVELS[dataset])):
            q = regenerate(qid(dataset, level))
            assert q.text and q.answer, (dataset, level)


@pytest.mark.parametrize("dataset", PAPER_SPECIALTIES)
def test_regeneration_is_exact(dataset):
    a, b = regenerate(qid(dataset, 1)), regenerate(qid(dataset, 1))
    assert (a.text, a.answer, a.entry) == (b.text, b.answer, b.entry)
    other = regenerate(qid(dataset, 1, index=12346))
    assert other.id != a.id


def test_regeneration_is_exact_in_a_fresh_process():
    ids = [qid(d, level, seed=7, index=MAX_INDEX - 1 - level) for d in PAPER_SPECIALTIES for level in (0, 1)]
    script = (
        "import json, sys\n"
        "from sapo_core.rollouts import QuestionId\n"
        "from sapo_core.tasks import regenerate\n"
        "out = []\n"
        "for d, c, s, i in json.load(sys.stdin):\n"
        "    q = regenerate(QuestionId(d, c, s, i))\n"
        "    out.append([q.text, q.answer])\n"
        "print(json.dumps(out))\n"
    )
    payload = json.dumps([[q.dataset, q.config_digest, q.seed, q.index] for q in ids])
    done = subprocess.run(
        [sys.executable, "-c", script], input=payload, capture_output=True, text=True, timeout=120, check=True
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [[regenerate(q).text, regenerate(q).answer] for q in ids]
    assert theirs == ours


@pytest.mark.parametrize(
    "bad, reason",
    [
        (QuestionId("chess", "0" * 16, 1, 1), "unknown_task"),
        (QuestionId(["bf"], "0" * 16, 1, 1), "unknown_task"),  # type: ignore[arg-type]
        (QuestionId("bf", "0123456789abcdef", 1, 1), "unknown_config"),
        (QuestionId("bf", config_digest("bf", {"difficulty": 1, "extra": 1}), 1, 1), "unknown_config"),
        (QuestionId("bf", config_digest("bf", {"difficulty": 3}), 1, 1), "unknown_config"),  # too slow to verify
        (QuestionId("bf", qid("arc_1d").config_digest, 1, 1), "unknown_config"),  # another dataset's level
        (QuestionId("bf", None, 1, 1), "unknown_config"),  # type: ignore[arg-type]
        (dataclasses.replace(qid("bf"), index=-1), "bad_index"),
        (dataclasses.replace(qid("bf"), index=MAX_INDEX), "bad_index"),
        (dataclasses.replace(qid("bf"), index=True), "bad_index"),
        (dataclasses.replace(qid("bf"), index="3"), "bad_index"),
        (dataclasses.replace(qid("bf"), seed=-1), "bad_index"),
        (dataclasses.replace(qid("bf"), seed=MAX_SEED), "bad_index"),
        (dataclasses.replace(qid("bf"), seed=1.0), "bad_index"),
    ],
)
def test_unknown_questions_are_rejected_with_a_reason(bad, reason):
    with pytest.raises(UnknownQuestion) as info:
        TaskSet(TaskConfig(), seed=0).regenerate(bad)
    assert info.value.reason == reason


def test_questions_of_datasets_we_do_not_train_on_still_regenerate():
    tasks = TaskSet(TaskConfig(weights={"basic_arithmetic": 1.0}), seed=0)
    q = tasks.regenerate(qid("binary_matrix", 2, seed=99))
    assert q.id.dataset == "binary_matrix" and "matrix" in q.text


def test_seed_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        TaskSet(TaskConfig(), seed=MAX_SEED)


# --- sampling ---------------------------------------------------------------------------


def test_sampling_is_deterministic_per_seed_and_round():
    a = TaskSet(ALL_NINE, seed=3)
    b = TaskSet(ALL_NINE, seed=3)
    ids = [q.id for q in a.sample_questions(round=5, n=12)]
    assert ids == [q.id for q in b.sample_questions(round=5, n=12)]
    assert ids == [q.id for q in a.sample_questions(round=5, n=12)]  # no hidden state consumed
    assert ids != [q.id for q in a.sample_questions(round=6, n=12)]
    assert ids != [q.id for q in TaskSet(ALL_NINE, seed=4).sample_questions(round=5, n=12)]
    assert all(q.seed == 3 and 0 <= q.index < MAX_INDEX for q in ids)


def test_a_dataset_with_fewer_levels_starts_hard_at_its_hardest():
    tasks = TaskSet(TaskConfig(weights={"bf": 1.0}, difficulty="hard"), seed=0)
    assert len(LEVELS["bf"]) < len(LEVEL_NAMES) and tasks.levels() == {"bf": LEVEL_NAMES[len(LEVELS["bf"]) - 1]}
    assert tasks.sample_questions(0, 1)[0].id.config_digest == qid("bf", len(LEVELS["bf"]) - 1).config_digest


def test_sampling_follows_weights_and_levels():
    cfg = TaskConfig(weights={"bf": 1.0, "arc_1d": 3.0, "calendar_arithmetic": 0.0}, levels={"arc_1d": "hard"})
    tasks = TaskSet(cfg, seed=1)
    assert tasks.datasets == ["arc_1d", "bf"]
    qs = tasks.sample_questions(round=0, n=200)
    counts = {d: sum(q.id.dataset == d for q in qs) for d in ("arc_1d", "bf")}
    assert counts["arc_1d"] + counts["bf"] == 200 and counts["arc_1d"] > counts["bf"] > 0
    assert {q.id.config_digest for q in qs if q.id.dataset == "arc_1d"} == {qid("arc_1d", 2).config_digest}
    assert {q.id.config_digest for q in qs if q.id.dataset == "bf"} == {qid("bf", 0).config_digest}


# --- prompts and scoring ----------------------------------------------------------------


def test_prompt_styles_match_the_config_names():
    assert set(PROMPTS) == set(PROMPT_STYLES)


def test_messages_per_prompt_style():
    q = regenerate(qid("basic_arithmetic"))
    line = TaskSet(TaskConfig(prompt="answer_line"), 0).messages(q)
    assert line == [{"role": "user", "content": line[0]["content"]}]
    assert line[0]["content"].startswith(q.text) and "Answer: <answer>" in line[0]["content"]
    assert TaskSet(TaskConfig(prompt="plain"), 0).messages(q) == [{"role": "user", "content": q.text.rstrip()}]
    assert "<answer>" in TaskSet(TaskConfig(prompt="tags"), 0).messages(q)[-1]["content"]
    shot = TaskSet(TaskConfig(prompt="one_shot", system_prompt="Be brief."), 0).messages(q)
    assert [m["role"] for m in shot] == ["system", "user", "assistant", "user"]
    assert shot[0]["content"] == "Be brief." and shot[3] == line[0]
    example = shot[1]["content"]
    assert example != shot[3]["content"] and shot[2]["content"].startswith("Answer: ")


def test_the_worked_example_shows_its_expression_above_the_answer_line():
    q = regenerate(qid("basic_arithmetic", 0, index=3))
    worked = TaskSet(TaskConfig(prompt="worked"), 0).messages(q)
    shot = TaskSet(TaskConfig(prompt="one_shot"), 0).messages(q)
    # the example of basic_arithmetic's easy level is "Calculate 9 - 8." (EXAMPLE_SEED, index 0)
    assert shot[0]["content"].startswith("Calculate 9 - 8.") and shot[1]["content"] == "Answer: 1"
    assert worked[1]["content"] == "9 - 8 = 1\nAnswer: 1"
    assert worked[0] == shot[0] and worked[2] == shot[2]  # only the example's answer differs
    medium = regenerate(qid("basic_arithmetic", 2))
    example = TaskSet(TaskConfig(prompt="worked"), 0).messages(medium)[1]["content"]
    expression = one_shot_example("basic_arithmetic", qid("basic_arithmetic", 2).config_digest).entry["metadata"]
    assert example == f"{expression['expression']} = -135\nAnswer: -135"


@pytest.mark.parametrize("dataset", [d for d in PAPER_SPECIALTIES if d != "basic_arithmetic"])
def test_the_worked_style_asks_other_datasets_as_one_shot_does(dataset):
    for level in range(len(LEVELS[dataset])):
        q = regenerate(qid(dataset, level))
        assert TaskSet(TaskConfig(prompt="worked"), 0).messages(q) == TaskSet(
            TaskConfig(prompt="one_shot"), 0
        ).messages(q)


@pytest.mark.parametrize("style", ["one_shot", "worked"])
def test_a_reference_guide_is_written_as_the_example_and_earns_full_credit(style):
    """train.reference_guide's text: the question's answer as the prompt's example writes its own
    (worked: basic_arithmetic's expression above the Answer line), right by our own scoring on
    every level of the default datasets."""
    tasks = TaskSet(TaskConfig(prompt=style), seed=0)
    for dataset in TaskConfig().weights:
        for level in range(len(LEVELS[dataset])):
            for index in range(4):
                q = regenerate(qid(dataset, level, index=index))
                text = tasks.reference_text(q)
                worked = style == "worked" and dataset == "basic_arithmetic"
                expected = f"{q.entry['metadata']['expression']} = {q.answer}\n" if worked else ""
                assert text == f"{expected}Answer: {q.answer}"
                assert tasks.score(q, [text]) == [1.0]


@pytest.mark.parametrize("style", ["one_shot", "worked"])
@pytest.mark.parametrize("dataset", PAPER_SPECIALTIES)
def test_one_shot_examples_are_right_and_fixed(dataset, style):
    tasks = TaskSet(TaskConfig(prompt=style), seed=0)
    for level in range(len(LEVELS[dataset])):
        shots = [tasks.messages(regenerate(qid(dataset, level, index=i)))[:2] for i in (1, 2)]
        assert shots[0] == shots[1]  # one example per (dataset, level), whatever the question
        example = regenerate(
            QuestionId(
                dataset,
                qid(dataset, level).config_digest,
                EXAMPLE_SEED,
                one_shot_example(dataset, qid(dataset, level).config_digest).id.index,
            )
        )
        assert tasks.score(example, [shots[0][1]["content"]]) == [1.0]


@pytest.mark.parametrize("dataset, level", [(d, i) for d in PAPER_SPECIALTIES for i in range(len(LEVELS[d]))])
def test_reference_answers_in_the_asked_format_score_full(dataset, level):
    """Prompt format -> extraction -> ReasoningGYM scorer must fit every level's answers."""
    tasks = TaskSet(dataclasses.replace(ALL_NINE, partial_credit=True), seed=0)  # to see the 0.25 of a tautology
    for index in range(3):
        q = regenerate(qid(dataset, level, index=index * 1000))
        answer = q.answer
        if dataset == "propositional_logic":
            # Many conclusions are right and ReasoningGYM's own example may be a fallback that
            # is not; the conjunction of the premises always follows (0.25 if a tautology).
            answer = " ∧ ".join(f"({p})" for p in q.entry["metadata"]["premises"])
        sep = "\n" if "\n" in answer else " "  # a matrix goes below the marker
        right, wrong = f"Let me think.\nAnswer:{sep}{answer}", "I do not know."
        scores = tasks.score(q, [right, wrong])
        assert scores[0] in ((0.25, 1.0) if dataset == "propositional_logic" else (1.0,)), (q.id, answer)
        assert scores[1] < 0.25


def test_format_reward_is_off_by_default_and_adds_its_weight():
    q = regenerate(qid("basic_arithmetic"))
    completions = [f"Answer: {q.answer}", q.answer, "Answer: nonsense"]
    assert TaskSet(TaskConfig(), 0).score(q, completions) == [1.0, 1.0, 0.0]
    assert TaskSet(TaskConfig(format_reward=0.5), 0).score(q, completions) == [1.5, 1.0, 0.5]


def _question(dataset: str, text: str, seed: int = 0) -> Question:
    """The first easy question of `seed` whose text starts with `text`."""
    for index in range(20_000):
        q = regenerate(qid(dataset, 0, seed=seed, index=index))
        if q.text.startswith(text):
            return q
    raise AssertionError(f"no {dataset} question starting {text!r}")


def _issue_11_table():
    """Partial-credit examples (docs/environment.md, 'ReasoningGYM'): (question, completion,
    reward under correctness, with partial credit)."""
    four_minus_one = _question("basic_arithmetic", "Calculate 4 - 1.")
    assert four_minus_one.answer == "3"
    frac = regenerate(qid("fraction_simplification", 0, index=3))
    m = frac.entry["metadata"]
    assert (m["numerator"], m["denominator"]) != (m["simplified_numerator"], m["simplified_denominator"])
    right_frac = f"{m['simplified_numerator']}/{m['simplified_denominator']}"
    day = next(
        q
        for q in (regenerate(qid("calendar_arithmetic", 0, index=i)) for i in range(200))
        if q.answer in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    )
    wrong_day = "Sunday" if day.answer != "Sunday" else "Monday"
    return [
        (four_minus_one, "Answer: 3", 1.0, 1.0),
        (four_minus_one, "Answer: 13", 0.0, 0.5),
        (four_minus_one, "Answer: 3 or 3", 0.0, 1 / 6),
        (four_minus_one, "Answer: " + " ".join(str(i) for i in range(21)), 0.0, 1 / 51),
        (four_minus_one, "Answer: 4", 0.0, 0.0),
        (frac, f"Answer: {right_frac}", 1.0, 1.0),
        (frac, f"Answer: {m['numerator']}/{m['denominator']}", 0.0, 0.1),  # the question's own fraction
        (frac, "Answer: 97/89", 0.0, 0.05),  # any wrong fraction
        (day, f"Answer: {day.answer}", 1.0, 1.0),
        (day, f"Answer: {wrong_day}", 0.0, 0.1),  # any wrong weekday
    ]


@pytest.mark.parametrize("case", range(len(_issue_11_table())))
def test_reward_is_correctness_by_default_partial_credit_on_request(case):
    q, completion, correct, partial = _issue_11_table()[case]
    assert TaskSet(TaskConfig(), 0).score(q, [completion]) == [correct]
    assert TaskSet(TaskConfig(partial_credit=True), 0).score(q, [completion]) == [pytest.approx(partial, abs=1e-3)]
    assert TaskSet(TaskConfig(partial_credit=True), 0).solved(q, [completion]) == [correct == 1.0]


def test_partial_credit_gives_signal_where_correctness_sees_none():
    """Seven wrong fractions and the question's own: a 'signal' only partial credit invents."""
    q = regenerate(qid("fraction_simplification", 0, index=3))
    m = q.entry["metadata"]
    texts = ["Answer: 97/89"] * 7 + [f"Answer: {m['numerator']}/{m['denominator']}"]
    flat = _group(q, texts)
    for c, r in zip(flat.completions, TaskSet(TaskConfig(), 0).score(q, texts)):
        c.reward = r
    assert not flat.has_signal()
    for c, r in zip(flat.completions, TaskSet(TaskConfig(partial_credit=True), 0).score(q, texts)):
        c.reward = r
    assert flat.has_signal()


def test_training_skips_held_out_questions():
    cfg = TaskConfig(weights={"basic_arithmetic": 1.0})
    free = TaskSet(cfg, seed=3)
    drawn = [q.text for r in range(40) for q in free.sample_questions(r, 8)]
    banned = set(drawn[::3])
    held = TaskSet(cfg, seed=3, held_out=lambda dataset, level, text: text in banned)
    kept = [q.text for r in range(40) for q in held.sample_questions(r, 8)]
    assert len(kept) == len(drawn) and not banned & set(kept)
    assert kept == [q.text for r in range(40) for q in held.sample_questions(r, 8)]  # still deterministic


def test_score_survives_peer_garbage():
    tasks = TaskSet(ALL_NINE, seed=0)
    junk = ["", "\x00" * 10, "Answer: " + "[" * 3000, "Answer: __import__('os')", "🙂" * 5000]
    for dataset in PAPER_SPECIALTIES:
        scores = tasks.score(regenerate(qid(dataset)), junk)
        assert len(scores) == len(junk) and all(0.0 <= s < 0.25 for s in scores)


# --- curriculum hook --------------------------------------------------------------------


def _group(q, texts, source="local"):
    return Group(question=q, completions=[Completion(text=t) for t in texts], source=source)


def test_observe_raises_the_level_from_own_groups_only():
    cfg = TaskConfig(weights={"basic_arithmetic": 1.0}, curriculum_window=8)
    tasks = TaskSet(cfg, seed=0)
    q = tasks.sample_questions(round=0, n=1)[0]
    right = [f"Answer: {q.answer}"] * 8
    assert tasks.observe(_group(q, right, source="peer-1")) is None  # a peer's model, not ours
    change = tasks.observe(_group(q, right))
    assert change is not None and (change.old_level, change.new_level) == ("easy", "medium")
    q2 = tasks.sample_questions(round=1, n=1)[0]
    assert q2.id.config_digest == qid("basic_arithmetic", 1).config_digest
    assert tasks.observe(_group(q, right)) is None  # an easy question no longer counts


def test_state_round_trips_through_json():
    cfg = TaskConfig(weights={"bf": 1.0, "arc_1d": 1.0}, curriculum_window=8)
    a = TaskSet(cfg, seed=2)
    q = regenerate(qid("bf"))
    a.observe(_group(q, [f"Answer: {q.answer}"] * 8))
    a.observe(_group(regenerate(qid("arc_1d")), ["no"] * 3))
    b = TaskSet(cfg, seed=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    assert [x.id for x in b.sample_questions(4, 6)] == [x.id for x in a.sample_questions(4, 6)]


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"weights": {"chess": 1.0}}, "tasks.weights.chess"),
        ({"weights": {"bf": -1}}, "tasks.weights.bf"),
        ({"weights": {"bf": 0}}, "tasks.weights"),
        ({"difficulty": "default"}, "tasks.difficulty"),
        ({"levels": {"bf": "extreme"}}, "tasks.levels.bf"),
        ({"curriculum_window": 0}, "tasks.curriculum_window"),
        ({"curriculum_raise": 0.1, "curriculum_lower": 0.2}, "tasks.curriculum_lower"),
        ({"prompt": "cot"}, "tasks.prompt"),
        ({"format_reward": 2.0}, "tasks.format_reward"),
    ],
)
def test_task_config_rejects_nonsense(changes, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        TaskConfig(**changes)


def test_the_swarm_verifier_rescores_with_the_same_reward_setting():
    """verify.py re-scores peers' completions through TaskSet.score: under correctness a group of
    wrong fractions has no signal (dropped), under partial credit the question's own fraction
    'earns' 0.1 and the group passes."""
    from sapo_core.swarm.records import Record, wire_group_of
    from sapo_core.swarm.verify import verify_record

    q = regenerate(qid("fraction_simplification", 0, index=3))
    m = q.entry["metadata"]
    group = _group(q, ["Answer: 97/89"] * 7 + [f"Answer: {m['numerator']}/{m['denominator']}"], source="peer-1")
    record = Record(swarm="s", window=0, peer_id="peer-1", round=1, groups=(wire_group_of(group),))
    strict = verify_record(record, TaskSet(TaskConfig(weights={"fraction_simplification": 1.0}), 0), "peer-1")
    assert not strict.accepted and strict.rejected["zero_advantage"] == 1
    lenient = verify_record(record, TaskSet(TaskConfig(partial_credit=True), 0), "peer-1")
    assert len(lenient.accepted) == 1 and max(lenient.accepted[0].rewards) == pytest.approx(0.1)
