"""The same vectors are in sdk/go/idempotency_test.go: both SDKs must derive the same
key for the same task."""

import json

import pytest

import asyncd

BIG = str(int(1e300))


@pytest.mark.parametrize(
    "text,want",
    [
        ('{"b":1,"a":[true,false,null],"c":"x"}', '{"a":[true,false,null],"b":1,"c":"x"}'),
        (
            "[42.0, -0, 1e3, 1.5e-7, 0.1, 123456789.5, 1e300, 12345678901234567890]",
            f"[42,0,1000,1.5e-07,1e-01,1.234567895e+08,{BIG},12345678901234567890]",
        ),
        (
            '"a\\"b\\\\c\\n\\t\\u0001\\u001f/<>&é😀\\u2028"',
            '"a\\"b\\\\c\\n\\t\\u0001\\u001f/<>&é😀\u2028"',
        ),
        ('{"é":1,"z":2,"A":3,"😀":4,"ｚ":5}', '{"A":3,"z":2,"é":1,"ｚ":5,"😀":4}'),
        ("{ }", "{}"),
    ],
)
def test_canonical_json(text, want):
    assert asyncd.canonical_json(json.loads(text)) == want


def test_canonical_json_float_forms():
    # Also in sdk/go/idempotency_test.go.
    assert asyncd.canonical_json([-2.5, 1e-5, 5e-324, 1e22, 0.30000000000000004]) == (
        "[-2.5e+00,1e-05,5e-324,10000000000000000000000,3.0000000000000004e-01]"
    )


VECTORS = [
    ("cancel_expired_order", '{"order_id":42,"customer":"ann"}', ["order_id"],
     "4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec"),
    ("send_email", '{"to":"a@b.c","subject":"Grüße","n":1.5}', [],
     "57331f991c0efb748bd8e40a152f18cf790e31d13a90019a89571a5bb93315f6"),
    ("send_email", '{"to":"a@b.c","subject":"Grüße","n":1.5}', ["to", "n"],
     "506c0222380f9cad6b1ca8b019bc6ebadbb04ede3cc7caf3da21b21135d17b52"),
]


@pytest.mark.parametrize("task_type,payload,fields,want", VECTORS)
def test_key_vectors_shared_with_go(task_type, payload, fields, want):
    assert asyncd.idempotency_key_from(task_type, json.loads(payload), *fields) == want


def test_key_depends_on_named_fields_and_type_only():
    base = asyncd.idempotency_key_from("cancel_expired_order", {"order_id": 42, "customer": "ann"}, "order_id")
    assert len(base) == 64
    assert asyncd.idempotency_key_from("cancel_expired_order", {"order_id": 42.0, "customer": "bob"}, "order_id") == base
    assert asyncd.idempotency_key_from("cancel_expired_order", {"order_id": 43}, "order_id") != base
    assert asyncd.idempotency_key_from("refund_order", {"order_id": 42}, "order_id") != base
    p = {"a": 1, "b": (1, 2)}
    assert asyncd.idempotency_key_from("t", p, "a", "b") == asyncd.idempotency_key_from("t", p, "b", "a")


def test_key_errors():
    with pytest.raises(ValueError, match="not in the payload"):
        asyncd.idempotency_key_from("t", {"a": 1}, "missing")
    with pytest.raises(ValueError, match="not a JSON object"):
        asyncd.idempotency_key_from("t", [1], "a")
    with pytest.raises(ValueError):
        asyncd.idempotency_key_from("", 1)
    with pytest.raises(ValueError):
        asyncd.idempotency_key_from("t", float("nan"))
    with pytest.raises(TypeError):
        asyncd.idempotency_key_from("t", {"when": object()})
