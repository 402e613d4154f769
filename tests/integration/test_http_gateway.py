"""The fulfilment saga through ``COMMITLINE_GATEWAY=http`` to a real gateway server on loopback, the
gateway settings (timeout, attempts, back-off) and a gateway chosen by import path."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from uuid import UUID, uuid4

import pytest

from commitline.application.errors import ConfigurationError
from commitline.examples.fulfilment_saga import FulfilmentSaga
from commitline.composition import Commitline, bootstrap
from commitline.examples.fulfilment import OrderFulfilment, fulfilment_id, payment_id_for
from commitline.examples.orders import Order
from commitline.examples.payments import PaymentTransaction
from commitline.examples.http_gateway import HttpGateway
from tests.gateway_server import GatewayServer
from tests.support import settings_for
from tests.support import configured_gateway, make_saga

TOKEN = "gw-secret-token-7"


@pytest.fixture
def gateway_server() -> Iterator[GatewayServer]:
    # The slow answer comes well after the client's timeout, and the timeout is far above a loopback round trip
    # on a loaded machine: only the provoked call times out, so the call counts below are exact.
    with GatewayServer(token=TOKEN, slow_s=6.0) as server:
        yield server


def shop_app(pg_dsn: str, schema: str, url: str, **overrides: object) -> Commitline:
    values: dict[str, object] = {"gateway": "http", "gateway_url": url, "gateway_token": TOKEN,
                                 "gateway_timeout_s": 2.0, "gateway_attempts": 3, "gateway_backoff_ms": 10}
    values.update(overrides)
    return bootstrap(settings_for(pg_dsn, schema, **values))


def place(app: Commitline, item: UUID, account: str) -> UUID:
    return app.dispatch({"type": "place_order", "item_id": str(item), "quantity": 1, "amount": "25.00",
                         "currency": "EUR", "account": account}, idempotency_key=f"order-{uuid4()}").aggregate_id


def outcome(app: Commitline, order_id: UUID) -> tuple[str, str, str | None]:
    saga = app.store.load(OrderFulfilment, fulfilment_id(order_id))
    payment = app.store.load(PaymentTransaction, payment_id_for(order_id))
    return (saga.state.value, app.store.load(Order, order_id).state.value,
            payment.state.value if payment.state else None)


def test_orders_through_the_http_gateway(pg_dsn: str, schema: str, gateway_server: GatewayServer) -> None:
    with shop_app(pg_dsn, schema, gateway_server.url) as app:
        saga = make_saga(app)
        assert isinstance(saga.gateway, HttpGateway) and saga.attempts == 3 and saga.backoff == 0.01
        item = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 10}, idempotency_key="stock")
        cases = {"acct": ("COMPLETED", "CONFIRMED", "COMPLETED"),
                 "acct|declines": ("COMPENSATED", "CANCELLED", "FAILED"),
                 "acct|fails-once": ("COMPLETED", "CONFIRMED", "COMPLETED"),
                 "acct|slow-once": ("COMPLETED", "CONFIRMED", "COMPLETED")}
        orders = {account: place(app, item, account) for account in cases}
        for account, order_id in orders.items():
            saga.advance(order_id)
            assert outcome(app, order_id) == cases[account], account
            key = FulfilmentSaga.gateway_key(order_id)
            entry = gateway_server.ledger[key]
            assert entry["status"] == ("VOIDED" if "declines" in account else "CAPTURED"), account
            assert entry["captures"] == (0 if "declines" in account else 1), account
            # advancing again repeats nothing at the gateway
            calls = dict(gateway_server.calls)
            saga.advance(order_id)
            assert dict(gateway_server.calls) == calls
        # retried calls reuse their key: the slow authorize (timed out at 2 s) was sent twice, held once
        slow_key = FulfilmentSaga.gateway_key(orders["acct|slow-once"])
        assert gateway_server.calls[("authorize", slow_key)] == 2
        assert gateway_server.calls[("authorize", FulfilmentSaga.gateway_key(orders["acct|fails-once"]))] == 2
        sent = [h for h in gateway_server.headers_seen if h.get("idempotency-key") == f"authorize/{slow_key}"]
        assert len(sent) == 2 and all(h["authorization"] == f"Bearer {TOKEN}" for h in sent)


def test_attempts_and_backoff_are_settings(pg_dsn: str, schema: str, gateway_server: GatewayServer) -> None:
    with shop_app(pg_dsn, schema, gateway_server.url, gateway_attempts=4) as app:
        item = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1}, idempotency_key="stock")
        order_id = place(app, item, "acct|unavailable")
        make_saga(app).advance(order_id)
        key = FulfilmentSaga.gateway_key(order_id)
        # authorize tried 4 times, then the compensation's void 4 times: the void never got through -> STUCK
        assert gateway_server.calls[("authorize", key)] == 4
        assert gateway_server.calls[("void", key)] == 4
        saga = app.store.load(OrderFulfilment, fulfilment_id(order_id))
        assert saga.state.value == "STUCK" and "gateway down for maintenance" in (saga.stuck or "")


def test_an_unreachable_gateway_is_unavailable_and_never_leaks_the_token(pg_dsn: str, schema: str) -> None:
    with GatewayServer() as closed:
        url = closed.url
    with shop_app(pg_dsn, schema, url) as app:
        item = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1}, idempotency_key="stock")
        order_id = place(app, item, "acct")
        make_saga(app).advance(order_id)
        saga = app.store.load(OrderFulfilment, fulfilment_id(order_id))
        assert saga.state.value == "STUCK" and "cannot reach the gateway" in (saga.stuck or "")
        history = app.auditor().history(fulfilment_id(order_id), compact=False)
        assert TOKEN not in repr(history)


def test_a_gateway_factory_chosen_by_import_path(pg_dsn: str, schema: str, gateway_server: GatewayServer) -> None:
    with shop_app(pg_dsn, schema, gateway_server.url, gateway="tests.gateway_server:factory",
                  gateway_token=None) as app:
        gateway = configured_gateway(app)
        assert isinstance(gateway, HttpGateway)
        gateway_server.token = None
        assert gateway.authorize("k1", __import__("decimal").Decimal("1.00"), "EUR", "acct") == "auth-k1"
    for path, complaint in (("tests.gateway_server:nothing_here", "has no function 'nothing_here'"),
                            ("tests.no_such_module:factory", "cannot import 'tests.no_such_module'"),
                            ("tests.gateway_server:not_a_gateway", "lacks capture, void")):
        with shop_app(pg_dsn, schema, gateway_server.url, gateway=path) as app:
            with pytest.raises(ConfigurationError) as refused:
                make_saga(app)
            assert refused.value.variable == "COMMITLINE_GATEWAY" and complaint in str(refused.value)


def test_http_gateway_needs_its_url() -> None:
    from commitline.infrastructure.config import load_settings

    with pytest.raises(ConfigurationError) as refused:
        load_settings({"COMMITLINE_GATEWAY": "http", "COMMITLINE_GATEWAY_TOKEN": TOKEN})
    assert refused.value.variable == "COMMITLINE_GATEWAY_URL" and TOKEN not in str(refused.value)


def test_credentials_in_the_gateway_url_are_sent_only_without_a_token_and_never_logged(
        gateway_server: GatewayServer, caplog: pytest.LogCaptureFixture) -> None:
    """A user and password in COMMITLINE_GATEWAY_URL: the configured token wins (httpx would send them as Basic
    credentials in its place), and no log line of the calls names them."""
    import base64
    import logging

    with_credentials = gateway_server.url.replace("http://", "http://gwuser:GwUrlPass%21@")
    caplog.set_level(logging.DEBUG)
    tokened = HttpGateway(with_credentials, token=TOKEN)
    assert tokened.authorize("k-1", Decimal("5.00"), "EUR", "acct").startswith("auth-")
    tokened.close()
    assert gateway_server.headers_seen[-1]["authorization"] == f"Bearer {TOKEN}"

    gateway_server.token = None
    basic = HttpGateway(with_credentials)
    basic.capture("k-1")
    basic.close()
    sent = gateway_server.headers_seen[-1]["authorization"]
    assert sent == "Basic " + base64.b64encode(b"gwuser:GwUrlPass!").decode()
    assert "GwUrlPass" not in caplog.text and "gwuser:" not in caplog.text


def test_a_capture_without_a_definite_answer_waits_for_a_retry_and_never_undoes_a_payment_taken(
        pg_dsn: str, schema: str, gateway_server: GatewayServer) -> None:
    """The gateway takes the money and then answers 500, every time: the outcome is unknown to the saga, so it
    neither voids (the gateway would refuse: captured) nor cancels a paid order. It parks at AUTHORIZED; once the
    gateway answers again, an operator's retry captures under the same key and gets the first outcome: one
    capture, the order confirmed, the payment completed."""
    with shop_app(pg_dsn, schema, gateway_server.url) as app:
        saga = make_saga(app)
        item = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1}, idempotency_key="stock")
        order_id = place(app, item, "acct|capture-lost")
        assert saga.advance(order_id).value == "PARKED"
        assert outcome(app, order_id) == ("PARKED", "CONFIRMED", "PENDING")
        key = FulfilmentSaga.gateway_key(order_id)
        assert gateway_server.calls[("capture", key)] == 3 and ("void", key) not in gateway_server.calls
        parked = app.store.load(OrderFulfilment, fulfilment_id(order_id))
        assert "no definite answer to the capture after 3 attempts: capture: HTTP 500" in (parked.stuck or "")

        gateway_server.capture_lost = False
        print(saga.retry(order_id, "default", "operator-retry-1"))
        assert saga.advance(order_id).value == "COMPLETED"
        assert outcome(app, order_id) == ("COMPLETED", "CONFIRMED", "COMPLETED")
        assert gateway_server.ledger[key]["captures"] == 1


def test_credentials_the_gateway_refuses_or_a_server_that_is_not_the_gateway_park_the_order_instead_of_cancelling(
        pg_dsn: str, schema: str, gateway_server: GatewayServer) -> None:
    """A 401 is no order's fault, and a 200 without a reference (a web server at the wrong URL) is no payment:
    either parks the saga at the charge with a reason naming the configuration, voids nothing and cancels no
    order; after the fix, a retry charges and completes it."""
    item = uuid4()
    with shop_app(pg_dsn, schema, gateway_server.url, gateway_token="not-the-token") as wrong:
        wrong.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 2}, idempotency_key="stock")
        refused = place(wrong, item, "acct")
        assert make_saga(wrong).advance(refused).value == "PARKED"
        assert "not-the-token" not in repr(wrong.auditor().history(fulfilment_id(refused), compact=False))
    with shop_app(pg_dsn, schema, gateway_server.url) as fixed:
        web_page = place(fixed, item, "acct|not-a-gateway")
        assert make_saga(fixed).advance(web_page).value == "PARKED"
        for order_id, said in ((refused, "authorize: HTTP 401: bad token: the gateway refused the credentials"),
                               (web_page, "authorize: HTTP 200 without a reference: not the gateway's answer")):
            assert outcome(fixed, order_id) == ("PARKED", "PLACED", "PENDING")
            assert (fixed.store.load(OrderFulfilment, fulfilment_id(order_id)).stuck or "").startswith(said)
            assert ("void", FulfilmentSaga.gateway_key(order_id)) not in gateway_server.calls
        saga = make_saga(fixed)
        saga.retry(refused, "default", "operator-retry-1")
        assert saga.advance(refused).value == "COMPLETED"
        assert outcome(fixed, refused) == ("COMPLETED", "CONFIRMED", "COMPLETED")


def test_the_timeout_bounds_the_whole_call_and_a_token_no_header_can_carry_is_refused_at_once(
        gateway_server: GatewayServer) -> None:
    """An answer trickled in a byte at a time never waits the timeout for any one read, yet takes longer as a
    whole: the call ends at the timeout, an unknown outcome. A token with a line break (a secret file's last
    newline) or a non-ASCII character is refused when the adapter is made, naming the variable, not the token."""
    from commitline.examples.payment_gateway import GatewayTimeout

    gateway_server.trickle_s = 0.1  # 30 bytes: 3 s in all, each byte well within the timeout
    gateway = HttpGateway(gateway_server.url, token=TOKEN, timeout_s=1.0)
    with pytest.raises(GatewayTimeout, match="authorize: no whole answer within 1.0 s"):
        gateway.authorize("k-trickle", Decimal("1.00"), "EUR", "acct|trickle")
    gateway.close()
    for token in (TOKEN + "\n", "“" + TOKEN + "”", "two words"):
        with pytest.raises(ConfigurationError) as bad:
            HttpGateway(gateway_server.url, token=token)
        assert bad.value.variable == "COMMITLINE_GATEWAY_TOKEN" and TOKEN not in str(bad.value)
