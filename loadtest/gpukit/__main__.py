"""``python -m loadtest.gpukit run [--cpu]``: the kit's run (scripts/gpu-kit.sh calls it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path

from loadtest.bench.goodput import replace_section
from loadtest.gpukit import report
from loadtest.gpukit.run import Kit, Options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpukit")
    actions = parser.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="Triton alone and Ferry on this machine's GPU")
    run.add_argument("--out", type=Path, required=True, help="where the report goes")
    run.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one)")
    run.add_argument("--cpu", action="store_true", help="the dry run: a tiny numpy model on "
                     "the CPU, no GPU needed")
    run.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time")
    run.add_argument("--arch", default="resnet50", help="the torchvision classifier")
    run.add_argument("--instances", default="1,2", help="instance counts, comma-separated")
    run.add_argument("--interval-ms", type=int, default=700, help="perf_analyzer's window")
    run.add_argument("--threads", type=int, default=0, help="perf_analyzer's sending threads, "
                     "each its own connection (default: two per gateway process)")
    run.add_argument("--gateways", type=int, default=0, help="Ferry's gateway processes "
                     "(default: 3 per 8 cores)")
    run.add_argument("--batchers", type=int, default=0, help="Ferry's batchers (default: 2, "
                     "sharing the model's instances)")
    run.add_argument("--redis-masters", type=int, default=1, help="Ferry's Redis: one server "
                     "(1), or a Redis Cluster of this many masters, the partitions spread "
                     "over them")
    run.add_argument("--setting", action="append", default=[], metavar="FERRY_NAME=VALUE",
                     help="a Ferry setting for its gateway and batchers, over the kit's own "
                     "(repeatable; named in the report)")
    run.add_argument("--input-kind", choices=("image", "bytes"), default="image",
                     help="what Ferry's gateway checks of each request: 'image' decodes it "
                     "(the default for an image model), 'bytes' nothing")
    write = actions.add_parser("section", help="put kit runs' figures in BENCHMARKS.md's "
                               "section \"On a GPU\"")
    write.add_argument("results", type=Path, nargs="+", help="gpu-kit.json files of runs")
    write.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.action == "section":
        results = [json.loads(path.read_text()) for path in args.results]
        lines = report.section(results, [str(path) for path in args.results])
        old = args.out.read_text() if args.out.exists() else ""
        args.out.write_text(replace_section(old, lines, report.HEADING))
        print(f"wrote {report.HEADING!r} of {args.out}")
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(name)s %(message)s")
    work = args.work or Path(tempfile.mkdtemp(prefix="ferry-kit-"))
    options = Options(out=args.out, work=work, cpu=args.cpu, budget_s=args.budget_s,
                      arch=args.arch, interval_ms=args.interval_ms, threads=args.threads,
                      gateways=args.gateways, batchers=args.batchers,
                      input_kind=args.input_kind, redis_masters=args.redis_masters,
                      instance_counts=tuple(int(n) for n in args.instances.split(",")),
                      settings=tuple(args.setting))
    result = asyncio.run(Kit(options).run())
    print((args.out / "gpu-kit.md").read_text())
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
