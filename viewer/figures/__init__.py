"""Every plotly figure of goalprobe, as pure functions (the one implementation of each).

Each takes plain data (arrays, sequences, parsed JSON) and returns a new
``plotly.graph_objects.Figure``, reading no file and keeping no state, so the viewer, the
static export, the report and the application's figure files draw with the same code.
Coordinates are ``(row, col)``, row 0 drawn at the top, each cell a unit square centred on its
integer coordinates. Modules by subject: :mod:`.style` (colours, layout), :mod:`.maps`,
:mod:`.plans`, :mod:`.episodes`, :mod:`.false_belief`, :mod:`.behaviour`, :mod:`.harm`,
:mod:`.probes`, :mod:`.scoring`, :mod:`.patching`, :mod:`.attribution`, :mod:`.decision`
(import each figure from its module).
"""
