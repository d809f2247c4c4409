"""GET /cache_tree, `radixrt cache-tree` and the /dashboard page, on a real server running the
session's tiny random Llama with the default tokenizer (tests/conftest.py): what the tree holds and
what the page draws follow from the token ids sent, not from what the weights know.

Truth for the tree: tests/naive_cache_tree.py, an independent model of what a known sequence of requests
leaves in the radix tree (structure, token counts, hits). Truth for the dashboard: a real headless
Chromium (Debian's `chromium` + `chromium-driver`, driven by selenium) loading the page: no console
errors, the tree and the plots render, and the figures move after requests are sent. A screenshot is
saved under $RADIXRT_TEST_ARTIFACTS (default: test-artifacts/ in the repository).
"""

import os
import pathlib
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from conftest_server import ServerProcess
from naive_cache_tree import NaiveCacheTree, canonical_view

pytestmark = pytest.mark.integration
PAGE_SIZE = 4
SYSTEM = (
    "You are a careful assistant who answers questions about geography, history and science in one "
    "short sentence. "
)
QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Peru?",
    "Who wrote Hamlet?",
    "What is the capital of France? Answer briefly.",
    "Why is the sky blue?",
]
ADMIN_KEY = "cache-view-admin-key"  # /cache_tree is an admin route; the other routes stay open
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ARTIFACTS = pathlib.Path(
    os.environ.get("RADIXRT_TEST_ARTIFACTS", pathlib.Path(__file__).parents[2] / "test-artifacts")
)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        [
            *("--model-path", tiny_model_dir),
            *("--page-size", str(PAGE_SIZE), "--max-total-tokens", "4096"),
            *("--admin-api-key", ADMIN_KEY, "--log-level", "warning"),
        ],
        tmp_path_factory.mktemp("cache_view"),
    )
    yield srv
    srv.stop()


def generate(server, ids: list[int]) -> dict:
    r = httpx.post(
        server.url + "/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_cache_tree_is_what_the_requests_imply(server, tokenizer):
    assert httpx.post(server.url + "/flush_cache", headers=ADMIN, timeout=60).status_code == 200
    prompts = [tokenizer.encode(SYSTEM + q, add_special_tokens=False) for q in QUESTIONS]
    prompts += [
        prompts[0],
        prompts[1],
        tokenizer.encode("Completely unrelated words here.", add_special_tokens=False),
    ]
    naive = NaiveCacheTree(PAGE_SIZE)
    for ids in prompts:  # one at a time, so the order of matches is the order sent
        # max_new_tokens=1: the sampled token is never fed back, so the cached sequence is the prompt
        cached = generate(server, ids)["meta_info"]["cached_tokens"]
        assert cached == naive.request(ids[:-1], ids)
    assert httpx.get(server.url + "/cache_tree", timeout=60).status_code == 401
    view = httpx.get(server.url + "/cache_tree", headers=ADMIN, timeout=60).json()
    assert canonical_view(view["root"]) == naive.canonical()
    assert view["num_nodes"] == view["num_nodes_shown"] == len(naive.nodes())
    assert view["num_tokens"] == sum(n["num_tokens"] for n in naive.nodes().values())
    assert view["page_size"] == PAGE_SIZE
    # the first level: the shared system prompt, then the unrelated prompt; text previews decode the edge
    first = max(view["root"]["children"], key=lambda c: c["subtree_tokens"])
    edge = tokenizer.decode(prompts[0][: first["num_tokens"]], skip_special_tokens=False)
    assert first["text"].rstrip("…") and edge.startswith(first["text"].rstrip("…"))
    # everything but the first and the unrelated prompt matched it
    assert first["hits"] == len(prompts) - 2
    assert first["tokens_served"] == first["hits"] * first["num_tokens"]
    assert all(
        c["last_access_age_s"] is not None and c["lock_ref"] == 0 for c in view["root"]["children"]
    )
    # a summarised view keeps the totals
    small = httpx.get(
        server.url + "/cache_tree",
        params={"max_depth": 1, "max_nodes": 1},
        headers=ADMIN,
        timeout=60,
    ).json()
    assert small["num_nodes_shown"] == 1 and small["num_nodes"] == view["num_nodes"]
    assert (
        small["root"]["omitted"]["tokens"] + small["root"]["children"][0]["subtree_tokens"]
        == view["num_tokens"]
    )
    assert httpx.get(server.url + "/get_server_info", timeout=60).json()["integrity_ok"]


def test_cache_tree_refuses_bad_limits_by_name(server):
    for params, field in (
        ({"max_nodes": "0"}, "max_nodes"),
        ({"max_depth": "x"}, "max_depth"),
        ({"max_nodes": "99999999"}, "max_nodes"),
        ({"depth": "3"}, "depth"),
    ):
        r = httpx.get(server.url + "/cache_tree", params=params, headers=ADMIN, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


def test_cli_prints_the_tree(server):
    out = subprocess.run(
        [sys.executable, "-m", "radixrt.cli", "cache-tree", "--url", server.url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RADIXRT_ADMIN_API_KEY": ADMIN_KEY},
    )
    assert out.returncode == 0, out.stderr
    view = httpx.get(server.url + "/cache_tree", headers=ADMIN, timeout=60).json()
    lines = out.stdout.splitlines()
    assert lines[0].startswith(
        f"radix cache: {view['num_nodes']} nodes, {view['num_tokens']} tokens"
    )
    assert len(lines) == 1 + view["num_nodes"]  # one line per node, nothing summarised at this size
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixrt.cli",
            "cache-tree",
            "--url",
            server.url,
            "--max-nodes",
            "0",
            "--admin-api-key",
            ADMIN_KEY,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "max_nodes" in bad.stderr


def _browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("no browser: install Debian's chromium and chromium-driver (.ci/run does)")
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
    )
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1150",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def _wait(browser, script: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = browser.execute_script(script)
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for: {script}")


def test_dashboard_in_a_real_browser(server, tokenizer):
    browser = _browser()
    try:
        assert httpx.post(server.url + "/flush_cache", headers=ADMIN, timeout=60).status_code == 200
        browser.get(server.url + "/dashboard")
        # no key yet: the page asks for the admin key; given it, it draws
        _wait(browser, "return document.getElementById('keybox').style.display === 'block'")
        browser.execute_script(f"sessionStorage.setItem('radixrt-api-key', '{ADMIN_KEY}')")
        browser.get_log("browser")  # drained: the refused fetches before the key was given
        browser.refresh()
        _wait(
            browser,
            "const d = window.radixrtDashboard; return d && d.infoUpdates >= 2 && d.treeUpdates >= 1",
        )
        assert (
            browser.execute_script("return document.getElementById('tree').dataset.numNodes") == "0"
        )
        plots = browser.execute_script(
            "return Array.from(document.querySelectorAll('.js-plotly-plot')).map(e => e.id)"
        )
        assert sorted(plots) == [
            "plot-hitrate",
            "plot-pool",
            "plot-requests",
            "plot-throughput",
            "tree",
        ]
        # requests sharing a prefix: the tree gains nodes with hits, the hit-rate card and the table fill
        for q in QUESTIONS:
            generate(server, tokenizer.encode(SYSTEM + q, add_special_tokens=False))
        _wait(browser, "return Number(document.getElementById('tree').dataset.numNodes) >= 5")
        _wait(browser, "return document.querySelectorAll('#tree .slice').length >= 5")
        _wait(browser, "return document.querySelectorAll('#hot-table tbody tr').length >= 5")
        _wait(browser, "return document.getElementById('card-hitrate').textContent !== '0.0%'")
        # the time series are redrawn with the new figures: the throughput axis grows past its empty range (0-4)
        _wait(
            browser,
            "return Math.max(...Array.from(document.querySelectorAll('#plot-throughput .ytick text'))"
            ".map(t => Number(t.textContent.replace(/[^0-9.]/g, '')) || 0)) > 4",
        )
        top_hits = browser.execute_script(
            "return document.querySelector('#hot-table tbody tr td:nth-child(3)').textContent"
        )
        assert int(top_hits) == len(QUESTIONS) - 1
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
    finally:
        browser.quit()
