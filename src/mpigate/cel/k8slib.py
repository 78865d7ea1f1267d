"""Kubernetes' CEL function libraries, for cel-expr-python.

The API server compiles admission and validation expressions with the libraries of
``k8s.io/apiserver/pkg/cel/environment/base.go`` (``baseOpts``): the CEL standard library and
optionals, cel-go's ``ext.Strings`` (version 2, here cel-cpp's strings extension), ``ext.Sets``,
``ext.Lists`` (version 3) and Kubernetes' own ``library.Lists``, ``Regex``, ``URLs``,
``Quantity``, ``IP``, ``CIDR`` and ``SemverLib``. This module declares the functions that
cel-cpp does not have, with the names, overloads and semantics of those files (each section cites
its source), implemented in Python. Errors are raised as exceptions: cel-expr-python turns them
into CEL errors, which ``||``/``&&`` absorb as CEL specifies.

Not available, because cel-expr-python can neither add macros nor return optional values from a
Python function: ``sortBy`` and two-variable comprehensions (``all(i, v, ...)``,
``transformList``...), ``lists.first``/``last`` and the ``format`` library (whose ``validate``
returns an optional); and the list overloads of ``indexOf``, ``lastIndexOf`` and ``reverse``, whose
names cel-cpp's strings extension already declares for strings (a function cannot gain overloads
outside its declaration there). Expressions that use them fail to compile, naming the function.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, urlsplit

from cel_expr_python import cel

from .types import message_class

__all__ = ["functions"]

_QUANTITY = cel.Type("kubernetes.Quantity")
_URL = cel.Type("kubernetes.URL")
_SEMVER = cel.Type("kubernetes.Semver")
_IP = cel.Type("net.IP")
_CIDR = cel.Type("net.CIDR")
_S, _I, _B, _D = cel.Type.STRING, cel.Type.INT, cel.Type.BOOL, cel.Type.DOUBLE
_DYN = cel.Type.DYN
_LIST = cel.Type.List(cel.Type.DYN)
_STRINGS = cel.Type.List(cel.Type.STRING)
_INT64 = (-(2**63), 2**63 - 1)


def _decl(name: str, *overloads: tuple[str, Any, Sequence[Any], Callable[..., Any] | None, bool]) -> Any:
    """A function declaration; an overload without an implementation is served by another overload
    of the same declaration that takes the same argument kinds."""
    return cel.FunctionDecl(
        name,
        [
            cel.Overload(oid, return_type=ret, parameters=list(params), is_member=member, impl=impl)
            if impl is not None
            else cel.Overload(oid, return_type=ret, parameters=list(params), is_member=member)
            for oid, ret, params, impl, member in overloads
        ],
    )


def _new(type_name: str, value: str) -> Any:
    return message_class(type_name)(value=value)


# -- Quantity: pkg/cel/library/quantity.go, values as apimachinery resource.Quantity -------------

_QUANTITY_TEXT = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def _fraction_text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def _quantity_value(q: Any) -> Fraction:
    return _fraction(q.value)


@lru_cache(maxsize=4096)
def _fraction(text: str) -> Fraction:
    # a rule reads the same few quantities of every pod again and again: parse each text once
    return Fraction(text)


@lru_cache(maxsize=4096)
def _approximate(text: str) -> float:
    return float(_fraction(text))


def _to_quantity(text: str) -> Any:
    if not isinstance(text, str):
        raise ValueError(f"quantities must match the regular expression '{_QUANTITY_TEXT.pattern}'")
    return _quantity_message(text)


@lru_cache(maxsize=4096)
def _quantity_message(text: str) -> Any:
    # resource.ParseQuantity: no surrounding space, the regular expression of quantity.go — checked
    # once per valid text (an invalid one raises, which is not kept); the binding copies a returned
    # message into CEL, so one message per text serves every call
    if not _QUANTITY_TEXT.match(text):
        raise ValueError(f"quantities must match the regular expression '{_QUANTITY_TEXT.pattern}'")
    return _new("kubernetes.Quantity", _quantity_text(text))


@lru_cache(maxsize=4096)
def _quantity_text(text: str) -> str:
    """The exact value of a valid quantity's text, as ``numerator/denominator`` (once per text)."""
    # Imported here: importing mpigate.config loads its custom-rule checks, which import mpigate.cel.
    from mpigate.config.units import parse_quantity

    return _fraction_text(parse_quantity(text))


def _is_quantity(text: str) -> bool:
    try:
        _to_quantity(text)
    except ValueError:
        return False
    return True


def _quantity_of(value: Fraction) -> Any:
    return _new("kubernetes.Quantity", _fraction_text(value))


def _as_integer(q: Any) -> int:
    # quantity.go asInteger: "cannot convert value to integer" unless exact and within int64
    value = _quantity_value(q)
    if value.denominator != 1 or not _INT64[0] <= value.numerator <= _INT64[1]:
        raise ValueError("cannot convert value to integer")
    return value.numerator


def _is_integer(q: Any) -> bool:
    value = _quantity_value(q)
    return value.denominator == 1 and _INT64[0] <= value.numerator <= _INT64[1]


def _sign(q: Any) -> int:
    value = _quantity_value(q)
    return (value > 0) - (value < 0)


def _compare(a: Fraction, b: Fraction) -> int:
    return (a > b) - (a < b)


def _opaque_cmp(a: Any, b: Any) -> int:
    if a.DESCRIPTOR.full_name != b.DESCRIPTOR.full_name:
        raise TypeError(f"no such overload: {a.DESCRIPTOR.full_name} and {b.DESCRIPTOR.full_name}")
    if a.DESCRIPTOR.full_name == "kubernetes.Semver":
        return _semver_cmp(a, b)
    if a.DESCRIPTOR.full_name == "kubernetes.Quantity":
        return _compare(_quantity_value(a), _quantity_value(b))
    raise TypeError(f"no such overload: {a.DESCRIPTOR.full_name} is not comparable")


def _quantity_functions() -> list[Any]:
    q = _QUANTITY
    return [
        _decl("quantity", ("string_to_quantity", q, [_S], _to_quantity, False)),
        _decl("isQuantity", ("is_quantity_string", _B, [_S], _is_quantity, False)),
        _decl("sign", ("quantity_sign", _I, [q], _sign, True)),
        # One implementation per name: cel-cpp's runtime dispatches on the argument kinds, and every
        # opaque type is a message to it, so the Quantity and Semver overloads share one function.
        _decl(
            "isGreaterThan",
            ("quantity_is_greater_than", _B, [q, q], lambda a, b: _opaque_cmp(a, b) > 0, True),
            ("semver_is_greater_than", _B, [_SEMVER, _SEMVER], None, True),
        ),
        _decl(
            "isLessThan",
            ("quantity_is_less_than", _B, [q, q], lambda a, b: _opaque_cmp(a, b) < 0, True),
            ("semver_is_less_than", _B, [_SEMVER, _SEMVER], None, True),
        ),
        _decl(
            "compareTo",
            ("quantity_compare_to", _I, [q, q], _opaque_cmp, True),
            ("semver_compare_to", _I, [_SEMVER, _SEMVER], None, True),
        ),
        _decl(
            "asApproximateFloat",
            ("quantity_get_float", _D, [q], lambda a: _approximate(a.value), True),
        ),
        # quantity(s).asApproximateFloat() as one call (mpigate.cel.fuse): no source can name it
        _decl(
            "@mpigate_quantity_float",
            ("mpigate_quantity_float", _D, [_S], lambda s: _approximate(_to_quantity(s).value), False),
        ),
        _decl("asInteger", ("quantity_get_int", _I, [q], _as_integer, True)),
        _decl("isInteger", ("quantity_is_integer", _B, [q], _is_integer, True)),
        _decl(
            "add",
            (
                "quantity_add",
                q,
                [q, q],
                lambda a, b: _quantity_of(_quantity_value(a) + _quantity_value(b)),
                True,
            ),
            ("quantity_add_int", q, [q, _I], lambda a, b: _quantity_of(_quantity_value(a) + b), True),
        ),
        _decl(
            "sub",
            (
                "quantity_sub",
                q,
                [q, q],
                lambda a, b: _quantity_of(_quantity_value(a) - _quantity_value(b)),
                True,
            ),
            ("quantity_sub_int", q, [q, _I], lambda a, b: _quantity_of(_quantity_value(a) - b), True),
        ),
    ]


# -- Semver: pkg/cel/library/semverlib.go (blang/semver v4 Parse, ParseTolerant-like normalize) ----

_SEMVER_TEXT = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _normalize_semver(text: str) -> str:
    # semverlib.go normalizeAndParse: drop a "v" prefix, pad to three parts, drop leading zeros
    text = text.removeprefix("v")
    core, sep, rest = text.partition("-") if "-" in text.split("+")[0] else text.partition("+")
    parts = core.split(".")
    if len(parts) < 3:
        parts += ["0"] * (3 - len(parts))
    parts = [p.lstrip("0") or "0" if p.isdigit() else p for p in parts]
    return ".".join(parts) + (sep + rest if sep else "")


def _to_semver(text: str, normalize: bool = False) -> Any:
    candidate = _normalize_semver(text) if normalize else text
    if not _SEMVER_TEXT.match(candidate):
        raise ValueError(f"invalid semver: {text}")
    return _new("kubernetes.Semver", candidate)


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        _to_semver(text, normalize)
    except ValueError:
        return False
    return True


def _semver_parts(v: Any) -> tuple[int, int, int, list[str]]:
    match = _SEMVER_TEXT.match(v.value)
    assert match is not None
    pre = match.group(4)
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), pre.split(".") if pre else []


def _semver_cmp(a: Any, b: Any) -> int:
    # semver.org §11 (blang/semver Version.Compare): numbers, then a version without pre-release
    # is greater, then pre-release identifiers one by one (numeric < alphanumeric).
    ma, na, pa, prea = _semver_parts(a)
    mb, nb, pb, preb = _semver_parts(b)
    if (ma, na, pa) != (mb, nb, pb):
        return 1 if (ma, na, pa) > (mb, nb, pb) else -1
    if not prea or not preb:
        return (not prea) - (not preb)
    for x, y in zip(prea, preb, strict=False):
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return 1 if int(x) > int(y) else -1
        if x.isdigit() != y.isdigit():
            return -1 if x.isdigit() else 1
        return -1 if x < y else 1
    return (len(prea) > len(preb)) - (len(prea) < len(preb))


def _semver_functions() -> list[Any]:
    v = _SEMVER
    return [
        _decl(
            "semver",
            ("string_to_semver", v, [_S], _to_semver, False),
            ("string_bool_to_semver", v, [_S, _B], _to_semver, False),
        ),
        _decl(
            "isSemver",
            ("is_semver_string", _B, [_S], _is_semver, False),
            ("is_semver_string_bool", _B, [_S, _B], _is_semver, False),
        ),
        _decl("major", ("semver_major", _I, [v], lambda a: _semver_parts(a)[0], True)),
        _decl("minor", ("semver_minor", _I, [v], lambda a: _semver_parts(a)[1], True)),
        _decl("patch", ("semver_patch", _I, [v], lambda a: _semver_parts(a)[2], True)),
    ]


# -- IP and CIDR: pkg/cel/library/ip.go, cidr.go -------------------------------------------------


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # ip.go parseIPAddr: netip.ParseAddr without zones or IPv4-mapped IPv6 (Python's parser already
    # refuses leading zeros in IPv4 octets)
    if "%" in text:
        raise ValueError(f"IP address with zone value is not allowed: {text}")
    try:
        address = ipaddress.ip_address(text)
    except ValueError as exc:
        raise ValueError(f"IP Address {text!r} parse error during conversion from string: {exc}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text}")
    return address


def _to_ip(text: str) -> Any:
    return _new("net.IP", str(_parse_ip(text)))


def _is_ip(text: str) -> bool:
    try:
        _parse_ip(text)
    except ValueError:
        return False
    return True


def _ip_is_canonical(text: str) -> bool:
    return str(_parse_ip(text)) == text


def _ip(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(value.value)


def _ip_global_unicast(value: Any) -> bool:
    # netip.Addr.IsGlobalUnicast: not unspecified, loopback, multicast, link-local or broadcast
    a = _ip(value)
    if a == ipaddress.IPv4Address("255.255.255.255"):
        return False
    return not (a.is_unspecified or a.is_loopback or a.is_multicast or a.is_link_local)


def _link_local_multicast(value: Any) -> bool:
    a = _ip(value)
    if isinstance(a, ipaddress.IPv4Address):
        return a in ipaddress.IPv4Network("224.0.0.0/24")
    return a in ipaddress.IPv6Network("ff02::/16")


def _parse_cidr(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    # cidr.go parseCIDR: netip.ParsePrefix (address/bits), IPv4-mapped IPv6 refused
    address, sep, bits = text.partition("/")
    if not sep or not bits.isdigit() or (len(bits) > 1 and bits[0] == "0"):
        raise ValueError(f"network address parse error during conversion from string: {text!r}")
    _parse_ip(address)
    try:
        return ipaddress.ip_interface(text)
    except ValueError as exc:
        raise ValueError(f"network address parse error during conversion from string: {exc}") from None


def _to_cidr(text: str) -> Any:
    return _new("net.CIDR", str(_parse_cidr(text)))


def _is_cidr(text: str) -> bool:
    try:
        _parse_cidr(text)
    except ValueError:
        return False
    return True


def _cidr(value: Any) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    return ipaddress.ip_interface(value.value)


def _contains_ip(c: Any, ip: Any) -> bool:
    address = _parse_ip(ip) if isinstance(ip, str) else _ip(ip)
    return address in _cidr(c).network


def _contains_cidr(c: Any, other: Any) -> bool:
    inner = _parse_cidr(other) if isinstance(other, str) else _cidr(other)
    outer = _cidr(c).network
    return inner.version == outer.version and inner.network.subnet_of(outer)  # type: ignore[arg-type]


def _net_functions() -> list[Any]:
    return [
        _decl("ip", ("string_to_ip", _IP, [_S], _to_ip, False), ("cidr_ip", _IP, [_CIDR], _cidr_ip, True)),
        _decl("isIP", ("is_ip", _B, [_S], _is_ip, False)),
        _decl("ip.isCanonical", ("ip_is_canonical", _B, [_S], _ip_is_canonical, False)),
        _decl("family", ("ip_family", _I, [_IP], lambda a: _ip(a).version, True)),
        _decl("isUnspecified", ("ip_is_unspecified", _B, [_IP], lambda a: _ip(a).is_unspecified, True)),
        _decl("isLoopback", ("ip_is_loopback", _B, [_IP], lambda a: _ip(a).is_loopback, True)),
        _decl("isLinkLocalMulticast", ("ip_is_link_local_multicast", _B, [_IP], _link_local_multicast, True)),
        _decl(
            "isLinkLocalUnicast",
            (
                "ip_is_link_local_unicast",
                _B,
                [_IP],
                lambda a: _ip(a).is_link_local and not _ip(a).is_multicast,
                True,
            ),
        ),
        _decl("isGlobalUnicast", ("ip_is_global_unicast", _B, [_IP], _ip_global_unicast, True)),
        _decl("cidr", ("string_to_cidr", _CIDR, [_S], _to_cidr, False)),
        _decl("isCIDR", ("is_cidr", _B, [_S], _is_cidr, False)),
        _decl(
            "containsIP",
            ("cidr_contains_ip_string", _B, [_CIDR, _S], _contains_ip, True),
            ("cidr_contains_ip_ip", _B, [_CIDR, _IP], _contains_ip, True),
        ),
        _decl(
            "containsCIDR",
            ("cidr_contains_cidr_string", _B, [_CIDR, _S], _contains_cidr, True),
            ("cidr_contains_cidr", _B, [_CIDR, _CIDR], _contains_cidr, True),
        ),
        _decl(
            "masked",
            ("cidr_masked", _CIDR, [_CIDR], lambda c: _new("net.CIDR", str(_cidr(c).network)), True),
        ),
        _decl(
            "prefixLength", ("cidr_prefix_length", _I, [_CIDR], lambda c: _cidr(c).network.prefixlen, True)
        ),
    ]


def _cidr_ip(c: Any) -> Any:
    return _new("net.IP", str(_cidr(c).ip))


# -- URLs: pkg/cel/library/urls.go (Go's url.ParseRequestURI, then url.Parse) --------------------


def _parse_url(text: str) -> Any:
    # ParseRequestURI: an absolute URI or an absolute path; no fragment check (Parse again)
    parts = urlsplit(text)
    if not parts.scheme and not text.startswith("/"):
        raise ValueError(
            f"URL parse error during conversion from string: parse {text!r}: invalid URI for request"
        )
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise ValueError(
            f"URL parse error during conversion from string: parse {text!r}: invalid control character in URL"
        )
    return parts


def _to_url(text: str) -> Any:
    _parse_url(text)
    return _new("kubernetes.URL", text)


def _is_url(text: str) -> bool:
    try:
        _parse_url(text)
    except ValueError:
        return False
    return True


def _url(value: Any) -> SplitResult:
    return urlsplit(str(value.value))


def _hostname(value: Any) -> str:
    netloc = _url(value).netloc.rpartition("@")[2]
    if netloc.startswith("["):
        return netloc[1 : netloc.index("]")] if "]" in netloc else netloc[1:]
    return netloc.partition(":")[0]


def _port(value: Any) -> str:
    netloc = _url(value).netloc.rpartition("@")[2]
    if netloc.startswith("["):
        rest = netloc.partition("]")[2]
        return rest[1:] if rest.startswith(":") else ""
    return netloc.partition(":")[2]


def _query(value: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, item in parse_qsl(_url(value).query, keep_blank_values=True):
        out.setdefault(key, []).append(item)
    return out


def _url_functions() -> list[Any]:
    return [
        _decl("url", ("string_to_url", _URL, [_S], _to_url, False)),
        _decl("isURL", ("is_url_string", _B, [_S], _is_url, False)),
        _decl("getScheme", ("url_get_scheme", _S, [_URL], lambda u: _url(u).scheme, True)),
        _decl("getHost", ("url_get_host", _S, [_URL], lambda u: _url(u).netloc.rpartition("@")[2], True)),
        _decl("getHostname", ("url_get_hostname", _S, [_URL], _hostname, True)),
        _decl("getPort", ("url_get_port", _S, [_URL], _port, True)),
        _decl(
            "getEscapedPath",
            (
                "url_get_escaped_path",
                _S,
                [_URL],
                lambda u: quote(_url(u).path, safe="/:@!$&'()*+,;=-._~%"),
                True,
            ),
        ),
        _decl(
            "getQuery",
            ("url_get_query", cel.Type.Map(_S, _STRINGS), [_URL], _query, True),
        ),
    ]


# -- Regex: pkg/cel/library/regex.go (RE2 there; Python's re here, see docs) ---------------------


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _find(text: str, pattern: str) -> str:
    match = _regex(pattern).search(text)
    return match.group(0) if match else ""


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    found = [m.group(0) for m in _regex(pattern).finditer(text)]
    return found if limit < 0 else found[:limit]


def _regex_functions() -> list[Any]:
    return [
        _decl("find", ("string_find_n", _S, [_S, _S], _find, True)),
        _decl(
            "findAll",
            ("string_find_all", _STRINGS, [_S, _S], _find_all, True),
            ("string_find_all_n", _STRINGS, [_S, _S, _I], _find_all, True),
        ),
    ]


# -- Lists: pkg/cel/library/lists.go and cel-go ext.Lists (version 3), ext.Sets ------------------


def _comparable(items: Iterable[Any]) -> list[Any]:
    values = list(items)
    kinds = {
        bool if isinstance(v, bool) else (float if isinstance(v, int | float) else type(v)) for v in values
    }
    if len(kinds) > 1:
        raise TypeError("no such overload: list elements are not comparable with each other")
    return values


def _is_sorted(items: list[Any]) -> bool:
    values = _comparable(items)
    return all(a <= b for a, b in itertools.pairwise(values))


def _sum(items: list[Any]) -> Any:
    values = _comparable(items)
    if not values:
        return 0
    total = values[0]
    for v in values[1:]:
        total = total + v
    if isinstance(total, int) and not isinstance(total, bool) and not _INT64[0] <= total <= _INT64[1]:
        raise OverflowError("integer overflow")
    return total


def _min(items: list[Any]) -> Any:
    values = _comparable(items)
    if not values:
        raise ValueError("min(list) called on empty list")
    return min(values)


def _max(items: list[Any]) -> Any:
    values = _comparable(items)
    if not values:
        raise ValueError("max(list) called on empty list")
    return max(values)


def _range(n: int) -> list[int]:
    if n > 100_000:  # a list the cost budget would refuse anyway
        raise ValueError(f"lists.range({n}) is larger than mpigate allows (100000)")
    return list(range(n))


def _slice(items: list[Any], start: int, end: int) -> list[Any]:
    if start < 0 or end < 0:
        raise IndexError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise IndexError(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if end > len(items):
        raise IndexError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return items[start:end]


def _flatten(items: list[Any], depth: int = 1) -> list[Any]:
    if depth < 0:
        raise ValueError("level must be non-negative")
    out: list[Any] = []
    for item in items:
        if isinstance(item, list) and depth > 0:
            out.extend(_flatten(item, depth - 1))
        else:
            out.append(item)
    return out


def _distinct(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if not any(item == seen and type(item) is type(seen) for seen in out):
            out.append(item)
    return out


def _sort(items: list[Any]) -> list[Any]:
    return sorted(_comparable(items))


def _sets_contains(a: list[Any], b: list[Any]) -> bool:
    return all(any(x == y for y in a) for x in b)


def _sets_intersects(a: list[Any], b: list[Any]) -> bool:
    return any(any(x == y for y in a) for x in b)


def _list_functions() -> list[Any]:
    lst = _LIST
    return [
        _decl("isSorted", ("list_is_sorted", _B, [lst], _is_sorted, True)),
        _decl("sum", ("list_sum", _DYN, [lst], _sum, True)),
        _decl("min", ("list_min", _DYN, [lst], _min, True)),
        _decl("max", ("list_max", _DYN, [lst], _max, True)),
        _decl("lists.range", ("lists_range", cel.Type.List(_I), [_I], _range, False)),
        _decl("slice", ("list_slice", lst, [lst, _I, _I], _slice, True)),
        _decl(
            "flatten",
            ("list_flatten", lst, [lst], _flatten, True),
            ("list_flatten_int", lst, [lst, _I], _flatten, True),
        ),
        _decl("distinct", ("list_distinct", lst, [lst], _distinct, True)),
        _decl("sort", ("list_sort", lst, [lst], _sort, True)),
        _decl("sets.contains", ("list_sets_contains_list", _B, [lst, lst], _sets_contains, False)),
        _decl(
            "sets.equivalent",
            (
                "list_sets_equivalent_list",
                _B,
                [lst, lst],
                lambda a, b: _sets_contains(a, b) and _sets_contains(b, a),
                False,
            ),
        ),
        _decl("sets.intersects", ("list_sets_intersects_list", _B, [lst, lst], _sets_intersects, False)),
    ]


def functions() -> list[Any]:
    """Every function declaration (with its implementation) of this module."""
    return [
        *_quantity_functions(),
        *_semver_functions(),
        *_net_functions(),
        *_url_functions(),
        *_regex_functions(),
        *_list_functions(),
    ]
