"""The wire shapes of the asyncd-contract crate (contract/fixtures, generated from the
Rust types the server uses): this SDK must write the request bodies and read the
answers exactly as they are there, and its signing must reproduce the test vector."""

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import asyncd
from asyncd._errors import error_from_body
from asyncd._executor import sign, verify_signature
from asyncd._time import format_duration, parse_duration, parse_time

FIXTURES = Path(__file__).resolve().parents[3] / "contract" / "fixtures"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def task_from(body: dict) -> asyncd.Task:
    """The Task whose submit body is ``body``."""
    return asyncd.Task(
        type=body["type"], payload=body["payload"], delay=body.get("delay"), priority=body.get("priority"),
        idempotency_key=body["idempotency_key"], unique_key=body.get("unique_key"),
        max_retries=body.get("max_retries"), timeout=body.get("timeout"), depends_on=body.get("depends_on") or [],
    )


def client(body: dict) -> asyncd.Client:
    return asyncd.Client("http://127.0.0.1:1", service_name=body.get("source_service"))


def test_submit_bodies_are_the_contracts():
    want = fixture("submit_request")
    assert client(want)._body(task_from(want)) == want
    batch = fixture("batch_request")
    assert {"tasks": [client(t)._body(task_from(t)) for t in batch["tasks"]]} == batch


@pytest.mark.parametrize("name", ["heartbeat_request", "executor_accepted", "result_request"])
def test_durations_are_written_as_the_contract_writes_them(name):
    body = fixture(name)
    for key in ("lease", "retry_after"):
        if key in body:
            assert format_duration(parse_duration(body[key])) == body[key]
            assert format_duration(timedelta(seconds=parse_duration(body[key]).total_seconds())) == body[key]


def test_answers_decode():
    sub = fixture("submit_response")
    res = asyncd.SubmitResult.from_json(sub)
    assert (res.id, res.eta, res.route, res.duplicate) == (sub["id"], parse_time(sub["eta"]), sub["route"], sub["duplicate"])

    for d in [fixture("task_status"), *fixture("dead_letters_response")["items"]]:
        st = asyncd.TaskStatus.from_json(d)
        for key, value in d.items():
            if key in ("eta", "created_at", "updated_at"):
                assert getattr(st, key) == parse_time(value), key
            elif key != "lease_until":  # TaskStatus does not carry it
                assert getattr(st, key) == value, key

    for item, want in zip(fixture("batch_response")["results"], [201, 400]):
        assert item["status"] == want


def test_errors_decode():
    codes = set()
    for case in fixture("errors"):
        e = error_from_body(case["status"], case["body"])
        err = case["body"]["error"]
        assert (e.status, e.code, e.message, e.field, e.existing_id, e.state) == (
            case["status"], err["code"], err["message"], err.get("field"), err.get("existing_id"), err.get("state"),
        )
        assert isinstance(e, asyncd.APIError)
        codes.add(e.code)
    assert len(codes) == len(fixture("errors"))


def test_executor_call_is_read_into_the_context():
    call = fixture("executor_call")
    ctx = asyncd.Executor()._context({}, call)
    assert (ctx.id, ctx.type, ctx.attempt, ctx.eta) == (call["id"], call["type"], call["attempt"], parse_time(call["eta"]))


def _outcome(verifier, step):
    try:
        verifier.verify(step["headers"], step["body"].encode(), now=step["now"])
    except asyncd.Replayed:
        return "replay"
    except asyncd.StaleTimestamp:
        return "stale"
    except asyncd.MalformedTimestamp:
        return "malformed_timestamp"
    except asyncd.BadSignature:
        return "mismatch"
    return "ok"


def test_signature_vectors():
    v = fixture("signature")
    assert v["tolerance_seconds"] == asyncd.SIGNATURE_TOLERANCE.total_seconds()
    assert asyncd.canonical_string(v["headers"], v["body"].encode()) == v["canonical"].encode()
    assert sign(v["keys"]["primary"], v["headers"], v["body"].encode()) == v["headers"]["Asyncd-Signature"]
    verify_signature(v["keys"]["primary"], v["headers"], v["body"].encode(), now=int(v["headers"]["Asyncd-Timestamp"]))
    assert len(v["cases"]) >= 20
    for case in v["cases"]:
        verifier = asyncd.Verifier([v["keys"][name] for name in case["keys"]])
        got = [_outcome(verifier, step) for step in case["steps"]]
        assert got == [step["want"] for step in case["steps"]], case["name"]
