"""Declared strategy options: each strategy lists what a job may set, the declaration checks
every way in (make_strategy, POST /tune, the CLI, the replay) and writes the docstrings."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from api.cli import main as cli
from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from search import replay
from search.options import Option, OptionError, with_defaults
from search.registry import STRATEGIES, check_options, make_strategy, parse_spec
from store.db import session_scope
from store.models import Job

SPACE = ScheduleSpace(RESNET50_3X3["stage5"], Precision.INT8, TARGETS["h100"])
STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}


def test_every_strategy_declares_its_options_and_its_docstring_lists_them() -> None:
    for name, cls in STRATEGIES.items():
        assert cls.__doc__ is not None and "Options:" in cls.__doc__, name
        for o in cls.OPTIONS:
            assert o.help and f"{o.name} (" in cls.__doc__, (name, o.name)
        # The instance holds every declared option, at its default.
        strat = make_strategy(name, SPACE)
        assert strat.options == {o.name: o.default for o in cls.OPTIONS}
    assert [o.name for o in STRATEGIES["random"].OPTIONS] == []
    assert "none" in STRATEGIES["grid"].__doc__.split("Options:")[1]


def test_unknown_options_are_refused_listing_the_known_ones() -> None:
    # Options only experiments used are gone; sa's options are not diversity's.
    for name, option in (("diversity", "final_ratio"), ("diversity", "offer_all"),
                         ("diversity", "pool"), ("diversity", "mutants"),
                         ("diversity", "plan_size"), ("sa", "first_n"), ("random", "iters")):
        with pytest.raises(OptionError, match="known: ") as err:
            make_strategy(name, SPACE, **{option: 1})
        assert err.value.option == option
        assert f"strategy {name!r}" in err.value.reason
    with pytest.raises(OptionError, match="known: none"):
        make_strategy("grid", SPACE, walkers=8)


@pytest.mark.parametrize("name,options,reason", [
    ("diversity", {"bags": 2.5}, "integer"),
    ("diversity", {"bags": True}, "integer"),
    ("diversity", {"bags": 0}, ">= 1"),
    ("diversity", {"walkers": 10**6}, "<= 4096"),
    ("diversity", {"refit": "fast"}, "number"),
    ("diversity", {"refit": float("nan")}, "finite"),
    ("diversity", {"pick": "best"}, "bags or top"),
    ("sa", {"loss": 1}, "string"),
    ("sa", {"eps_greedy": -0.1}, ">= 0"),
])
def test_bad_values_are_refused_naming_the_option(name: str, options: dict[str, Any],
                                                  reason: str) -> None:
    with pytest.raises(OptionError, match=reason) as err:
        make_strategy(name, SPACE, **options)
    assert err.value.option == next(iter(options))


def test_values_take_their_declared_types() -> None:
    assert check_options("diversity", {"refit": 1, "first_n": 16}) == {"refit": 1.0,
                                                                        "first_n": 16}
    assert isinstance(check_options("diversity", {"refit": 1})["refit"], float)
    assert parse_spec("diversity:refit=1:first=coverage:first_n=0") == (
        "diversity", {"refit": 1.0, "first": "coverage", "first_n": 0})
    assert parse_spec("sa") == ("sa", {})
    with pytest.raises(OptionError, match="integer"):
        parse_spec("diversity:first_n=2.5")
    with pytest.raises(OptionError, match="key=value"):
        parse_spec("diversity:first_n")
    with pytest.raises(ValueError, match="unknown strategy"):
        parse_spec("annealing:iters=5")
    # A subclass re-defaults its parent's declarations; a typo there is an error.
    assert with_defaults((Option("a", int, 1, "x"),), a=2)[0].default == 2
    with pytest.raises(TypeError):
        with_defaults((Option("a", int, 1, "x"),), b=2)
    with pytest.raises(OptionError):
        Option("bad", int, -1, "a default below its own minimum", minimum=0)


def test_replay_refuses_an_unknown_option_before_it_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.parse_strategy("diversity+transfer:first_n=0") == (
        "diversity", {"first_n": 0}, True)
    code = replay.main(["--strategies", "random,diversity:pool=4", "--out", "", "--png", "",
                        "--dataset", "does-not-matter.jsonl.gz"])
    assert code == 2
    out = capsys.readouterr().out
    assert "pool" in out and "known:" in out


def test_replay_help_lists_every_strategy_with_its_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        replay.main(["--help"])
    out = capsys.readouterr().out
    for name, cls in STRATEGIES.items():
        assert f"{name}: " in out
        for o in cls.OPTIONS:
            assert f"{o.name} (" in out




def test_tune_takes_declared_options_and_the_explorer_gets_them(
        api: tuple[TestClient, str]) -> None:
    from workers.history import strategy_for

    client, db_url = api
    resp = client.post("/tune", json={"shape": STAGE2, "precision": "int8", "target": "h200",
                                      "trials": 64, "strategy": "diversity",
                                      "strategy_options": {"refit": 1, "pick": "top"}})
    assert resp.status_code == 202, resp.text
    job = client.get(f"/jobs/{resp.json()['job_id']}").json()
    assert job["strategy"] == "diversity"
    assert job["strategy_options"] == {"refit": 1.0, "pick": "top"}
    with session_scope(db_url) as s:
        row = s.get(Job, job["id"])
        assert row is not None
        strat = strategy_for(db_url, row, SPACE)
    assert strat.options["refit"] == 1.0 and strat.options["pick"] == "top"
    assert strat.options["bags"] == 5  # the rest at the strategy's defaults


def test_tune_without_options_stores_none(api: tuple[TestClient, str]) -> None:
    client, _ = api
    resp = client.post("/tune", json={"shape": STAGE2, "precision": "int8", "target": "h200",
                                      "strategy": "sa", "strategy_options": {}})
    assert resp.status_code == 202, resp.text
    assert client.get(f"/jobs/{resp.json()['job_id']}").json()["strategy_options"] is None


@pytest.mark.parametrize("strategy,options,loc,reason", [
    ("diversity", {"final_ratio": 2}, "final_ratio", "known: loss, rounds"),
    (None, {"plan_size": 8}, "plan_size", "unknown option of strategy 'diversity'"),
    ("sa", {"plan_size": 1.5}, "plan_size", "integer"),
    ("diversity", {"first_n": -1}, "first_n", ">= 0"),
    ("diversity", {"pick": "best"}, "pick", "bags or top"),
    ("random", {"iters": 10}, "iters", "known: none"),
])
def test_tune_refuses_a_bad_option_with_a_422_naming_it(
        api: tuple[TestClient, str], strategy: str | None, options: dict[str, Any], loc: str,
        reason: str) -> None:
    client, db_url = api
    payload: dict[str, Any] = {"shape": STAGE2, "precision": "int8", "target": "h200",
                               "strategy_options": options}
    if strategy:
        payload["strategy"] = strategy
    resp = client.post("/tune", json=payload)
    assert resp.status_code == 422, resp.text
    errors = resp.json()["detail"]
    assert [e["loc"] for e in errors] == [["body", "strategy_options", loc]]
    assert reason in errors[0]["msg"]
    with session_scope(db_url) as s:
        assert s.query(Job).count() == 0


def test_tune_refuses_an_option_value_json_cannot_mean(api: tuple[TestClient, str]) -> None:
    client, _ = api
    resp = client.post("/tune", json={"shape": STAGE2, "precision": "int8", "target": "h200",
                                      "strategy_options": {"bags": [5]}})
    assert resp.status_code == 422
    assert all(e["loc"][:3] == ["body", "strategy_options", "bags"]
               for e in resp.json()["detail"])


def test_cli_refuses_an_unknown_option_in_one_line_before_asking_the_service() -> None:
    res = CliRunner().invoke(cli, ["tune", "--shape", "n=8,h=56,w=56,c=64,k=64,r=3,s=3,pad=1",
                                   "--precision", "int8", "--target", "h200",
                                   "--server", "http://127.0.0.1:9",
                                   "--strategy", "diversity:final_ratio=2"])
    assert res.exit_code == 2
    assert "--strategy" in res.output and "final_ratio" in res.output
    assert "known: loss" in res.output


def test_cli_help_lists_the_strategies_and_their_options() -> None:
    res = CliRunner().invoke(cli, ["tune", "--help"])
    assert res.exit_code == 0
    for name, cls in STRATEGIES.items():
        assert f"{name}: " in res.output
        for o in cls.OPTIONS:
            assert f"{o.name} (" in res.output
