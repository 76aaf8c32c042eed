"""Small public QA samples shipped with the package (CC BY-SA 4.0; see SOURCES.md here).

They make the examples, the deployments' defaults and the tests run on a clone with nothing
beside it. Real evaluations pass the full files (``--hotpotqa``, ``--squad``).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
HOTPOTQA_DEV = HERE / "hotpotqa_dev.json"  # 24 HotpotQA dev records, official format
SQUAD_DEV = HERE / "squad_dev.json"  # the 39 paragraphs of one SQuAD v2.0 dev article, official format
