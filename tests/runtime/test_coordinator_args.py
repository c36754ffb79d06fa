"""``--coordinator HOST:PORT`` is checked at the boundary, and joining the runtime is bounded in time.

A coordinator address with a port outside 1..65535 used to reach ``jax.distributed.initialize``,
which waited its whole default timeout (300 s, silently) before dying; now the parser refuses it
at once, naming the value. Joining passes ``--coordinator-timeout`` (default 300 s, JAX's) to JAX,
and a process other than 0 first waits for the coordinator's port, raising one line naming the
address when it never answers.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _procs import free_port

import sarjax.runtime.distributed as dist
from sarjax.cli import build_parser
from sarjax.cli.args import initialize_distributed
from sarjax.runtime.distributed import initialize

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(HERE.parent / "attacks")}
BASE = ["autoattack", "--model", "_aa_tiny:make_linear_pool", "--norm", "linf", "--eps", "0.1"]


@pytest.mark.parametrize(
    "address, expect",
    [
        ("localhost:12355", ("localhost", 12355)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
        ("host0.cluster.internal:65535", ("host0.cluster.internal", 65535)),
        ("[::1]:8476", ("::1", 8476)),
        ("[fe80::1:2]:80", ("fe80::1:2", 80)),
    ],
)
def test_parse_coordinator_known_answers(address, expect):
    assert dist.parse_coordinator(address) == expect


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1:99999", "port must be in 1..65535, got 99999 in '127.0.0.1:99999'"),
        ("localhost:65536", "port must be in 1..65535, got 65536"),
        ("localhost:0", "port must be in 1..65535, got 0"),
        (":12355", "HOST:PORT with a host and a port in 1..65535"),
        ("localhost", "got 'localhost'"),
        ("localhost:", "got 'localhost:'"),
        ("localhost:12a", "got 'localhost:12a'"),
        ("local host:12355", "got 'local host:12355'"),
        ("::1:12355", "got '::1:12355'"),  # an IPv6 host needs brackets
        ("", "got ''"),
    ],
)
def test_parse_coordinator_refuses_naming_the_value(address, message):
    with pytest.raises(ValueError) as e:
        dist.parse_coordinator(address)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_parse_coordinator_wants_a_str():
    with pytest.raises(TypeError, match="coordinator must be a str HOST:PORT, got int 12355"):
        dist.parse_coordinator(12355)  # type: ignore[arg-type]


def test_the_parser_refuses_a_bad_port_and_keeps_auto(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        parser.parse_args([*BASE, "--coordinator", "127.0.0.1:99999", "--num-processes", "2", "--process-id", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --coordinator: coordinator port must be in 1..65535, got 99999 in '127.0.0.1:99999'" in err
    assert parser.parse_args([*BASE, "--coordinator", "auto"]).coordinator == "auto"
    args = parser.parse_args([*BASE, "--coordinator", "[::1]:12355", "--coordinator-timeout", "7"])
    assert args.coordinator == "[::1]:12355" and args.coordinator_timeout == 7
    assert parser.parse_args(BASE).coordinator_timeout is None
    with pytest.raises(SystemExit):
        parser.parse_args([*BASE, "--coordinator-timeout", "0"])


def test_initialize_refuses_a_bad_port_and_timeout_before_joining(monkeypatch):
    def joined(**kw):
        raise AssertionError(f"jax.distributed.initialize was called with {kw}")

    monkeypatch.setattr(dist.jax.distributed, "initialize", joined)
    with pytest.raises(ValueError, match=r"port must be in 1\.\.65535, got 99999 in '127\.0\.0\.1:99999'"):
        initialize("127.0.0.1:99999", 2, 0)
    with pytest.raises(ValueError, match="timeout must be an int >= 1"):
        initialize("localhost:1234", 2, 0, timeout=0)
    with pytest.raises(ValueError, match="does not resolve"):
        initialize("no-such-host.invalid:1234", 2, 0)


def test_initialize_passes_the_timeout_to_jax(monkeypatch):
    seen = []
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda **kw: seen.append(kw))
    initialize("localhost:1234", 2, 0, timeout=7)
    initialize(None, None, None)
    assert seen == [
        dict(coordinator_address="localhost:1234", num_processes=2, process_id=0, initialization_timeout=7),
        dict(initialization_timeout=dist.COORDINATOR_TIMEOUT),
    ]
    assert dist.COORDINATOR_TIMEOUT == 300  # JAX's own default: jobs whose processes start minutes apart still join


def test_initialize_distributed_wires_the_timeout_and_says_what_it_awaits(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(dist, "initialize", lambda *a, **kw: seen.append((a, kw)))
    parser = build_parser()
    initialize_distributed(parser.parse_args([*BASE, "--coordinator", "localhost:1234"] + ["--num-processes", "2"]))
    initialize_distributed(
        parser.parse_args([*BASE, "--coordinator", "auto", "--coordinator-timeout", "9"]),
    )
    assert seen == [(("localhost:1234", 2, None), {"timeout": 300}), ((None, None, None), {"timeout": 9})]
    err = capsys.readouterr().err
    assert "coordinator localhost:1234" in err and "giving up after 300 s (--coordinator-timeout)" in err
    with pytest.raises(ValueError, match="--coordinator-timeout bounds joining the distributed runtime"):
        initialize_distributed(parser.parse_args([*BASE, "--coordinator-timeout", "5"]))


def test_wait_for_coordinator_returns_once_the_port_listens_and_raises_when_it_never_does():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        dist.wait_for_coordinator("127.0.0.1", srv.getsockname()[1], 5)  # returns at once
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        dist.wait_for_coordinator("127.0.0.1", port, 1)
    assert time.monotonic() - t0 < 5
    assert f"the coordinator 127.0.0.1:{port} did not accept a connection within 1 s" in str(e.value)


def _sarjax(argv, timeout):
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "sarjax.cli", *argv], env=ENV, capture_output=True, text=True, timeout=timeout
    )
    return p, time.monotonic() - t0


def test_the_command_with_a_bad_port_fails_at_once():
    # before the fix this reached jax.distributed.initialize and waited 300 s: the timeout fails it
    p, seconds = _sarjax([*BASE, "--coordinator", "127.0.0.1:99999", "--num-processes", "2", "--process-id", "0"], 60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "coordinator port must be in 1..65535, got 99999 in '127.0.0.1:99999'" in p.stderr
    assert seconds < 60


def test_the_command_with_an_unreachable_coordinator_fails_within_its_timeout():
    port = free_port()  # nobody listens there
    argv = [*BASE, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1"]
    p, seconds = _sarjax([*argv, "--coordinator-timeout", "2"], 60)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith(f"joining JAX's distributed runtime (coordinator 127.0.0.1:{port}) as process 1 of 2")
    assert lines[-1] == (
        f"sarjax autoattack: error: the coordinator 127.0.0.1:{port} did not accept a connection within 2 s: check "
        "--coordinator and that process 0 runs (or raise --coordinator-timeout)"
    )
