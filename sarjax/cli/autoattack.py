"""``sarjax autoattack``: AutoAttack (Croce & Hein 2020) on every member of a pool.

    sarjax autoattack (--pool DIR | --model PKG.MODULE:FUNCTION) --norm linf --eps 0.3
                      [--version standard|plus|rand] [--samples N] [--data-dir D | --images FILE.npz]
                      [--out OUT.json] [--overwrite] [--no-progress] [--checkpoint DIR]
                      [--coordinator HOST:PORT --num-processes P --process-id I [--coordinator-timeout S]]

Loads the pool (a saved one, :func:`sarjax.models.checkpoint.load_pool`, or the one a function
returns, :func:`sarjax.models.builders.load_model`), takes ``--samples`` MNIST test images (a
fixed random subset, ``default_rng(0)``; chosen while the embedded test split was still
class-sorted, kept so that results stay comparable) or the first ``--samples`` images of
``--images FILE.npz`` (all by default), and runs
:func:`sarjax.experiments.autoattack.run_autoattack` (every member attacked on its own, members
vmapped per stack): it prints AutoAttack's log, a progress bar per stage, and each member's clean
and robust accuracy, and writes the JSON report and ``OUT.npz`` beside it (per image and member:
robust flags, adversarial points; docs/autoattack.md). With ``--coordinator`` every process runs
its share of each attack run's chunks and process 0 writes the outputs (bit-identical to one
process). With ``--checkpoint DIR`` the cascade's state is saved after every attack run: a rerun
with the same DIR and settings resumes where it stopped (bit-identical), other settings are
refused (naming them) unless ``--overwrite``. An existing ``OUT.json`` / ``OUT.npz`` is replaced
only by a run with the same settings (the report records them) or with ``--overwrite``; other
settings are refused before the data and the pool are loaded (the settings the command line
gives) and again, in full, before any attack work.

``--version rand`` attacks the pool's randomized members as deployed (:func:`randomized_members`:
a self-ensemble's stochastic views, a noise defense's Gaussian input noise at the sigma its saved
config records), or, with ``--noise-sigma S``, every member behind Gaussian input noise of ``S``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sarjax.cli.args import (
    add_distributed_arguments,
    add_images_argument,
    add_model_argument,
    initialize_distributed,
    positive_float,
    positive_int,
)
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
    from sarjax.attacks.eot import with_input_noise  # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)

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


def _sources(args: argparse.Namespace) -> None:
    """One-line errors for the model and image options given together or not at all."""
    if args.pool is not None and args.model:
        raise ValueError("give --pool DIR or --model PKG.MODULE:FUNCTION, not both")
    if args.pool is None and not args.model:
        raise ValueError("give the models to attack: --pool DIR (a saved pool) or --model PKG.MODULE:FUNCTION")
    if args.model and len(args.model) > 1:
        raise ValueError(f"autoattack attacks one pool: give --model once, got {len(args.model)}: {args.model}")
    if args.images is not None and args.data_dir is not None:
        raise ValueError("give --images FILE.npz or --data-dir D (MNIST IDX files), not both")


def _progress_callback(bar, groups: list[tuple[str, ...]]):
    """``progress(stage, done, total)`` drawing one bar per stage of each AutoAttack call
    (``groups``: the members of each call, in order; labelled when there are several)."""
    state = {"task": None, "call": -1}

    def on_progress(stage: str, done: int, total: int) -> None:
        if done == 0 or state["task"] is None:
            if stage == "apgd-ce" or state["task"] is None:  # every version starts with APGD-CE
                state["call"] += 1
            label = stage
            if len(groups) > 1:
                names = ", ".join(groups[min(state["call"], len(groups) - 1)])
                label = f"{names if len(names) <= 32 else names[:29] + '...'}: {stage}"
            state["task"] = bar.add_task(label, total=total)
        bar.update(state["task"], completed=done, total=total)  # a stage with no rows left: 0/0

    return on_progress


def cmd_autoattack(args: argparse.Namespace) -> int:
    """AutoAttack on a saved pool or a ``--model``; prints the log, writes OUT.json and OUT.npz."""
    initialize_distributed(args)  # before any JAX computation
    _sources(args)

    # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)
    import numpy as np

    from sarjax.attacks.autoattack import AutoAttackSettings, autoattack_config
    from sarjax.attacks.eot import with_input_noise
    from sarjax.experiments.autoattack import check_outputs, output_paths, run_autoattack
    from sarjax.runtime.distributed import is_main, process_count
    from sarjax.runtime.fingerprint import sarjax_version
    from sarjax.runtime.progress import progress_bar

    main = is_main()
    say = print if main else (lambda *a, **k: None)
    if args.noise_sigma is not None and args.version != "rand":
        raise ValueError("--noise-sigma makes the pool randomized: it needs --version rand")
    json_path, npz_path = output_paths(args.out)
    # the attack's settings, checked before anything is read or written (a bad --fab-iter leaves no trace)
    attack = autoattack_config(
        args.norm,
        float(args.eps),
        args.version,
        n_iter=args.n_iter,
        fab_iter=args.fab_iter,
        square_queries=args.square_queries,
    )
    if args.model:
        where = {"pool": None, "model": args.model[0]}
    else:
        where = {"pool": str(Path(args.pool).absolute())}
    # another run's outputs: refused now on the settings the command line gives (before the data and
    # the pool load), and by run_autoattack on all of them (pool, images) before any attack work
    given = dict(
        norm=args.norm,
        eps=float(args.eps),
        version=args.version,
        n_iter=args.n_iter,
        fab_iter=args.fab_iter,
        square_queries=args.square_queries,
        batch_size=args.batch_size,
        seed=args.seed,
        per_member=args.per_member,
        wrap=args.noise_sigma is not None,
        sarjax=sarjax_version(),
    )
    multi = process_count() > 1
    check_outputs(
        json_path,
        given,
        {**where, "noise_sigma": args.noise_sigma},
        overwrite=args.overwrite,
        distribute=multi,
        partial=True,
    )
    ids = None
    if args.images is not None:
        from sarjax.data.images import load_images  # deferred: sarjax --help speed, as above

        images = load_images(args.images)
        n = len(images.x) if args.samples is None else args.samples
        if not 1 <= n <= len(images.x):  # before any model work (the pool, its kernels)
            raise ValueError(f"samples must be in [1, {len(images.x)}] (the images in {args.images}), got {n}")
        x, y, ids = images.x[:n], images.y[:n], images.ids[:n]
        source, sample_indices = images.source, list(range(n))
    else:
        from sarjax.data.mnist import load_mnist  # deferred: sarjax --help speed (tests replace load_mnist)

        data = load_mnist(args.data_dir)
        n = len(data.x_test)
        samples = 1000 if args.samples is None else args.samples
        if not 1 <= samples <= n:  # before any model work (the pool, its kernels)
            raise ValueError(f"samples must be in [1, {n}] (the test images in {data.source}), got {samples}")
        n = samples
        # a fixed random subset; the embedded split was class-sorted when it was chosen
        idx = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[:n])
        x, y = np.asarray(data.x_test[idx]), np.asarray(data.y_test[idx])
        source, sample_indices = data.source, idx.tolist()
    if args.model:
        from sarjax.models.builders import load_model  # deferred: sarjax --help speed (tests replace it)

        pool, config = load_model(args.model[0]), {}
        what = f"--model {args.model[0]}"
    else:
        from sarjax.models.checkpoint import load_pool  # deferred: sarjax --help speed (tests replace it)

        pool, config = load_pool(args.pool)
        what = f"pool {args.pool}"
    stochastic, randomized = None, {}
    if args.version == "rand" and args.noise_sigma is None:
        randomized = randomized_members(pool, config)
        if not randomized:
            raise ValueError(
                f"--version rand needs a randomized model, and no member of {what} is randomized (no stack "
                "with stochastic views, no saved inference_sigma): give --noise-sigma S to attack the pool behind "
                "Gaussian input noise at inference (EOT), or run --version standard"
            )
        stochastic = {n: f for n, (f, _) in randomized.items()}
    if tuple(pool.input_shape) != tuple(x.shape[1:]):
        src = f"--images {args.images}" if args.images is not None else "the data"
        raise ValueError(f"the pool takes inputs {tuple(pool.input_shape)}, {src} has {tuple(x.shape[1:])}")
    wrap = None if args.noise_sigma is None else (lambda a: with_input_noise(a, args.noise_sigma))
    kind = "images (the file's first)" if args.images is not None else "test images (random subset)"
    say(f"{what}: {pool.num_members} member(s); data: {source}, {n} {kind}")
    skipped = [m for m in pool.names if m not in randomized] if randomized else []
    for name, (_, how) in randomized.items():
        say(f"  {name}: randomized, attacked as deployed ({how}), EOT over 20 draws")
    if skipped:
        say(f"  deterministic, not attacked by the rand version (run --version standard): {', '.join(skipped)}")
    if stochastic is not None:
        groups = [(nm,) for st in pool.stacks for nm in st.names if nm in stochastic]
    elif args.per_member:
        groups = [(nm,) for st in pool.stacks for nm in st.names]
    else:
        groups = [tuple(st.names) for st in pool.stacks]
    with progress_bar(main and not args.no_progress) as bar:
        res = run_autoattack(
            pool,
            x,
            y,
            attack=attack,
            seed=args.seed,
            ids=ids,
            wrap=wrap,
            stochastic=stochastic,
            settings=AutoAttackSettings(
                batch_size=args.batch_size,
                log=main,
                progress=None if args.no_progress or not main else _progress_callback(bar, groups),
                distribute=process_count() > 1,
                per_member=args.per_member,
                checkpoint_dir=args.checkpoint,
                overwrite=args.overwrite,
                out=json_path,
            ),
            meta=dict(
                where,
                sample_indices=sample_indices,
                data=source,
                noise_sigma=args.noise_sigma,
                randomized_members={n: how for n, (_, how) in randomized.items()},
                deterministic_members_skipped=skipped,
            ),
        )
    for s in res.log:
        if not s.skipped:
            say(f"{s.name}: {s.broken} of {s.attacked} (image, member) pairs broken, {s.queries} queries")
    say(f"wrote {json_path} and {npz_path}")
    return 0


def register(sub) -> None:
    """Adds the ``autoattack`` subcommand to ``sarjax``'s subparsers."""
    a = sub.add_parser(
        "autoattack",
        help="AutoAttack (standard / plus / rand) on every member of a saved pool or a --model (robust accuracy "
        "per member, adversarial points per image)",
    )
    a.add_argument("--pool", default=None, help="pool directory (train-pool / train-defenses output); or --model")
    add_model_argument(a)
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
        default=None,
        help="images to attack: MNIST test images, at most the test split (1000 when not given, the embedded "
        "test split; a fixed random subset when fewer); with --images the file's first N (every image of the "
        "file when not given)",
    )
    a.add_argument("--data-dir", default=None, help="directory with MNIST IDX files (default: the embedded digits)")
    add_images_argument(a)
    a.add_argument(
        "--out",
        default="sarjax-autoattack.json",
        help="JSON report path; the per-image arrays (robust, clean, queries, x_adv, ids, y, members) go to "
        "the .npz of the same stem beside it; existing files are replaced only by a run with the same settings "
        "(or with --overwrite)",
    )
    a.add_argument("--no-progress", action="store_true", help="no progress bars")
    a.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="save the attack's state after every attack run (restart / target) in DIR; a rerun with the same DIR "
        "and settings resumes where it stopped (default: no checkpoint)",
    )
    a.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT.json / OUT.npz written with other settings, and discard the checkpoints in "
        "--checkpoint DIR (any settings); default: other settings are refused",
    )
    add_distributed_arguments(a)
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
