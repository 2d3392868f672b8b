"""Who is erased: an email address, a phone number or an identifier, normalised, and how each
of its values is recognised inside stored text.

Two ways of recognising a value, by whose row it is:

- In the person's own rows (their runs and everything of those runs), *contained*: a text
  holds a value when it contains it with nothing of the same kind joined to it (below), and
  a JSON number holds a phone number or an identifier of at least MIN_IDENTIFIER_CHARS
  characters when its digits are the same.
- In every other row (other people's runs, rows of the organisation tied to no run of
  theirs), *whole* (``strict``), so that an erasure never reaches into other values:
  an email address wherever it is written as a whole address (its own syntax delimits it,
  so free text such as an email body or a provider's refusal that names it holds it); a
  phone number only as a token of its own (the whole text, or delimited by spaces, brackets,
  quotes, commas, colons or semicolons, or ending a sentence: never a part of a URL, a path,
  a longer number or an id); an identifier only as the whole text (a JSON string, a text
  column or a JSON key equal to it, exactly). No JSON number is matched there (run ids,
  counts and timestamps are numbers).

By kind:

- email: the mailbox the text names, as the suppression list keeps it (``Ann <ANN@X.example>``
  is ``ann@x.example``). Contained with no address character joined to it on either side,
  so ``ann@x.example`` is not found in ``joann@x.example`` or ``ann@x.example.org``.
- phone: its digits alone (spaces, dashes, dots, brackets, slashes and a leading ``+`` are
  ignored): ``+44 20 7946 0000`` and ``+442079460000`` are one number; ``020 7946 0000`` is
  another (give each form that was used). Written as the same digits in order, separated by
  nothing or by those characters only, with no digit joined on either side.
- identifier (a customer id, an account number: a value at a path the definition declares in
  ``personal_data.identifiers``): the text itself, at least MIN_IDENTIFIER_CHARS characters,
  compared exactly; contained (in the person's own rows) with no letter or digit joined.

Values other than the one asked for (the person's name, found at the definition's
``personal_data.fields``) are looked for in the person's own rows only, like identifiers,
case-insensitively.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.utils import getaddresses

from django.conf import settings

from ...errors import IdentifierTooShort, InvalidPerson

KINDS = ("email", "phone", "identifier")
MIN_PHONE_DIGITS = 6  # fewer would match parts of ordinary numbers (an order's id, a price)
MAX_VALUE_CHARS = 320  # the longest email address; identifiers and phones are shorter
MIN_VALUE_CHARS = 2  # a field's value shorter than this is not searched for (it is everywhere)
# An identifier shorter than this would be a part of too many other values ("5", "42").
MIN_IDENTIFIER_CHARS = 4
_PHONE_SEPARATORS = r"[\s().\-/]*"
# ILIKE's wildcards and its escape character, escaped to mean themselves.
_LIKE_SPECIAL = re.compile(r"([%_\\])")


@dataclass(frozen=True)
class Subject:
    """The person as asked for: ``kind`` (email, phone, identifier) and its normal form."""

    kind: str
    value: str

    @property
    def digest(self) -> str:
        """A keyed hash of the normal form (``keyed_hash``): what a tombstone keeps, so a
        second request for the same person is recognised without keeping who it was."""
        return keyed_hash(f"{self.kind}:{self.value}")


def subject_of(*, email: str | None = None, phone: str | None = None,
               identifier: str | None = None) -> Subject:  # fmt: skip
    """The one person named; InvalidPerson (400 ``invalid_person``) for none, several, or a
    value that is not an address, a number or an identifier."""
    given = {k: v for k, v in {"email": email, "phone": phone, "identifier": identifier}.items()
             if v is not None}  # fmt: skip
    if len(given) != 1:
        raise InvalidPerson(reason="name the person by exactly one of email, phone, identifier")
    kind, raw = next(iter(given.items()))
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidPerson(reason=f"{kind} must be a non-empty string")
    if len(raw) > MAX_VALUE_CHARS:
        raise InvalidPerson(reason=f"{kind} is longer than {MAX_VALUE_CHARS} characters")
    if kind == "email":
        return Subject("email", _email(raw))
    if kind == "phone":
        return Subject("phone", _phone(raw))
    identifier = raw.strip()
    if len(identifier) < MIN_IDENTIFIER_CHARS:
        raise IdentifierTooShort(min_chars=MIN_IDENTIFIER_CHARS)
    return Subject("identifier", identifier)


class NotOneAddress(ValueError):
    """A text is not exactly one well-formed email address."""


def canonical_email(text: str) -> str:
    """The one mailbox ``text`` names, as the suppression list stores it (``local@domain``,
    lowercased, quotes and display name gone): ``Friend <Unsub@Victim.example>``,
    ``<unsub@victim.example>`` and ``"unsub"@victim.example`` are all ``unsub@victim.example``,
    the mailbox the mail server is given. Parsed as Django's mail delivery parses it, so what
    is checked is what is sent to. Raises NotOneAddress for none, several or a malformed one.
    (The effects app's consent check and the erasure of a person by email share it.)"""
    found = [(name, spec) for name, spec in getaddresses([text]) if name or spec]
    if len(found) != 1:
        raise NotOneAddress(f"{len(found)} addresses, not one")
    try:
        address = Address(addr_spec=found[0][1])
    except (HeaderParseError, ValueError, IndexError) as exc:
        raise NotOneAddress("not an email address") from exc
    if not address.username or not address.domain:
        raise NotOneAddress("not an email address")
    return f"{address.username}@{address.domain}".lower()


def _email(raw: str) -> str:
    try:
        return canonical_email(raw)
    except NotOneAddress as exc:
        raise InvalidPerson(reason=f"email is not one email address ({exc})") from exc


# A phone number as written: digits, separated by spaces, dashes, dots, brackets or slashes,
# after a leading + (a text with a letter in it, "INV-794601", is an id, not a number).
PHONE_SHAPE = re.compile(r"\s*\+?[\d\s().\-/]+\s*")


def looks_like_phone(text: str) -> bool:
    return PHONE_SHAPE.fullmatch(text) is not None


def _phone(raw: str) -> str:
    if not looks_like_phone(raw):
        raise InvalidPerson(
            reason="phone may hold only digits, spaces, dashes, dots, brackets and a leading +"
        )
    digits = phone_digits(raw)
    if len(digits) < MIN_PHONE_DIGITS:
        raise InvalidPerson(reason=f"phone must have at least {MIN_PHONE_DIGITS} digits")
    return digits


def phone_digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def keyed_hash(text: str) -> str:
    """HMAC-SHA256 of ``text`` under a key derived from SECRET_KEY, as ``hmac-sha256:<hex>``:
    the same text gives the same hash on this installation and cannot be reversed or tested
    without the secret. (A new SECRET_KEY makes new hashes: see docs/how-to/erase-a-person.md.)"""
    key = hashlib.sha256(f"waymark.erasure:{settings.SECRET_KEY}".encode()).digest()
    return "hmac-sha256:" + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


# An address in a URL (a query's ``?email=ann%40example.org``, a template's ``urlencode``) has
# its @ and + percent-encoded: the same address, written whole.
_PERCENT_ENCODED = {"@": "%40", "+": "%2B"}


def _encoded_too(address: str) -> str:
    """The regular expression of ``address`` as written or percent-encoded in a URL."""
    return "".join(
        f"(?:{re.escape(char)}|{_PERCENT_ENCODED[char]})" if char in _PERCENT_ENCODED
        else re.escape(char)
        for char in address
    )  # fmt: skip


def _percent_encoded(value: str) -> str:
    """An address as a URL writes it (its @ and +); any other value as it is."""
    if "@" not in value:
        return value
    return "".join(_PERCENT_ENCODED.get(char, char) for char in value)


def like_patterns(values: Iterable[str]) -> list[str]:
    """ILIKE patterns that find each value inside a column's text: as written, as JSON
    escapes it (a quote, a backslash, a control character) and, for an address, as a URL
    encodes it; a superset of what the matcher then recognises."""
    patterns: set[str] = set()
    for value in values:
        for form in {value, _json_escaped(value), _percent_encoded(value)}:
            patterns.add("%" + _LIKE_SPECIAL.sub(r"\\\1", form) + "%")
    return sorted(patterns)


def _json_escaped(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)[1:-1]


# What may stand beside a phone number written as a token of its own (strict): a text's ends,
# spaces, brackets, quotes, commas, colons, semicolons; after it, also a sentence's end.
_PHONE_BEFORE = r"(?<![^\s()\[\]{}<>\"',;:])"
_PHONE_AFTER = r"(?=$|[\s()\[\]{}<>\"',;:]|[.!?](?:$|\s))"


def value_pattern(kind: str, value: str, *, strict: bool = False) -> str | None:
    """The regular expression that finds ``value`` (of ``kind``) inside a text; None when it
    is found only as a whole text (an identifier or a field, ``strict``)."""
    if kind == "email":
        return rf"(?<![\w.+\-]){_encoded_too(value)}(?![\w\-]|\.\w)"
    if kind == "phone":
        digits = _PHONE_SEPARATORS.join(re.escape(d) for d in value)
        if strict:
            return _PHONE_BEFORE + r"\+?" + digits + _PHONE_AFTER
        return r"(?<!\d)" + digits + r"(?!\d)"
    if strict:
        return None
    # No letter or digit joined to an end that is one ("cust-42" is not in "cust-420").
    before = r"(?<!\w)" if value[:1].isalnum() else ""
    after = r"(?!\w)" if value[-1:].isalnum() else ""
    return before + re.escape(value) + after
