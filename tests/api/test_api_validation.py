"""Every bad input gets a 422 that names the field and the reason, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from store.db import session_scope
from store.models import Candidate, Job, Measurement, Task

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}
# ResNet-50 layer2's last conv (128 channels at 28x28) and its projection (256 at 56x56, /2)
BOTTLENECK = {"n": 8, "h": 56, "w": 56, "c": 384, "k": 512, "r": 1, "s": 1, "stride": 2,
              "pad": 0}




def body(**over: Any) -> dict[str, Any]:
    shape = {**STAGE2, **over.pop("shape", {})}
    return {"shape": shape, "precision": "int8", "target": "h200", "trials": 64, **over}


def _locs(resp: Any) -> list[tuple[str, ...]]:
    assert resp.status_code == 422, resp.text
    return [tuple(str(x) for x in e["loc"]) for e in resp.json()["detail"]]


BAD_BODIES = [
    ("zero channels", body(shape={"c": 0}), ("body", "shape", "c"), "positive"),
    ("negative k", body(shape={"k": -1}), ("body", "shape", "k"), "positive"),
    ("zero batch", body(shape={"n": 0}), ("body", "shape", "n"), "positive"),
    ("non-integer h", body(shape={"h": 3.5}), ("body", "shape", "h"), "integer"),
    ("string w", body(shape={"w": "56"}), ("body", "shape", "w"), "integer"),
    ("bool r", body(shape={"r": True}), ("body", "shape", "r"), "integer"),
    ("absurd batch", body(shape={"n": 100_000}), ("body", "shape", "n"), "at most"),
    ("absurd height", body(shape={"h": 10**9}), ("body", "shape", "h"), "at most"),
    ("absurd filter", body(shape={"r": 99}), ("body", "shape", "r"), "at most"),
    ("zero stride", body(shape={"stride": [0, 1]}), ("body", "shape", "stride"), "between"),
    ("stride of 3 values", body(shape={"stride": [1, 1, 1]}), ("body", "shape", "stride"), ""),
    ("filter larger than input", body(shape={"h": 2, "w": 2, "pad": [0, 0]}),
     ("body", "shape"), "does not fit"),
    ("tensor beyond 32-bit indexing", body(shape={"n": 4096, "h": 1024, "w": 1024}),
     ("body", "shape"), "32-bit"),
    ("layer too large for the GPU", body(precision="fp32_tc", target="t4", shape={
        "n": 256, "h": 256, "w": 256, "c": 120, "k": 120}), ("body", "shape"), "GiB"),
    ("int4 odd channels", body(precision="int4", shape={"c": 3}), ("body", "shape", "c"),
     "even"),
    ("unknown precision", body(precision="int2"), ("body", "precision"), "fp16"),
    ("unknown target", body(target="v100"), ("body", "target"), "unknown target"),
    ("unknown strategy", body(strategy="magic"), ("body", "strategy"), "unknown strategy"),
    ("zero trials", body(trials=0), ("body", "trials"), "greater"),
    ("absurd trials", body(trials=10**9), ("body", "trials"), "less"),
    ("text trials", body(trials="ten"), ("body", "trials"), "integer"),
    ("unknown field", body(priority=1), ("body", "priority"), "not permitted"),
    ("missing field", {"shape": STAGE2, "target": "h200"}, ("body", "precision"), "required"),
    ("missing shape field", body(shape={"k": None}), ("body", "shape", "k"), "integer"),
    ("two inputs on a 3x3 layer", body(shape={"concat": 32}), ("body", "shape", "concat"),
     "1x1"),
    ("two inputs with every channel in x1", body(shape={**BOTTLENECK, "concat": 384}),
     ("body", "shape", "concat"), "between 0 and c"),
    ("two inputs in int4", body(precision="int4", shape={**BOTTLENECK, "concat": 128}),
     ("body", "shape", "concat"), "int8 and fp16"),
    ("negative concat", body(shape={**BOTTLENECK, "concat": -1}), ("body", "shape", "concat"),
     "between 0 and c"),
    ("a residual in int4", body(precision="int4", shape={"residual": True}),
     ("body", "shape", "residual"), "int8 and fp16"),
    ("a residual over two inputs", body(shape={**BOTTLENECK, "concat": 128, "residual": True}),
     ("body", "shape", "residual"), "two inputs"),
    ("a residual as text", body(shape={"residual": "yes"}), ("body", "shape", "residual"),
     "boolean"),
    ("a back-to-back conv of 12 channels", body(shape={"b2b": 12}), ("body", "shape", "b2b"),
     "multiple of 8"),
    ("a back-to-back conv in int4", body(precision="int4", shape={"b2b": 64}),
     ("body", "shape", "b2b"), "int8 and fp16"),
    ("a back-to-back conv as text", body(shape={"b2b": "64"}), ("body", "shape", "b2b"),
     "integer"),
]


@pytest.mark.parametrize("case,payload,loc,reason", BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_tune_request_is_422_naming_the_field(api: tuple[TestClient, str], case: str,
                                                 payload: dict[str, Any], loc: tuple[str, ...],
                                                 reason: str) -> None:
    client, db_url = api
    resp = client.post("/tune", json=payload)
    errors = resp.json()["detail"] if resp.status_code == 422 else []
    assert loc in _locs(resp), errors
    assert any(reason.lower() in e["msg"].lower() for e in errors
               if tuple(str(x) for x in e["loc"]) == loc), errors
    with session_scope(db_url) as s:
        for model in (Task, Job, Candidate, Measurement):
            assert s.scalar(select(func.count()).select_from(model)) == 0


def test_malformed_json_is_422(api: tuple[TestClient, str]) -> None:
    client, _ = api
    resp = client.post("/tune", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422


BAD_QUERIES = [
    ("c=0", ("query", "c")),
    ("c=x", ("query", "c")),
    ("stride=a", ("query", "stride")),
    ("stride=1,2,3", ("query", "stride")),
    ("target=v100", ("query", "target")),
    ("precision=int2", ("query", "precision")),
    ("n=0", ("query", "n")),
    ("concat=16", ("query", "concat")),  # a 3x3 layer
    ("concat=x", ("query", "concat")),
    ("residual=maybe", ("query", "residual")),
]


@pytest.mark.parametrize("override,loc", BAD_QUERIES, ids=[q[0] for q in BAD_QUERIES])
def test_bad_schedule_query_is_422(api: tuple[TestClient, str], override: str,
                                   loc: tuple[str, ...]) -> None:
    client, _ = api
    params = dict(n="8", h="56", w="56", c="64", k="64", r="3", s="3", pad="1",
                  precision="int8", target="h200")
    name, value = override.split("=")
    params[name] = value
    assert loc in _locs(client.get("/schedule", params=params))


def test_unknown_schedule_is_404_with_what_is_known(api: tuple[TestClient, str]) -> None:
    client, _ = api
    params = dict(n=8, h=56, w=56, c=64, k=64, r=3, s=3, pad=1, precision="int8", target="h200")
    resp = client.get("/schedule", params=params)
    assert resp.status_code == 404
    assert resp.json()["known"] is False and resp.json()["running"] is False
    client.post("/tune", json=body())
    resp = client.get("/schedule", params=params)
    assert resp.status_code == 404
    assert resp.json()["known"] is True and resp.json()["running"] is True
    assert resp.json()["job"]["status"] == "queued"


def test_unknown_job_is_404(api: tuple[TestClient, str]) -> None:
    client, _ = api
    assert client.get("/jobs/12345").status_code == 404


def test_same_active_task_returns_its_job(api: tuple[TestClient, str]) -> None:
    client, _ = api
    first = client.post("/tune", json=body())
    assert first.status_code == 202 and first.json()["created"] is True
    again = client.post("/tune", json=body(trials=10))
    assert again.status_code == 200
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.json()["created"] is False
    other = client.post("/tune", json=body(precision="fp16"))
    assert other.status_code == 202 and other.json()["job_id"] != first.json()["job_id"]


def test_stride_pad_dilation_defaults_and_scalars(api: tuple[TestClient, str]) -> None:
    client, _ = api
    shape = {k: v for k, v in STAGE2.items() if k != "pad"}
    resp = client.post("/tune", json=body(shape={**shape, "pad": 1}))
    assert resp.status_code == 202
    assert resp.json()["task_key"].startswith("n8_h56_w56_c64_k64_r3_s3_st1x1_p1x1_d1x1")


def test_a_layer_over_two_inputs_is_a_task_of_its_own(api: tuple[TestClient, str]) -> None:
    """concat makes a task apart from the one-input layer of the same channels, and
    GET /schedule finds it by the same field."""
    client, _ = api
    one = client.post("/tune", json=body(shape=BOTTLENECK))
    two = client.post("/tune", json=body(shape={**BOTTLENECK, "concat": 128}))
    assert one.status_code == two.status_code == 202
    assert two.json()["task_key"].startswith("n8_h56_w56_c384_k512_r1_s1_st2x2_p0x0_d1x1_cat128|")
    assert one.json()["task_key"] != two.json()["task_key"]
    params = dict(n=8, h=56, w=56, c=384, k=512, r=1, s=1, stride=2, concat=128,
                  precision="int8", target="h200")
    resp = client.get("/schedule", params=params)
    assert resp.status_code == 404 and resp.json()["running"] is True
    assert client.get(f"/jobs/{two.json()['job_id']}").json()["task"]["shape"]["concat"] == 128


def test_a_layer_with_a_back_to_back_conv_is_a_task_of_its_own(
        api: tuple[TestClient, str]) -> None:
    """b2b makes a task apart from the layer alone (ConvShape.b2b), found by GET /schedule
    with the same field; a b2b the kernel cannot run is refused there too."""
    client, _ = api
    shape = {"c": 64, "k": 256, "r": 1, "s": 1, "pad": 0, "residual": True, "b2b": 64}
    res = client.post("/tune", json=body(shape=shape))
    assert res.status_code == 202, res.json()
    assert res.json()["task_key"].startswith("n8_h56_w56_c64_k256_r1_s1_st1x1_p0x0_d1x1_res_b2b64|")
    params = dict(n=8, h=56, w=56, c=64, k=256, r=1, s=1, residual="true", precision="int8",
                  target="h200")
    alone = client.get("/schedule", params=params).json()  # the layer alone: another task
    assert alone["running"] is False and alone["job"] is None
    found = client.get("/schedule", params={**params, "b2b": 64})
    assert found.status_code == 404 and found.json()["job"]["id"] == res.json()["job_id"]
    assert client.get(f"/jobs/{res.json()['job_id']}").json()["task"]["shape"]["b2b"] == 64
    assert ("query", "b2b") in _locs(client.get("/schedule", params={**params, "b2b": 12}))


def test_a_layer_with_its_residual_is_a_task_of_its_own(api: tuple[TestClient, str]) -> None:
    """residual makes a task apart from the conv alone, and GET /schedule finds it by the
    same field; an int4 residual is refused there too."""
    client, _ = api
    one = client.post("/tune", json=body())
    res = client.post("/tune", json=body(shape={"residual": True}))
    assert one.status_code == res.status_code == 202
    assert res.json()["task_key"].startswith("n8_h56_w56_c64_k64_r3_s3_st1x1_p1x1_d1x1_res|")
    assert one.json()["job_id"] != res.json()["job_id"]
    params = dict(n=8, h=56, w=56, c=64, k=64, r=3, s=3, pad=1, precision="int8",
                  target="h200")
    found = client.get("/schedule", params={**params, "residual": "true"})
    assert found.status_code == 404 and found.json()["running"] is True
    assert found.json()["job"]["id"] == res.json()["job_id"]
    assert client.get(f"/jobs/{res.json()['job_id']}").json()["task"]["shape"]["residual"]
    bad = client.get("/schedule", params={**params, "residual": "true", "precision": "int4"})
    assert ("query", "residual") in _locs(bad)
