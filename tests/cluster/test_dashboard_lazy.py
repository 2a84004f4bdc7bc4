"""The local cluster's dashboard is loaded at its first request: a job nobody watches never
imports bokeh; the first visitor gets a page that reloads itself, then the dashboard."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.child_env import child_env

SCRIPT = """
import json, sys, time, urllib.error, urllib.request
from cluster.spec import ClusterSpec
from cluster.lifecycle import start

def get(port, host="127.0.0.1"):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/status", headers={"Host": f"{host}:{port}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

spec = ClusterSpec(workers=1, threads_per_worker=1, dashboard_address="127.0.0.1:0")
with start(spec, 2 * 2**30) as client:
    port = client.scheduler_info()["services"]["dashboard"]
    time.sleep(1.0)
    seen = {"idle_loaded": "bokeh" in sys.modules}
    seen["foreign"] = get(port, "evil.example")[0]
    time.sleep(0.5)
    seen["after_foreign_loaded"] = "bokeh" in sys.modules
    seen["first"] = get(port)
    deadline, status = time.monotonic() + 60, 0
    while status != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
        status, page = get(port)
    seen["then"] = status
    seen["bokeh_page"] = "bokeh" in page.lower()
print(json.dumps(seen))
"""


def test_dashboard_loads_when_first_asked() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["idle_loaded"] is False  # nobody asked: no bokeh in the process
    assert seen["foreign"] == 403  # another host's name is refused, and loads nothing
    assert seen["after_foreign_loaded"] is False
    status, page = seen["first"]
    assert status == 503 and "reloads itself" in page and "refresh" in page
    assert seen["then"] == 200 and seen["bokeh_page"]
