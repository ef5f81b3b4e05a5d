"""``tailtrain.tasks`` loads its names on first use (issue 35 item 6; its table is held to its
names in ``tests/test_lazy.py``): taking the light ``stream`` or ``partition`` loads no built-in
task."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_stream_loads_no_built_in_task():
    code = (
        "import sys\nfrom tailtrain.tasks.stream import deal\n"
        "from tailtrain.tasks import parse_partition\n"
        "import json\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tailtrain.tasks.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["tailtrain.tasks.partition", "tailtrain.tasks.stream"]
