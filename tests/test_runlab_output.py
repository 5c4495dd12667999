"""Units: runlab's terminal output (dashboard/management/commands/runlab.py)."""
import io
import socket

import pytest
from django.core.management.base import CommandError

from dashboard.management.commands.runlab import Command, JavaTraceLines


def test_a_java_stack_trace_is_its_first_line():
    out = io.StringIO()
    lines = JavaTraceLines(out)
    for line in ["[lagservice] lag history: 3 windows\n",
                 "[lagservice] java.util.concurrent.RejectedExecutionException: Task rejected\n",
                 "[lagservice] \tat java.base/java.util.concurrent.ThreadPoolExecutor.reject(ThreadPoolExecutor.java:2065)\n",
                 "[lagservice] Caused by: java.lang.InterruptedException\n",
                 "[lagservice] \t... 42 more\n"]:
        lines.write(line)
    assert out.getvalue().splitlines() == ["[lagservice] lag history: 3 windows",
                                           "[lagservice] java.util.concurrent.RejectedExecutionException: Task rejected"]


def test_a_port_in_use_is_named_with_its_flag_or_the_next_free_one_is_used():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = Command(stdout=io.StringIO())
        with pytest.raises(CommandError, match=f"port {port} is in use: pick another with --namesrv-port=PORT"):
            command.free_port("127.0.0.1", "--namesrv-port", port, 9876)
        chosen = command.free_port("127.0.0.1", "--namesrv-port", None, port)
        assert chosen != port and f"port {port} (--namesrv-port) is in use, using {chosen}" in command.stdout._out.getvalue()
        # Not offered twice: the next flag gets another.
        assert command.free_port("127.0.0.1", "--remoting-port", None, chosen) not in (port, chosen)


def test_once_the_lab_is_stopping_what_spark_says_about_its_stop_is_not_printed():
    out = io.StringIO()
    lines = JavaTraceLines(out)
    lines.stopping = True
    for line in ["[lag] 12:00:01 ERROR Executor: Exception in task 0.0 in stage 3.0 (TID 5)\n",
                 "[lag] java.util.concurrent.RejectedExecutionException: Task rejected from pool\n",
                 "[lag] \tat java.base/java.util.concurrent.ThreadPoolExecutor.reject(ThreadPoolExecutor.java:2065)\n",
                 "[lag] 12:00:01 WARN TaskSetManager: Lost task 1.0 in stage 3.0\n",
                 "[lag] py4j.protocol.Py4JError: An error occurred while calling o42.collect\n",
                 "[lag] lag service stopped\n"]:
        lines.write(line)
    assert out.getvalue().splitlines() == ["[lag] lag service stopped"]
