"""Bulk jobs' pure parts: manifest lines, states and counts, result merging, the upload."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from ferry.durations import parse_window
from ferry.errors import BadRequestError, PayloadTooLargeError
from ferry.jobs.manifest import LineError, Sources, read_item
from ferry.jobs.model import Counts, ItemStatus, JobStatus, Progress, end_state
from ferry.jobs.pacing import feed_share, window_room
from ferry.jobs.results import latest, result_line, segment_bytes
from ferry.jobs.upload import Limits, ManifestError, upload

SOURCES = Sources.parse("file:///mnt/images/")


def problem(raw: bytes) -> str:
    with pytest.raises(LineError) as caught:
        read_item(raw, 7, SOURCES)
    assert caught.value.problem.line == 7
    return caught.value.problem.code


def test_an_item_names_its_input_one_way() -> None:
    item = read_item(b'{"custom_id": "a", "uri": "file:///mnt/images/x.jpg"}', 1, SOURCES)
    assert (item.custom_id, item.kind, item.uri) == ("a", "uri", "file:///mnt/images/x.jpg")
    assert read_item(b'{"custom_id": "b", "inputs": [{"name": "x"}]}', 2, SOURCES).kind == \
        "inputs"
    assert problem(b'{"custom_id": "a"}') == "missing_input"
    assert problem(b'{"custom_id": "a", "input": "x", "uri": "file:///mnt/images/x"}') == \
        "ambiguous_input"
    assert problem(b'{"custom_id": "a", "input": "x", "parameters": {}}') == "invalid_field"
    assert problem(b'{"custom_id": "", "input": "x"}') == "missing_custom_id"
    assert problem(b'{"custom_id": "a\\u0000", "input": "x"}') == "invalid_custom_id"
    assert problem(b'[1]') == "malformed_json"
    assert problem(b'{"custom_id": "a", "input_base64": ""}') == "empty_input"
    assert problem(b'{"custom_id": "a", "inputs": []}') == "invalid_tensors"


@pytest.mark.parametrize("uri", [
    "file:///etc/passwd", "file:///mnt/images/../secret", "file:///mnt/images//x",
    "file:///mnt/images/x?y=1", "s3://bucket/x", "file:///mnt/images/", "http://x/y"])
def test_only_plain_paths_under_an_allowlisted_root_are_read(uri: str) -> None:
    assert SOURCES.refusal(uri)
    assert not SOURCES.refusal("file:///mnt/images/a/b.jpg")
    assert Sources().refusal("file:///mnt/images/a.jpg").startswith("this Ferry reads no URIs")


def test_job_sources_are_absolute_file_roots_or_buckets() -> None:
    assert Sources.parse(" file:///a , file:///b/ , s3://shelf/2026").roots == (
        "file:///a/", "file:///b/", "s3://shelf/2026/")
    assert not Sources.parse("s3://shelf/2026/").refusal("s3://shelf/2026/x.jpg")
    assert Sources.parse("s3://shelf/2026/").refusal("s3://shelf/2027/x.jpg")
    for bad in ("file://host/a/", "relative/", "s3:///no-bucket/", "http://x/"):
        with pytest.raises(ValueError):
            Sources.parse(bad)


def test_a_job_whose_every_item_failed_is_failed_with_a_reason() -> None:
    assert end_state(Counts(3, failed=3), JobStatus.RUNNING)[0] is JobStatus.FAILED
    assert "every one of its 3 items failed" in end_state(Counts(3, failed=3),
                                                          JobStatus.RUNNING)[1]
    assert end_state(Counts(3, succeeded=1, failed=2), JobStatus.RUNNING) == (
        JobStatus.COMPLETED, "")
    assert end_state(Counts(3, cancelled=3), JobStatus.CANCELLING)[0] is JobStatus.CANCELLED
    assert end_state(Counts(3, expired=3), JobStatus.EXPIRED)[0] is JobStatus.EXPIRED
    assert Counts(10, 2, 1, 1, 1).to_json()["pending"] == 5


def test_completion_windows_and_the_eta() -> None:
    assert parse_window(None, 60, 3600) == 60
    assert parse_window("30m", 60, 3600) == 1800
    for bad in ("0h", "2h", "1y", "h", "-1s"):
        with pytest.raises(BadRequestError):
            parse_window(bad, 60, 3600)
    assert Progress(done=100, pending=300, running_s=10).eta_s == 30
    assert Progress(done=0, pending=300, running_s=10).eta_s is None


def test_the_merge_keeps_each_items_last_result_in_line_order() -> None:
    first = segment_bytes([result_line(2, "c", ItemStatus.FAILED),
                           result_line(0, "a", ItemStatus.SUCCEEDED)])
    assert [orjson.loads(x)["line"] for x in first.splitlines()] == [1, 3]  # sorted
    merged = list(latest(iter([(1, 0, b"a"), (3, 0, b"c-failed"), (3, 2, b"c-retried"),
                               (4, 1, b"d")])))
    assert merged == [b"a", b"c-retried", b"d"]


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


class Writer:
    def __init__(self) -> None:
        self.data = b""

    async def write(self, data: bytes) -> None:
        self.data += data

    async def commit(self) -> None:
        return None

    async def abort(self) -> None:
        return None


LIMITS = Limits(max_items=3, max_bytes=1000, max_line_bytes=100)


async def test_an_upload_checks_lines_across_chunks_and_reports_every_bad_one() -> None:
    writer = Writer()
    tally = await upload(chunks(b'{"custom_id": "a", "in', b'put": "x"}\n{"custom_id": "b", ',
                                b'"input": "y"}'), writer, SOURCES, LIMITS, lambda _: "")
    assert tally.lines == 2 and writer.data.endswith(b"}\n")
    with pytest.raises(ManifestError) as caught:
        await upload(chunks(b'{"custom_id": "a", "input": "x"}\n\n{"custom_id": "a", '
                            b'"input": "x"}\n'), Writer(), SOURCES, LIMITS,
                     lambda _: "model says no")
    assert [(p.line, p.code) for p in caught.value.problems] == [
        (1, "invalid_input"), (2, "empty_line"), (3, "duplicate_custom_id")]


async def test_an_upload_over_its_limits_is_refused_at_once() -> None:
    item = b'{"custom_id": "%d", "input": "x"}\n'
    with pytest.raises(PayloadTooLargeError, match="job_max_items"):
        await upload(chunks(*(item % i for i in range(4))), Writer(), SOURCES, LIMITS,
                     lambda _: "")
    with pytest.raises(PayloadTooLargeError, match="job_max_bytes"):
        await upload(chunks(*(b"x" * 90 + b"\n" for _ in range(12))), Writer(), SOURCES,
                     Limits(max_items=100, max_bytes=1000, max_line_bytes=100), lambda _: "")
    with pytest.raises(PayloadTooLargeError, match="exceeds 100 bytes"):
        await upload(chunks(b"x" * 150), Writer(), SOURCES, LIMITS, lambda _: "")
    with pytest.raises(BadRequestError, match="no items"):
        await upload(chunks(b""), Writer(), SOURCES, LIMITS, lambda _: "")


def test_jobs_step_back_as_interactive_work_queues() -> None:
    # 100 tasks/s in 0.1 s batches: calm under 0.2 s of queued interactive work, busy past 0.4 s
    assert feed_share(0, 100.0, 0.1) == 1.0
    assert feed_share(20, 100.0, 0.1) == 1.0
    assert feed_share(30, 100.0, 0.1) == pytest.approx(0.5)
    assert feed_share(40, 100.0, 0.1) == 0.0
    assert feed_share(5000, 0.0, 0.1) == 1.0  # not measured yet: nothing to go by
    assert feed_share(2, 100.0, 0.0) == 1.0  # batch time unmeasured: 10 ms assumed
    assert feed_share(4, 100.0, 0.0) == 0.0
    assert window_room(256, 0.5, 100) == 28
    assert window_room(256, 0.0, 100) == 0
