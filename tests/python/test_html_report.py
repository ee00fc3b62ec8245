"""tests/python/test_html_report.py — `--html` on `run` and `explain`, rendered in a real
browser, and `explain --json`.

The report must work with no network: the test renders it in headless Chromium (Debian
`chromium`, installed by scripts/setup.sh) with every connection routed to a local proxy
that only records what reaches it and answers 502 (`--proxy-server`, with `<-loopback>` so
not even localhost bypasses it). Chromium itself still calls home even with its background
networking switched off (measured with Chromium 156 on an empty page: clients2.google.com
time, update.googleapis.com component updates, accounts.google.com), so the check is: the
report makes no request to a host that an empty page rendered the same way does not
contact, nor to any host but Chromium's own three — a CDN script, a web font or an image
would show up. A control page that loads one external image proves the proxy does see a
page's request, so "no request" means something. The page's script marks every chart it
drew (`data-drawn="1"`) and the count on <body>; the test reads them from the DOM Chromium
dumps after running the script.

The program is found through TPCHECK_CLI (ctest sets it); Chromium through PATH. Missing
either is a failure, not a skip.
Runtime: about 20 s on the shared 2-core machine (six Chromium starts).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading

import pytest

CASE = "LayerNormMLP.sp0.default"
# docs/POLICIES.md's false alarm (te with atol 1e-5, --cpu-gemm auto, TP 4).
AUTO = ["--suite", "te", "--backend", "cpu", "--tp", "4", "--cpu-gemm", "auto", "--policy", "te", "--atol", "1e-5"]


def tpcheck():
    cli = os.environ.get("TPCHECK_CLI")
    assert cli, "TPCHECK_CLI is not set (ctest sets it to the tpcheck program)"
    return cli


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no chromium on PATH: run scripts/setup.sh (Debian package `chromium`)")


class RecordingProxy:
    """Accepts connections on 127.0.0.1 and records the first line of each; answers 502."""

    def __init__(self):
        self.requests = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    first = "(no data)"
                self.requests.append(first)
                try:
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def render(path, proxy):
    """Runs the page's scripts in headless Chromium behind `proxy`; returns the DOM."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--disable-domain-reliability", "--no-pings",
             f"--user-data-dir={profile}",
             f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
             "--virtual-time-budget=10000", "--dump-dom", f"file://{path}"],
            capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


# Hosts Chromium contacts by itself (see the module docstring).
CHROMIUM_OWN_HOSTS = {"clients2.google.com", "update.googleapis.com", "accounts.google.com"}


def hosts(requests):
    """Host of each recorded request line ("GET http://h/p HTTP/1.1", "CONNECT h:443 ...")."""
    out = set()
    for line in requests:
        m = re.match(r"\S+ (?:https?://)?([^/:\s]+)", line)
        out.add(m.group(1) if m else line)
    return out


def page_hosts(proxy, path, tmp_path):
    """Hosts the page at `path` contacted beyond what Chromium contacts for an empty page."""
    empty = tmp_path / "empty.html"
    empty.write_text("<html><body></body></html>")
    render(str(empty), proxy)
    baseline = hosts(proxy.requests) | CHROMIUM_OWN_HOSTS
    proxy.requests.clear()
    dom = render(str(path), proxy)
    return dom, hosts(proxy.requests) - baseline


@pytest.fixture
def proxy():
    p = RecordingProxy()
    yield p
    p.close()


def charts_drawn(dom):
    m = re.search(r'data-charts-drawn="(\d+)"', dom)
    assert m, "the page script did not finish (no data-charts-drawn on <body>)"
    return int(m.group(1))


def test_control_page_reaches_the_proxy(proxy, tmp_path):
    page = tmp_path / "control.html"
    page.write_text('<html><body><img src="http://tpcheck-control.invalid/x.png"></body></html>')
    _, contacted = page_hosts(proxy, page, tmp_path)
    assert contacted == {"tpcheck-control.invalid"}, proxy.requests


def test_explain_html_draws_every_chart_offline(proxy, tmp_path):
    html = tmp_path / "explain.html"
    out = subprocess.run([tpcheck(), "explain", CASE, *AUTO, "--html", str(html)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr  # te fails: the false alarm
    text = html.read_text()
    assert "<script src" not in text and "<link" not in text  # everything inline
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "Chart.js v3.9.1" in text
    assert "rounding: the numerical class change at `mlp.fc2/fwd`" in text
    dom, contacted = page_hosts(proxy, html, tmp_path)
    # One failing tensor (output): scatter + histogram, and the first-divergence chart.
    assert charts_drawn(dom) == 3
    assert dom.count('data-drawn="1"') == 3
    assert contacted == set(), f"the report reached the network: {contacted} ({proxy.requests})"


def test_run_html_plots_failing_tensors(proxy, tmp_path):
    html = tmp_path / "run.html"
    out = subprocess.run([tpcheck(), "run", "--filter", "^LayerNormMLP.sp0.(default|bias=false)$",
                          *AUTO, "--html", str(html)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    text = html.read_text()
    assert text.count('<tr><td><a href="#case-') == 2  # the case table
    data = json.loads(re.search(r'id="tpcheck-data">(.*?)</script>', text, re.S).group(1))
    plotted = [t for c in data["cases"] for t in c["tensors"]]
    assert plotted and all(t["verdict"] == "fail" for t in plotted)
    for t in plotted:
        assert 0 < len(t["points"]) <= 20000
        assert t["atol"] == 1e-5 and t["rtol"] == 1e-3  # the te lines (atol overridden)
    dom, contacted = page_hosts(proxy, html, tmp_path)
    assert charts_drawn(dom) == 2 * len(plotted)  # scatter + histogram each; no explanation
    assert contacted == set(), f"the report reached the network: {contacted} ({proxy.requests})"


def test_explain_json(tmp_path):
    path = tmp_path / "explain.json"
    out = subprocess.run([tpcheck(), "explain", CASE, *AUTO, "--json", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    j = json.loads(path.read_text())
    assert j["schema"] == "tpcheck.explain/1"
    assert j["run"]["cases"][0]["id"] == CASE
    x = j["explanation"]["tensors"][0]
    assert x["name"] == "output" and x["cause"] == "rounding" and x["best_site"] == "mlp.fc2/fwd"
    diff = x["upstream_gemm_diffs"][0]
    assert (diff["single"]["math_class"], diff["sharded"]["math_class"]) == ("tf32", "fp32")
    assert (diff["single"]["k"], diff["sharded"]["k"]) == (32, 8)
    trail = j["explanation"]["trail"]
    assert [t["name"] for t in trail if t["op"] == "gemm"][:2] == ["mlp.fc1/fwd", "mlp.fc2/fwd"]
    assert not any(t.get("diverges") for t in trail)
    # The console carries the same sentence.
    assert x["sentence"] in out.stdout


def test_explain_bad_case_is_input_error():
    # The message names the CASE argument (not --filter, which explain does not take).
    for case in ("NoSuchLayer", "(Linear"):
        out = subprocess.run([tpcheck(), "explain", case, "--backend", "cpu", "--tp", "2"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2
        assert f"case '{case}'" in out.stderr, out.stderr
        assert "--filter" not in out.stderr, out.stderr
