"""The run report: one self-contained HTML page (no CDN, no network: the page is one file).

- :mod:`memagent.report.html`: row views, summary sections and the page itself (tables in, HTML out).
- :mod:`memagent.report.fields`: an extraction run's per-field values, evidence and summary.
- :mod:`memagent.report.retention_view`: per row with known evidence (needles, supporting paragraphs)
  each item's states over the memory steps (``rt``), and the summary's capture/retention rates.
- ``assets/report.css``, ``assets/report.js``: the page's style and script, package data that
  :mod:`~memagent.report.html` inlines into every page.

The script reads the row data embedded as JSON (``#report-data``), renders the filterable,
sortable row table a page at a time, and renders one row's timeline on demand. Hash routes:
``#row=KEY`` shows a row's timeline; ``#filter=method=M&task=T&length=L&status=S&err=N&q=TEXT``
(``status=evlost``: rows that lost evidence) sets the table filters (the eval table's cells and the error groups
link to them);
``#filter=field=F&value=V`` lists the rows whose extracted field F is V (a value's JSON text; ``*``
any value, empty: no value). Extraction rows (``x``: per field [name, value JSON, step, start, end])
get one column per field and, in the timeline, each value linked to its evidence span.

Reading and writing outputs (local or S3) is :mod:`pipelines.report`'s; nothing here does I/O
beyond reading the assets.
"""
