"""`python -m benchmarks [--quick]`: run every benchmark, print and write RESULTS.md."""

import pathlib
import sys

from . import api, check, checkpoint, library, lowering, suite, testers

SCRIPTS = [lowering, api, checkpoint, testers, check, library, suite]


def main() -> int:
    quick = "--quick" in sys.argv
    parts = [f"# Benchmark results{' (quick mode: small sizes, one round)' if quick else ''}\n"]
    for script in SCRIPTS:
        section = script.run(quick=quick)
        print(section, flush=True)
        parts.append(section)
    if not quick:
        (pathlib.Path(__file__).parent / "RESULTS.md").write_text("\n\n".join(parts) + "\n")
    return 0


sys.exit(main())
