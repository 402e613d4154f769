"""Store commands: ``store generation`` shows which history the store's notification ids belong to, and
``store new-generation`` starts another after a restore or an asynchronous failover."""

from __future__ import annotations

import argparse
import sys

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, actions, print_json


def _show(generation: object, json: bool, started: bool = False) -> None:
    values = generation.as_dict()  # type: ignore[attr-defined]
    if json:
        print_json(values)
        return
    server = ""
    if values["timeline"] is not None:
        server = f"; server timeline {values['timeline']}, system identifier {values['system_identifier']}"
    what = "started generation" if started else "generation"
    print(f"{what} {values['generation']} since {values['started_at']} (log head then {values['head']}): "
          f"{values['reason']}{server}")
    if started:
        print("every follower with a saved position stops until an operator resets it: commitline followers reset "
              "NAME --from-head | --from N | --keep (see commitline status); one that never ran on this store starts "
              "from the first event unless reset first")


def cmd_generation(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    with bootstrap() as app:
        _show(app.store_generation(), args.json)
    return EXIT_OK


def cmd_new_generation(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap
    from commitline.composition import InterventionRefused

    with bootstrap() as app:
        try:
            generation = app.new_generation(args.reason)
        except InterventionRefused as e:
            print(f"commitline store new-generation: {e}", file=sys.stderr)
            return EXIT_REFUSED
    _show(generation, args.json, started=True)
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    store = actions(sub, "store", "the store's generation: show it, or start a new one after a restore or an "
                    "asynchronous failover")
    show = store.add_parser("generation", help="the store's current generation: since when, why, and the log head "
                            "it started at",
                            description="Notification ids are positions in one history of the store: its "
                            "generation. Followers record it with their positions and Kafka records carry it.")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=cmd_generation)
    new = store.add_parser(
        "new-generation", help="start the store's next generation: run it after a restore from a backup or an "
        "asynchronous failover, before starting any follower",
        description="After a restore, or a failover to a standby that lacked the last acknowledged commits, the "
        "notification ids after the new head will be used again by other events. Starting a new generation "
        "records that (append-only), so that every follower with a saved position stops until an operator resets it "
        "(commitline followers reset NAME --from-head | --from N | --keep; one that never ran starts from the first "
        "event unless reset first) and every Kafka record published from then on carries the new generation. Prints "
        "the generation started.")
    new.add_argument("--reason", required=True, help="what happened (the restore, the failover): kept with the "
                     "generation")
    new.add_argument("--json", action="store_true", help="machine-readable output")
    new.set_defaults(run=cmd_new_generation)
