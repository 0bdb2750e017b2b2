"""How long `make demo` takes: the whole demo (daemon, one agent process per host replaying
Bitbrains VMs, accounting with level decisions, the gmd-admin commands, the plot).

    python bench/demo.py --days 3 --hosts 4

The demo's own output goes to /dev/null; prints one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

from gmd.admin import demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--vms", default="1-100")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
        figures = demo.run(
            Path(tmp) / "demo",
            demo.default_traces(),
            vms=args.vms,
            hosts=args.hosts,
            days=args.days,
            out=sink,
        )
    keep = ("vms", "hosts", "simulated_days", "intervals", "batches", "replay_s")
    result = {k: figures[k] for k in keep}
    result |= {
        "accounting_s": figures["accounting_s"],
        "total_s": figures["total_s"],
        "python": platform.python_version(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
