"""Address rules at connect time: which IP addresses a lap may open a connection to (issue 13).

Every connection the lap opens (model, HTTP tools, MCP servers, the checkpoint store) is checked by
address, whatever name it resolved from (``lap/netguard.py``, docs/security.md "At connect time"):
the ranges every policy denies (:data:`ALWAYS_DENIED_CIDRS`), loopback unless every policy that
applies allows it, and each policy's ``apiServerCIDRs`` and ``deniedCIDRs``
(:class:`AddressRules`, made by the operator from the run's AgentRunPolicies and handed to the lap
Job). Apart from ``api/tenancy.py`` (the policies, their models and the admission rules) so that a lap
pod does not build the policy models to check an address.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .tenancy import AgentRunPolicySpec

ALWAYS_DENIED_CIDRS: Final = (
    "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128",
    "fd00:ec2::254/128",  # AWS IMDS over IPv6
    "100.100.100.200/32",  # Alibaba Cloud metadata
    "64:ff9b::a9fe:0/112", "64:ff9b::/104", "64:ff9b::6464:64c8/128",  # their NAT64 forms (RFC 6052 prefix)
    "::a9fe:0/112", "::6464:64c8/128",  # their IPv4-compatible forms (::169.254.x.y)
    "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215): where it embeds the IPv4 address is the network's choice
)
"""Cloud metadata (169.254.169.254, AWS's fd00:ec2::254, Alibaba's 100.100.100.200), link-local and
unspecified addresses, and the NAT64 and IPv4-compatible IPv6 forms of the IPv4 ones: denied by every
policy, for model and tool URLs and checkpoint endpoints. (IPv4-mapped forms, ``::ffff:a.b.c.d``, are
no IP address for the API server's CEL: refused as ``hostForm``.) At connect time the lap also checks
the IPv4 address embedded in any IPv6 address it resolves (:func:`embedded_ipv4`)."""
LOOPBACK_CIDRS: Final = ("127.0.0.0/8", "::1/128", "64:ff9b::7f00:0/104", "::7f00:0/104")
ALWAYS_DENIED_DETAIL: Final = "cloud metadata, link-local and unspecified addresses are always refused"


def in_cidrs(a: ipaddress.IPv4Address | ipaddress.IPv6Address, cidrs: list[str] | tuple[str, ...]) -> bool:
    return any(a in ipaddress.ip_network(c, strict=False) for c in cidrs)


IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPAT = ipaddress.ip_network("::/96")


def embedded_ipv4(a: IPAddr) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for on the way out: IPv4-mapped (``::ffff:a.b.c.d``),
    NAT64 with the well-known prefix (``64:ff9b::a.b.c.d``), IPv4-compatible (``::a.b.c.d``, not ``::``
    or ``::1``) and 6to4 (``2002:AABB:CCDD::``); None for any other address."""
    if isinstance(a, ipaddress.IPv4Address):
        return None
    if a.ipv4_mapped is not None:
        return a.ipv4_mapped
    if a in _NAT64 or (a in _COMPAT and int(a) > 1):
        return ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)
    return a.sixtofour


@dataclass(frozen=True)
class AddressRules:
    """What the lap checks the address of every connection against, whatever name it resolved from
    (docs/security.md "At connect time"): the always-denied ranges, loopback unless every policy that
    applies allows it, and each policy's ``apiServerCIDRs`` and ``deniedCIDRs``. The operator makes it
    from the policies it resolved for the run (:func:`agentrun.api.tenancy.check_all`) and hands it to the lap Job as
    :data:`~agentrun.api.contract.Env.ADDRESS_RULES` (:meth:`to_env`). Allowed ranges and host
    names are not in it: they judge what a URL names, at admission; an address a name resolves to is
    judged by what is denied. ``loopback_rule`` names the policy that refuses loopback."""

    denied: tuple[tuple[str, str], ...] = ()
    """(CIDR, "AgentRunPolicy NAME rule destinations.deniedCIDRs") pairs."""
    allow_loopback: bool = True
    loopback_rule: str = ""

    def to_env(self) -> str:
        return json.dumps({"denied": [list(d) for d in self.denied], "allowLoopback": self.allow_loopback,
                           "loopbackRule": self.loopback_rule}, separators=(",", ":"))

    @classmethod
    def from_env(cls, text: str) -> AddressRules:
        """The rules from :meth:`to_env`'s text; ValueError naming what is wrong."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        denied = doc.get("denied", [])
        if not isinstance(denied, list) or not all(
                isinstance(d, list) and len(d) == 2 and all(isinstance(x, str) for x in d) for d in denied):
            raise ValueError("denied must be a list of [CIDR, rule] pairs")
        for cidr, _ in denied:
            ipaddress.ip_network(cidr, strict=False)
        allow, rule = doc.get("allowLoopback", True), doc.get("loopbackRule", "")
        if not isinstance(allow, bool) or not isinstance(rule, str):
            raise ValueError("allowLoopback must be a boolean and loopbackRule a string")
        return cls(tuple((c, r) for c, r in denied), allow, rule)

    @classmethod
    def of(cls, policies: dict[str, AgentRunPolicySpec]) -> AddressRules:
        """The rules of every policy that applies to a run (each one's denials hold)."""
        denied: list[tuple[str, str]] = []
        loopback_rule = ""
        for name in sorted(policies):
            d = policies[name].destinations
            denied += [(c, f"AgentRunPolicy {name} rule destinations.apiServerCIDRs") for c in d.api_server_cidrs]
            denied += [(c, f"AgentRunPolicy {name} rule destinations.deniedCIDRs") for c in d.denied_cidrs]
            if not d.allow_loopback and not loopback_rule:
                loopback_rule = f"AgentRunPolicy {name} rule destinations.allowLoopback"
        return cls(tuple(denied), not loopback_rule, loopback_rule)


class AddressRefusal(Exception):  # noqa: N818 - a refusal, raised by the lap's connection guards
    """A connection the address rules refused before it was opened (nothing was sent): raised by
    the lap's guards (``lap/netguard.py``), recognised by the checkpoint store's error translation."""


def address_refusal(a: IPAddr, rules: AddressRules) -> str | None:
    """Why the lap may not connect to address ``a`` (also judged as the IPv4 address it embeds,
    :func:`embedded_ipv4`), or None."""
    v4 = embedded_ipv4(a)
    for x in (a,) if v4 is None else (a, v4):
        via = "" if x is a else f" (the IPv4 address {x})"
        for c in ALWAYS_DENIED_CIDRS:
            if x in ipaddress.ip_network(c):
                return (f"address {a}{via} is in {c}: {ALWAYS_DENIED_DETAIL} "
                        "(AgentRunPolicy rule destinations.alwaysDenied)")
        if not rules.allow_loopback and in_cidrs(x, LOOPBACK_CIDRS):
            return f"address {a}{via} is loopback, refused unless allowLoopback is true ({rules.loopback_rule})"
        for c, rule in rules.denied:
            if x in ipaddress.ip_network(c, strict=False):
                return f"address {a}{via} is in the denied range {c} ({rule})"
    return None
