"""Load an HTML file in headless Chromium over the DevTools protocol and report what happened:
console messages and errors, every network request, selected DOM facts, a full-page screenshot
and a printed PDF.

Used by tests/report/test_browser.py and by ``make report-screenshot`` (``python -m
tests.report.chromium``), which regenerates docs/img/report.png from the sample trail.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["CHROMIUM_FLAGS", "PageResult", "find_chromium", "inspect_page"]

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
)

# What the page is asked once it has loaded (JSON-serialisable facts).
_PROBE = """(() => ({
  title: document.title,
  sections: [...document.querySelectorAll('main > section[id]')].map(s => s.id),
  headings: [...document.querySelectorAll('h2')].map(h => h.textContent.trim()),
  banner: (document.getElementById('integrity-banner') || {}).textContent || null,
  scripts: document.scripts.length,
  svgs: document.querySelectorAll('svg[role=img]').length,
  svgTitles: [...document.querySelectorAll('svg[role=img] > title')].map(t => t.textContent),
  bars: document.querySelectorAll('svg rect').length,
  tables: document.querySelectorAll('table').length,
  tablesWithoutHeaders: [...document.querySelectorAll('table')].filter(t => !t.querySelector('th')).length,
  colHeadersWithoutScope: document.querySelectorAll('thead th:not([scope])').length,
  text: document.body.innerText,
  lang: document.documentElement.lang,
  pageRules: [...document.styleSheets].flatMap(s => [...s.cssRules])
    .filter(r => r.constructor.name === 'CSSPageRule').map(r => r.cssText),
}))()"""


@dataclass
class PageResult:
    facts: dict[str, Any]
    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    screenshot: bytes = b""
    pdf: bytes = b""

    @property
    def errors(self) -> list[str]:
        """Everything that counts as a page error: console errors, exceptions, log errors."""
        return (
            [t for level, t in self.console if level in ("error", "assert")]
            + self.exceptions
            + self.log_errors
        )


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _Session:
    """A minimal DevTools-protocol client over one page's websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = await asyncio.wait_for(self.ws.receive(), max(deadline - time.monotonic(), 0.01))
            if message.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"DevTools connection closed ({message.type})")
            data = json.loads(message.data)
            if data.get("id") == ident:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                result: dict[str, Any] = data.get("result", {})
                return result
            if "method" in data:
                self.events.append(data)

    async def wait_for(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        for seen in self.events:
            if seen["method"] == event:
                return seen
        deadline = time.monotonic() + timeout
        while True:
            message = await asyncio.wait_for(self.ws.receive(), max(deadline - time.monotonic(), 0.01))
            if message.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"DevTools connection closed ({message.type})")
            data = json.loads(message.data)
            if "method" in data:
                self.events.append(data)
                if data["method"] == event:
                    return data


@contextlib.asynccontextmanager
async def _browser(binary: str, profile: Path) -> AsyncIterator[int]:
    process = subprocess.Popen(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its zygote, renderers and crashpad handler in a group of their own
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while True:  # Chromium writes the port it bound once it listens
            if port_file.exists() and port_file.read_text().strip():
                port = int(port_file.read_text().split()[0])
                break
            if process.poll() is not None:
                raise RuntimeError(f"chromium exited with status {process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port within 30 s")
            await asyncio.sleep(0.05)
        yield port
    finally:
        stop_group(process)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def stop_group(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Stop the browser and every process it started, and return only once they are all gone.

    Terminating the browser alone left its children (zygote, renderers, the crashpad handler)
    running for a moment, still writing into the profile: the profile's removal then failed now
    and then with "Directory not empty: 'Default'" on a loaded machine."""
    pgid = process.pid  # the session leader of start_new_session
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.02)


async def _inspect(binary: str, html: Path, profile: Path, width: int, max_height: int) -> PageResult:
    async with _browser(binary, profile) as port, aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 30
        while True:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no page target in chromium")
            await asyncio.sleep(0.05)
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _Session(ws)
            for domain in ("Page", "Runtime", "Log", "Network"):
                await cdp.call(f"{domain}.enable")
            await cdp.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            await cdp.call("Page.navigate", url=html.resolve().as_uri())
            await cdp.wait_for("Page.loadEventFired")
            probe = await cdp.call("Runtime.evaluate", expression=_PROBE, returnByValue=True)
            facts: dict[str, Any] = probe["result"]["value"]
            metrics = await cdp.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            shot = await cdp.call(
                "Page.captureScreenshot",
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": width, "height": min(size["height"], max_height), "scale": 1},
            )
            pdf = await cdp.call(
                "Page.printToPDF", timeout=60.0, printBackground=True, preferCSSPageSize=True
            )
            result = PageResult(
                facts=facts, screenshot=base64.b64decode(shot["data"]), pdf=base64.b64decode(pdf["data"])
            )
            for event in cdp.events:
                method, params = event["method"], event.get("params", {})
                if method == "Runtime.consoleAPICalled":
                    text = " ".join(
                        str(a.get("value", a.get("description", ""))) for a in params.get("args", [])
                    )
                    result.console.append((params.get("type", ""), text))
                elif method == "Runtime.exceptionThrown":
                    result.exceptions.append(str(params.get("exceptionDetails", {}).get("text", "")))
                elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                    result.log_errors.append(str(params["entry"].get("text", "")))
                elif method == "Network.requestWillBeSent":
                    result.requests.append(str(params.get("request", {}).get("url", "")))
            return result


def inspect_page(
    html: Path, *, binary: str | None = None, width: int = 1200, max_height: int = 16000
) -> PageResult:
    """Open ``html`` in a fresh headless Chromium (own temporary profile) and collect the result;
    the screenshot covers the page's top ``max_height`` pixels."""
    chosen = binary or find_chromium()
    if chosen is None:
        raise FileNotFoundError("chromium not found")
    with tempfile.TemporaryDirectory(prefix="mpigate-chromium-") as profile:
        return asyncio.run(_inspect(chosen, html, Path(profile), width, max_height))


def _main() -> int:
    """Regenerate docs/img/report.png: write the sample trail, render its report, screenshot it."""
    import argparse

    from mpigate.audit import HmacSigner, KeyRing
    from mpigate.report import ReportOptions, build_report, render

    from .sample import write_sample

    parser = argparse.ArgumentParser(description=_main.__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/img/report.png"))
    parser.add_argument("--html", type=Path, help="also keep the rendered HTML here")
    parser.add_argument("--max-height", type=int, default=2000, help="pixels of the page's top to keep")
    args = parser.parse_args()
    secret = b"sample-secret-0123456789abcdef!!"
    with tempfile.TemporaryDirectory(prefix="mpigate-report-sample-") as tmp:
        root = Path(tmp)
        audit, k8s = write_sample(root, HmacSigner(secret))
        (root / "key").write_bytes(secret)
        report = build_report(
            [audit],
            [k8s],
            keys=KeyRing.load([root / "key"]),
            options=ReportOptions(generated="2026-12-01T08:00:00.000Z"),
        )
        html = args.html or root / "report.html"
        html.write_text(render(report, "html"), encoding="utf-8")
        result = inspect_page(html, max_height=args.max_height)
    if result.errors or len(result.requests) != 1:
        print(f"page problems: errors={result.errors} requests={result.requests}")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(result.screenshot)
    print(
        f"wrote {args.out} ({len(result.screenshot):,} bytes; page of {len(result.pdf):,} PDF bytes in print)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
