"""``python -m gmd.sim``: the simulator without the admin CLI (gmd-admin simulate's options)."""

from __future__ import annotations

import argparse
import sys

from gmd.common.units import DAY_S
from gmd.sim.bootstrap import DEFAULT_RESAMPLES
from gmd.sim.command import DEFAULT_POLICIES, SimulateOptions, pooled_text, run_simulate
from gmd.sim.policies import policy_names


def _parser() -> argparse.ArgumentParser:
    """The command line: its length is its options, each with its help text."""
    parser = argparse.ArgumentParser(prog="python -m gmd.sim", description=__doc__)
    parser.add_argument("--trace", help="an .swf or .swf.gz job log (required but with --pool)")
    parser.add_argument("--window", type=int, default=DAY_S, help="sample length [s]")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--orgs", type=int, default=5, help="number of organizations")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help=f"repeatable; one of {', '.join(policy_names())} (Rand:N for N samples); "
        f"default: {' '.join(DEFAULT_POLICIES)}",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processors", default="equal", help="equal or zipf")
    parser.add_argument("--total-processors", type=int, default=None)
    parser.add_argument("--unit", type=int, default=None, help="cut jobs into pieces [s]")
    parser.add_argument("--cloudshare", action="store_true", help="CloudShare's scoring too")
    parser.add_argument("--no-ref", action="store_true", help="skip Ref (no Δψ/p)")
    parser.add_argument("--assignment", default=None, help="file of 'USER ORGANIZATION' lines")
    parser.add_argument("--format", default="table", help="table, csv or json")
    parser.add_argument("--workers", type=int, default=None, help="default: all cores")
    parser.add_argument(
        "--background",
        type=float,
        default=0.0,
        help="share of each organization's users that are local: their jobs run only on its "
        "processors, before the federation's (CloudShare's Scenario 3); needs --no-ref",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="N",
        help="also order every pair of policies, with a 95%% bootstrap interval over the "
        f"contended samples from N resamples (e.g. {DEFAULT_RESAMPLES})",
    )
    parser.add_argument(
        "--contention",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="a sample is contended when a federation job waited for a processor and its jobs, "
        "started at release, need more than the processors for more than SHARE of its window "
        "(default 0: at any moment)",
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="JSON",
        help="repeatable: no simulation; --bootstrap's orderings over the samples of these "
        "runs' --format json output together (e.g. several traces)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m gmd.sim``: exit 0 with the table (or CSV, JSON) on stdout, 2 with one line
    on stderr for a bad option or trace."""
    args = _parser().parse_args(argv)
    try:
        if args.pool:
            seed = args.seed
            sys.stdout.write(
                pooled_text(args.pool, args.bootstrap, args.contention, seed, args.format)
            )
            return 0
        if args.trace is None:
            raise ValueError("--trace is required (or --pool)")
        text = run_simulate(
            SimulateOptions(
                args.trace,
                args.window,
                args.samples,
                args.orgs,
                args.policy,
                args.seed,
                args.processors,
                args.workers,
                True,
                total_processors=args.total_processors,
                unit_s=args.unit,
                cloudshare=args.cloudshare,
                assignment=args.assignment,
                reference=not args.no_ref,
                background=args.background,
                bootstrap=args.bootstrap,
                contention=args.contention,
            ),
            args.format,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
