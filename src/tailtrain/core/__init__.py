"""What any run is, whatever its clock, and with no process group: the scenario and its seeded
world, the run record and its folder, checkpoints, evaluations, the shared weighted-update path,
memory refusals, and how a run is kept (``session``). The simulator (``tailtrain.sim``) and the
real runtime (``tailtrain.runtime``) both build on it."""
