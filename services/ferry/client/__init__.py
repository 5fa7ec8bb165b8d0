"""A typed client of Ferry's own ``/v1`` API, sync (``Client``) and asyncio (``AsyncClient``).

    from ferry.client import Client
    with Client("http://127.0.0.1:8000") as ferry:
        print(ferry.infer("sim", "hello").output)

Calls are retried on connection errors, 429 and 503 (``RetryPolicy``), a submission's every
try carrying the same ``Idempotency-Key``; refusals raise ``FerryError`` subclasses, one per
error code (``ferry.client.errors``). It imports httpx, orjson and the standard library only.
"""

from ferry.client.async_client import AsyncClient, AsyncJobResults, AsyncTask
from ferry.client.errors import (
    ConnectionFailedError,
    FerryError,
    OverloadedError,
    ResultTimeoutError,
    UnavailableError,
)
from ferry.client.records import (
    JobList,
    JobRecord,
    JobStatus,
    ResultLine,
    TaskResult,
    TaskStatus,
)
from ferry.client.retrying import RetryPolicy
from ferry.client.sync_client import Client, JobResults, Task

__all__ = [
    "AsyncClient", "AsyncJobResults", "AsyncTask", "Client", "ConnectionFailedError",
    "FerryError", "JobList", "JobRecord", "JobResults", "JobStatus", "OverloadedError",
    "ResultLine", "ResultTimeoutError", "RetryPolicy", "Task", "TaskResult", "TaskStatus",
    "UnavailableError",
]
