"""docs/batch.md's list of output columns is the result schema's, so the two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from memagent.batch import result_schema
from memagent.config import AgentConfig
from memagent.extraction import ExtractionSchema
from memagent.result_schema import EXTRA_OUTPUT_COLUMNS, JOB_SCHEMA, RESULT_COLUMNS, STEP_TYPE

DOC = Path(__file__).resolve().parents[1] / "docs" / "batch.md"
NOT_COLUMNS = {"answers"}  # input columns the paragraph mentions


def documented() -> tuple[list[str], list[str]]:
    """The columns the **Output** paragraph names, in order, and the fields of its ``steps`` list."""
    text = DOC.read_text()
    start = text.index("**Output**")
    paragraph = text[start: text.index("\n\n", start)]
    steps = re.search(r"`steps` \(list of `([^`]+)`", paragraph)
    assert steps, "the Output paragraph lists the fields of `steps`"
    fields = [f.strip() for f in steps.group(1).replace("\n", " ").split(",")]
    rest = paragraph.replace(steps.group(0), "`steps` (")
    names = [n for n in re.findall(r"`([a-z_]+)`", rest) if n not in NOT_COLUMNS]
    return names, fields


def test_the_documented_columns_are_the_result_schemas():
    names, fields = documented()
    assert fields == STEP_TYPE.names
    assert len(names) == len(set(names)), names
    assert set(names) == {"id", *RESULT_COLUMNS, *EXTRA_OUTPUT_COLUMNS}
    assert names[-len(JOB_SCHEMA.names):] == JOB_SCHEMA.names  # the job's own come last, as it writes them


def test_an_extraction_adds_exactly_its_fields_and_the_documented_extraction_columns():
    schema = ExtractionSchema.model_validate({"type": "object", "properties": {"total": {"type": "number"}}})
    columns = result_schema(AgentConfig(extraction=schema)).names
    assert columns == [*RESULT_COLUMNS, "total", *EXTRA_OUTPUT_COLUMNS[:-len(JOB_SCHEMA.names)]]
