"""The client's bearer token against a real `asyncd dev --auth tokens` (its own
process; the shared one of test_integration.py runs without auth). Fails, never skips,
without $ASYNCD_BIN."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Iterator

import pytest

import asyncd
from devserver import DevServer

TOKEN = "py-it-token-for-auth-job"
OTHER_TOKEN = "py-it-token-for-another-job"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    work = tmp_path_factory.mktemp("asyncd-auth")
    tokens = work / "tokens.yaml"
    tokens.write_text(
        "tokens:\n"
        f'  - {{name: py-it, sha256: "{sha256(TOKEN)}", jobs: [py-auth-job], verbs: ["*"]}}\n'
        f'  - {{name: py-it-other, sha256: "{sha256(OTHER_TOKEN)}", jobs: [py-other-job], verbs: [read]}}\n'
    )
    srv = DevServer(work, args=["--auth", "tokens", "--auth-tokens-file", str(tokens)])
    for name, task_type in (("py-auth-job", "py_auth"), ("py-other-job", "py_other")):
        (srv.config_dir / f"{name}.yaml").write_text(
            asyncd.job_config_yaml(name=name, task_type=task_type, executor_url="http://127.0.0.1:9/run")
        )
    srv.start()
    yield srv
    srv.stop()


def key() -> str:
    return f"py-auth-{uuid.uuid4()}"


def test_a_client_with_the_token_succeeds_and_without_it_gets_unauthenticated(server: DevServer, tmp_path: Path) -> None:
    client = asyncd.Client(server.endpoint, token=TOKEN)
    res = client.submit_delayed("py_auth", {"n": 1}, delay="1h", idempotency_key=key())
    assert client.get(res.id).state == asyncd.PENDING

    # The same token from a file, as a pod mounts its projected ServiceAccount token.
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert asyncd.Client(server.endpoint, token_file=str(token_file)).get(res.id).id == res.id

    for anonymous in (
        asyncd.Client(server.endpoint, token_file=str(tmp_path / "missing")),
        asyncd.Client(server.endpoint, token="not-the-token"),
        asyncd.Client(server.endpoint, token=sha256(TOKEN)),
    ):
        with pytest.raises(asyncd.Unauthenticated) as refused:
            anonymous.submit("py_auth", {"n": 2}, idempotency_key=key())
        assert refused.value.status == 401 and refused.value.code == "unauthenticated"
        with pytest.raises(asyncd.Unauthenticated):
            anonymous.get(res.id)

    # Scoped to another job: 403 on submit, and this job's task looks unknown.
    other = asyncd.Client(server.endpoint, token=OTHER_TOKEN)
    with pytest.raises(asyncd.Forbidden) as forbidden:
        other.submit("py_auth", {"n": 3}, idempotency_key=key())
    assert forbidden.value.status == 403
    with pytest.raises(asyncd.NotFound):
        other.get(res.id)
    client.cancel(res.id)
    assert client.get(res.id).state == asyncd.CANCELLED


def test_the_token_file_is_re_read_after_the_refresh_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncd._client as client_module

    token_file = tmp_path / "token"
    token_file.write_text("first")
    clock = [1000.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    client = asyncd.Client("http://127.0.0.1:9", token_file=str(token_file))
    assert client._bearer() == "first"
    token_file.write_text("rotated")
    clock[0] += client_module.TOKEN_FILE_REFRESH - 1
    assert client._bearer() == "first"
    clock[0] += 1
    assert client._bearer() == "rotated"
    token_file.unlink()
    clock[0] += client_module.TOKEN_FILE_REFRESH
    assert client._bearer() is None
