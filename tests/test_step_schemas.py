"""A step is written in three places: the trace (memagent.agent.Step), the chain checkpoint
(memagent.checkpoint.SegmentStep) and the output column (memagent.result_schema.STEP_TYPE).

Invariant: the three name the same fields in the same order, so a field added to one is added to all.
"""

from dataclasses import fields

from memagent.agent import Step
from memagent.checkpoint import SegmentStep
from memagent.result_schema import STEP_TYPE


def test_a_step_has_one_shape_in_the_trace_the_checkpoint_and_the_output():
    """Step, SegmentStep and STEP_TYPE list the same fields in the same order."""
    names = [f.name for f in fields(Step)]
    assert list(SegmentStep.model_fields) == names
    assert [STEP_TYPE.field(i).name for i in range(STEP_TYPE.num_fields)] == names
