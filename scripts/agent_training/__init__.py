"""Training of the bundled agents, run by ``scripts/train_default_agent.py`` (not part of the
library: the toolkit measures agents, it does not train them).

* :mod:`agent_training.training_data`: one example per episode step, its harmony prompt and
  target completion, batched with the positions the auxiliary losses need.
* :mod:`agent_training.supervision`: the shipped agent's training-only signals (cell-coordinate
  read-out, attention supervision).
* :mod:`agent_training.map_supervision`: the map agent's (map read-out at the anchors, anchor
  routing, the interchange objective).
* :mod:`agent_training.training`: the losses and the shared-prefix loop.
* :mod:`agent_training.evaluation`: behaviour on held-out grids and the model cards.

The architecture the loop builds is the library's :mod:`goalprobe.agents.bundled`. The scripts
run with ``scripts/`` on ``sys.path`` (Python puts a script's folder there); the tests add it in
``tests/agents/conftest.py``.
"""
