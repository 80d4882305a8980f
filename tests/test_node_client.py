"""The Node client's fixtures are the real CLI's --json: validated, and recorded again to compare.

clients/node/test/ runs the client against these recorded outputs (``make
node-test``); here they are held to the contract (schemas/, strictly) and
to what the CLI prints today, so a changed output cannot leave the Node
tests passing against a stale copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.node_face import record
from tests.test_contract import validate

FIXTURES = Path(__file__).resolve().parent.parent / "clients" / "node" / "test" / "fixtures"


def _documents(path: Path) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines()]
    data = json.loads(text)
    return data if isinstance(data, list) else [data]


def _layout(value: Any) -> Any:
    """The keys and types of a document, without its values (PIDs, times, paths differ)."""
    if isinstance(value, dict):
        return {k: _layout(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_layout(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_every_fixture_is_a_shape_of_the_contract(name: str) -> None:
    documents = _documents(FIXTURES / name)
    assert documents
    for document in documents:
        validate(document)


def _same_layout(fresh: Any, kept: Any) -> bool:
    """The same keys and types; a null matches any type (a nullable field, as
    ``pss`` of a process whose smaps this host cannot read: the report's
    processes are the recording host's own)."""
    if fresh == "NoneType" or kept == "NoneType":
        return True
    if isinstance(fresh, dict) and isinstance(kept, dict):
        return fresh.keys() == kept.keys() and all(_same_layout(fresh[k], kept[k]) for k in fresh)
    if isinstance(fresh, list) and isinstance(kept, list):
        return len(fresh) == len(kept) and all(map(_same_layout, fresh, kept))
    return bool(fresh == kept)


def test_the_fixtures_are_what_the_cli_prints_today(tmp_path: Path) -> None:
    record(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in FIXTURES.iterdir())
    for path in tmp_path.iterdir():
        fresh = [_layout(d) for d in _documents(path)]
        kept = [_layout(d) for d in _documents(FIXTURES / path.name)]
        assert _same_layout(fresh, kept), (
            f"{path.name}: run python -m tests.node_face record {FIXTURES}",
            fresh,
            kept,
        )


def test_a_field_that_changes_type_or_goes_missing_is_a_different_layout() -> None:
    kept = _layout({"pid": 1, "pss": None, "agents": [{"agent": "a"}]})
    assert _same_layout(_layout({"pid": 2, "pss": 5, "agents": [{"agent": "b"}]}), kept)
    assert not _same_layout(_layout({"pid": "1", "pss": 5, "agents": [{"agent": "b"}]}), kept)
    assert not _same_layout(_layout({"pid": 1, "agents": [{"agent": "b"}]}), kept)
    assert not _same_layout(_layout({"pid": 1, "pss": 5, "agents": []}), kept)
