"""``commitline sagas ...``: run the order-fulfilment process manager, show, list, retry.

``show`` and ``retry`` act as the order's tenant (``--tenant/-t``, default ``default``): another
tenant's order is not found. ``list`` shows every tenant's sagas unless given ``--tenant``."""

from __future__ import annotations

import argparse
import logging
import sys
from uuid import uuid4

from commitline.application.errors import CommitlineError
from commitline.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    aggregate_id,
    error_exit,
    print_json,
)
from commitline.cli.followers import add_metrics_options, metrics_endpoint


def cmd_sagas(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap

    if args.sagas_command == "run":
        return _run_sagas(args)
    with bootstrap() as app:
        if args.sagas_command == "list":
            try:
                rows = app.read_models().fulfilments(stuck_only=args.stuck, tenant=args.tenant)
            except CommitlineError as e:
                return error_exit(e, EXIT_USAGE)
            if args.json:
                print_json([r.__dict__ for r in rows], sys.stdout)
            else:
                for r in rows:
                    print(f"{r.order_id}  {r.state:<12} {r.stuck or r.failure}")
                print(f"{len(rows)} saga(s){' STUCK or PARKED' if args.stuck else ''}", file=sys.stderr)
            return EXIT_OK
        from commitline.domain.fulfilment import fulfilment_id

        if args.sagas_command == "retry":
            from commitline.application.commands import RetryFulfilment

            try:
                result = app.processor.dispatch(RetryFulfilment(order_id=args.order_id),
                                                idempotency_key=f"operator-retry/{args.order_id}/{uuid4()}",
                                                tenant=args.tenant)
            except CommitlineError as e:
                return error_exit(e, EXIT_REFUSED)
            resumed = result.events[-1].payload.get("resumed", "COMPENSATING")
            print(f"fulfilment of {args.order_id} resumed at {resumed} (version {result.version}); "
                  "the running process manager picks it up")
            return EXIT_OK
        try:
            history = app.auditor().history(fulfilment_id(args.order_id), tenant=args.tenant)
        except CommitlineError as e:
            return error_exit(e, EXIT_USAGE)
        if args.json:
            print_json([{"version": e.version, "at": e.recorded_at, "type": e.type, "payload": e.payload,
                          "state": e.transition} for e in history.entries], sys.stdout)
            return EXIT_OK
        for e in history.entries:
            outcome = ", ".join(f"{k}={v}" for k, v in e.payload.items() if k != "order_id")
            print(f"{e.version:>3}  {e.recorded_at:%H:%M:%S.%f}  {e.type:<24} {outcome:<60} {e.transition or ''}")
        return EXIT_OK


def _run_sagas(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap

    with bootstrap() as app:
        if app.settings.gateway == "simulated":
            logging.getLogger(__name__).warning(
                "payments go through the SIMULATED gateway: set COMMITLINE_GATEWAY=http (with COMMITLINE_GATEWAY_URL) "
                "or COMMITLINE_GATEWAY=module:factory for a real one")
        followers = [app.fulfilment_runner(), app.projector("order_fulfilments")]
        with metrics_endpoint(args, app, followers):
            app.run_until_signalled(*followers)
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sagas = sub.add_parser("sagas", help="order fulfilment: run the process manager, show, list, retry")
    ssub = sagas.add_subparsers(dest="sagas_command", required=True, metavar="ACTION")
    srun = ssub.add_parser("run", help="run the order-fulfilment process manager until SIGINT/SIGTERM",
                           description="Advances every placed order: reserve stock -> authorize payment -> confirm "
                           "and capture; compensates in reverse on failure. One instance at a time (advisory lock).")
    add_metrics_options(srun)
    sshow = ssub.add_parser("show", help="the steps a fulfilment took and their outcomes")
    sshow.add_argument("order_id", type=aggregate_id, metavar="ORDER_ID")
    sshow.add_argument("--json", action="store_true")
    slist = ssub.add_parser("list", help="fulfilments and their state (from the order_fulfilments read model)")
    slist.add_argument("--stuck", "--failed", dest="stuck", action="store_true",
                       help="only those waiting for a person: STUCK (a compensation kept failing) or PARKED "
                       "(advancing kept failing), with the reason")
    slist.add_argument("--json", action="store_true")
    sretry = ssub.add_parser("retry", help="after fixing the cause: resume a PARKED fulfilment where it stopped, or "
                             "retry the compensations of a STUCK one")
    sretry.add_argument("order_id", type=aggregate_id, metavar="ORDER_ID")
    for parser_, default in ((sshow, "default"), (sretry, "default"), (slist, None)):
        parser_.add_argument("--tenant", "-t", default=default,
                             help="the order's tenant (default: default)" if default else "only this tenant's sagas")
    sagas.set_defaults(run=cmd_sagas)
