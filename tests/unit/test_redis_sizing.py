"""Redis' memory for a load (``ferry.planner.memory``): the rule against the figures that
``python -m loadtest.redis_memory`` measured, maxmemory, sizes as flags take them, the fit the
measurement makes, and the lines ``ferry plan size`` prints."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import replace

import pytest

from ferry.cli import main
from ferry.errors import ConfigError
from ferry.planner import arrivals
from ferry.planner.command import memory_rows, redis_loads, sizing_json, sizing_table
from ferry.planner.costs import CostModel
from ferry.planner.memory import (
    CACHE_ENTRY_BYTES,
    FIXED_BYTES,
    MAXMEMORY_HEADROOM,
    RedisLoad,
    RedisSizes,
    byte_size,
    human,
    kept_result_bytes,
    maxmemory,
    redis_memory,
    unfinished_task_bytes,
)
from ferry.planner.search import Sizing, Target, size
from loadtest.redis_memory import firm, upper_line

MIB = 1 << 20
# What loadtest.redis_memory measured (Redis 7.0.15, jemalloc 5.3.0), bytes per task: an
# unfinished task (read by a batcher) by payload, a kept result (no cache entry) by output JSON.
MEASURED_UNFINISHED = {2048: 3_836, 204_800: 230_710, 1_048_576: 1_312_126}
MEASURED_RESULT = {105: 1_294, 2_061: 3_508, 204_813: 230_363, 1_048_589: 1_311_761}


@pytest.mark.parametrize(("measured", "rule"), [
    (MEASURED_UNFINISHED, unfinished_task_bytes), (MEASURED_RESULT, kept_result_bytes)])
def test_the_rule_is_at_or_just_below_every_measured_figure_and_at_most_13_percent_above(
    measured: dict[int, int], rule: Callable[[int], float],
) -> None:
    for size_bytes, figure in measured.items():
        assert -0.001 <= rule(size_bytes) / figure - 1 <= 0.13, size_bytes


def test_the_rule_adds_its_parts() -> None:
    load = RedisSizes(payload_bytes=2048, output_bytes=256, result_ttl_s=600,
                      cache_ttl_s=300).at(400, 4000)
    memory = redis_memory(load)
    assert load.kept_results == 240_000 and load.cache_entries == 120_000
    assert memory.unfinished == 4000 * unfinished_task_bytes(2048)
    assert memory.results == 240_000 * kept_result_bytes(256)
    assert memory.cache == 120_000 * CACHE_ENTRY_BYTES
    assert memory.total == FIXED_BYTES + memory.unfinished + memory.results + memory.cache
    assert 300 * MIB < memory.total < 400 * MIB


def test_the_cache_lives_at_most_while_the_result_and_not_at_all_when_off() -> None:
    assert RedisSizes(result_ttl_s=60, cache_ttl_s=300).at(10, 0).cache_entries == 600
    assert redis_memory(RedisSizes(cache_ttl_s=0).at(10, 0)).cache == 0


def test_maxmemory_has_headroom_over_the_design_load_in_whole_mib_per_master() -> None:
    design = RedisSizes().at(480, 5000)
    total = redis_memory(design).total
    one = maxmemory(design)
    assert one % MIB == 0 and 0 <= one - MAXMEMORY_HEADROOM * total < MIB
    three = maxmemory(design, masters=3)
    share = FIXED_BYTES + (total - FIXED_BYTES) / 3
    assert 0 <= three - MAXMEMORY_HEADROOM * share < MIB


@pytest.mark.parametrize(("text", "expected"), [
    ("2048", 2048), ("2K", 2048), ("2kb", 2048), ("2 KiB", 2048), ("200K", 204_800),
    ("1.5M", 1_572_864), ("1G", 1 << 30), ("0", 0)])
def test_sizes_take_binary_units(text: str, expected: int) -> None:
    assert byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "2X", "K", "-1", "2 K B"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        byte_size(text)


@pytest.mark.parametrize(("size_bytes", "shown"), [
    (512, "512 B"), (2048, "2 KiB"), (204_800, "200 KiB"), (1536 * 1024, "1.5 MiB"),
    (int(1.23 * (1 << 30)), "1.2 GiB"), (12 << 30, "12 GiB")])
def test_sizes_are_shown_in_binary_units(size_bytes: int, shown: str) -> None:
    assert human(size_bytes) == shown


def test_impossible_loads_are_refused() -> None:
    with pytest.raises(ConfigError):
        RedisSizes(payload_bytes=-1)
    with pytest.raises(ConfigError):
        RedisSizes(result_ttl_s=0)
    with pytest.raises(ConfigError):
        RedisLoad(-1.0, 0)


def test_the_fit_passes_through_the_smallest_size_and_over_a_staircase() -> None:
    on_a_line = upper_line([(100, 1100), (1000, 2000), (10_000, 11_000)])
    assert on_a_line.base == pytest.approx(1000) and on_a_line.per_byte == pytest.approx(1)
    assert on_a_line.over == pytest.approx(0) and on_a_line.under == 0
    # A size class that fits snugly (a step below the line) does not lower the line
    stairs = upper_line([(100, 1100), (1000, 1800), (10_000, 11_000)])
    assert stairs.at(1000) > 1800 and stairs.under == 0
    assert stairs.over == pytest.approx(2000 / 1800 - 1)


def test_the_fit_takes_the_dearest_of_the_smallest_sizes_and_needs_a_larger_one() -> None:
    line = upper_line([(105, 1100), (107, 1130), (2000, 3500)])
    assert line.at(107) == pytest.approx(1130)
    with pytest.raises(ValueError, match="twice"):
        upper_line([(100, 1000), (150, 1100)])


def test_figures_within_the_noise_are_not_fitted() -> None:
    assert firm(1100, 2000) and not firm(1100, 100) and firm(1_300_000, 100)


@pytest.fixture(scope="module")
def sizing() -> Sizing:
    return size(CostModel(0.01, 0.001), Target(qps=100, p99_s=0.2, search_seconds=5,
                                               check_seconds=5), arrivals.poisson)


def test_unfinished_tasks_are_the_backlog_bound_or_else_littles_law(sizing: Sizing) -> None:
    at_target, at_design = redis_loads(sizing, RedisSizes())
    assert at_target.unfinished == at_design.unfinished == sizing.deployment.max_backlog > 0
    assert at_design.rate_per_s == pytest.approx(120)
    unbounded = replace(sizing, deployment=replace(sizing.deployment, max_backlog=0))
    at_target, _ = redis_loads(unbounded, RedisSizes())
    assert at_target.unfinished == math.ceil(100 * sizing.at_target.mean_s)
    assert "no backlog bound" in memory_rows(unbounded, RedisSizes())[1][1]


def test_the_table_shows_redis_memory_only_when_given_sizes(sizing: Sizing) -> None:
    assert "Redis memory" not in sizing_table(sizing)  # as make plan-check prints it
    table = sizing_table(sizing, redis=RedisSizes(payload_bytes=200 * 1024))
    line = next(row for row in table.splitlines() if row.startswith("Redis memory "))
    assert "at 100/s with 200 KiB payloads, results kept 600 s; set maxmemory ≥" in line
    assert line.endswith("noeviction")
    cluster = replace(sizing, redis_shards=3)
    assert "on each of its 3 masters" in sizing_table(cluster, redis=RedisSizes())


def test_the_command_takes_the_sizes_and_prints_the_memory() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["plan", "size", "--qps", "20", "--p99-ms", "200", "--t-fixed-ms", "10",
                     "--t-per-ms", "1", "--seconds", "5", "--no-cpu", "--payload-bytes", "200K",
                     "--output-bytes", "2K", "--result-ttl-s", "60", "--cache-ttl-s", "0"]) == 0
    assert "with 200 KiB payloads, results kept 60 s; set maxmemory" in out.getvalue()
    assert "1,200 results of 2 KiB" in out.getvalue()
    assert "cache entries" not in out.getvalue()


def test_the_json_has_the_memory_by_part_and_maxmemory(sizing: Sizing) -> None:
    sizes = RedisSizes(payload_bytes=204_800, cache_ttl_s=0)
    memory = json.loads(json.dumps(sizing_json(sizing, redis=sizes)))["redis_memory"]
    assert memory["payload_bytes"] == 204_800 and memory["kept_results"] == 60_000
    assert memory["cache_bytes"] == 0 and memory["maxmemory_per"] == "server"
    parts = ("fixed_bytes", "unfinished_bytes", "results_bytes", "cache_bytes")
    assert memory["bytes"] == pytest.approx(sum(memory[part] for part in parts))
    assert memory["maxmemory_bytes"] >= MAXMEMORY_HEADROOM * memory["bytes"]
    assert "redis_memory" not in sizing_json(sizing)
