"""``sarjax plan``: size an attack run before renting the hardware (docs/scale.md).

The attack's step is lowered and compiled ahead of time with abstract shapes
(``jax.ShapeDtypeStruct`` params and inputs: no weights are allocated; params come from
``jax.eval_shape`` of the init) on as many fake CPU devices as the target has, sharded on the
mesh the run would use. XLA's analyses of that program give, per device:

- memory (``compiled.memory_analysis()``): argument, output, temporary, aliased (the donated
  attack state) and generated-code bytes; their sum less the aliased bytes is the footprint;
- FLOPs and bytes accessed (``compiled.cost_analysis()``). XLA counts a ``while`` loop's body
  once, whatever its trip count; a step whose program holds ``lax.scan`` loops (an LLM's layers)
  is therefore compiled a second time with every scan unrolled (:func:`unroll_scans`) for its
  cost, and the memory is read from the program as it runs (rolled).

From these and a device's datasheet (:mod:`sarjax.runtime.devices`):

- the largest batch that fits: per-device memory is fitted linear in the batch from two compiles
  (batch ``b`` and ``2b``), and the largest multiple of the mesh's ``data`` axis under
  ``memory_fraction`` of the device's memory is reported (method ``"linear fit of 2 compiles"``);
- a roofline time per step, ``max(flops / peak, bytes / bandwidth)``, and per run (steps x
  restarts x chunks x greedy rounds). Every such figure is a PROJECTION and labelled so.

The plan is only as good as the step it compiles: the host work around it (the greedy cover,
tokenizers, audits) and input pipelines are not in it. ``benchmarks/plan_validation.py`` compares
the method's projections with measurements on this CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sarjax.attacks.apgd import make_apgd
from sarjax.attacks.autoattack import N_ITER, SQUARE_QUERIES
from sarjax.attacks.autoattack_checks import N_TARGETS
from sarjax.attacks.fab import make_fab
from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.attacks.square import make_square
from sarjax.attacks.text import model as TM
from sarjax.attacks.text import requests as TR
from sarjax.attacks.text.gcg import make_gcg
from sarjax.models.llm.config import config_from_hf
from sarjax.models.llm.decoder import init_params
from sarjax.models.pool import Stack
from sarjax.models.presets import preset_members
from sarjax.models.sharding import make_mesh, mesh_stack_apply
from sarjax.runtime.devices import DeviceSpec, device_spec

ATTACKS = ("joint-pgd", "autoattack", "joint-gcg")
PROJECTION = "projection"
#: JAX preallocates this share of a GPU's memory by default (JAX documentation, "GPU memory
#: allocation": XLA_PYTHON_CLIENT_MEM_FRACTION, default .75): what a run's arrays may use
DEFAULT_MEMORY_FRACTION = 0.75


# ----------------------------------------------------------------------------- fake devices


def use_fake_devices(n: int) -> None:
    """Give this process ``n`` fake CPU devices (before JAX starts its backend).

    Raises:
      ValueError: ``n < 1``, or JAX's backend already started with another device count (run the
        plan in a fresh process: ``sarjax plan`` does).
    """
    if int(n) < 1:
        raise ValueError(f"devices must be >= 1, got {n}")
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", int(n))
    if jax.device_count() != int(n):
        raise ValueError(
            f"need {n} fake CPU devices but JAX's backend already started with {jax.device_count()}: "
            "run the plan in a fresh process (the `sarjax plan` command)"
        )


# ----------------------------------------------------------------------------- pools as shapes


@dataclasses.dataclass(frozen=True)
class ShapeStack:
    """One architecture of a planned pool: its stacked apply and ABSTRACT stacked params.

    Attributes:
      name: architecture name.
      apply: ``apply(params [K, ...], x [B, *S]) -> logits [K, B, C]``.
      params: pytree of ``jax.ShapeDtypeStruct`` with a leading member axis ``K``.
      size: ``K``.
    """

    name: str
    apply: Callable
    params: Any
    size: int


@dataclasses.dataclass(frozen=True)
class ShapePool:
    """A vision pool as shapes: stacks, one input's shape, the class count."""

    stacks: tuple[ShapeStack, ...]
    input_shape: tuple[int, ...]
    num_classes: int

    @property
    def num_members(self) -> int:
        return sum(s.size for s in self.stacks)

    @property
    def param_bytes(self) -> int:
        return sum(_nbytes(leaf) for s in self.stacks for leaf in jax.tree.leaves(s.params))

    def describe(self) -> str:
        return " + ".join(f"{s.size} x {s.name}" for s in self.stacks)


def _nbytes(leaf) -> int:
    return int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize


def _abstract(tree) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype), tree)


def _stacked_shapes(init: Callable, k: int) -> Any:
    """Abstract params of ``k`` stacked members of ``init(key)`` (nothing allocated)."""
    return jax.eval_shape(jax.vmap(init), jax.random.split(jax.random.key(0), k))


def preset_pool(name: str, members: int, input_shape=(28, 28, 1), num_classes: int = 10) -> ShapePool:
    """A diversity preset (``low``, ``medium``, ``high``: :mod:`sarjax.models.presets`) as shapes."""

    archs = [dataclasses.replace(a, input_shape=tuple(input_shape), num_classes=num_classes) for a, _ in
             preset_members(name, members)]  # fmt: skip
    groups: dict[Any, int] = {}
    for a in archs:
        groups[a] = groups.get(a, 0) + 1
    stacks = []
    for a, k in groups.items():
        shell = Stack(a, {"_": np.zeros((k,), np.float32)}, tuple(f"{a.name}/{i}" for i in range(k)))  # apply only
        stacks.append(ShapeStack(a.name, shell.apply, _stacked_shapes(a.init, k), k))
    return ShapePool(tuple(stacks), tuple(input_shape), num_classes)


def pool_shapes(pool) -> ShapePool:
    """A built :class:`~sarjax.models.pool.Pool` (``--model``, ``--pool DIR``) as shapes."""
    stacks = tuple(ShapeStack(s.name, s.apply, _abstract(s.params), s.size) for s in pool.stacks)
    return ShapePool(stacks, tuple(pool.input_shape), int(pool.num_classes))


# -- a WideResNet of RobustBench's DMWideResNet shape ------------------------------------------


def _wrn_init(key, depth: int, width: int, channels: int, classes: int) -> dict:
    """One WideResNet-``depth``-``width`` (Zagoruyko & Komodakis 2016, "Wide Residual Networks"; the
    pre-activation layout and Swish of DeepMind's ``DMWideResNet`` in RobustBench)."""
    n = (depth - 4) // 6
    keys = iter(jax.random.split(key, 8 * n + 8))

    def conv(k, cin, cout):
        return jax.random.normal(next(keys), (k, k, cin, cout)) * math.sqrt(2.0 / (k * k * cin))

    def bn(c):
        return {"scale": jnp.ones((c,)), "bias": jnp.zeros((c,))}

    p: dict[str, Any] = {"stem": conv(3, channels, 16)}
    cin = 16
    for g, c in enumerate((16 * width, 32 * width, 64 * width)):
        for b in range(n):
            blk = {"bn0": bn(cin), "conv0": conv(3, cin, c), "bn1": bn(c), "conv1": conv(3, c, c)}
            if cin != c:
                blk["short"] = conv(1, cin, c)
            p[f"g{g}b{b}"] = blk
            cin = c
    p["bn"] = bn(cin)
    p["head"] = {"w": jax.random.normal(next(keys), (cin, classes)) / math.sqrt(cin), "b": jnp.zeros((classes,))}
    return p


def _wrn_apply(p: dict, x: jax.Array, depth: int) -> jax.Array:
    """Logits ``[B, C]`` of one WideResNet for ``x [B, H, W, C] in [0, 1]`` (BN in inference form)."""
    n = (depth - 4) // 6

    def conv(z, w, stride=1):
        return jax.lax.conv_general_dilated(z, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def act(z, q):
        return jax.nn.swish(z * q["scale"] + q["bias"])

    z = conv(x, p["stem"])
    for g in range(3):
        for b in range(n):
            q = p[f"g{g}b{b}"]
            stride = 2 if (g > 0 and b == 0) else 1
            o = act(z, q["bn0"])
            y = conv(act(conv(o, q["conv0"], stride), q["bn1"]), q["conv1"])
            z = y + (conv(o, q["short"], stride) if "short" in q else z)
    z = jnp.mean(act(z, p["bn"]), axis=(1, 2))
    return z @ p["head"]["w"] + p["head"]["b"]


def wrn_pool(depth: int = 28, width: int = 10, members: int = 1, input_shape=(32, 32, 3), num_classes: int = 10):
    """``members`` WideResNet-``depth``-``width`` members (RobustBench's DMWideResNet shape) as shapes.

    Raises:
      ValueError: ``depth`` not ``6n + 4``.
    """
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"a WideResNet's depth is 6n + 4 (e.g. 28), got {depth}")
    init = functools.partial(_wrn_init, depth=depth, width=width, channels=input_shape[-1], classes=num_classes)
    apply = jax.vmap(functools.partial(_wrn_apply, depth=depth), in_axes=(0, None))
    name = f"wrn-{depth}-{width}"
    return ShapePool((ShapeStack(name, apply, _stacked_shapes(init, members), members),), tuple(input_shape),
                     num_classes)  # fmt: skip


def zoo_pool(spec: str, input_shape: Sequence[int] | None = None, num_classes: int = 10) -> ShapePool:
    """A pool from a zoo spec ``NAME:M``: ``low``/``medium``/``high`` (the diversity presets,
    default 28x28x1) or ``wrn-D-W`` (WideResNet-D-W, default 32x32x3).

    Raises:
      ValueError: a malformed spec or member count.
    """
    name, _, m = spec.partition(":")
    if not m.isdigit() or int(m) < 1:
        raise ValueError(f"zoo spec is NAME:M with M >= 1 members (e.g. low:20, wrn-28-10:20), got {spec!r}")
    if name in ("low", "medium", "high"):
        return preset_pool(name, int(m), tuple(input_shape or (28, 28, 1)), num_classes)
    parts = name.split("-")
    if len(parts) == 3 and parts[0] == "wrn" and parts[1].isdigit() and parts[2].isdigit():
        return wrn_pool(int(parts[1]), int(parts[2]), int(m), tuple(input_shape or (32, 32, 3)), num_classes)
    raise ValueError(f"zoo spec NAME must be low, medium, high or wrn-DEPTH-WIDTH, got {name!r}")


# ----------------------------------------------------------------------------- cost: scans unrolled


_CALLS = ("pjit", "jit", "closed_call", "core_call")


def count_loops(jaxpr) -> dict:
    """``{"scan": n, "while": n}``: the loops in a (closed) jaxpr, nested ones included."""
    out = {"scan": 0, "while": 0}

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "scan":
                out["scan"] += 1
            elif eqn.primitive.name == "while":
                out["while"] += 1
            for sub in jex_core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(getattr(jaxpr, "jaxpr", jaxpr))
    return out


def _eval_unrolled(jaxpr, consts, *args):
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = c
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a
    for eqn in jaxpr.eqns:
        inv = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "scan":
            outs = _scan_unrolled(eqn.params, inv)
        elif name in _CALLS and "jaxpr" in eqn.params:
            cj = eqn.params["jaxpr"]
            outs = _eval_unrolled(cj.jaxpr, cj.consts, *inv) if hasattr(cj, "consts") else _eval_unrolled(cj, (), *inv)
        else:
            with eqn.ctx.manager:  # as jax's own eval_jaxpr binds an equation
                outs = eqn.primitive.bind(*inv, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _scan_unrolled(params, inv):
    body, length = params["jaxpr"], int(params["length"])
    nc, ncar = int(params["num_consts"]), int(params["num_carry"])
    consts, carry, xs = inv[:nc], list(inv[nc : nc + ncar]), inv[nc + ncar :]
    n_ys = len(body.jaxpr.outvars) - ncar
    ys: list[list] = [[] for _ in range(n_ys)]
    order = range(length - 1, -1, -1) if params["reverse"] else range(length)
    for i in order:
        out = _eval_unrolled(body.jaxpr, body.consts, *consts, *carry, *[x[i] for x in xs])
        carry = out[:ncar]
        for j, y in enumerate(out[ncar:]):
            ys[j].append(y)
    if params["reverse"]:
        ys = [col[::-1] for col in ys]
    stacked = [jnp.stack(col) if col else jnp.zeros((0, *a.shape), a.dtype) for col, a in
               zip(ys, [v.aval for v in body.jaxpr.outvars[ncar:]], strict=True)]  # fmt: skip
    return [*carry, *stacked]


def unroll_scans(fn: Callable, *args) -> Callable:
    """``fn`` with every ``lax.scan`` in its trace unrolled (same values; no loops for XLA's cost
    analysis, which counts a loop body once). ``args``: abstract arguments to trace at."""
    closed = jax.make_jaxpr(fn)(*args)
    out_tree = jax.tree.structure(jax.eval_shape(fn, *args))

    def unrolled(*a):
        return jax.tree.unflatten(out_tree, _eval_unrolled(closed.jaxpr, closed.consts, *jax.tree.leaves(a)))

    return unrolled


# ----------------------------------------------------------------------------- one program's analysis


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """An attack step to compile: ``fn(params, state) -> state`` and abstract arguments.

    Attributes:
      name: what the step is (e.g. ``"joint-pgd step"``).
      fn: the step; ``state`` (argument 1) is donated, as in the run's loop.
      params: abstract params (with shardings).
      state: abstract state (with shardings).
      steps_per_call: step calls per attack call (e.g. steps x restarts).
      init: ``init(params, *init_args) -> state``, the attack's own state builder (what ``state``'s
        shapes come from); ``benchmarks/plan_validation.py`` calls it on concrete arrays to run the
        step it projects.
      init_args: abstract arguments of ``init`` after the params (vision: ``x, ref, mask, key``;
        joint GCG: the ``TextProblem``).
    """

    name: str
    fn: Callable
    params: Any
    state: Any
    steps_per_call: int
    init: Callable | None = None
    init_args: tuple = ()


def analyse(program: StepProgram, layers: tuple[int, Callable[[int], StepProgram]] | None = None) -> dict:
    """Compile ``program`` and read XLA's memory and cost analyses (per device).

    Args:
      program: the step.
      layers: ``(L, at)`` for a step whose scans run over ``L`` layers (an LLM) and
        ``at(n) -> StepProgram``, the same step with ``n`` layers. Its cost is then read from the
        programs at 2 and 3 layers, scans unrolled, and extended linearly to ``L``:
        ``c(L) = c(2) + (L - 2) * (c(3) - c(2))`` (layers are identical, so the cost is affine in
        their count; the first and the last layer's extra work, e.g. the input gradient, is in
        both; :func:`layer_cost` checks the rule against a full unroll on a small decoder). Two
        small compiles instead of one of ``L`` unrolled layers (Llama-3-8B's 32: minutes).

    Returns:
      ``{"memory": {argument, output, temp, alias, generated_code, total}`` bytes per device,
      ``"flops"``, ``"bytes_accessed"`` per device and step, ``"loops"`` (scans / whiles in the
      step), ``"cost_from"`` (``"compiled step"``, ``"compiled step, scans unrolled"`` or the
      layer rule), ``"compile_seconds"``}.
    """
    t0 = time.perf_counter()
    jitted = jax.jit(program.fn, donate_argnums=1)
    compiled = jitted.lower(program.params, program.state).compile()
    mem = compiled.memory_analysis()
    memory = {
        "argument": int(mem.argument_size_in_bytes),
        "output": int(mem.output_size_in_bytes),
        "temp": int(mem.temp_size_in_bytes),
        "alias": int(mem.alias_size_in_bytes),
        "generated_code": int(mem.generated_code_size_in_bytes),
    }
    memory["total"] = (
        memory["argument"] + memory["output"] + memory["temp"] + memory["generated_code"] - memory["alias"]
    )
    loops = count_loops(jax.make_jaxpr(program.fn)(program.params, program.state))
    cost_from = "compiled step"
    cost = _cost(compiled)
    if loops["scan"] and layers is not None and layers[0] > 3:
        cost = layer_cost(layers[0], layers[1])
        cost_from = f"compiled step at 2 and 3 layers, scans unrolled, linear in the layer count to {layers[0]}"
    elif loops["scan"]:
        cost = unrolled_cost(program)
        cost_from = "compiled step, scans unrolled"
    out = {
        "memory": memory,
        "flops": cost[0],
        "bytes_accessed": cost[1],
        "loops": loops,
        "cost_from": cost_from,
        "compile_seconds": time.perf_counter() - t0,
    }
    if loops["while"]:
        out["warning"] = f"{loops['while']} while loop(s) with data-dependent trip counts: their bodies count once"
    return out


def unrolled_cost(program: StepProgram) -> tuple[float, float]:
    """``(flops, bytes accessed)`` per device of ``program`` compiled with its scans unrolled."""
    unrolled = unroll_scans(program.fn, program.params, program.state)
    return _cost(jax.jit(unrolled).lower(program.params, program.state).compile())


def layer_cost(n_layers: int, at: Callable[[int], StepProgram]) -> tuple[float, float]:
    """``(flops, bytes accessed)`` of the step at ``n_layers`` layers from its unrolled cost at 2
    and 3: ``c(2) + (n_layers - 2) * (c(3) - c(2))`` (see :func:`analyse`)."""
    c2, c3 = unrolled_cost(at(2)), unrolled_cost(at(3))
    return tuple(a + (n_layers - 2) * (b - a) for a, b in zip(c2, c3, strict=True))  # type: ignore[return-value]


def _cost(compiled) -> tuple[float, float]:
    c = compiled.cost_analysis()
    if isinstance(c, list | tuple):  # older JAX: one dict per device program
        c = c[0]
    return float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0))


# ----------------------------------------------------------------------------- meshes and shardings


def parse_mesh(s: str | None, devices: int, axes: Sequence[str]) -> dict[str, int]:
    """``"pool=P,data=D[,model=T]"`` as ``{axis: size}`` over ``axes``; every size defaults to 1 but
    ``data``, which takes what the others leave.

    Raises:
      ValueError: a malformed string, an unknown axis, or sizes whose product is not ``devices``.
    """
    shape = {a: 1 for a in axes}
    given = set()
    for part in (s or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in shape or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"mesh is {','.join(f'{a}=N' for a in axes)} with positive integers, got {s!r}")
        shape[name] = int(value)
        given.add(name)
    if "data" not in given:
        rest = math.prod(v for a, v in shape.items() if a != "data")
        if devices % rest:
            raise ValueError(f"{devices} devices are not divisible by the mesh's other axes {shape} (product {rest})")
        shape["data"] = devices // rest
    if math.prod(shape.values()) != devices:
        raise ValueError(f"mesh {shape} has {math.prod(shape.values())} devices, the target has {devices}")
    return shape


def _on(mesh, spec: P, leaf) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))


def _batch_sharded(mesh, tree, b: int) -> Any:
    """Leaves with a leading batch axis ``b`` on ``data``, the rest replicated."""
    return jax.tree.map(lambda a: _on(mesh, P("data") if a.ndim and a.shape[0] == b else P(), a), tree)


# ----------------------------------------------------------------------------- vision programs


def _padded_pool(pool: ShapePool, mesh) -> tuple[Callable, tuple, int]:
    """``(apply, params, padded members)``: every stack padded to a multiple of the ``pool`` axis,
    its params sharded on it; ``apply`` runs each stack as :class:`~sarjax.models.sharding.ShardedPool`
    does (:func:`~sarjax.models.sharding.mesh_stack_apply`: each device its members on its samples)
    and returns the real members only."""
    k = mesh.shape["pool"]
    params, sizes, start = [], [], 0
    for s in pool.stacks:
        kp = -(-s.size // k) * k
        params.append(jax.tree.map(lambda a, kp=kp: _on(mesh, P("pool"), jax.ShapeDtypeStruct((kp, *a.shape[1:]),
                                                                                               a.dtype)), s.params))  # fmt: skip
        sizes.append((s.size, kp))
        start += kp
    applies = tuple(mesh_stack_apply(s.apply, mesh) for s in pool.stacks)

    def apply(ps, x):
        outs = [f(p, x)[:n] if n != kp else f(p, x) for f, p, (n, kp) in zip(applies, ps, sizes, strict=True)]
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs)

    return apply, tuple(params), start


def vision_program(pool: ShapePool, attack: str, batch: int, mesh, settings: dict) -> list[StepProgram]:
    """The step programs of a vision attack on ``pool`` for a global batch ``batch``.

    ``joint-pgd``: the SAR paper's joint PGD (``settings``: steps, restarts, eps); ``autoattack``:
    AutoAttack standard linf's building blocks on a one-member pool (APGD, FAB-T, Square steps).
    """

    apply, params, _ = _padded_pool(pool, mesh)
    m = pool.num_members
    x = jax.ShapeDtypeStruct((batch, *pool.input_shape), jnp.float32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    eps = float(settings.get("eps", 8 / 255))
    if attack == "joint-pgd":
        fn = make_joint_pgd(apply, steps=settings["steps"], step=JointPGDStep(restarts=settings["restarts"]), eps=eps)
        ref, mask = jax.ShapeDtypeStruct((batch, m), jnp.int32), jax.ShapeDtypeStruct((batch, m), jnp.float32)
        return [_program(fn, fn.attack, "joint-pgd step", params, (x, ref, mask, key), batch, mesh, eps=eps)]
    if attack == "autoattack":
        if m != 1:
            raise ValueError(f"plan AutoAttack on one model (AutoAttack attacks each member alone), got {m} members")
        apply1 = lambda p, z: apply(p, z)[0]  # noqa: E731  [B, C]: one model
        ref, mask = jax.ShapeDtypeStruct((batch,), jnp.int32), jax.ShapeDtypeStruct((batch, 1), jnp.float32)
        n_iter, targets, queries = settings["n_iter"], settings["targets"], settings["square_queries"]
        apgd = make_apgd(apply1, n_iter=n_iter, eps=eps, audit=False)
        fab = make_fab(apply1, norm=np.inf, max_queries=1 + 3 * n_iter, fab_t=True, targeted=True,
                       success="untargeted", audit=False)  # fmt: skip
        square = make_square(apply1, n_queries=queries, eps=eps, audit=False)
        progs = [
            _program(apgd, apgd.attack, "apgd step (APGD-CE, APGD-T)", params, (x, ref, mask, key), batch, mesh,
                     eps=eps, calls=1 + targets),
            _program(fab, fab.attack_for(pool.num_classes), "fab-t step", params, (x, ref, mask, key), batch, mesh,
                     calls=targets, labels=True),
            _program(square, square.attack, "square step", params, (x, ref, mask, key), batch, mesh, eps=eps),
        ]  # fmt: skip
        return progs
    raise ValueError(f"attack must be one of {ATTACKS} for a vision pool, got {attack!r}")


def _program(fn, attack, name, params, inputs, batch, mesh, calls: int = 1, labels: bool = False,
             **call) -> StepProgram:  # fmt: skip
    """A :class:`StepProgram` of ``attack`` (the state machine of entry ``fn``) at abstract ``inputs``
    (``labels``: the call also passes ``labels=`` the ``ref`` array, as a targeted FAB-T needs the
    true labels beside its targets; the same shape, so the same program)."""
    x, ref, mask, key = inputs
    cfg = attack.cfg

    def prepared(p):
        return attack.prepare(cfg, p) if attack.prepare is not None else (cfg, p)

    def init(p, x, r, mk, k):  # the jit-safe entry's own problem builder (jnp operations only)
        extra = {"labels": r} if labels else {}
        return attack.init(*prepared(p), fn._traced_problem(p, x, r, mk, k, **call, **extra))

    state = jax.eval_shape(init, params, x, ref, mask, key)

    def step(p, s):
        c, q = prepared(p)
        return attack.step(c, s, q)

    return StepProgram(name, step, params, _batch_sharded(mesh, state, batch), attack.num_steps * calls, init,
                       (x, ref, mask, key))  # fmt: skip


# ----------------------------------------------------------------------------- LLM programs


def llm_configs(paths: Sequence[str]) -> list:
    """The :class:`~sarjax.models.llm.config.DecoderConfig` of each Hugging Face ``config.json``.

    Raises:
      FileNotFoundError: a missing file (naming it).
      ValueError: a file that is not a JSON object, or a model type sarjax does not run.
    """

    out = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {str(p)!r} (give a Hugging Face config.json or its folder)")
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object (a Hugging Face config), got {type(raw).__name__}")
        out.append(config_from_hf(raw))
    return out


def llm_program(cfgs: Sequence, batch: int, mesh_shape: dict, settings: dict, dtype: str = "bfloat16") -> tuple:
    """The joint GCG step (:func:`sarjax.attacks.text.gcg.make_gcg`) on a stack of decoders.

    Members must share one configuration (one stack, one vocabulary). Uses
    :mod:`sarjax.models.llm.mesh` (``pool`` x ``data`` x ``model``) when it is importable; else the
    program is compiled on ONE device and the plan says so (``"sharding": "unsharded fallback"``).

    Returns:
      ``(StepProgram, sharding label, param bytes)``.
    """

    cfg = cfgs[0]
    if any(c != cfg for c in cfgs):
        raise ValueError("plan joint GCG on members of one configuration (one stack, one vocabulary)")
    m = len(cfgs)
    one = jax.eval_shape(lambda k: init_params(cfg, k, jnp.dtype(dtype)), jax.random.key(0))
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct((m, *a.shape), a.dtype), one)
    pbytes = sum(_nbytes(a) for a in jax.tree.leaves(params))
    try:
        from sarjax.models.llm import mesh as llm_mesh_mod  # the LLM mesh (pool x data x model), when present
    except ImportError:
        llm_mesh_mod = None
    if llm_mesh_mod is not None:
        mesh = llm_mesh_mod.llm_mesh(mesh_shape.get("pool", 1), mesh_shape.get("model", 1), mesh_shape.get("data", 1))
        specs = llm_mesh_mod.llm_param_specs(params, cfg, mesh)
        params = jax.tree.map(lambda a, s: _on(mesh, s, a), params, specs)
        label = f"pool={mesh.shape['pool']} x data={mesh.shape['data']} x model={mesh.shape['model']}"
    else:
        mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
        params = jax.tree.map(lambda a: _on(mesh, P(), a), params)
        label = "unsharded fallback (sarjax.models.llm.mesh not available): ONE device holds the whole pool"
    ls, pb, pa, tt = settings["suffix_len"], settings["prompt_len"], settings["after_len"], settings["target_len"]
    fn = make_gcg(TM.llm_text_model(cfg), vocab_size=cfg.vocab_size, num_steps=settings["steps"], suffix_len=ls,
                  topk=settings["topk"], num_candidates=settings["candidates"])  # fmt: skip
    i32 = jnp.int32
    batch_t = TR.TextBatch(*(jax.ShapeDtypeStruct((batch, n), i32) for n in (pb, pb, pa, pa, tt, tt)))
    f32 = jnp.float32
    problem = TR.TextProblem(
        batch_t, jax.ShapeDtypeStruct((batch, m), f32), jax.ShapeDtypeStruct((cfg.vocab_size,), jnp.bool_),
        jax.ShapeDtypeStruct((batch,), i32), jax.eval_shape(lambda: jax.random.key(0)),
        jax.ShapeDtypeStruct((batch,), i32), jax.ShapeDtypeStruct((batch, ls), i32), jax.ShapeDtypeStruct((batch,), i32),
    )  # fmt: skip
    attack = fn.attack
    state = jax.eval_shape(lambda p, pr: attack.init(attack.cfg, p, pr), params, problem)
    state = _batch_sharded(mesh, state, batch)
    prog = StepProgram("joint-gcg step", lambda p, s: attack.step(attack.cfg, s, p), params, state, attack.num_steps,
                       lambda p, pr: attack.init(attack.cfg, p, pr), (problem,))  # fmt: skip
    return prog, label, pbytes


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """What to plan (every field is a command option of ``sarjax plan``).

    Attributes:
      attack: ``joint-pgd``, ``autoattack`` or ``joint-gcg``.
      batch: global batch per attack call (samples / requests), >= 1.
      device: a :data:`sarjax.runtime.devices.DEVICES` name.
      devices: the target's device count.
      mesh: ``"pool=P,data=D"`` (LLM: ``",model=T"``) or None (``data`` takes every device the
        others leave).
      samples: samples in the run (chunks = ceil(samples / batch)).
      rounds: greedy cover rounds of the run (SAR; an upper bound is the member count).
      steps, restarts, eps: joint PGD (the SAR paper's Table 1: 40, 3).
      n_iter, targets, square_queries: AutoAttack standard (100, 9, 5,000).
      gcg_steps, topk, candidates, suffix_len, prompt_len, after_len, target_len: joint GCG
        (the SAR paper's Table 3: 20 steps per round, top-k 256, 64 candidates, 20 tokens).
      precision: the datasheet peak to use (``auto``: bf16 for bfloat16 params, else fp32).
      memory_fraction: share of the device's memory a run's arrays may use.
      fit_batch: search the largest batch that fits (two extra compiles).
      llm_cost: how an LLM step's cost is counted: ``layers`` (unrolled at 2 and 3 layers,
        linear in the layer count: :func:`layer_cost`) or ``unroll`` (every layer unrolled).
    """

    attack: str = "joint-pgd"
    batch: int = 128
    device: str = "h100-80gb"
    devices: int = 1
    mesh: str | None = None
    samples: int = 1000
    rounds: int = 1
    steps: int = 40
    restarts: int = 3
    eps: float = 8 / 255
    n_iter: int = N_ITER
    targets: int = N_TARGETS
    square_queries: int = SQUARE_QUERIES
    gcg_steps: int = 20
    topk: int = 256
    candidates: int = 64
    suffix_len: int = 20
    prompt_len: int = 64
    after_len: int = 8
    target_len: int = 16
    precision: str = "auto"
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    fit_batch: bool = True
    llm_cost: str = "layers"

    def check(self) -> DeviceSpec:
        """Validate; returns the device's datasheet entry.

        Raises:
          ValueError: an unknown attack / device / precision, a batch / devices / count < 1, a
            memory fraction outside (0, 1].
        """
        if self.attack not in ATTACKS:
            raise ValueError(f"attack must be one of {ATTACKS}, got {self.attack!r}")
        for name in ("batch", "devices", "samples", "rounds", "steps", "restarts", "n_iter", "square_queries",
                     "gcg_steps", "topk", "candidates", "suffix_len", "prompt_len", "target_len"):  # fmt: skip
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.llm_cost not in ("layers", "unroll"):
            raise ValueError(f"llm_cost must be layers or unroll, got {self.llm_cost!r}")
        if self.precision not in ("auto", "fp32", "tf32", "bf16"):
            raise ValueError(f"precision must be auto, fp32, tf32 or bf16, got {self.precision!r}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        return device_spec(self.device)


def roofline(flops: float, bytes_accessed: float, dev: DeviceSpec, dtype: str) -> dict:
    """``max(flops / peak, bytes / bandwidth)`` seconds (a PROJECTION) and which bound it is."""
    peak, note = dev.peak(dtype)
    t_c, t_m = flops / peak, bytes_accessed / dev.bandwidth
    return {"seconds": max(t_c, t_m), "compute_seconds": t_c, "memory_seconds": t_m,
            "bound": "compute" if t_c >= t_m else "memory", "peak_flops": peak, "peak_note": note,
            "bandwidth": dev.bandwidth, "label": PROJECTION}  # fmt: skip


def plan(settings: PlanSettings, *, pool: ShapePool | None = None, llm: Sequence | None = None, dtype: str = "bfloat16",
         log: Callable[[str], None] = lambda s: None) -> dict:  # fmt: skip
    """Size ``settings.attack`` on ``pool`` (vision) or the decoders ``llm`` (configs) on the target.

    Needs ``settings.devices`` JAX devices (fake CPU devices: :func:`use_fake_devices`).

    Returns:
      A JSON-able dict: the inputs, the mesh, one entry per step program (memory per device,
      FLOPs, bytes accessed, roofline seconds per step and per run), the per-device memory of the
      whole run (the largest program's), the largest batch that fits (with its method and model),
      and the run's total projected seconds. Projections carry ``"label": "projection"``.

    Raises:
      ValueError: invalid settings, neither or both of ``pool`` / ``llm``, a device count other
        than the process's, a mesh that does not divide the devices.
    """
    dev = settings.check()
    if (pool is None) == (llm is None):
        raise ValueError("plan needs one pool: a vision pool or LLM configs")
    if jax.device_count() != settings.devices:
        raise ValueError(f"the plan is for {settings.devices} devices but JAX has {jax.device_count()} "
                         "(use_fake_devices(n) first, in a fresh process)")  # fmt: skip
    is_llm = llm is not None
    if is_llm and settings.attack != "joint-gcg":
        raise ValueError(f"an LLM pool is planned with joint-gcg, got {settings.attack!r}")
    if not is_llm and settings.attack == "joint-gcg":
        raise ValueError("joint-gcg needs an LLM pool (--llm-config)")
    axes = ("pool", "data", "model") if is_llm else ("pool", "data")
    shape = parse_mesh(settings.mesh, settings.devices, axes)
    if settings.batch % shape["data"]:
        raise ValueError(f"batch {settings.batch} is not a multiple of the mesh's data axis ({shape['data']})")

    def build(batch: int) -> tuple[list[StepProgram], str, int, str]:
        if is_llm:
            assert llm is not None
            prog, label, pbytes = llm_program(llm, batch, shape, _llm_settings(settings), dtype)
            return [prog], label, pbytes, "bf16" if jnp.dtype(dtype) == jnp.bfloat16 else "fp32"
        assert pool is not None

        mesh = make_mesh(shape["pool"], shape["data"])
        progs = vision_program(pool, settings.attack, batch, mesh, dataclasses.asdict(settings))
        dts = {jnp.dtype(a.dtype) for s in pool.stacks for a in jax.tree.leaves(s.params)}
        return progs, f"pool={shape['pool']} x data={shape['data']}", pool.param_bytes, \
            "bf16" if jnp.dtype(jnp.bfloat16) in dts else "fp32"  # fmt: skip

    progs, mesh_label, pbytes, auto_dtype = build(settings.batch)
    dtype_key = auto_dtype if settings.precision == "auto" else settings.precision
    log(f"mesh: {mesh_label}; {len(progs)} step program(s) at batch {settings.batch}")
    rows, run_seconds = [], 0.0
    chunks, rounds = -(-settings.samples // settings.batch), settings.rounds
    layers = None
    if is_llm and settings.llm_cost == "layers":
        assert llm is not None

        def at(n: int) -> StepProgram:
            cfgs = [dataclasses.replace(c, num_layers=n) for c in llm]
            return llm_program(cfgs, settings.batch, shape, _llm_settings(settings), dtype)[0]

        layers = (llm[0].num_layers, at)
    for prog in progs:
        a = analyse(prog, layers)
        rl = roofline(a["flops"], a["bytes_accessed"], dev, dtype_key)
        calls = prog.steps_per_call * chunks * rounds
        a["roofline_step"] = rl
        a["steps_per_call"] = prog.steps_per_call
        a["steps_per_run"] = calls
        a["run_seconds"] = {"seconds": rl["seconds"] * calls, "label": PROJECTION}
        a["name"] = prog.name
        run_seconds += rl["seconds"] * calls
        rows.append(a)
        log(f"  {prog.name}: compiled in {a['compile_seconds']:.1f} s")
    peak_mem = max(r["memory"]["total"] for r in rows)
    cap = settings.memory_fraction * dev.memory_bytes
    result: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "device": dataclasses.asdict(dev),
        "mesh": shape,
        "mesh_label": mesh_label,
        "param_bytes_global": pbytes,
        "precision": dtype_key,
        "programs": rows,
        "memory_per_device": peak_mem,
        "memory_limit": cap,
        "fits": peak_mem <= cap,
        "chunks": chunks,
        "rounds": rounds,
        "run_seconds": {"seconds": run_seconds, "label": PROJECTION},
    }
    if settings.fit_batch:
        b2 = 2 * settings.batch
        mem2 = max(analyse_memory(p) for p in build(b2)[0])
        slope = (mem2 - peak_mem) / (b2 - settings.batch)
        intercept = peak_mem - slope * settings.batch
        d = shape["data"]
        if slope <= 0:
            best = None
        else:
            best = int((cap - intercept) // slope) // d * d
            best = best if best >= d else 0
        result["largest_batch"] = {
            "batch": best,
            "method": f"linear fit of 2 compiles (batch {settings.batch} and {b2}): memory = intercept + slope x "
            f"batch, the largest multiple of data={d} under {settings.memory_fraction:g} x device memory",
            "intercept": intercept,
            "slope": slope,
            "label": PROJECTION,
        }
    return result


def analyse_memory(program: StepProgram) -> int:
    """Per-device footprint (bytes) of ``program``'s compiled step (:func:`analyse`'s ``total``)."""
    m = jax.jit(program.fn, donate_argnums=1).lower(program.params, program.state).compile().memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               + m.generated_code_size_in_bytes - m.alias_size_in_bytes)  # fmt: skip


def _llm_settings(s: PlanSettings) -> dict:
    return {"steps": s.gcg_steps, "topk": s.topk, "candidates": s.candidates, "suffix_len": s.suffix_len,
            "prompt_len": s.prompt_len, "after_len": s.after_len, "target_len": s.target_len}  # fmt: skip


def _gb(n: float) -> str:
    return f"{n / 1e9:,.3f} GB"


def report(result: dict) -> str:
    """The plan as text; every projected figure says ``projection``."""
    s, dev = result["settings"], result["device"]
    lines = [
        f"plan: {s['attack']} on {s['devices']} x {dev['label']} (datasheet: {dev['source']})",
        f"mesh: {result['mesh_label']}; params {_gb(result['param_bytes_global'])} in all; precision {result['precision']}",
    ]
    for r in result["programs"]:
        m, rl = r["memory"], r["roofline_step"]
        lines += [
            f"{r['name']} at batch {s['batch']} (per device, XLA memory_analysis): argument {m['argument']:,} B, "
            f"output {m['output']:,} B, temp {m['temp']:,} B, alias {m['alias']:,} B, generated code "
            f"{m['generated_code']:,} B; total {m['total']:,} B ({_gb(m['total'])})",
            f"  cost per step per device ({r['cost_from']}): {r['flops']:.4g} FLOPs, {r['bytes_accessed']:.4g} bytes accessed",
            f"  roofline per step (projection): {rl['seconds']:.4g} s ({rl['bound']}-bound; {rl['peak_note']})",
            f"  steps per run: {r['steps_per_call']} per call x {result['chunks']} chunk(s) x {result['rounds']} "
            f"round(s) = {r['steps_per_run']:,}; time (projection): {r['run_seconds']['seconds']:.4g} s",
        ]
        if "warning" in r:
            lines.append(f"  warning: {r['warning']}")
    lines.append(
        f"memory per device: {result['memory_per_device']:,} B of {result['memory_limit']:,.0f} B usable "
        f"({s['memory_fraction']:g} x {_gb(dev['memory_bytes'])}): {'fits' if result['fits'] else 'does NOT fit'}"
    )
    if "largest_batch" in result:
        lb = result["largest_batch"]
        lines.append(f"largest batch (projection): {lb['batch']} ({lb['method']})")
    rs = result["run_seconds"]["seconds"]
    lines.append(f"run time (projection): {rs:.4g} s = {rs / 3600:.3g} h on {s['devices']} x {dev['label']}")
    return "\n".join(lines)


__all__ = [
    "ATTACKS",
    "PROJECTION",
    "PlanSettings",
    "ShapePool",
    "ShapeStack",
    "StepProgram",
    "analyse",
    "count_loops",
    "layer_cost",
    "llm_configs",
    "llm_program",
    "parse_mesh",
    "plan",
    "pool_shapes",
    "preset_pool",
    "report",
    "roofline",
    "unroll_scans",
    "unrolled_cost",
    "use_fake_devices",
    "vision_program",
    "wrn_pool",
    "zoo_pool",
]
