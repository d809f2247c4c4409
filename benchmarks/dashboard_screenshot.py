"""A screenshot of /dashboard while the serving benchmark loads the server (the README's picture).

    python benchmarks/dashboard_screenshot.py [--out docs/dashboard.png] [--repeats 1]

Starts `radixrt serve` (default config), opens the dashboard in headless Chromium (Debian's chromium +
chromium-driver, through selenium), runs benchmarks/bench_serving.py --url against the server, and keeps
the screenshot taken when the radix tree held the most nodes (the benchmark flushes the cache between
levels). Checks the page logged no console errors.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import time

from radixrt.runtime.processes import free_port, wait_until_healthy

HERE = pathlib.Path(__file__).parent


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
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
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE.parent / "docs" / "dashboard.png"))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--every", type=float, default=3.0, help="seconds between screenshots")
    args = ap.parse_args()
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        sys.exit("needs Debian's chromium and chromium-driver (bash tests/install_browser.sh)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixrt.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    )
    b = None
    try:
        wait_until_healthy(url, server, 600)
        b = browser()
        b.get(url + "/dashboard")
        bench = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "bench_serving.py"),
                "--url",
                url,
                "--repeats",
                str(args.repeats),
                "--out",
                "/tmp/radixrt-dashboard-bench",
            ]
        )
        best = (-1, b"")
        while bench.poll() is None:
            time.sleep(args.every)
            nodes = int(
                b.execute_script("return document.getElementById('tree').dataset.numNodes || 0")
            )
            if nodes >= best[0]:
                best = (nodes, b.get_screenshot_as_png())
        errors = [e for e in b.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        if errors:
            sys.exit(f"the dashboard logged errors: {errors}")
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        pathlib.Path(args.out).write_bytes(best[1])
        print(f"wrote {args.out} (tree of {best[0]} nodes); benchmark exit code {bench.returncode}")
    finally:
        if b is not None:
            b.quit()
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
