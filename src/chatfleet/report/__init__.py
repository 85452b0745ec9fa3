"""`chatfleet report`: an HTML report (inline SVG plots) and a Markdown summary of sweeps.

    from chatfleet.report.build import build_report
    written = build_report(["out/l4-bf16", "out/l4-fp8"], out_dir="out/cmp")
    written.html, written.markdown
    build_report(["out/demo/twin-fp8.json"], live_proof="out/demo/live/proof.json")

Input errors raise `chatfleet.report.load.ReportInputError` (a ValueError). See docs/report.md.

This package's own module imports nothing: reading a sweep (`report.load`), which the command
line's options do for every command, must not import matplotlib (0.3 s), which only drawing
(`report.build`, `report.plots`) needs.
"""
