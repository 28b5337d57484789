"""The class's JupyterHub for real: hub/jupyterhub_config.py on loopback, with JupyterHub's
test authenticator and its one-account spawner in place of PAM and OS accounts. Two students
log in through the login form, their servers start through the Hub's API, and notebook 01
runs in each one's own copy through their server's kernels API; then their copies are
shown separate, nothing listens beyond loopback, and every process ends with the Hub."""
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.cookiejar import CookieJar
from pathlib import Path

import nbformat
import psutil
import pytest

pytest.importorskip("jupyterhub")
from tornado.httpclient import HTTPRequest  # noqa: E402  (JupyterHub's web server)
from tornado.websocket import websocket_connect  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import grade  # noqa: E402  (tools/grade.py)
from lessonlib.launcher.checks import cores  # noqa: E402

PROXY = ROOT / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
TOKEN = uuid.uuid4().hex
NOTEBOOK = "01-why-scale.ipynb"
STUDENTS = ("alice", "bob")
CPUS = 1           # each student's share of the cores, hence their kernels' threads
PROBE = ("import json, os, sys, torch\n"
         "print(json.dumps({'cwd': os.getcwd(), 'prefix': sys.prefix, "
         "'omp': os.environ.get('OMP_NUM_THREADS'), 'threads': torch.get_num_threads()}))")

pytestmark = pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is not "
                                "installed in hub/node_modules: run make class-setup")


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Stay(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: a login answers 302 and the test looks at it."""

    def redirect_request(self, *args):
        return None


class Hub:
    """A JupyterHub process started from hub/jupyterhub_config.py, and its REST API."""

    def __init__(self, folder: Path):
        self.port, hub_port, proxy_api = free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.homes, self.release = folder / "home", folder / "release"
        (folder / "course").mkdir()
        shutil.copy(ROOT / "notebooks" / NOTEBOOK, folder / "course")
        grade.release(self.release, source=folder / "course")
        config = folder / "test_config.py"
        config.write_text(
            f"import os\nc = get_config()\n"
            f"load_subconfig({str(ROOT / 'hub' / 'jupyterhub_config.py')!r})\n"
            f"c.JupyterHub.authenticator_class = 'dummy'\n"
            f"c.JupyterHub.spawner_class = 'simple'\n"
            f"c.SimpleLocalProcessSpawner.home_dir_template = {str(self.homes)!r} + '/{{username}}'\n"
            f"c.Spawner.cpu_limit = {CPUS}\n"
            f"c.JupyterHub.bind_url = {self.url!r}\n"
            f"c.JupyterHub.hub_port = {hub_port}\n"
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{proxy_api}'\n"
            f"c.JupyterHub.services = [{{'name': 'class-test', 'api_token': {TOKEN!r}}}]\n"
            f"if os.geteuid() == 0:  # one account for all: root in a container\n"
            f"    c.Spawner.args.append('--allow-root')\n"
            f"c.JupyterHub.load_roles = [{{'name': 'class-test', 'services': ['class-test'], "
            f"'scopes': ['admin:users', 'admin:servers', 'tokens']}}]\n")
        env = {**os.environ, "COURSE_HUB_STATE": str(folder / "state"),
               "COURSE_NOTEBOOKS": str(self.release)}
        self.seen = {}                   # pid: process, of every process the Hub started
        self.log = (folder / "hub.log").open("w")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(config)], cwd=folder,
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait(lambda: self.api("GET", "/hub/api/")[0] == 200, 120, "the Hub to answer")

    def api(self, method: str, path: str, body=None, token: str = TOKEN):
        """(status, parsed JSON or None) of one request to the Hub's public URL."""
        request = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {token}"},
            data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            return error.code, None
        except OSError:
            return None, None

    def wait(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(f"the Hub exited while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {seconds} s for {what}")
            time.sleep(0.5)

    def log_in(self, name: str) -> CookieJar:
        """Log in through the login form, as a browser does."""
        jar = CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), Stay)
        browser.open(self.url + "/hub/login", timeout=30).read()
        xsrf = next(cookie.value for cookie in jar if cookie.name == "_xsrf")
        form = urllib.parse.urlencode({"username": name, "password": "any", "_xsrf": xsrf})
        with pytest.raises(urllib.error.HTTPError) as redirect:   # logged in: sent on
            browser.open(self.url + "/hub/login", data=form.encode(), timeout=30)
        assert redirect.value.code == 302, redirect.value.code
        return jar

    def start_server(self, name: str) -> None:
        assert self.api("POST", f"/hub/api/users/{name}/server")[0] in (201, 202)
        self.wait(lambda: (self.api("GET", f"/hub/api/users/{name}")[1] or {})
                  .get("servers", {}).get("", {}).get("ready"), 120, f"{name}'s server")

    def stop_server(self, name: str) -> None:
        assert self.api("DELETE", f"/hub/api/users/{name}/server")[0] in (202, 204)
        self.wait(lambda: not (self.api("GET", f"/hub/api/users/{name}")[1] or {})
                  .get("servers"), 60, f"{name}'s server to stop")

    def user_token(self, name: str) -> str:
        status, body = self.api("POST", f"/hub/api/users/{name}/tokens", {"note": "class test"})
        assert status == 201, status
        return body["token"]

    def processes(self) -> list[psutil.Process]:
        hub = psutil.Process(self.process.pid)
        return [hub, *hub.children(recursive=True)]

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C would; a Hub that does not end in 60 s is killed with its group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def message(code: str, session: str) -> dict:
    header = {"msg_id": uuid.uuid4().hex, "username": "class-test", "session": session,
              "msg_type": "execute_request", "version": "5.3", "date": ""}
    return {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
            "buffers": [], "content": {"code": code, "silent": False, "store_history": True,
                                       "user_expressions": {}, "allow_stdin": False,
                                       "stop_on_error": True}}


async def run_cells(hub: Hub, name: str, token: str, cells: list[str]) -> list[dict]:
    """Each cell executed in a kernel of ``name``'s server (its kernels API, behind the Hub's
    proxy), opened on their copy of notebook 01; returns each cell's outputs."""
    status, session = hub.api("POST", f"/user/{name}/api/sessions", token=token, body={
        "path": NOTEBOOK, "name": NOTEBOOK, "type": "notebook", "kernel": {"name": "python3"}})
    assert status == 201, status
    url = f"ws://127.0.0.1:{hub.port}/user/{name}/api/kernels/{session['kernel']['id']}/channels"
    socket = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    results = []
    for code in cells:
        request = message(code, uuid.uuid4().hex)
        await socket.write_message(json.dumps(request))
        outputs, replied, idle = [], False, False
        while not (replied and idle):
            raw = await asyncio.wait_for(socket.read_message(), 300)
            if not isinstance(raw, str):
                continue
            reply = json.loads(raw)
            if reply["parent_header"].get("msg_id") != request["header"]["msg_id"]:
                continue
            kind = reply["msg_type"]
            replied |= kind == "execute_reply"
            idle |= kind == "status" and reply["content"]["execution_state"] == "idle"
            if kind in ("stream", "error", "execute_result"):
                outputs.append({"type": kind, **reply["content"]})
        results.append(outputs)
    socket.close()
    return results


def test_kernel_threads_are_the_cores_or_the_students_share():
    sys.path.insert(0, str(ROOT / "hub"))
    import course_hub  # hub/course_hub.py

    assert course_hub.kernel_threads(types.SimpleNamespace(cpu_limit=None)) == str(cores())
    assert course_hub.kernel_threads(types.SimpleNamespace(cpu_limit=0.5)) == "1"
    assert course_hub.kernel_threads(types.SimpleNamespace(cpu_limit=1e6)) == str(cores())


@pytest.fixture
def hub(tmp_path):
    started = Hub(tmp_path)
    yield started
    started.stop()
    for process in started.seen.values():   # what outlived the Hub (the test fails on it)
        if process.is_running():
            process.kill()


@pytest.mark.timeout(420)
def test_two_students_run_notebook_01_in_their_own_copies(hub):
    for name in STUDENTS:
        jar = hub.log_in(name)
        assert any(cookie.name.startswith("jupyterhub-") for cookie in jar), name
        hub.start_server(name)
    tokens = {name: hub.user_token(name) for name in STUDENTS}
    copies = {name: hub.homes / name / "course" / NOTEBOOK for name in STUDENTS}
    cells = [cell.source for cell in nbformat.read(copies["alice"], as_version=4).cells
             if cell.cell_type == "code"]

    async def both():
        return await asyncio.gather(*(run_cells(hub, name, tokens[name], [PROBE, *cells])
                                      for name in STUDENTS))

    ran = dict(zip(STUDENTS, asyncio.run(both())))
    hub.seen.update({p.pid: p for p in hub.processes()})
    for name, outputs in ran.items():
        errors = [o for cell in outputs for o in cell if o["type"] == "error"]
        assert not errors, f"{name}: {errors[0]['ename']}: {errors[0]['evalue']}"
        probe = json.loads(outputs[0][0]["text"])
        assert probe == {"cwd": str(copies[name].parent), "prefix": sys.prefix,
                         "omp": str(min(cores(), CPUS)), "threads": min(cores(), CPUS)}
        assert any("Your turn" in o.get("data", {}).get("text/plain", "")
                   for cell in outputs for o in cell), "the exercises wait for an answer"

    # nothing listens beyond loopback: the proxy, the Hub, both servers, their kernels
    listening = [(p.name(), c.laddr) for p in hub.seen.values() if p.is_running()
                 for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 5
    assert all(address.ip in ("127.0.0.1", "::1") for _, address in listening), listening

    # their copies are their own: alice's saved work reaches neither bob nor the release,
    # and survives her next login (the hook never writes over a notebook)
    before = {name: copies[name].read_bytes() for name in STUDENTS}
    path = f"/user/alice/api/contents/{NOTEBOOK}"
    _, model = hub.api("GET", path, token=tokens["alice"])
    model["content"]["cells"][0]["source"] = "# alice's notes"
    status, _ = hub.api("PUT", path, token=tokens["alice"],
                        body={"type": "notebook", "format": "json", "content": model["content"]})
    assert status == 200
    assert copies["alice"].read_bytes() != before["alice"]
    assert copies["bob"].read_bytes() == before["bob"]
    assert b"alice's notes" not in (hub.release / NOTEBOOK).read_bytes()
    hub.stop_server("alice")
    hub.start_server("alice")
    assert b"alice's notes" in copies["alice"].read_bytes()
    hub.seen.update({p.pid: p for p in hub.processes()})

    # every process ends with the Hub
    hub.stop()
    deadline = time.monotonic() + 30
    while [p for p in hub.seen.values() if p.is_running()] and time.monotonic() < deadline:
        time.sleep(0.5)
    alive = [(p.pid, p.name()) for p in hub.seen.values()
             if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"outlived the Hub: {alive}"
