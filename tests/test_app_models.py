"""The app's plain-Python parts, without a display: models, the setup's config, the hardware
report, the display check, the dashboard's axis steps. Values are computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from app.binning import ScreenBins, bin_for_screen
from app.eventlog import EventLog, readable_error
from app.hardware_scan import HardwareReport
from app.main import display_available
from app.models import (
    NodeStatus,
    RoundHistory,
    Series,
    SwarmModel,
    rejection_words,
    rolling_mean,
)
from app.setup_choices import ALONE, HOST, JOIN, SetupChoices, address_problem, apply_choices, choices_from_config
from sapo_core.catalog import choose_model, load_catalogue
from sapo_core.commands.hardware import report
from sapo_core.config import NodeConfig, RoundConfig
from sapo_core.control import protocol as P
from sapo_core.control.vocabulary import PHASE_BANDS
from sapo_core.hardware import HardwareProfile

PEER = "/ip4/203.0.113.5/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


@pytest.mark.parametrize(
    "y, window, expected",
    [
        ([1, 2, 3, 4, 5], 2, [1, 1.5, 2.5, 3.5, 4.5]),
        ([1, 2, 3, 4, 5], 10, [1, 1.5, 2, 2.5, 3]),  # window longer than the data: mean so far
        ([1, 2, 3], 1, [1, 2, 3]),
        ([0, 0, 6], 3, [0, 0, 2]),
        ([], 5, []),
    ],
)
def test_rolling_mean(y, window, expected):
    assert rolling_mean(np.array(y, dtype=float), window).tolist() == pytest.approx(expected)


def test_series_grows_past_its_capacity_and_keeps_order():
    s = Series(capacity=2)
    for i in range(5):
        s.append(i, 10 * i)
    s.extend([5, 6], [50, 60])
    assert s.x.tolist() == [0, 1, 2, 3, 4, 5, 6] and s.y.tolist() == [0, 10, 20, 30, 40, 50, 60]


def test_running_sums_grow_with_the_series_and_equal_one_cumsum_exactly():
    rng = np.random.default_rng(1)
    s = Series(4)
    ys = rng.normal(size=300)
    for i, y in enumerate(ys):
        s.append(float(i), float(y))
        if i % 37 == 0:
            s.sums()  # summed in pieces: 1, 37, ... points at a time
    assert np.array_equal(s.sums(), np.concatenate([[0.0], np.cumsum(ys)]))  # the same floats, not close ones
    h = RoundHistory()
    h.add_many((r, {"a": float(v)}) for r, v in enumerate(ys, start=1))
    assert np.array_equal(h.rolling("a", 7)[1], rolling_mean(ys, 7))
    assert np.array_equal(h.cumulative("a")[1], np.cumsum(ys))


def test_binning_for_the_screen_by_hand():
    x = np.arange(1.0, 9.0)  # rounds 1..8 on an axis 0..8 of 2 pixels: bins [0, 4) and [4, 8]
    y = np.array([1.0, 5.0, 2.0, 3.0, 0.0, 9.0, 4.0, 4.0])
    px, py = bin_for_screen(x, y, 0.0, 8.0, 2, peak=True)
    # at each bin's middle; round 8, on the right edge, is a bin of its own just past it
    assert px.tolist() == [2.0, 2.0, 6.0, 6.0, 10.0, 10.0]
    assert py.tolist() == [1.0, 5.0, 0.0, 9.0, 4.0, 4.0]  # smallest and largest: the spike at 9 stays
    mx, my = bin_for_screen(x, y, 0.0, 8.0, 2, peak=False)
    assert mx.tolist() == [2.0, 5.5, 8.0] and my.tolist() == pytest.approx([8 / 3, 4.0, 4.0])
    # few points: as they are; a zoomed view: the points inside plus one either side
    assert bin_for_screen(x, y, 0.0, 8.0, 100, peak=True)[0].tolist() == x.tolist()
    assert bin_for_screen(x, y, 3.0, 5.0, 100, peak=False)[0].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]


@pytest.mark.parametrize("peak", [True, False])
def test_screen_bins_after_each_round_equal_binning_everything_again(peak):
    rng = np.random.default_rng(2)
    x, y = np.arange(1.0, 3001.0), rng.normal(size=3000)
    bins = ScreenBins(peak)
    for n in list(range(700, 1400)) + list(range(1400, 3001, 13)):
        got = bins(x[:n], y[:n], 0.0, 3300.0, 150, token=1)
        want = bin_for_screen(x[:n], y[:n], 0.0, 3300.0, 150, peak)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), n
    # another view or token starts again; a shorter history (another run) too
    assert np.array_equal(bins(x, y, 0.0, 3000.0, 99, token=1)[1], bin_for_screen(x, y, 0.0, 3000.0, 99, peak)[1])
    changed = y.copy()
    changed[:10] = 50.0
    assert np.array_equal(
        bins(x, changed, 0.0, 3000.0, 99, token=2)[1], bin_for_screen(x, changed, 0.0, 3000.0, 99, peak)[1]
    )
    assert np.array_equal(
        bins(x[:900], y[:900], 0.0, 3000.0, 99, token=2)[1], bin_for_screen(x[:900], y[:900], 0.0, 3000.0, 99, peak)[1]
    )


def test_history_ignores_old_rounds_and_non_numbers():
    h = RoundHistory()
    assert h.add(1, {"reward/mean": 0.5, "bad": float("nan")})
    assert h.add(2, {"reward/mean": 1.0, "accuracy/basic_arithmetic": 1.0})
    assert not h.add(2, {"reward/mean": 9.0})  # already have round 2
    assert h.add_many([(1, {"reward/mean": 9.0}), (3, {"reward/mean": 0.0})]) == 1
    x, y = h.get("reward/mean")
    assert x.tolist() == [1, 2, 3] and y.tolist() == [0.5, 1.0, 0.0]
    assert "bad" not in h.series and h.rounds == 3 and h.last_round == 3
    assert h.cumulative("reward/mean")[1].tolist() == [0.5, 1.5, 1.5]
    assert h.keys_under("accuracy/") == ["accuracy/basic_arithmetic"]


def test_stacked_bands_add_up_and_missing_phases_count_zero():
    h = RoundHistory()
    h.add(1, {"time/sample": 2.0, "time/update": 3.0, "time/score": 1.0})
    h.add(2, {"time/sample": 4.0, "time/update": 1.0, "time/score": 1.0, "time/share": 2.0})
    x, bands = h.stacked(PHASE_BANDS, window=1)
    assert x.tolist() == [1, 2]
    sampling, training, sharing, other = (b.tolist() for b in bands)
    assert sampling == [2, 4] and training == [5, 5] and sharing == [5, 7] and other == [6, 8]


def test_swarm_model_sums_rounds_and_words_rejections():
    m = SwarmModel()
    m.apply_info(
        P.NodeInfo(
            model_id="m", sampler="s", run_dir="r", next_round=1, peer_id="Qm1", node_name="n", join_address=PEER
        )
    )
    m.add_round(
        1,
        {
            "swarm/published": 2,
            "swarm/received": 6,
            "swarm/accepted": 5,
            "swarm/used": 2,
            "swarm/rejected": 1,
            "swarm/rejected/zero_advantage": 1,
            "swarm/peers": 3,
        },
    )
    m.add_round(
        2,
        {
            "swarm/published": 2,
            "swarm/received": 4,
            "swarm/rejected/index_malformed": 2,
            "swarm/dht_rejected/oversized": 1,
            "swarm/peers": 2,
        },
    )
    m.add_round(3, {"reward/mean": 1.0})  # a round without swarm figures (alone) changes nothing
    assert m.totals["published"] == 4 and m.totals["received"] == 10 and m.totals["accepted"] == 5
    assert m.rejections == {
        rejection_words("zero_advantage"): 1,
        "index entry: malformed record": 2,
        "DHT: record too large": 1,
    }
    assert m.peers_now == 2 and m.rounds == 2 and m.invite == PEER and m.alone is False
    assert m.apply_progress(P.Progress(round=4, phase="gather", done=0, total=1, info={"peer": "calm-heron"}))
    assert not m.apply_progress(P.Progress(round=4, phase="sample", done=0, total=1))
    assert m.peers_seen == {"calm-heron": 4}


def test_node_status_says_what_the_round_does_or_why_it_holds():
    s = NodeStatus()
    assert not s.alive and s.title == "Not started"
    s.apply(P.State(state=P.RUNNING, round=3))
    s.apply(P.Progress(round=3, phase="sample", done=4, total=16))
    assert s.detail == "round 3: sampling 4 of 16 tokens"
    s.apply(P.Progress(round=3, phase="gather", done=1, total=3))
    assert s.detail == "round 3: gathering 1/3"
    started = s.round_started
    assert started is not None and s.round_eta(60.0, now=started + 20) == 40.0
    assert s.round_eta(60.0, now=started + 90) == 0.0 and s.round_eta(0.0) is None
    s.apply(P.RoundDone(round=3, metrics={}))
    assert s.round == 4 and s.detail == "round 4" and s.round_started >= started
    s.apply(P.State(state=P.PAUSED, reason="on battery (40 %)", round=4))
    assert s.holding and s.detail == "on battery (40 %)" and s.title == "Paused"
    assert s.apply(P.Heartbeat(t=0, state=P.PAUSED, round=4, cpu_seconds=1, rss_bytes=5, throttle=0.5))
    assert not s.apply(P.Heartbeat(t=1, state=P.PAUSED, round=4, cpu_seconds=2, rss_bytes=5, throttle=0.5))


def test_event_log_keeps_words_and_drops_noise():
    log = EventLog(limit=3)
    assert log.from_event(P.Heartbeat(t=0, state="running", round=1, cpu_seconds=0, rss_bytes=0)) is None
    assert "Paused: paused by you" in log.from_event(P.State(state=P.PAUSED, reason="paused by you")).text
    line = log.from_event(P.RoundDone(round=7, metrics={"reward/mean": 0.25, "groups/external": 2}))
    assert "round 7 done: reward 0.250" in line.text and "2 group(s) from peers" in line.text
    err = log.from_event(P.Error(message="boom", traceback="Traceback...\nValueError", kind=P.CRASH))
    assert err.level == "error" and "ValueError" in err.text
    log.add("info", "fourth")
    assert len(log.lines) == 3 and "fourth" in log.text(last=1)


def test_errors_read_as_what_to_do():
    head, hint = readable_error(P.Error(message="model.name: unknown", kind=P.CONFIG))
    assert "cannot run with these settings: model.name: unknown" in head and "Start" in hint
    head, hint = readable_error(P.Error(message="ValueError: x", kind=P.CRASH, fatal=True))
    assert "stopped on an error" in head and "restarts by itself" in hint
    assert "refused a command" in readable_error(P.Error(message="x", kind=P.COMMAND, fatal=False))[0]


@pytest.mark.parametrize(
    "text, ok", [(PEER, True), ("", False), ("203.0.113.5:31337", False), ("/ip4/203.0.113.5/tcp/31337", False)]
)
def test_invite_address_check(text, ok):
    assert (address_problem(text) == "") is ok


def test_setup_choices_become_the_config_and_back():
    base = NodeConfig().replace(**{"train.learning_rate": 1e-4})
    joined = apply_choices(
        base,
        SetupChoices(
            model="smollm2-135m-instruct",
            swarm=JOIN,
            address=PEER,
            throttle=0.3,
            threads=1,
            pause_on_battery=False,
            only_when_idle=True,
        ),
    )
    assert joined.model.name == "smollm2-135m-instruct" and joined.swarm.enabled
    assert joined.swarm.initial_peers == [PEER]
    assert joined.control.throttle == 0.3 and joined.sampler.threads == 1 and joined.control.only_when_idle
    assert joined.train.learning_rate == 1e-4  # the rest of the config is kept
    alone = apply_choices(joined, SetupChoices(swarm=ALONE))
    assert not alone.swarm.enabled and alone.round.external_groups == 0
    hosting = apply_choices(alone, SetupChoices(swarm=HOST))  # back in a swarm: J comes back too
    assert hosting.swarm.enabled and hosting.swarm.initial_peers == []
    assert hosting.round.external_groups == RoundConfig().external_groups
    assert choices_from_config(joined).swarm == JOIN and choices_from_config(alone).swarm == ALONE
    assert choices_from_config(hosting).swarm == HOST and choices_from_config(joined).address == PEER


def test_hardware_report_reads_the_json_of_sapo_node_hardware():
    profile = HardwareProfile.manual(cpu_cores=4, ram_gb=16.0, ram_available_gb=12.0)
    choice = choose_model(profile, load_catalogue(), NodeConfig())
    rep = HardwareReport.from_json(report(profile, choice))
    assert rep.recommended == choice.entry.id and rep.recommended_reason == choice.reason
    assert {m.id for m in rep.models} == set(load_catalogue().ids())
    best = rep.option(choice.entry.id)
    assert best.status == "fits" and best.summary(rep.budget_gb).startswith(f"fits: {best.memory_gb:.1f} of ")
    assert dict((w, v) for w, v, _ in rep.machine)["CPU cores"] == "4 physical, 4 logical"


@pytest.mark.parametrize(
    "env, platform, ok",
    [
        ({}, "linux", False),
        ({"DISPLAY": ":0"}, "linux", True),
        ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", True),
        ({"QT_QPA_PLATFORM": "offscreen"}, "linux", True),
        ({"QT_QPA_PLATFORM": "xcb"}, "linux", False),
        ({}, "win32", True),
        ({}, "darwin", True),
    ],
)
def test_display_check(env, platform, ok):
    assert display_available(env, platform) is ok


@pytest.mark.parametrize("last, end", [(0, 10), (5, 10), (95, 110), (10_000, 11_000), (10_080, 12_000)])
def test_round_axis_moves_in_steps(last, end):
    from app.dashboard import axis_end

    assert axis_end(last) == end
