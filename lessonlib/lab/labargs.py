"""A lab's command line: its flags, and every check of their values before any process starts.

What it teaches: a bad setting costs the student one line, not a traceback from a rank a
minute later. Each check names the flag, the value and one that would work; the usage is
printed only for ``--help`` and for a flag the lab does not know (``argcheck.LabParser``,
which also bounds every number a flag takes). The counts go through ``argcheck`` (the
course's one check of a count), the world size and the timeout through the launcher's own
limits, a size through ``check_fits`` (what this machine's memory could ever hold), and an
output path is tried where it will be written (never on a kernel file system such as
``/proc``: ``writable``).

Laptop:  ``python labs/ddp.py --timeout 1e10``  (refused: one line)
GPU box: the same.
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

import torch

from lessonlib import argcheck, device, launcher, writable
from lessonlib.launcher import checks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parser(lab: str, description: str) -> argparse.ArgumentParser:
    """The flags every lab takes; a lab adds its own on the returned parser."""
    p = argcheck.LabParser(prog=f"labs/{lab}.py", description=description)
    p.add_argument("--world-size", type=int, default=2,
                   help="ranks to spawn (ignored under torchrun, which sets it)")
    p.add_argument("--backend", default="auto", choices=list(device.BACKENDS))
    p.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before ranks are stopped")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES),
                   help="compute precision: bf16 runs forward and backward under bf16 "
                        "autocast, weights and optimizer state stay fp32")
    return p


def world_size(args) -> int:
    """The run's world size: torchrun's when under torchrun, else ``--world-size``."""
    return int(os.environ["WORLD_SIZE"]) if launcher.under_torchrun() else args.world_size


def check_common(p: argparse.ArgumentParser, args, fp32_only: str | None = None) -> None:
    """The shared flags: ``--timeout`` a positive number of seconds the launcher accepts,
    ``--world-size`` one this machine can start, ``--dtype`` one the lab runs, ``--json`` a
    file that can be written."""
    if not 0 < args.timeout <= checks.MAX_TIMEOUT_S:      # False for nan
        p.error(f"--timeout must be a positive number of seconds, at most "
                f"{checks.MAX_TIMEOUT_S:g}, e.g. 600; got {args.timeout}")
    check_positive(p, args, "world-size")
    check_world_sizes(p, "--world-size", [args.world_size], args.backend)
    if fp32_only and args.dtype != "fp32":
        p.error(f"--dtype {args.dtype}: {p.prog} runs only --dtype fp32 ({fp32_only})")
    check_output(p, "--json", args.json)


def check_world_sizes(p: argparse.ArgumentParser, flag: str, sizes, backend: str = "auto") -> None:
    """Each world size in ``sizes`` one the launcher would start here (under torchrun the
    world is torchrun's)."""
    if launcher.under_torchrun():
        return
    for size in sizes:
        try:
            checks.check_launch(size, 1.0, backend, oversubscribe=False,
                                  names=(flag, "--timeout"))
        except ValueError as exc:
            p.error(str(exc))


def _each(p: argparse.ArgumentParser, args, names, check, should: str) -> None:
    for name in names:
        value = getattr(args, name.replace("-", "_"))
        try:
            check(f"--{name}", value)
        except ValueError:
            p.error(f"--{name} must be {should}; got {value}")


def check_positive(p: argparse.ArgumentParser, args, *names: str) -> None:
    """Reject non-positive integer settings before any process starts."""
    _each(p, args, names, argcheck.positive_int, "a positive integer, e.g. 2")


def check_threads(p: argparse.ArgumentParser, args) -> None:
    """``--threads``: a positive count, at most the cores this process may use (a container's
    quota counted; more only take turns)."""
    check_positive(p, args, "threads")
    cores = checks.cores()
    if args.threads > cores:
        p.error(f"--threads {args.threads} is more than the {cores} cores this process may "
                f"use, where threads only take turns; give at most {cores}, e.g. 1")


def check_number(p: argparse.ArgumentParser, args, *names: str, example: str = "0.001") -> None:
    """Reject settings that are not finite positive numbers (a learning rate, a size)."""
    _each(p, args, names, argcheck.positive_number,
          f"a finite positive number, e.g. {example}")


def machine_bytes() -> int:
    """This machine's memory in bytes, which every rank started here shares."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):      # no sysconf: assume a large machine
        return 2 ** 40


def check_fits(p: argparse.ArgumentParser, args, what: str, factors: list[tuple[str, float]],
               itemsize: int = 4) -> None:
    """Refuse settings whose tensor ``what`` (the product of ``factors``' values, ``(flag,
    value)`` pairs, in elements of ``itemsize`` bytes) could never fit: held by every rank
    started on this machine, it would need more than the machine's memory. One line naming
    the largest factor's flag. An upper bound: what passes may still not fit beside the rest."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if launcher.under_torchrun() \
        else args.world_size
    each, have = math.prod(v for _, v in factors) * itemsize, machine_bytes()
    if each * ranks > have:
        flag, value = max(factors, key=lambda factor: factor[1])
        value = f"{value:g}" if isinstance(value, float) else value
        p.error(f"{flag} {value}: {what} would take {each / 2 ** 30:.3g} GiB on each of the "
                f"{ranks} rank(s) started here, more than this machine's "
                f"{have / 2 ** 30:.0f} GiB of memory; give a smaller {flag}")


def check_gpt_fits(p: argparse.ArgumentParser, args, batch: str = "global-batch") -> None:
    """The tiny GPT of ``--layers``, ``--hidden``, ``--heads`` and ``--seq`` on a batch of
    ``--<batch>`` sequences, held whole by one process (the parity reference): its weights
    with their gradients and Adam's two moments, its activations, its attention scores."""
    L, h, a, s = args.layers, args.hidden, args.heads, args.seq
    B = (f"--{batch}", getattr(args, batch.replace("-", "_")))
    check_fits(p, args, "the weights, gradients and Adam moments (4 x 12 L h^2 floats)",
               [("--layers", L), ("--hidden", h), ("--hidden", h)], itemsize=4 * 4 * 12)
    check_fits(p, args, "the activations of a step (B s h L floats)",
               [B, ("--seq", s), ("--hidden", h), ("--layers", L)])
    check_fits(p, args, "the attention scores of a step (B a s^2 L floats)",
               [B, ("--heads", a), ("--seq", s), ("--seq", s), ("--layers", L)])


def _nearest_existing(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists():
            return parent
    return Path(".")


def check_output(p: argparse.ArgumentParser, flag: str, path: Path | None) -> None:
    """Refuse an output file ``path`` that cannot be written, before any process starts: a
    folder, a path below a file, a name too long for the file system, or a place where no
    file can be made (tried: ``/proc`` says it is writable to root, and is not)."""
    if path is None:
        return
    path = Path(path)
    longest = os.pathconf(".", "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    if any(len(os.fsencode(part)) > longest for part in path.parts):
        p.error(f"{flag}: a name in {str(path)[:40]}... is longer than the {longest} bytes "
                f"a file name may have; give a shorter one")
    if path.is_dir():
        p.error(f"{flag} {path} is a folder; give a file name")
    place = _nearest_existing(path.parent)
    if not place.is_dir():
        p.error(f"{flag} {path}: {place} is a file, so nothing can be written below it")
    kernel = writable.kernel_filesystem(place)
    if kernel:
        p.error(f"{flag} {path}: {place} is on the kernel's {kernel} file system, where no "
                f"result can be kept; choose a folder on a disk")
    if not os.access(place, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        p.error(f"{flag} {path}: no write permission in {place}; choose a writable place")
    try:
        with tempfile.TemporaryFile(dir=place):
            pass
    except OSError as exc:
        p.error(f"{flag} {path}: no file can be written in {place} ({exc.strerror or exc}); "
                f"choose a writable place")


def add_gpt_flags(p: argparse.ArgumentParser, hidden: int = 64, seq: int = 32) -> None:
    """The tiny GPT's shape and the batch split of the labs that train it (hybrid, train)."""
    p.add_argument("--layers", type=int, default=4, help="L, transformer layers")
    p.add_argument("--hidden", type=int, default=hidden, help="h")
    p.add_argument("--heads", type=int, default=4, help="a")
    p.add_argument("--seq", type=int, default=seq, help="s, tokens per sequence")
    p.add_argument("--global-batch", type=int, default=32, help="B, sequences per step")
    # Not "--m": torchrun reads that as an abbreviation of its own flags and refuses it.
    p.add_argument("--microbatches", type=int, default=4,
                   help="m, micro-batches per replica per step")


def gpt_model(p: argparse.ArgumentParser, args) -> dict:
    """``add_gpt_flags``' values checked (a model this machine can hold), as ``GPTConfig``
    keywords (the corpus has 27 characters)."""
    check_positive(p, args, "layers", "hidden", "heads", "seq", "global-batch", "microbatches")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    check_gpt_fits(p, args)
    return {"vocab": 27, "seq": args.seq, "hidden": args.hidden, "heads": args.heads,
            "layers": args.layers}
