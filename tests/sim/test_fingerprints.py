"""Timing-only `simulate` records (no model: every decision and virtual time, no float32
loss) match fingerprints stored from commit 02464a6, byte for byte, for each parameter-server
mode (token queue, interrupts, push & wait), DBW, LGC's drain, DropCompute, eager-SGD and
2048-worker batches: a change to how the simulator handles its events (``topology.ps``'s
batched events, ``sim.ps.timeline``) must leave every record as it was.

The cases are ``bench/fingerprint_simulate.py``'s; that script also compares model runs of
every strategy family between two commits on one machine (float32 losses round apart across
CPUs, so those are not stored). Regenerate these only for an intended change of results:

    python bench/fingerprint_simulate.py --quick --save /tmp/f.json
"""

from __future__ import annotations

import pytest

from bench import fingerprint_simulate as fp

STORED = {
    "t:sync": "99e8bdb7d6099cd259a215344ff215fcaf9ae30a241d31d07be121a72dd0d187",
    "t:sync:mode=pull": "0bec9aeba3f8a9f7be46757444d6952f335f01dae7d41499b638fec9da938772",
    "t:k-sync": "513207536906ef5ffe178edfc863f4a8e6c77ec6ccaa57b06bcf00aa209838c9",
    "t:k-batch-sync": "f0cb1eeef20371b8321f3ea595656ce89303870e8f4fb4c9ff56ac23f2e9434b",
    "t:k-async": "79c453a71c1844776add397ef3f4ee64cbca36889c4e2e0578961d7d9fe416c3",
    "t:k-batch-async": "704e96cd0f437840c5c21d971c4e30fa7591461d6de75617b30c6af1047776a0",
    "t:k-sync-psw": "3562ac7ac378546936c752a7f04c7ed356dc9b1c5685d841768a75154c7bb6b7",
    "t:lgc-complete": "f4dde75357f641894a0853cf2a5cee421a538d40991915cccf5b171f9b4fd966",
    "t:dropcompute": "a4adc8844d580d84ad2ef4fe3753d15b7cd19b14f01f1144f779bd6ebe52db65",
    "t:eager-majority": "134f62f1f033caea1f899fb399e1264f3b4b97ddf2960f5d52a29462b0878042",
    "t:k-async-ties": "e32a18cb32962ef96ef8a5f4f7ef627075525e29c9a5e0687f6b5d0012012a2e",
    "t:k-batch-async-ties": "2cbf0285fb7609058e762eb416680c9bb55914e845c5318378d8afd66daeab1d",
    "t:k-batch-sync-ties": "0726ae21055930473d800bf69322196d99d36227f9b8a0103445149e9e80bcb6",
    "t:dbw": "f1abe486d81b1e709837ce852e8596a373a29283a3122118a38fdd9f00e67e70",
    "t:sync:mode=pull-comm": "64c13f6d507211a6347f149d4b09c678e017ef3710b93351991510c818f7c3e2",
    "t:k-async-slowdown": "680449487eb067ba0e67117b51cbb6818b54f29f10e9553512dc231de8c6b19b",
    "t:k-sync-2048": "d9f10a9fc1a5a67ffb6f3a8cbaf3d7c46558fe2e2fc5665b1d5dc2b67096c74e",
    "t:k-batch-async-2048": "0f3bc032f781a43e57fc43331dd4f03cc35f6d22b21be58a85e8755544d022bc",
}


def test_every_timing_only_case_is_stored():
    assert sorted(STORED) == sorted(name for name in fp.CASES if name.startswith("t:"))


@pytest.mark.parametrize("name", sorted(STORED))
def test_timing_only_record_matches_its_fingerprint(name):
    assert fp.fingerprint(*fp.CASES[name]) == STORED[name]
