"""``commitline sagas ...``: run the domain's process managers, show, list, retry their instances.

``show`` and ``retry`` act as the instance's tenant (``--tenant/-t``, default ``default``): another
tenant's instance is not found. ``list`` shows every tenant's instances unless given ``--tenant``.
With several process managers, ``--saga NAME`` picks one (``run`` runs them all)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any
from uuid import UUID, uuid4

from commitline.application.errors import CommitlineError
from commitline.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    actions,
    aggregate_id,
    declared,
    error_exit,
    print_json,
)
from commitline.cli.followers import add_metrics_options


def cmd_sagas(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap
    from commitline.composition import UnknownProcessManager

    if args.sagas_command == "run":
        return _run_sagas(args)
    with bootstrap(create_store=False) as app:
        try:
            manager = app.saga(args.saga)
        except UnknownProcessManager as e:
            print(f"commitline sagas: {e}", file=sys.stderr)
            return EXIT_USAGE
        if args.sagas_command == "list":
            try:
                rows = manager.instances(app.read_models(), stuck_only=args.stuck, tenant=args.tenant)
            except CommitlineError as e:
                return error_exit(e, EXIT_USAGE)
            if args.json:
                print_json([_as_dict(r) for r in rows], sys.stdout)
            else:
                for r in rows:
                    print(manager.describe(r))
                print(f"{len(rows)} saga(s){' STUCK or PARKED' if args.stuck else ''}", file=sys.stderr)
            return EXIT_OK
        if args.sagas_command == "retry":
            try:
                said = manager.retry(args.instance_id, args.tenant, f"operator-retry/{args.instance_id}/{uuid4()}")
            except CommitlineError as e:
                return error_exit(_named(e, args.instance_id), _exit_for(e))
            running = any(f.name == manager.name and f.alive for f in app.status().followers)
            if args.json:
                print_json({"saga": manager.name, "id": str(args.instance_id), "tenant": args.tenant,
                            "message": said, "runner_running": running}, sys.stdout)
            elif running:
                print(f"{said}; the running process manager picks it up")
            else:
                print(f"{said}; no `commitline sagas run` runs {manager.name} now: it goes on once one does")
            return EXIT_OK
        try:
            history = app.auditor().history(manager.history_of(args.instance_id), tenant=args.tenant)
        except CommitlineError as e:
            return error_exit(_named(e, args.instance_id), _exit_for(e))
        if args.json:
            print_json([{"version": e.version, "at": e.recorded_at, "type": e.type, "payload": e.payload,
                          "state": e.transition} for e in history.entries], sys.stdout)
            return EXIT_OK
        for e in history.entries:
            outcome = ", ".join(f"{k}={v}" for k, v in e.payload.items() if not isinstance(v, dict | list)
                                and str(v) != str(args.instance_id))
            print(f"{e.version:>3}  {e.recorded_at:%H:%M:%S.%f}  {e.type:<24} {outcome:<60} {e.transition or ''}")
        return EXIT_OK


def _as_dict(row: Any) -> dict[str, Any]:
    return dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(vars(row))


def _exit_for(error: CommitlineError) -> int:
    """A tenant that is no tenant is a wrong argument (2); an instance not found, or not waiting, is refused (1)."""
    from commitline.application.errors import InvalidTenant

    return EXIT_USAGE if isinstance(error, InvalidTenant) else EXIT_REFUSED


def _named(error: CommitlineError, instance: UUID) -> CommitlineError:
    """A not-found error about the instance's own aggregate, naming the id the operator gave."""
    from commitline.application.errors import AggregateNotFound

    if isinstance(error, AggregateNotFound):
        return AggregateNotFound("saga instance", instance)
    return error


def _run_sagas(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    with bootstrap(long_running=True) as app:
        simulated = sorted(name for name, factory in app.domain.port_factories.items()
                           if getattr(factory, "__module__", "").startswith("commitline.examples"))
        if app.settings.gateway == "simulated" and simulated:  # a domain's own factories choose for themselves
            logging.getLogger(__name__).warning(
                "the examples' ports (%s) use their SIMULATED adapters: set COMMITLINE_GATEWAY=http (with "
                "COMMITLINE_GATEWAY_URL) or COMMITLINE_GATEWAY=module:factory for a real one", ", ".join(simulated))
        names = [args.saga] if args.saga else sorted(app.domain.managers)
        if not names:
            print(f"commitline sagas run: the domain {app.domain.name!r} declares no process manager",
                  file=sys.stderr)
            return EXIT_USAGE
        followers: list[Any] = []
        models: list[str] = []
        for name in names:
            runner = app.process_runner(name)
            followers.append(runner)
            models += [m for m in runner.manager.read_models if m not in models]
        followers += [app.projector(model) for model in models]
        with app.metrics_endpoint(args.metrics_host, args.metrics_port, followers):
            app.run_until_signalled(*followers)
    return EXIT_OK


_saga_name = declared("process manager", lambda domain: domain.managers)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ssub = actions(sub, "sagas", "process managers (sagas): run them, show, list, retry their instances")
    srun = ssub.add_parser("run", help="run the domain's process managers until SIGINT/SIGTERM",
                           description="Advances every instance the domain's events trigger (the examples: reserve "
                           "stock -> authorize payment -> confirm and capture, compensated in reverse on failure), "
                           "keeping the read models they report from up to date. One instance of each at a time "
                           "(advisory lock).")
    add_metrics_options(srun)
    srun.set_defaults(long_running=True)
    sshow = ssub.add_parser("show", help="the steps an instance took and their outcomes")
    sshow.add_argument("instance_id", type=aggregate_id, metavar="ID", help="the instance (the examples: the order)")
    sshow.add_argument("--json", action="store_true", help="machine-readable output")
    slist = ssub.add_parser("list", help="instances and their state (from the process manager's read model)")
    slist.add_argument("--stuck", "--failed", dest="stuck", action="store_true",
                       help="only those waiting for a person: STUCK (a compensation kept failing) or PARKED "
                       "(advancing kept failing), with the reason")
    slist.add_argument("--json", action="store_true", help="machine-readable output")
    sretry = ssub.add_parser("retry", help="after fixing the cause: resume a PARKED instance where it stopped, or "
                             "retry the compensations of a STUCK one")
    sretry.add_argument("instance_id", type=aggregate_id, metavar="ID", help="the instance (the examples: the order)")
    sretry.add_argument("--json", action="store_true", help="machine-readable output")
    for parser_, default in ((sshow, "default"), (sretry, "default"), (slist, None)):
        parser_.add_argument("--tenant", "-t", default=default,
                             help="the instance's tenant (default: default)" if default else "only this tenant's")
    for parser_ in (srun, sshow, slist, sretry):
        parser_.add_argument("--saga", type=_saga_name, metavar="NAME",
                             help="the process manager (needed only when the domain has several)")
        parser_.set_defaults(run=cmd_sagas)
