"""The explorer's shared caches: bounded, the least recently used entry out first."""

from __future__ import annotations

from workers.lru import Lru


def test_the_least_recently_used_entry_goes_first() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and len(lru) == 2
    assert lru.get_or_make("a", lambda: 9) == 1  # kept what was there
    assert lru.get_or_make("d", lambda: 4) == 4 and "c" not in lru


def test_a_byte_budget_holds_what_the_entries_weighed_when_last_used() -> None:
    # Entries grow after they are stored (a strategy's arrays appear at its proposals): each
    # is weighed again whenever it is used, and the budget checked then.
    weight = {"a": 1, "b": 1, "c": 1}
    lru: Lru[str, str] = Lru(10, weigh=lambda k: weight[k], budget=5)
    for k in "abc":
        lru.put(k, k)
    assert len(lru) == 3
    weight["b"] = 3  # a 1 + b 3 + c 1 = 5: within
    assert lru.get("b") == "b" and len(lru) == 3
    weight["c"] = 2  # 6 over 5: a (the least recent) goes
    assert lru.get("c") == "c"
    assert "a" not in lru and [k for k, _ in lru.items()] == ["b", "c"]
    weight["b"] = 9  # the newest stays whatever it weighs
    assert lru.get("b") == "b" and [k for k, _ in lru.items()] == ["b"]
    lru.clear()
    weight.update(a=1, b=1)
    lru.put("a", "a")
    lru.put("b", "b")  # the cleared weights no longer count
    assert len(lru) == 2


def test_the_explorer_keeps_the_strategy_of_every_job_of_a_whole_model() -> None:
    # A whole model's jobs propose in turn (DenseNet-121: 132 of them): a cache holding fewer
    # strategies than jobs would make each one anew at every proposal of the cycle.
    from types import SimpleNamespace

    from kernels.space import ScheduleSpace
    from kernels.spec import RESNET50_3X3, TARGETS, Precision
    from workers.history import strategy_for

    space = ScheduleSpace(RESNET50_3X3["stage5"], Precision.INT8, TARGETS["h200"])
    jobs = [SimpleNamespace(id=i, strategy="random", seed=0, strategy_options={})
            for i in range(132)]
    first = [strategy_for("sqlite:///lru-test", job, space) for job in jobs]
    again = [strategy_for("sqlite:///lru-test", job, space) for job in jobs]
    assert all(a is b for a, b in zip(first, again, strict=True))
