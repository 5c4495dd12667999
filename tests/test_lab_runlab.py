"""``manage.py runlab`` as a user runs it: broker, web and lab up, a login URL, a clean stop."""

from .runlab import Server, children_of, migrated_env, pid_alive, start_lab, wait_for_three
from .support import free_port


def test_runlab_starts_everything_prints_a_login_url_and_stops_cleanly(tmp_path):
    port = free_port()
    lab, browser = start_lab(port, migrated_env(tmp_path))
    helpers = []
    try:
        progress = [x.strip() for x in lab.lines if not x.startswith("[broker]")]
        assert progress[:5] == ["migrating database…", "starting broker…", "broker ready", "starting workers…",
                                "scenario running"]
        wait_for_three(lab, browser, port, timeout=30, message="the default scenario via the API")
        helpers = children_of(lab.process.pid)   # the broker and the worker processes
        assert len(helpers) == 3
    finally:
        code = lab.stop()
    # A quick stop is one that waits out nothing (no child killed after its grace, below);
    # how long it takes is a figure, not a test's threshold.
    assert code == 0, "".join(lab.lines)
    assert "Rebalance Lab stopped" in "".join(lab.lines)
    # Workers told to shut down are not "lost": none replaced, none waited out and killed.
    assert not [x for x in lab.lines if "replacing worker" in x or "did not exit" in x], "".join(lab.lines)
    assert not [pid for pid in helpers if pid_alive(pid)], "broker and workers stopped with the lab"


def test_a_second_web_process_reaches_the_controller_over_redis(tmp_path, redis_database):
    # Its own Redis database: another test process's controller must not answer ours.
    env = migrated_env(tmp_path, CHANNEL_LAYER_URL=redis_database(1))
    port, other_port = free_port(), free_port()
    lab, browser = start_lab(port, env)
    web = Server("runweb", "--no-controller", "--host", "127.0.0.1", "--port", str(other_port), env=env)
    try:
        web.line_starting("web listening on", timeout=30)
        wait_for_three(lab, browser, other_port, timeout=60, message="the default scenario through the second web process")
    finally:
        assert web.stop() == 0, "".join(web.lines)
        lab.stop()


def _listening():
    """A socket something else listens on (a second lab's view of the first one's port)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_a_port_in_use_is_one_line_on_stderr_naming_it_and_its_flag(tmp_path):
    import os
    import subprocess
    import sys

    from .support import REPO

    def manage_py(*args, env):
        return subprocess.Popen([sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, text=True,
                                env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    held, port = _listening()
    with held:
        env = migrated_env(tmp_path)
        # Asked for by runlab's flag: refused before anything starts.
        lab = manage_py("runlab", "--host", "127.0.0.1", f"--port={free_port()}", f"--namesrv-port={port}",
                        "--remoting-port=0", env=env)
        out, err = lab.communicate(timeout=60)
        assert lab.returncode == 1, out + err
        assert err.strip().splitlines() == [f"CommandError: port {port} is in use: pick another with "
                                            f"--namesrv-port=PORT (0: any free port)"], err
        # The broker finding it taken on its own (another lab got there between runlab's
        # check and the bind): one line too, no traceback.
        broker = manage_py("runbroker", "--skip-checks", "--data-dir", str(tmp_path / "broker"), "--port=0",
                           f"--namesrv-port={port}", "--remoting-port=0", env=env)
        out, err = broker.communicate(timeout=60)
        assert broker.returncode == 1, out + err
        assert "Traceback" not in err and err.strip().splitlines()[-1] == (
            f"CommandError: port {port} is in use: pick another with --namesrv-port=PORT (0: any free port)"), err
