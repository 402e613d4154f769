"""Money rules: ISO 4217 currency codes and amounts that fit the currency's minor unit."""

from __future__ import annotations

from decimal import Decimal

from iso4217 import Currency

from commitline.domain.errors import InvalidValue


def check_currency(code: str) -> str:
    """Return the code if it is an active ISO 4217 currency; raise InvalidValue otherwise."""
    try:
        Currency(code)
    except ValueError:
        raise InvalidValue("currency", code, "not an ISO 4217 currency code") from None
    return code


def check_amount(amount: Decimal, currency: str) -> Decimal:
    """A payable amount is finite, positive and has no more decimals than the currency allows."""
    if not amount.is_finite():
        raise InvalidValue("amount", amount, "must be a finite number")
    if amount <= 0:
        raise InvalidValue("amount", amount, "must be greater than zero")
    exponent = Currency(check_currency(currency)).exponent
    if exponent is not None:
        decimals = -amount.as_tuple().exponent if amount.as_tuple().exponent < 0 else 0  # type: ignore[operator]
        if decimals > exponent:
            raise InvalidValue("amount", amount, f"{currency} allows at most {exponent} decimal places")
    return amount
