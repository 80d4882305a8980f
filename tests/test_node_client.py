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


def test_the_fixtures_are_what_the_cli_prints_today(tmp_path: Path) -> None:
    record(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in FIXTURES.iterdir())
    for path in tmp_path.iterdir():
        fresh = [_layout(d) for d in _documents(path)]
        kept = [_layout(d) for d in _documents(FIXTURES / path.name)]
        assert fresh == kept, f"{path.name}: run python -m tests.node_face record {FIXTURES}"
