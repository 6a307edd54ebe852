"""The viewer's page: its stylesheet, its keyboard shortcuts and the HTML template around the
Dash app (served from the package: no network, no external assets)."""

from __future__ import annotations

CSS = """
* { box-sizing: border-box; }
body { margin: 0; font-family: Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif;
       color: #1f2933; background: #f5f6f8; font-size: 14px; }
.gp-header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px;
             background: #1d3557; color: white; }
.gp-header h1 { font-size: 18px; margin: 0; font-weight: 600; }
.gp-header .gp-run { font-size: 13px; opacity: .85; }
.gp-notice { margin: 12px 20px 0; padding: 10px 14px; background: #fff8e1;
             border: 1px solid #f2d47a; border-radius: 6px; font-size: 13px; }
.gp-notice summary { cursor: pointer; font-weight: 600; }
.gp-notice ul { margin: 6px 0 0; padding-left: 20px; }
.gp-error { margin: 0 0 10px; padding: 8px 12px; background: #fdecea; border: 1px solid #f5c2c0;
            border-radius: 6px; color: #8a1c1c; }
.gp-body { display: flex; gap: 16px; padding: 12px 20px 24px; align-items: flex-start; }
.gp-side { flex: 0 0 290px; background: white; border-radius: 8px; padding: 14px;
           box-shadow: 0 1px 2px rgba(0,0,0,.06); position: sticky; top: 12px; }
.gp-side h3 { font-size: 12px; text-transform: uppercase; letter-spacing: .06em; color: #52606d;
              margin: 14px 0 6px; }
.gp-side h3:first-child { margin-top: 0; }
.gp-side label.gp-label { display: block; font-size: 12px; color: #52606d; margin: 8px 0 3px; }
.gp-main { flex: 1 1 auto; min-width: 0; display: flex; flex-direction: column; gap: 12px; }
.gp-card { background: white; border-radius: 8px; padding: 8px 10px;
           box-shadow: 0 1px 2px rgba(0,0,0,.06); min-width: 0; }
.gp-row3 { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 12px; }
.gp-row2 { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px; }
.gp-stepbar { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; }
.gp-badge { display: inline-block; padding: 3px 9px; border-radius: 999px; font-size: 13px;
            background: #e9ecef; }
.gp-badge.ok { background: #d8f3dc; color: #1b4332; }
.gp-badge.bad { background: #f8d7da; color: #842029; }
.gp-badge.info { background: #e7e0f5; color: #4a1f8a; }
.gp-count { font-size: 12px; color: #52606d; margin-top: 4px; }
.gp-buttons { display: flex; gap: 6px; margin-top: 8px; }
.gp-buttons button { flex: 1; padding: 5px 0; border: 1px solid #c5ccd3; background: #f8f9fa;
                     border-radius: 5px; cursor: pointer; font-size: 13px; }
.gp-buttons button:hover { background: #e9ecef; }
.gp-text h4 { margin: 4px 0; font-size: 13px; color: #52606d; }
.gp-text pre { white-space: pre-wrap; word-break: break-word; margin: 0 0 8px;
               font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: 12.5px;
               background: #f8f9fa; border-radius: 5px; padding: 8px; max-height: 220px;
               overflow: auto; }
.gp-reasoning { white-space: pre-wrap; word-break: break-word; margin: 0 0 8px;
                font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: 12.5px;
                background: #f8f9fa; border-radius: 5px; padding: 8px; max-height: 260px;
                overflow: auto; line-height: 1.6; }
.gp-chunk { border-radius: 2px; padding: 1px 0; }
.gp-table { border-collapse: collapse; font-size: 13px; }
.gp-table td, .gp-table th { padding: 3px 10px; border-bottom: 1px solid #eceff1; text-align: left; }
.gp-empty { color: #6c757d; padding: 20px; }
.gp-caption { font-size: 13px; color: #3e4c59; margin: 4px 8px 6px; max-width: 70em; }
.gp-agents { display: flex; gap: 6px; align-items: baseline; font-size: 13px; margin-left: auto; }
.gp-agents a { color: #dbe4ee; text-decoration: none; padding: 2px 8px; border-radius: 999px;
               border: 1px solid rgba(255,255,255,.35); }
.gp-agents a.current { background: white; color: #1d3557; }
#overview { padding: 12px 0; }
.gp-legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 12px; color: #3e4c59;
             padding: 4px 2px 2px; border-top: 1px solid #eceff1; margin-top: 4px; }
.gp-legend-item { display: inline-flex; align-items: center; gap: 6px; }
.gp-swatch { width: 13px; height: 13px; border: 1px solid #8a8f98; border-radius: 2px;
             display: inline-block; }
.gp-line { width: 20px; height: 4px; border-radius: 2px; display: inline-block; }
.gp-ring { width: 12px; height: 12px; border: 3px solid; border-radius: 50%;
           display: inline-block; }
"""

KEYS = """
document.addEventListener('keydown', function (event) {
  if (event.key !== 'ArrowLeft' && event.key !== 'ArrowRight') { return; }
  if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) { return; }
  const t = event.target;
  if (t && t.closest && t.closest('input, textarea, select, [contenteditable=true], ' +
      '[role=slider], [role=combobox], [role=listbox], .dash-dropdown, .rc-slider')) { return; }
  const ids = event.key === 'ArrowLeft' ? ['prev', 'fb-prev', 'fog-prev']
                                         : ['next', 'fb-next', 'fog-next'];
  const button = ids.map(id => document.getElementById(id))
    .find(b => b && b.offsetParent !== null);
  if (button) { event.preventDefault(); button.click(); }
});
"""
"""Left and right arrows press the step buttons of the open tab (the episode explorer's, the
false-belief tab's or the fog tab's), unless a control that uses arrows has focus."""

INDEX = (
    """<!DOCTYPE html>
<html>
  <head>
    {%metas%}
    <title>{%title%}</title>
    {%favicon%}
    {%css%}
    <style>"""
    + CSS
    + """</style>
  </head>
  <body>
    {%app_entry%}
    <footer>{%config%}{%scripts%}{%renderer%}</footer>
    <script>"""
    + KEYS
    + """</script>
  </body>
</html>"""
)
