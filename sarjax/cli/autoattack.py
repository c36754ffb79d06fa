"""``sarjax autoattack``: AutoAttack (Croce & Hein 2020) on every member of a saved pool.

    sarjax autoattack --pool DIR --norm linf --eps 0.3 [--version standard|plus|rand]
                      [--samples N] [--data-dir D] [--out OUT.json]

Loads the pool (:func:`sarjax.models.checkpoint.load_pool`), takes ``--samples`` MNIST test images
(a fixed random subset, ``default_rng(0)``; chosen while the embedded test split was still
class-sorted, kept so that results stay comparable), runs :func:`sarjax.attacks.autoattack.autoattack_pool` (every member attacked on its
own, members vmapped per stack), prints AutoAttack's log and each member's clean and robust
accuracy, and writes the result as JSON (docs/autoattack.md).

``--version rand`` attacks the pool's randomized members as deployed (:func:`randomized_members`:
a self-ensemble's stochastic views, a noise defense's Gaussian input noise at the sigma its saved
config records), or, with ``--noise-sigma S``, every member behind Gaussian input noise of ``S``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sarjax.cli.args import positive_float, positive_int
from sarjax.runtime.compile_cache import add_compile_cache_argument

N_ITER = 100  # = sarjax.attacks.autoattack.N_ITER (not imported: --help stays fast, no jax import)
SQUARE_QUERIES = 5000  # = sarjax.attacks.autoattack.SQUARE_QUERIES


def _member_specs(pool, config: dict) -> dict:
    """``{member name: its saved defense record}`` from a pool checkpoint's config: a
    ``sarjax zoo-pool`` pool (``config["members"][name]``, with ``"defense"`` and ``"stochastic"``)
    or one defense of ``sarjax train-defenses`` (``config["defense"]``, one member)."""
    members = config.get("members")
    if isinstance(members, dict):
        return {n: m for n, m in members.items() if isinstance(m, dict)}
    defense = config.get("defense")
    if isinstance(defense, dict) and pool.num_members == 1:
        return {pool.names[0]: {"defense": defense}}
    return {}


def randomized_members(pool, config: dict) -> dict:
    """The randomized members of a saved pool, as deployed: ``{name: (apply, how)}``.

    A member is randomized when its stack has a ``member_stochastic_apply`` (the self-ensemble:
    :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack`, its stochastic views, the function
    :func:`~sarjax.defenses.self_ensemble.pool_stochastic_apply` vmaps) or when its saved defense
    record has ``hp.inference_sigma`` (the Gaussian-noise CNN of the zoo: the saved weights
    classify behind ``N(0, sigma^2)`` input noise, :func:`sarjax.attacks.eot.with_input_noise`).

    Args:
      pool: the loaded :class:`~sarjax.models.pool.Pool`.
      config: the config :func:`~sarjax.models.checkpoint.load_pool` returned.

    Returns:
      ``{member name: (apply(member_params, x, key) -> [B, C], description)}`` in pool order
      (empty for a deterministic pool).

    Raises:
      ValueError: the config marks a member ``stochastic`` but neither its stack nor its record
        says how (no stochastic apply, no ``inference_sigma``).
    """
    from sarjax.attacks.eot import with_input_noise

    specs = _member_specs(pool, config)
    out = {}
    for stack in pool.stacks:
        for name in stack.names:
            rec = specs.get(name, {})
            sigma = ((rec.get("defense") or {}).get("hp") or {}).get("inference_sigma")
            if hasattr(stack, "member_stochastic_apply"):
                out[name] = (stack.member_stochastic_apply, f"{stack.name}: stochastic views (member_stochastic_apply)")
            elif sigma is not None:
                out[name] = (
                    with_input_noise(stack.member_apply, float(sigma)),
                    f"Gaussian input noise, sigma {float(sigma):g} (its saved inference_sigma)",
                )
            elif rec.get("stochastic"):
                raise ValueError(
                    f"the pool's config marks {name!r} randomized, but its stack has no stochastic apply and its "
                    "record no inference_sigma: give --noise-sigma S to attack it behind Gaussian input noise"
                )
    return out


def cmd_autoattack(args: argparse.Namespace) -> int:
    """AutoAttack on a saved pool; prints the log, writes JSON."""
    import jax
    import numpy as np

    if args.compile_cache:
        # XLA's persistent compilation cache: a rerun (another eps, version or pool of the same
        # architecture and batch shape) loads the compiled kernels instead of compiling them again
        from sarjax.runtime.compile_cache import enable_compile_cache

        enable_compile_cache(args.compile_cache)

    from sarjax.attacks.autoattack import autoattack_pool
    from sarjax.attacks.eot import with_input_noise
    from sarjax.data.mnist import load_mnist
    from sarjax.models.checkpoint import load_pool

    if args.noise_sigma is not None and args.version != "rand":
        raise ValueError("--noise-sigma makes the pool randomized: it needs --version rand")
    data = load_mnist(args.data_dir)
    n = len(data.x_test)
    if not 1 <= args.samples <= n:  # before any model work (the pool, its kernels)
        raise ValueError(f"samples must be in [1, {n}] (the test images in {data.source}), got {args.samples}")
    n = args.samples
    pool, config = load_pool(args.pool)
    stochastic, randomized = None, {}
    if args.version == "rand" and args.noise_sigma is None:
        randomized = randomized_members(pool, config)
        if not randomized:
            raise ValueError(
                f"--version rand needs a randomized model, and no member of {args.pool} is randomized (no stack "
                "with stochastic views, no saved inference_sigma): give --noise-sigma S to attack the pool behind "
                "Gaussian input noise at inference (EOT), or run --version standard"
            )
        stochastic = {n: f for n, (f, _) in randomized.items()}
    if tuple(pool.input_shape) != tuple(data.x_test.shape[1:]):
        raise ValueError(f"the pool takes inputs {pool.input_shape}, the data has {data.x_test.shape[1:]}")
    idx = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[:n])  # the embedded split is class-sorted
    x, y = np.asarray(data.x_test[idx]), np.asarray(data.y_test[idx])
    wrap = None if args.noise_sigma is None else (lambda a: with_input_noise(a, args.noise_sigma))
    print(f"pool {args.pool}: {pool.num_members} member(s); data: {data.source}, {n} test images (random subset)")
    skipped = [m for m in pool.names if m not in randomized] if randomized else []
    for name, (_, how) in randomized.items():
        print(f"  {name}: randomized, attacked as deployed ({how}), EOT over 20 draws")
    if skipped:
        print(f"  deterministic, not attacked by the rand version (run --version standard): {', '.join(skipped)}")
    t0 = time.perf_counter()
    res = autoattack_pool(
        pool,
        x,
        y,
        norm=args.norm,
        eps=args.eps,
        key=jax.random.PRNGKey(args.seed),
        version=args.version,
        batch_size=args.batch_size,
        n_iter=args.n_iter,
        fab_iter=args.fab_iter,
        square_queries=args.square_queries,
        wrap=wrap,
        stochastic=stochastic,
        per_member=args.per_member,
    )
    seconds = time.perf_counter() - t0
    for s in res.log:
        if not s.skipped:
            print(f"{s.name}: {s.broken} of {s.attacked} (image, member) pairs broken, {s.queries} queries")
    out = dict(
        res.to_json(),
        pool=str(Path(args.pool).absolute()),
        samples=n,
        sample_indices=idx.tolist(),
        data=data.source,
        seed=args.seed,
        seconds=seconds,
        budget=dict(n_iter=args.n_iter, fab_iter=args.fab_iter, square_queries=args.square_queries),
        noise_sigma=args.noise_sigma,
        randomized_members={n: how for n, (_, how) in randomized.items()},
        deterministic_members_skipped=skipped,
    )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


def register(sub) -> None:
    """Adds the ``autoattack`` subcommand to ``sarjax``'s subparsers."""
    a = sub.add_parser(
        "autoattack",
        help="AutoAttack (standard / plus / rand) on every member of a saved pool (robust accuracy per member)",
    )
    a.add_argument("--pool", required=True, help="pool directory (train-pool / train-defenses output)")
    a.add_argument("--norm", choices=["linf", "l2", "l1"], required=True, help="threat model")
    a.add_argument("--eps", type=positive_float, required=True, help="radius (MNIST: linf 0.3, l2 2.0, l1 10)")
    a.add_argument(
        "--version",
        choices=["standard", "plus", "rand"],
        default="standard",
        help="AutoAttack version (default standard; rand attacks the pool's randomized members as deployed: "
        "a self-ensemble's views, a noise defense's saved sigma; or every member with --noise-sigma)",
    )
    a.add_argument(
        "--samples",
        type=positive_int,
        default=1000,
        help="test images, at most the test split (default 1000, the embedded test split; a fixed random "
        "subset when fewer)",
    )
    a.add_argument("--data-dir", default=None, help="directory with MNIST IDX files (default: the embedded digits)")
    a.add_argument("--out", default="sarjax-autoattack.json", help="JSON output path")
    a.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="images per compiled call (default min(N, 250), AutoAttack's batch size; N = --samples)",
    )
    a.add_argument("--seed", type=int, default=0)
    a.add_argument(
        "--per-member",
        action="store_true",
        help="attack every member in its own call (members that differ in robustness, e.g. a defense zoo; "
        "default: members of a stack vmapped over the images still robust for any of them)",
    )
    add_compile_cache_argument(a)
    a.add_argument(
        "--noise-sigma",
        type=positive_float,
        default=None,
        help="rand only: attack every member behind Gaussian input noise of this sigma (EOT), instead of "
        "the randomized members the pool's config names",
    )
    a.add_argument("--n-iter", type=positive_int, default=N_ITER, help=f"APGD iterations (AutoAttack: {N_ITER})")
    a.add_argument("--fab-iter", type=positive_int, default=N_ITER, help=f"FAB iterations (AutoAttack: {N_ITER})")
    a.add_argument(
        "--square-queries",
        type=positive_int,
        default=SQUARE_QUERIES,
        help=f"Square queries (AutoAttack: {SQUARE_QUERIES})",
    )
    a.set_defaults(func=cmd_autoattack)
