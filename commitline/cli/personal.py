"""``commitline erase`` and ``commitline keys rotate|erasures``: forgetting a data subject, and the master key.

``erase --tenant T --subject S`` deletes the subject's data key and records the erasure; its personal values
read as erased from then on, while every hash chain stays verifiable. It then rebuilds the read models that may
have copied them (``--no-rebuild``: it names them and the command that does it). ``keys rotate`` rewraps every data key
under a new master key, read from standard input (or from the variable ``--new-key-env`` names: never from the
command line, where other users of the machine could read it), with the current one still configured; given
no new key (standard input empty or a terminal), it finishes a rolling rotation: every data key wrapped under
``COMMITLINE_PREVIOUS_MASTER_KEY`` is rewrapped under ``COMMITLINE_MASTER_KEY``.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
import getpass
import os
import sys

from commitline.application.errors import CommitlineError
from commitline.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    actions,
    error_exit,
    print_json,
)


def _erasure(e) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"tenant": e.tenant, "subject": e.subject, "key_id": str(e.key_id), "erased_at": e.erased_at.isoformat(),
            "erased_by": e.erased_by}


def _operator() -> str:
    try:
        return f"commitline erase ({getpass.getuser()})"
    except Exception:  # no user name for this uid (a container)
        return "commitline erase"


def cmd_erase(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap
    from commitline.cli.progress import progress_reporter
    from commitline.composition import RebuildError

    with bootstrap(create_store=False) as app:
        holding = dict(app.domain.personal_projections)
        rebuild = not args.no_rebuild and bool(holding)
        recompute = app.rebuild_command(" ".join(holding), fresh=True)
        try:
            reporter = progress_reporter(f"recompute {', '.join(holding)}") if rebuild else nullcontext()
            with reporter as progress:
                report = app.erase(args.tenant, args.subject, by=_operator(), rebuild=rebuild, progress=progress)
        except RebuildError as e:
            done = (f"the erasure of subject {args.subject} of tenant {args.tenant} is recorded" if e.erased else
                    f"tenant {args.tenant} has no data key for subject {args.subject} (it never had one, or it was "
                    "erased before): nothing was erased now")
            print(f"{done}, but recomputing the read models {', '.join(holding)} failed: {e}. Until they are "
                  f"rebuilt they may still show its values: run `{recompute}`", file=sys.stderr)
            if args.json:
                print_json({"tenant": args.tenant, "subject": args.subject,
                            "erased": [_erasure(erasure) for erasure in e.erased], "rebuilt": [],
                            "error": str(e), "recompute": recompute})
            return EXIT_REFUSED
        except KeyboardInterrupt:
            print(f"interrupted: the erasure is recorded, but the read models {', '.join(holding)} may still show "
                  f"the subject's values: run `{recompute}`", file=sys.stderr)
            return 130
        except CommitlineError as e:
            return error_exit(e, EXIT_USAGE)
    if args.json:
        print_json({"tenant": args.tenant, "subject": args.subject, "erased": [_erasure(e) for e in report],
                    "read_models": {name: list(fields) for name, fields in report.read_models.items()},
                    "rebuilt": [r.projection for r in report.rebuilt], "recompute": report.recompute})
        return EXIT_OK
    if report:
        print(f"erased subject {args.subject} of tenant {args.tenant}: data key {report[0].key_id} deleted; its "
              "personal values read as erased from now on")
    else:
        print(f"tenant {args.tenant} has no data key for subject {args.subject}: nothing to erase", file=sys.stderr)
    for result in report.rebuilt:
        print(f"recomputed read model {result.projection} (receives {', '.join(report.read_models[result.projection])})"
              f": position {result.position}, {result.events_applied} events in {result.seconds:.1f} s")
    if report.recompute:
        which = "read model" if len(report.pending) == 1 else "read models"
        print(f"{which} {', '.join(report.pending)} may still show the subject's values (receiving "
              f"{', '.join(f for name in report.pending for f in report.read_models[name])}): run "
              f"`{report.recompute}`")
    return EXIT_OK


def cmd_keys(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    with bootstrap(create_store=False) as app:
        try:
            if args.keys_command == "erasures":
                print_json([_erasure(e) for e in app.erasures(args.tenant)])
                return EXIT_OK
            if args.new_key_env and not os.environ.get(args.new_key_env):
                print(f"keys rotate: the variable {args.new_key_env} (--new-key-env) is not set, or empty: nothing "
                      "was rewrapped", file=sys.stderr)
                return EXIT_USAGE
            new = _new_key(args)
            done = app.rotate_master_key(new)
        except CommitlineError as e:
            return error_exit(e, EXIT_UNAVAILABLE)
    print_json({"rewrapped": done.rewrapped, "already": done.already, "master_key_id": done.master_key_id})
    if new is None:
        print(f"every data key is wrapped under the current master key {done.master_key_id}: "
              "COMMITLINE_PREVIOUS_MASTER_KEY can be dropped from every process", file=sys.stderr)
    else:
        print(f"data keys are wrapped under master key {done.master_key_id}: set COMMITLINE_MASTER_KEY to the new "
              "key in every process", file=sys.stderr)
    return EXIT_OK


def _new_key(args: argparse.Namespace) -> str | None:
    """The new master key given, or None for none (standard input empty, or a terminal)."""
    if args.new_key_env:
        return os.environ.get(args.new_key_env, "")
    if sys.stdin is None or sys.stdin.isatty():
        return None
    line = sys.stdin.readline()
    return line if line.strip() else None


ERASE = ("Delete the data key of SUBJECT (of TENANT): every personal value sealed under it reads as erased from now "
         "on, in loads, audit history and replayed outcomes; the hash chains stay verifiable. Recorded in the "
         "erasures table (no personal value). Then rebuild the read models that receive personal fields, so none "
         "still shows the subject's values (a running `commitline project` yields to the swap).")
ROTATE = ("With the current master key still in COMMITLINE_MASTER_KEY, rewrap every data key under the new one, read "
          "from standard input (base64 of 32 bytes); then configure the new key everywhere. Given no new key, finish "
          "a rolling rotation: rewrap every data key from COMMITLINE_PREVIOUS_MASTER_KEY to COMMITLINE_MASTER_KEY. "
          "Run again to finish a rotation cut short.")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    erase = sub.add_parser("erase", help="forget a data subject: delete its data key, record the erasure",
                           description=ERASE)
    erase.add_argument("--tenant", required=True, help="the tenant whose subject it is")
    erase.add_argument("--subject", required=True, help="the data subject's id, as the domain's events name it")
    erase.add_argument("--no-rebuild", action="store_true",
                       help="leave the read models that may hold the subject's values as they are, and print the "
                       "command that recomputes them (to erase many subjects, then rebuild once)")
    erase.add_argument("--json", action="store_true", help="machine-readable output")
    erase.set_defaults(run=cmd_erase)
    ksub = actions(sub, "keys", "the master key and the data keys: rotate, list erasures")
    rotate = ksub.add_parser("rotate", help="rewrap every data key under a new master key (read from stdin), or from the "
                             "previous master key to the current one",
                             description=ROTATE)
    rotate.add_argument("--new-key-env", metavar="VARIABLE", help="read the new key from this environment variable")
    erasures = ksub.add_parser("erasures", help="every erasure recorded (when, tenant, subject, key id, by whom)")
    erasures.add_argument("--tenant", help="only this tenant's")
    for parser_ in (rotate, erasures):
        # their output is JSON already: the flag every other command offers is taken, so scripts can pass it
        parser_.add_argument("--json", action="store_true", help="machine-readable output (always JSON)")
        parser_.set_defaults(run=cmd_keys)
