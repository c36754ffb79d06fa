"""Processes on JAX's distributed runtime: joining it, splitting rows, gathering them back.

Every command that spreads over processes (``sarjax sar``, ``sarjax frontier``, ``sarjax
autoattack``) splits its images into contiguous blocks, one per process, runs its block as one
process would, and gathers the per-row results in process order. The gather uses the runtime's
own collective (:func:`jax.experimental.multihost_utils.process_allgather`: gloo on CPU, NCCL /
ICI on GPU / TPU), so no shared file system is needed.

Example (two processes on one machine, each in its own shell)::

    sarjax frontier --model mypkg.models:make_pool --images mine.npz --norm l2 --out OUT \\
        --coordinator localhost:12355 --num-processes 2 --process-id 0      # and --process-id 1
"""

from __future__ import annotations

import io
import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import overload

import jax
import numpy as np

COORDINATOR_TIMEOUT = 300  # seconds; jax.distributed.initialize's own default (initialization_timeout)


def parse_coordinator(address: str) -> tuple[str, int]:
    """``(host, port)`` of a coordinator address ``HOST:PORT`` (``[IPv6]:PORT`` for an IPv6 host).

    Args:
        address: e.g. ``"localhost:12355"``, ``"10.0.0.1:12355"``, ``"[::1]:12355"``.

    Returns:
        The host (without brackets) and the port, an int in ``1 .. 65535``.

    Raises:
        TypeError: ``address`` is not a str.
        ValueError: no host, no port, or a port outside ``1 .. 65535`` (naming the value).
    """
    if not isinstance(address, str):
        raise TypeError(f"coordinator must be a str HOST:PORT, got {type(address).__name__} {address!r}")
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^\s:\[\]]+):(\d+)", address)
    if m is None:
        raise ValueError(
            f"coordinator must be HOST:PORT with a host and a port in 1..65535 (e.g. localhost:12355, "
            f"[::1]:12355), got {address!r}"
        )
    host, port = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"coordinator port must be in 1..65535, got {int(port)} in {address!r}")
    return host, int(port)


def _check_timeout(timeout: int) -> int:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, np.integer)) or timeout < 1:
        raise ValueError(f"timeout must be an int >= 1 (seconds), got {timeout!r}")
    return int(timeout)


def _resolve(host: str, port: int) -> None:
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"coordinator host {host!r} does not resolve ({e.strerror}): check --coordinator") from None


def wait_for_coordinator(host: str, port: int, timeout: float) -> None:
    """Wait until ``host:port`` accepts a TCP connection (process 0's coordinator service is up).

    Used by :func:`initialize` on every process but 0 before it joins: JAX's own join aborts the
    process (a C++ check failure) when its ``initialization_timeout`` runs out, so an unreachable
    coordinator is reported here first, as an exception naming it.

    Raises:
        ValueError: the host does not resolve, or nothing accepted a connection within
            ``timeout`` seconds (naming the address and the timeout).
    """
    _resolve(host, port)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(left, 5.0))):
                return
        except OSError:
            if time.monotonic() + 0.25 >= deadline:
                break
            time.sleep(0.25)
    raise ValueError(
        f"the coordinator {host}:{port} did not accept a connection within {timeout:g} s: check --coordinator "
        "and that process 0 runs (or raise --coordinator-timeout)"
    )


def initialize(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    *,
    timeout: int = COORDINATOR_TIMEOUT,
) -> None:
    """Join JAX's distributed runtime (``jax.distributed.initialize``) after checking the arguments.

    Call it before any JAX computation. All three None: the runtime detects the cluster itself
    (TPU pod slices, Slurm, Open MPI, ...; on one machine without a cluster it fails). Otherwise
    all three are required.

    Args:
        coordinator_address: ``HOST:PORT`` of process 0 (every process passes the same; the port
            in ``1 .. 65535``, :func:`parse_coordinator`).
        num_processes: ``n >= 1``.
        process_id: this process, in ``[0, n)``.
        timeout: seconds to wait for the coordinator and every process to join (JAX's
            ``initialization_timeout``; default 300, JAX's). Processes other than 0 first wait
            for the coordinator's port to accept a connection (:func:`wait_for_coordinator`) and
            raise if it never does; past the timeout inside JAX's own join, JAX ends the process
            with a ``DEADLINE_EXCEEDED`` message.

    Raises:
        ValueError: a partial or malformed set of arguments (naming what was given), a timeout
            below 1, a coordinator host that does not resolve, or one that did not accept a
            connection within ``timeout``.
    """
    timeout = _check_timeout(timeout)
    given = [a is not None for a in (coordinator_address, num_processes, process_id)]
    if any(given) and not all(given):
        raise ValueError(
            "--coordinator, --num-processes and --process-id go together (or none of them, to let "
            f"JAX detect a TPU / SLURM / MPI cluster), got coordinator={coordinator_address!r}, "
            f"num_processes={num_processes!r}, process_id={process_id!r}"
        )
    if all(given):
        assert coordinator_address is not None and num_processes is not None and process_id is not None
        host, port = parse_coordinator(coordinator_address)
        if isinstance(num_processes, bool) or not isinstance(num_processes, (int, np.integer)) or num_processes < 1:
            raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
        if isinstance(process_id, bool) or not isinstance(process_id, (int, np.integer)):
            raise ValueError(f"process_id must be an int in [0, {num_processes}), got {process_id!r}")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
        if process_id != 0:
            wait_for_coordinator(host, port, timeout)
        else:
            _resolve(host, port)
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=int(num_processes),
            process_id=int(process_id),
            initialization_timeout=timeout,
        )
    else:
        jax.distributed.initialize(initialization_timeout=timeout)


def process_count() -> int:
    """The number of processes in the run (1 without the distributed runtime)."""
    return jax.process_count()


def process_index() -> int:
    """This process's index in ``[0, process_count())``."""
    return jax.process_index()


def is_main() -> bool:
    """Whether this is process 0, the one that writes a run's shared outputs."""
    return jax.process_index() == 0


@overload
def process_checkpoint_dir(root: None) -> None: ...
@overload
def process_checkpoint_dir(root: str | os.PathLike) -> Path: ...
def process_checkpoint_dir(root: str | os.PathLike | None) -> Path | None:
    """``root/process_<i>_of_<n>`` (each process's own checkpoints), ``root`` for one process
    (``None`` for ``None``). The resumable runs that split over processes keep their state there:
    ``sarjax sar`` / ``demo`` and ``sarjax autoattack --checkpoint``."""
    if root is None:
        return None
    n = jax.process_count()
    return Path(root) if n == 1 else Path(root) / f"process_{jax.process_index()}_of_{n}"


def process_rows(n: int, index: int | None = None, count: int | None = None) -> np.ndarray:
    """The contiguous block of ``arange(n)`` that process ``index`` of ``count`` runs.

    Blocks differ in size by at most one (``np.array_split``), in process order.

    Args:
        n: number of samples.
        index: the process (default ``jax.process_index()``).
        count: the number of processes (default ``jax.process_count()``).

    Raises:
        ValueError: fewer samples than processes (a process would have none).
    """
    count = jax.process_count() if count is None else int(count)
    index = jax.process_index() if index is None else int(index)
    if n < count:
        raise ValueError(f"{n} samples cannot be split over {count} processes (each needs at least one)")
    return np.array_split(np.arange(n), count)[index]


def process_blocks(n: int, block: int, index: int | None = None, count: int | None = None) -> np.ndarray:
    """The rows of ``arange(n)`` that process ``index`` of ``count`` runs, in whole blocks of ``block``.

    The ``ceil(n / block)`` blocks (the last may be partial) are dealt out contiguously in process
    order, block counts differing by at most one. A process therefore runs exactly the
    ``block``-row batches a one-process run would, so per-batch computations are bit-identical
    to it. A process gets no rows when there are fewer blocks than processes.

    Args:
        n: number of rows, ``>= 0``.
        block: rows per block (an attack's batch size), ``>= 1``.
        index: the process (default ``jax.process_index()``).
        count: the number of processes (default ``jax.process_count()``).

    Raises:
        ValueError: ``block < 1`` or ``n < 0``.
    """
    if isinstance(block, bool) or int(block) != block or block < 1:
        raise ValueError(f"block must be an int >= 1, got {block!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    count = jax.process_count() if count is None else int(count)
    index = jax.process_index() if index is None else int(index)
    nblocks = -(-n // block)
    mine = np.array_split(np.arange(nblocks), count)[index]
    if not mine.size:
        return np.zeros(0, np.int64)
    return np.arange(int(mine[0]) * block, min(n, (int(mine[-1]) + 1) * block), dtype=np.int64)


def _pack(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})  # pyright: ignore[reportArgumentType]
    return np.frombuffer(buf.getvalue(), np.uint8)


def _unpack(blob: np.ndarray) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob.tobytes()), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def allgather_bytes(blob: np.ndarray) -> list[np.ndarray]:
    """Every process's ``uint8`` buffer (any length), in process order, on every process."""
    blob = np.asarray(blob, np.uint8).reshape(-1)
    if jax.process_count() == 1:
        return [blob]
    from jax.experimental.multihost_utils import process_allgather  # only with several processes

    sizes = np.asarray(process_allgather(np.array([blob.size], np.int64))).reshape(-1)
    padded = np.zeros(max(int(sizes.max()), 1), np.uint8)
    padded[: blob.size] = blob
    blobs = np.asarray(process_allgather(padded))  # [P, L]
    return [blobs[i, : int(sizes[i])] for i in range(len(sizes))]


def allgather_rows(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each process's arrays (axis 0 = its rows) concatenated over processes, on every process.

    Every process passes the same names, with the same dtypes and trailing shapes (zero rows are
    allowed). With one process the arrays come back as they are (as numpy arrays).

    Raises:
        ValueError: a process sent other names, dtypes or trailing shapes (naming the process).
    """
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    if jax.process_count() == 1:
        return arrays
    parts = [_unpack(b) for b in allgather_bytes(_pack(arrays))]
    for i, part in enumerate(parts):
        if sorted(part) != sorted(arrays):
            raise ValueError(f"process {i} sent arrays {sorted(part)}, this process {sorted(arrays)}")
        for k, v in part.items():
            if v.dtype != arrays[k].dtype or v.shape[1:] != arrays[k].shape[1:]:
                raise ValueError(
                    f"process {i} sent {k!r} as {v.dtype}{list(v.shape)}, this process "
                    f"{arrays[k].dtype}{list(arrays[k].shape)} (trailing shapes and dtypes must agree)"
                )
    return {k: np.concatenate([p[k] for p in parts], axis=0) for k in arrays}


def all_ok(ok: bool) -> bool:
    """Whether every process passed ``ok=True`` (a gathered flag; also a barrier)."""
    if jax.process_count() == 1:
        return bool(ok)
    from jax.experimental.multihost_utils import process_allgather  # only with several processes

    return bool(np.asarray(process_allgather(np.array([bool(ok)], np.int32))).all())
