"""The stylesheet of the HTML report, inlined into the page (the file must open with no network).

The status colors are shared by the status matrix cells and its key.
"""

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; margin: 0;
       background: #f6f7f9; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 8px; }
h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 2px solid #d9dde5; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
section.definition { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 4px 20px 18px;
                     margin-top: 24px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0 0; }
dl.meta dt { color: #5b6578; } dl.meta dd { margin: 0; }
nav a { margin-right: 12px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #d5dae3; padding: 4px 8px; text-align: left; vertical-align: top; }
.name { overflow-wrap: anywhere; min-width: 14ch; }
td.dtype { min-width: 17ch; }
.scroll { overflow-x: auto; }
th { background: #eef1f6; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; flex: 1 1 440px; max-width: 640px; }
figure svg { display: block; width: 100%; height: auto; border: 1px solid #e3e6ec; background: #fff; }
ul.legend { list-style: none; padding: 0; margin: 6px 0; display: flex; flex-wrap: wrap; gap: 2px 16px;
            font-size: 12px; }
ul.legend li { display: flex; align-items: center; gap: 6px; overflow-wrap: anywhere; }
.swatch { display: inline-block; width: 22px; border-top: 3px solid; }
.swatch.dashed { border-top-style: dashed; }
ul.key-list { margin: 4px 0; padding-left: 20px; } ul.key-list li { margin: 2px 0; }
.x-key { font-weight: 700; }
td.not-run { color: #9a5b00; font-weight: 600; }
figcaption { font-size: 12px; color: #5b6578; }
td.st { font-size: 12px; min-width: 110px; max-width: 260px; }
td.st .status { font-weight: 600; }
.st-passed { background: #d7f2dd; }
.st-incorrect_numerical, .st-incorrect_shape, .st-incorrect_dtype { background: #ffe2b8; }
.st-runtime_error { background: #ffd0d6; }
.st-compile_error { background: #e9d3f7; }
.st-timeout { background: #d3e3fb; }
.st-none { background: #f0f1f3; color: #7b8496; }
.suspect { background: #fff1a8; outline: 2px dashed #d00000; outline-offset: -3px; }
.spread { font-size: 11px; color: #5b6578; }
.footnote { font-size: 12px; margin: 2px 0 8px; }
.flag { color: #b00000; font-weight: 600; }
.log { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11px; color: #4a2530;
       word-break: break-word; margin-top: 2px; }
.best-mark { color: #0a7a2f; font-weight: 700; }
.overall { background: #eef8f0; border-left: 4px solid #0a7a2f; padding: 6px 10px; margin: 8px 0; }
.key span { display: inline-block; padding: 1px 8px; margin-right: 6px; border: 1px solid #d5dae3; font-size: 12px; }
.muted { color: #6b7486; }
p.not-run { font-size: 12px; color: #7b8496; margin: 4px 0; overflow-wrap: anywhere; }
svg.plot { font: 11px system-ui, sans-serif; }
svg.plot .frame { fill: #fff; stroke: #9aa3b2; }
svg.plot .grid { stroke: #e8eaef; }
svg.plot .end { text-anchor: end; } svg.plot .mid { text-anchor: middle; } svg.plot .title { font-size: 12px; }
svg.plot .line { stroke-width: 1.6; }
svg.plot .p10-p90 { stroke-opacity: 0.75; }
"""
