"""What the lag service's CPU meter (service.TreeCpu) counts: a process tree's CPU never
falls when a descendant exits - not even one whose parent ignores SIGCHLD (Spark's Python
daemon does, so the kernel drops its workers' times at their exit)."""
import os
import subprocess
import sys
import textwrap
import time

from dashboard.lag.service import TreeCpu

from .support import wait_until

# A "daemon" like pyspark's: SIGCHLD ignored, a child that burns CPU, says so, and exits
# when its stdin closes.
DAEMON = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    if os.fork() == 0:
        start = time.process_time()
        while time.process_time() - start < 0.3:
            pass
        print("burned", os.getpid(), flush=True)
        sys.stdin.read()
        os._exit(0)
    signal.pause()
""")


def test_a_child_of_a_sigchld_ignoring_parent_keeps_counting_after_it_exits():
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = daemon.stdout.readline()   # the child has burned its CPU
        assert line.startswith("burned"), line
        child = int(line.split()[1])
        meter = TreeCpu(daemon.pid)
        with_child = meter.seconds()
        assert with_child >= 0.25, with_child
        daemon.stdin.close()   # the child exits; auto-reaped, its times reach no cutime
        wait_until(lambda: not os.path.exists(f"/proc/{child}"), timeout=20, message="the child to be gone")
        assert meter.seconds() >= with_child
    finally:
        daemon.kill()
        daemon.wait()


def test_a_reading_is_the_tree_of_the_root():
    meter = TreeCpu(os.getpid())
    first = meter.seconds()
    start = time.process_time()
    while time.process_time() - start < 0.2:
        pass
    assert meter.seconds() - first >= 0.15
