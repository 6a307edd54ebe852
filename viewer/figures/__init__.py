"""Every plotly figure of goalprobe, as pure functions (the one implementation of each), one
module per subject (:mod:`.style` holds the colours and the layout; import each figure from its
module). Each takes plain data (arrays, sequences, parsed JSON) and returns a new
``plotly.graph_objects.Figure``, reading no file and keeping no state, so the viewer, the
static export, the report and the application's figure files draw with the same code.
Coordinates are ``(row, col)``, row 0 drawn at the top, each cell a unit square centred on its
integer coordinates.
"""
