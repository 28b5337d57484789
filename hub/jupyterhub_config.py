"""The class's JupyterHub: the course served to every student from one shared environment,
each student working in their own copy of the notebooks (docs/instructor.md).

    make hub                                   # http://127.0.0.1:8000, loopback only
    make hub HUB_ARGS=--JupyterHub.bind_url=http://0.0.0.0:8000   # every interface: if you mean it
    .venv/bin/jupyterhub -f hub/jupyterhub_config.py [JUPYTERHUB OPTION ...]

Everything it starts listens on 127.0.0.1 unless the instructor says otherwise (``bind_url``
moves only the public side of the proxy): the proxy, the Hub's API, the proxy's API and every student's
server. Students log in with their accounts on this machine (JupyterHub's default
authenticator, PAM) and their servers run as them (JupyterHub's ``LocalProcessSpawner``),
so the Hub runs as root; the accounts allowed are the lines of hub/students.txt. The
servers and kernels run this environment's Python (read-only to the students); each
server opens ``~/course``, which ``course_hub.give_copy`` fills from the student versions
(``COURSE_NOTEBOOKS``, by default build/class/release, written by ``tools/grade.py
release``). The Hub's database, cookie secret and proxy pid go to ``COURSE_HUB_STATE``
(default build/hub).
"""
import os
import sys
from functools import partial
from pathlib import Path

HUB = Path(__file__).resolve().parent
sys.path.insert(0, str(HUB))
import course_hub  # noqa: E402  (hub/course_hub.py)

c = get_config()  # noqa: F821  (given by JupyterHub to its config file)

STATE = Path(os.environ.get("COURSE_HUB_STATE", HUB.parent / "build" / "hub"))
STATE.mkdir(parents=True, exist_ok=True)
NOTEBOOKS = Path(os.environ.get("COURSE_NOTEBOOKS", HUB.parent / "build" / "class" / "release"))
STUDENTS = HUB / "students.txt"
ENVIRONMENT = Path(sys.executable).parent       # the shared .venv's bin/

# Loopback only, unless the instructor gives another bind_url (the public side of the proxy)
c.JupyterHub.bind_url = "http://127.0.0.1:8000"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = 8081
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:8001"
c.ConfigurableHTTPProxy.command = [str(HUB / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.Spawner.ip = "127.0.0.1"
# A class logs in at once: on a busy server a student's server and kernel take a while
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180

c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "cookie_secret")
if STUDENTS.exists():
    c.Authenticator.allowed_users = {line.strip() for line in STUDENTS.read_text().splitlines()
                                     if line.strip() and not line.startswith("#")}

# One environment for every student; each server opens their own copy of the course
c.Spawner.cmd = [str(ENVIRONMENT / "jupyterhub-singleuser")]
c.Spawner.notebook_dir = f"~/{course_hub.FOLDER}"
c.Spawner.default_url = f"/lab/tree/{course_hub.FIRST}"
c.Spawner.args = ["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
c.Spawner.pre_spawn_hook = partial(course_hub.give_copy, source=NOTEBOOKS)
# Kernels' threads: the cores this Hub may use, at most each student's share. A class on one
# machine shares its cores: give --Spawner.cpu_limit=CORES/STUDENTS (a container spawner also
# enforces it); kernels that each take every core slow each other down many times over.
c.Spawner.environment = {name: course_hub.kernel_threads for name in course_hub.THREADS}
