"""A finished request's ledger row (router/request/usage.py): read from its record by
position, each column holding the record's field of its name."""

from __future__ import annotations

import dataclasses

from router.common.record import Phase, RequestRecord
from router.config import load_config
from router.ledger.base import COLUMNS
from router.request.usage import ledger_row


def test_a_row_holds_each_field_of_its_record_in_its_own_column() -> None:
    """`ledger_row` reads the record by position (two attrgetters): every column that a
    record's field of the same name feeds holds that field, whatever the order."""
    fields = [f.name for f in dataclasses.fields(RequestRecord)]
    values: dict[str, object] = {name: f"v-{name}" for name in fields}
    values.update(backend=None, disconnect=Phase.STREAMING, queue_wait_ms=1.5, total_ms=2.5,
                  slot_ms=3.5, status=201, prompt_tokens=7, completion_tokens=9)
    rec = RequestRecord(**values)  # type: ignore[arg-type]
    row = ledger_row(rec, load_config(), None)
    named = {"id": "row_id"}
    for column, value in row._asdict().items():
        source = named.get(column, column)
        if column in ("cost", "counterfactual_cost"):
            assert value == 0.0  # no backend: unpriced
        elif column == "disconnect":
            assert value == "streaming"
        else:
            assert value == values[source], column
    assert set(COLUMNS) - {"cost", "counterfactual_cost"} <= {*values, "id"}
