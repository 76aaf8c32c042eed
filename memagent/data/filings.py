"""Generated quarterly-filing-like documents with gold objects in the filing schema's shape (:data:`SCHEMA`).

The schema (shipped as ``docs/schemas/filing.json``) has the shape of public 10-Q extraction schemas:
``meta`` (company, report period, its end date) and four statement objects whose 52 properties are each
an array of one shared ``$defs/metric`` (unit, scale, value, data_period, metric_type, segment_name,
segment_type). :func:`filing` writes a document from a seed:

- each statement as a **text table** with an ``(in millions of USD)`` scale line and two period columns
  (the quarter and the same quarter a year before: a **restated** prior period, its footnote saying so);
- a **segment table** (revenue by business segment, in millions);
- **prose mentions** of metrics not in the tables (employees, a restructuring charge, in thousands or
  unscaled), **footnotes**, and **guidance** for the next quarter (``metric_type`` guidance);
- filler paragraphs between them.

Every metric is stated on one line (a table row holds two: one per period), and ``statements`` lists
each line's char span with the records it states (the ground truth a perfect reader answers from). The
gold object lists each metric once.
"""

from __future__ import annotations

import random
from typing import Any

STATEMENTS: dict[str, list[tuple[str, str]]] = {  # statement object -> (property, row label)
    "balance_sheet": [(n, n.replace("_", " ").capitalize()) for n in (
        "cash", "short_term_investments", "marketable_securities", "accounts_receivable", "inventories",
        "current_assets", "property_plant_equipment", "goodwill", "total_assets", "accounts_payable",
        "short_term_debt", "current_liabilities", "long_term_debt", "total_debt", "total_liabilities",
        "dividends_payable", "commercial_paper", "additional_paid_in_capital", "retained_earnings",
        "shareholders_equity", "total_receivables", "money_market_funds", "cash_and_investments")],
    "income_statement": [(n, n.replace("_", " ").capitalize()) for n in (
        "revenue", "cost_of_revenue", "gross_profit", "gross_margin", "operating_expenses", "operating_income",
        "operating_margin", "interest_expense", "income_tax_expense", "effective_tax_rate", "net_income",
        "basic_eps", "diluted_eps", "stock_based_compensation", "restructuring_charge", "revenue_growth",
        "net_income_growth")],
    "cash_flow": [(n, n.replace("_", " ").capitalize()) for n in (
        "operating_cash_flow", "capital_expenditures", "financing_cash_flow", "dividends_paid",
        "share_repurchases", "shares_repurchased", "shares_issued", "commercial_paper_issued")],
    "other_disclosures": [(n, n.replace("_", " ").capitalize()) for n in (
        "employees", "notional_swaps", "notional_options", "notional_forwards")],
}
PROSE = {"employees", "restructuring_charge", "notional_swaps", "notional_options", "notional_forwards"}
RATIOS = {"gross_margin", "operating_margin", "effective_tax_rate", "revenue_growth", "net_income_growth"}
PER_SHARE = {"basic_eps", "diluted_eps"}
COUNTS = {"shares_repurchased", "shares_issued"}
SEGMENTS = ("Cloud", "Devices", "Services", "Licensing")
COMPANIES = ("Harlow Systems Inc.", "Calder Devices Corp.", "Norland Networks Inc.", "Selby Materials Co.")
FILLER = ("The Company operates in a competitive environment and its results may vary from quarter to quarter.",
          "Management believes the existing cash balances are sufficient to meet operating needs.",
          "Certain risks described in the annual report could materially affect future results.")

METRIC = {"type": "object", "additionalProperties": False,
          "required": ["unit", "scale", "value", "data_period", "segment_type"],
          "description": "One reported figure: its period, segment, unit, scale and value.",
          "properties": {
              "unit": {"type": "string", "description": "Currency or unit of the value (USD, %, employees, shares)."},
              "scale": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                        "description": "Scale factor of the value as written (1000000 for millions, 1000 for thousands, "
                                       "1 unscaled)."},
              "value": {"anyOf": [{"type": "number"}, {"type": "string"}, {"type": "null"}],
                        "description": "The figure as reported, without unit or scale (a string for a range)."},
              "data_period": {"type": "string", "description": "The period label, e.g. 'FY2025 Q3' or 'FY2025'."},
              "metric_type": {"enum": ["actual", "guidance"], "description": "Reported, or forward-looking guidance."},
              "segment_name": {"type": "string", "description": "The segment's name; 'NA' for the whole company."},
              "segment_type": {"enum": ["company", "business_segment", "geographic_segment"],
                               "description": "'company' for consolidated figures, else the kind of segment."}}}

SCHEMA: dict[str, Any] = {
    "type": "object", "$defs": {"metric": METRIC}, "required": ["meta"],
    "properties": {
        "meta": {"type": "object", "properties": {
            "company": {"type": "string", "description": "The reporting company's name."},
            "report_period": {"type": "string", "description": "The report's period, e.g. 'FY2025 Q3'."},
            "report_period_end_date": {"type": "string", "format": "date",
                                       "description": "The last day of the reporting period."}}},
        **{section: {"type": "object", "properties": {
            name: {"type": "array", "items": {"$ref": "#/$defs/metric"},
                   "description": f"{label} as reported in the {section.replace('_', ' ')}."}
            for name, label in rows}} for section, rows in STATEMENTS.items()}}}


def _record(value: Any, period: str, unit: str = "USD", scale: int | None = 1_000_000, kind: str = "actual",
            segment: str = "NA", segment_type: str = "company") -> dict[str, Any]:
    return {"unit": unit, "scale": scale, "value": value, "data_period": period, "metric_type": kind,
            "segment_name": segment, "segment_type": segment_type}


def _figure(rng: random.Random, name: str) -> tuple[float, str, int | None]:
    """A value, its unit and scale for a metric (ratios in %, per-share unscaled, counts in thousands)."""
    if name in RATIOS:
        return round(rng.uniform(2, 60), 1), "%", 1
    if name in PER_SHARE:
        return round(rng.uniform(0.1, 9), 2), "USD", 1
    if name in COUNTS or name == "employees":
        return float(rng.randint(100, 9000)), "shares" if name != "employees" else "employees", 1000
    return float(rng.randint(50, 90_000)), "USD", 1_000_000


def _num(value: float) -> str:
    return f"{value:,.2f}" if value != int(value) else f"{int(value):,}"


class _Writer:
    """The document's lines and the records each states (char spans)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.pos = 0
        self.statements: list[dict[str, Any]] = []

    def line(self, text: str, records: list[tuple[str, dict[str, Any]]] = ()) -> None:
        if records:
            self.statements.append({"start": self.pos, "end": self.pos + len(text),
                                    "records": [{"type": t, "record": r} for t, r in records]})
        self.lines.append(text)
        self.pos += len(text) + 1


def filing(seed: int, filler: int = 2) -> dict[str, Any]:
    """One generated filing: ``{"id", "text", "gold", "statements"}`` (see the module docstring); ``filler``
    paragraphs between sections."""
    rng = random.Random(seed)
    year, quarter = rng.randint(2019, 2026), rng.randint(1, 3)
    period, prior = f"FY{year} Q{quarter}", f"FY{year - 1} Q{quarter}"
    company = rng.choice(COMPANIES)
    end = f"{year}-{3 * quarter:02d}-{30 if quarter in (2, 3) else 31}"
    w = _Writer()
    gold: dict[str, Any] = {"meta": {"company": company, "report_period": period, "report_period_end_date": end}}
    w.line(f"{company} quarterly report for the period ended {end} ({period}).")
    for section, rows in STATEMENTS.items():
        gold[section] = {name: [] for name, _ in rows}
        table = [(n, label) for n, label in rows if n not in PROSE]
        if table:
            w.line("")
            w.line(f"{section.replace('_', ' ').upper()} (in millions of USD, except per-share data, percentages "
                   f"and share counts in thousands)")
            w.line(f"{'':32}{period:>14}{prior + ' (restated)':>24}")
        for name, label in table:
            value, unit, scale = _figure(rng, name)
            before = round(value * rng.uniform(0.7, 1.2), 2 if unit != "USD" or scale == 1 else 0)
            now, then = _record(value, period, unit, scale), _record(before, prior, unit, scale)
            gold[section][name] += [now, then]
            w.line(f"{label:32}{_num(value):>14}{_num(before):>24}", [(f"{section}.{name}", now),
                                                                        (f"{section}.{name}", then)])
        for name, label in [(n, lb) for n, lb in rows if n in PROSE]:
            value, unit, scale = _figure(rng, name)
            rec = _record(value, period, unit, scale)
            gold[section][name].append(rec)
            how = "thousand" if scale == 1000 else "million"
            w.line(f"{label} stood at {_num(value)} {how}{' ' + unit if unit == 'USD' else ''} in {period}.",
                   [(f"{section}.{name}", rec)])
        for _ in range(filler):
            w.line(rng.choice(FILLER))
    _segments(rng, w, gold, period)
    w.line(f"Note 1. Amounts for {prior} were restated to reflect a change in accounting principle.")
    guide = _record(float(rng.randint(50, 90_000)), f"FY{year} Q{quarter + 1}", kind="guidance")
    gold["income_statement"]["revenue"].append(guide)
    w.line(f"Guidance: the Company expects revenue of {_num(guide['value'])} million USD for "
           f"{guide['data_period']}.", [("income_statement.revenue", guide)])
    return {"id": f"filing-{seed}", "text": "\n".join(w.lines), "gold": gold, "statements": w.statements}


def _segments(rng: random.Random, w: _Writer, gold: dict[str, Any], period: str) -> None:
    w.line("")
    w.line("REVENUE BY SEGMENT (in millions of USD)")
    for seg in rng.sample(SEGMENTS, 3):
        rec = _record(float(rng.randint(100, 20_000)), period, segment=seg, segment_type="business_segment")
        gold["income_statement"]["revenue"].append(rec)
        w.line(f"{seg:32}{_num(rec['value']):>14}", [("income_statement.revenue", rec)])


def filings(n: int, seed: int = 0, filler: int = 2) -> list[dict[str, Any]]:
    """``n`` filings from consecutive seeds."""
    return [filing(seed + i, filler) for i in range(n)]
