"""The same table is in sdk/go/cron_test.go."""

import pytest

import asyncd

VALID = [
    "CRON_TZ=Asia/Singapore 0 0 * * *",
    "CRON_TZ=America/New_York */15 9-17 * * MON-FRI",
    "CRON_TZ=Europe/Berlin 30 2 L * ?",
    "CRON_TZ=UTC 0 0 1,15 jan,jul *",
    "CRON_TZ=Australia/Lord_Howe 0 30 2 * * 0",
    "CRON_TZ=Europe/London 0 9 15W * *",
    "CRON_TZ=Europe/London 0 9 ? * 5L",
    "CRON_TZ=Europe/London 0 9 ? * MON#2",
    "CRON_TZ=America/Argentina/Buenos_Aires @daily",
    "  CRON_TZ=Asia/Tokyo 0 0 * * 7  ",
]

INVALID = {
    "0 0 * * *": "CRON_TZ",
    "TZ=Asia/Singapore 0 0 * * *": "CRON_TZ",
    "CRON_TZ= 0 0 * * *": "time zone",
    "CRON_TZ=Local 0 0 * * *": "time zone",
    "CRON_TZ=Mars/Olympus 0 0 * * *": "unknown time zone",
    "CRON_TZ=Asia/Singapore": "no schedule",
    "CRON_TZ=Asia/Singapore 0 0 * *": "5 fields",
    "CRON_TZ=Asia/Singapore 0 0 * * * * *": "5 fields",
    "CRON_TZ=Asia/Singapore 60 0 * * *": "minute",
    "CRON_TZ=Asia/Singapore 0 24 * * *": "hour",
    "CRON_TZ=Asia/Singapore 0 0 0 * *": "day-of-month",
    "CRON_TZ=Asia/Singapore 0 0 * 13 *": "month",
    "CRON_TZ=Asia/Singapore 0 0 * * 8": "day-of-week",
    "CRON_TZ=Asia/Singapore 0 0 * * FUN": "day-of-week",
    "CRON_TZ=Asia/Singapore */0 0 * * *": "step",
    "CRON_TZ=Asia/Singapore 0 17-9 * * *": "backwards",
    "CRON_TZ=Asia/Singapore 0 0 1-x * *": "day-of-month",
    "CRON_TZ=Asia/Singapore ? 0 * * *": "minute",
    "CRON_TZ=Asia/Singapore 0 0 * * MON#6": "nth",
    "CRON_TZ=Asia/Singapore 0 0 1,,2 * *": "empty",
    "CRON_TZ=Asia/Singapore @fortnightly": "macro",
    "CRON_TZ=Asia/Singapore 61 0 0 * * *": "second",
}


@pytest.mark.parametrize("expr", VALID)
def test_valid(expr):
    asyncd.validate_cron(expr)
    assert asyncd.is_valid_cron(expr)


@pytest.mark.parametrize("expr,mention", sorted(INVALID.items()))
def test_invalid(expr, mention):
    with pytest.raises(asyncd.InvalidCron, match=mention):
        asyncd.validate_cron(expr)
    assert not asyncd.is_valid_cron(expr)


def test_invalid_cron_is_a_value_error():
    with pytest.raises(ValueError):
        asyncd.validate_cron("0 0 * * *")


def test_job_config_yaml():
    got = asyncd.job_config_yaml(
        "order-cancel-job", "cancel_expired_order", "http://order-service:8080/tasks/cancel",
        timeout=30, signing_secret="order-cancel-signing",
        signing_keys=["key", "previous"], batch_max_tasks=100, batch_max_wait=0.02, max_retries=3, backoff="exponential",
        initial_backoff=1, max_backoff="10m", unique_key="order:{order_id}", concurrency=64,
        cron=[{"name": "nightly-sweep", "schedule": "CRON_TZ=Asia/Singapore 0 0 * * *",
               "payload": {"nested": {"a b": 1}, "on": [], "sweep": True}}],
    )
    assert got == """apiVersion: "asyncd.example.io/v1"
kind: "AsyncJobConfig"
metadata:
  name: "order-cancel-job"
spec:
  taskType: "cancel_expired_order"
  executor:
    url: "http://order-service:8080/tasks/cancel"
    timeout: "30s"
    signing:
      secretRef:
        name: "order-cancel-signing"
        keys:
          - "key"
          - "previous"
    batch:
      maxTasks: 100
      maxWait: "20ms"
  retry:
    maxRetries: 3
    backoff: "exponential"
    initialBackoff: "1s"
    maxBackoff: "10m"
  uniqueKey: "order:{order_id}"
  concurrency: 64
  cron:
    - name: "nightly-sweep"
      schedule: "CRON_TZ=Asia/Singapore 0 0 * * *"
      payload:
        nested:
          "a b": 1
        "on": []
        sweep: true
"""
    with pytest.raises(asyncd.InvalidCron):
        asyncd.job_config("j", "t", "http://x", cron=[{"name": "n", "schedule": "0 0 * * *"}])


def test_yaml_lists_of_scalars_and_lists():
    assert asyncd.to_yaml({"a": [1, "x", [2], {}], "b": {}}) == 'a:\n  - 1\n  - "x"\n  -\n    - 2\n  - {}\nb: {}\n'
