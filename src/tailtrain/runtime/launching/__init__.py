"""Starting the ranks: the top of the runtime, above every topology.

``tailtrain train`` starts through ``launch`` (one rank under torchrun, or N local ranks),
after ``checks`` and ``endpoint`` refuse bad input before any process starts; every rank
runs ``rank_entry`` and the topology that ``topologies`` names; a failure is one line
(``failures``). Your own model on the parameter server starts through ``own_model``, your
own script under ``tailtrain launch`` through ``scripts`` (each rank's bootstrap:
``script_rank``), and the drills' plain functions through ``local``. Nothing below imports
this package."""
