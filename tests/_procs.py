"""Launch a one-process run and a multi-process run of a command at once (the 2-process tests).

Importable from every test folder: pytest puts ``tests/`` (the root conftest's folder) on ``sys.path``.
"""

import socket
import subprocess


def free_port() -> int:
    """A free localhost port for the coordinator."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def coordinator_args(port: int, count: int, index: int) -> list[str]:
    """``--coordinator localhost:PORT --num-processes COUNT --process-id INDEX``."""
    return ["--coordinator", f"localhost:{port}", "--num-processes", str(count), "--process-id", str(index)]


def run_at_once(cmds: list[tuple[list[str], dict]], timeout: float = 300) -> list[str]:
    """Start every ``(argv, env)`` at once, wait for all and return their outputs (stdout + stderr).

    Raises AssertionError naming the output's tail when one exits non-zero; kills them all when one
    runs past ``timeout`` seconds.
    """
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for argv, env in cmds
    ]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
        assert p.returncode == 0, out[-3000:]
    return outs
