from __future__ import annotations

from typing import Iterator

import pytest

from fakeapi import FakeAPI, serve


@pytest.fixture
def fake_api() -> Iterator[FakeAPI]:
    api = FakeAPI()
    srv = serve(api)
    yield api
    srv.shutdown()
    srv.server_close()
