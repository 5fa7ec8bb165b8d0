"""``/docs`` renders in a real browser with no network: Swagger UI's script and style are the
package's own files, so a machine with no internet (most GPU clusters) gets the page, not a
blank one. Debian's Chromium (scripts/install-chromium.sh) runs headless with every host but
loopback unresolvable, and its DOM, after the scripts ran, holds the rendered operations."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ferry.stack.ports import LOOPBACK, free_port
from tests.conftest import TritonServer
from tests.integration.helpers import Served, gateway_settings, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
CHROMIUM = shutil.which("chromium")


@pytest.fixture
async def served(redis_url: str, triton_server: TritonServer) -> AsyncIterator[Served]:
    async with serving(gateway_settings(redis_url, triton_server.grpc_url,
                                        port=free_port())) as ferry:
        yield ferry


async def rendered(url: str, profile: Path) -> str:
    """The page's DOM once its scripts have run, as an offline Chromium sees it."""
    assert CHROMIUM, "chromium is missing: scripts/install-chromium.sh (make tools) installs it"
    browser = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
        # offline: no name resolves but loopback, so a CDN script would never load
        f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {LOOPBACK}",
        "--virtual-time-budget=15000", "--dump-dom", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    dom, _ = await asyncio.wait_for(browser.communicate(), 60)
    return dom.decode()


async def test_docs_render_offline_from_the_package(served: Served, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=served.http) as client:
        page = (await client.get("/docs")).text
        assert "cdn" not in page.lower() and "/docs/assets/swagger-ui-bundle.js" in page
        script = await client.get("/docs/assets/swagger-ui-bundle.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    dom = await rendered(f"{served.http}/docs", tmp_path / "profile")
    assert 'class="swagger-ui' in dom, dom[:500]
    assert "opblock" in dom and 'data-path="/v1/inference"' in dom, dom[:2000]
    assert 'data-path="/v1/result/{task_id}"' in dom
