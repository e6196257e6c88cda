"""Renders AsyncJobConfig documents, the YAML `asyncd dev --config DIR` reads."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ._cron import validate_cron
from ._time import Duration, format_duration


def job_config(
    name: str,
    task_type: str,
    executor_url: str,
    *,
    timeout: Optional[Duration] = None,
    error_bodies: bool = False,
    signing_secret: Optional[str] = None,
    signing_keys: Optional[Sequence[str]] = None,
    batch_max_tasks: Optional[int] = None,
    batch_max_wait: Optional[Duration] = None,
    max_retries: Optional[int] = None,
    backoff: Optional[str] = None,
    initial_backoff: Optional[Duration] = None,
    max_backoff: Optional[Duration] = None,
    unique_key: Optional[str] = None,
    concurrency: Optional[int] = None,
    cron: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Dict[str, Any]:
    """Builds an AsyncJobConfig as a dict, refusing cron schedules without CRON_TZ.
    ``cron`` entries are ``{"name": ..., "schedule": ..., "payload": ...}``.
    ``error_bodies`` sets ``executor.errorBodies``: a task's ``last_error`` keeps what the
    executor answered with an error, not only asyncd's status line (off by default).
    ``signing_secret`` names the job's signing Secret (in its namespace) and
    ``signing_keys`` its keys, the primary first (default ``["key"]``; two while
    rotating). ``batch_max_tasks`` (1–1000) and ``batch_max_wait`` set
    ``executor.batch``: up to that many due tasks in one call, held at most that long to
    fill it (docs/api.md, "Batch delivery")."""
    executor: Dict[str, Any] = {"url": executor_url}
    if timeout is not None:
        executor["timeout"] = format_duration(timeout)
    if error_bodies:
        executor["errorBodies"] = True
    if signing_secret:
        ref: Dict[str, Any] = {"name": signing_secret}
        if signing_keys:
            ref["keys"] = list(signing_keys)
        executor["signing"] = {"secretRef": ref}
    if batch_max_tasks is not None or batch_max_wait is not None:
        batch: Dict[str, Any] = {}
        if batch_max_tasks is not None:
            batch["maxTasks"] = batch_max_tasks
        if batch_max_wait is not None:
            batch["maxWait"] = format_duration(batch_max_wait)
        executor["batch"] = batch
    spec: Dict[str, Any] = {"taskType": task_type, "executor": executor}
    retry: Dict[str, Any] = {}
    if max_retries is not None:
        retry["maxRetries"] = max_retries
    if backoff:
        retry["backoff"] = backoff
    if initial_backoff is not None:
        retry["initialBackoff"] = format_duration(initial_backoff)
    if max_backoff is not None:
        retry["maxBackoff"] = format_duration(max_backoff)
    if retry:
        spec["retry"] = retry
    if unique_key:
        spec["uniqueKey"] = unique_key
    if concurrency:
        spec["concurrency"] = concurrency
    if cron:
        entries: List[Dict[str, Any]] = []
        for c in cron:
            validate_cron(c["schedule"])
            entry = {"name": c["name"], "schedule": c["schedule"]}
            if c.get("payload") is not None:
                entry["payload"] = c["payload"]
            entries.append(entry)
        spec["cron"] = entries
    return {
        "apiVersion": "asyncd.example.io/v1",
        "kind": "AsyncJobConfig",
        "metadata": {"name": name},
        "spec": spec,
    }


def job_config_yaml(name: str, task_type: str, executor_url: str, **kwargs: Any) -> str:
    """:func:`job_config` rendered as YAML."""
    return to_yaml(job_config(name, task_type, executor_url, **kwargs))


def to_yaml(doc: Mapping[str, Any]) -> str:
    """Block-style YAML whose scalars are JSON literals: JSON's quoted strings are valid
    YAML double-quoted scalars, so no YAML quoting rules are needed."""
    out: List[str] = []
    _map(out, doc, 0)
    return "".join(out)


_IDENT = re.compile(r"^[A-Za-z0-9_-]+$")
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _key(k: str) -> str:
    if _IDENT.match(k) and k.lower() not in _YAML11_WORDS:
        return k
    return json.dumps(k, ensure_ascii=False)


def _map(out: List[str], m: Mapping[str, Any], indent: int) -> None:
    pad = "  " * indent
    for k, v in m.items():
        out.append(f"{pad}{_key(k)}:")
        _value(out, v, indent)


def _value(out: List[str], v: Any, indent: int) -> None:
    if isinstance(v, Mapping):
        if not v:
            out.append(" {}\n")
            return
        out.append("\n")
        _map(out, v, indent + 1)
    elif isinstance(v, (list, tuple)):
        if not v:
            out.append(" []\n")
            return
        out.append("\n")
        _seq(out, v, indent + 1)
    else:
        out.append(" " + json.dumps(v, ensure_ascii=False, allow_nan=False) + "\n")


def _seq(out: List[str], items: Sequence[Any], indent: int) -> None:
    pad = "  " * indent
    for e in items:
        if isinstance(e, Mapping) and e:
            # "- key: v" with the entry's other keys aligned under the first.
            sub: List[str] = []
            _map(sub, e, indent + 1)
            text = "".join(sub)
            out.append(pad + "- " + text[len(pad) + 2:])
        else:
            out.append(pad + "-")
            _value(out, e, indent)
