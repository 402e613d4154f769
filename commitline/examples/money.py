"""Money rules: ISO 4217 currency codes and amounts that fit the currency's minor unit, and the base of
commands that carry money (checked at the boundary, so a bad amount is an invalid command)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any

from iso4217 import Currency
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from commitline import Amount, Command, InvalidValue

MAX_AMOUNT = Decimal(10) ** 15
"""Amounts are below 10^15 (at most 15 digits before the point): stored as text and numeric, summed in
read models with Python's 28-digit decimal context, so sums of many amounts stay exact."""
MAX_DECIMALS_WITHOUT_MINOR_UNIT = 8
"""Decimal places allowed for currencies without a minor unit (XAU, XDR, ...), for the same reason."""


def check_currency(code: str) -> str:
    """Return the code if it is an active ISO 4217 currency; raise InvalidValue otherwise."""
    try:
        Currency(code)
    except ValueError:
        raise InvalidValue("currency", code, "not an ISO 4217 currency code") from None
    return code


def check_amount(amount: Decimal, currency: str) -> Decimal:
    """A payable amount is finite, positive, below ``MAX_AMOUNT`` and has no more decimals than the
    currency allows (``MAX_DECIMALS_WITHOUT_MINOR_UNIT`` for a currency without a minor unit)."""
    if not amount.is_finite():
        raise InvalidValue("amount", amount, "must be a finite number")
    if amount <= 0:
        raise InvalidValue("amount", amount, "must be greater than zero")
    if amount >= MAX_AMOUNT:
        raise InvalidValue("amount", amount, "must be less than 10^15 (at most 15 digits before the decimal point)")
    exponent = Currency(check_currency(currency)).exponent
    allowed = MAX_DECIMALS_WITHOUT_MINOR_UNIT if exponent is None else exponent
    decimals = -amount.as_tuple().exponent if amount.as_tuple().exponent < 0 else 0  # type: ignore[operator]
    if decimals > allowed:
        raise InvalidValue("amount", amount, f"{currency} allows at most {allowed} decimal places")
    return amount


def as_field_error(check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``, its InvalidValue turned into the ValueError a pydantic validator reports on its field."""
    try:
        return check(*args)
    except InvalidValue as e:
        raise ValueError(e.reason) from None


def allowed_decimals(currency: Currency) -> int:
    return MAX_DECIMALS_WITHOUT_MINOR_UNIT if currency.exponent is None else currency.exponent


def positive_amount_text(decimals: int) -> str:
    """The regular expression of an amount written as a string that ``check_amount`` accepts with at most
    ``decimals`` decimal places: above zero, below 10^15, no leading zero (as ``Amount`` is written)."""
    whole = r"[1-9][0-9]{0,14}"
    if decimals == 0:
        return f"^{whole}$"
    below_one = "|".join(rf"0\.{'0' * k}[1-9][0-9]{{0,{decimals - k - 1}}}" for k in range(decimals))
    return rf"^({whole}(\.[0-9]{{1,{decimals}}})?|{below_one})$"


def _priced_schema(schema: dict[str, Any]) -> None:
    """The JSON schema says what ``check_amount`` checks: the currency is an ISO 4217 code, and the amount is
    positive, below 10^15, with no more decimals than its currency allows (one branch per number of decimals),
    so a client generated from the OpenAPI description never sends an amount this domain refuses."""
    by_decimals: dict[int, list[str]] = {}
    for currency in Currency:
        by_decimals.setdefault(allowed_decimals(currency), []).append(currency.code)
    integer = {"type": "integer", "minimum": 1, "maximum": int(MAX_AMOUNT) - 1}
    properties = schema["properties"]
    properties["currency"] = {"type": "string", "enum": sorted(c.code for c in Currency),
                              "description": "an ISO 4217 currency code"}
    properties["amount"] = {"anyOf": [integer, {"type": "string", "pattern": positive_amount_text(
        max(by_decimals))}], "description": 'above zero and below 10^15, e.g. "12.50", with no more decimal '
        "places than the currency's minor unit"}
    schema["oneOf"] = [{"properties": {"currency": {"enum": sorted(codes)}, "amount": {"anyOf": [
        integer, {"type": "string", "pattern": positive_amount_text(decimals)}]}}}
        for decimals, codes in sorted(by_decimals.items())]


class PricedCommand(Command):
    """A command carrying money: an ISO 4217 currency and an amount that fits its minor unit."""

    model_config = ConfigDict(json_schema_extra=_priced_schema)

    currency: Annotated[str, Field(min_length=3, max_length=3)]
    amount: Amount

    @field_validator("currency")
    @classmethod
    def _iso_currency(cls, code: str) -> str:
        return as_field_error(check_currency, code)

    @field_validator("amount")
    @classmethod
    def _amount_fits_currency(cls, amount: Decimal, info: ValidationInfo) -> Decimal:
        currency = info.data.get("currency")
        if currency is None:  # the currency error is reported on its own field
            return amount
        return as_field_error(check_amount, amount, currency)
