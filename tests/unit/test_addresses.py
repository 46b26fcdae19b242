"""Tests name only loopback or reserved addresses (issue 56 item 7): a regression that starts a
worker, or a proxy test whose proxy resolves, must never send to a real network. Reserved: the
documentation ranges 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24 (RFC 5737), names under
``.invalid`` (RFC 2606)."""

import ipaddress
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
IPV4 = re.compile(r"(?<![\d.])(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})(?![\d.])")
ALLOWED = [
    ipaddress.ip_network(n) for n in ("127.0.0.0/8", "0.0.0.0/32", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
]


def test_every_address_a_test_names_is_loopback_or_reserved_for_documentation():
    bad = []
    for path in [*TESTS.rglob("*.py"), *TESTS.rglob("*.toml")]:
        if path.resolve() == Path(__file__).resolve():
            continue  # the check's own example below
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in IPV4.finditer(line):
                try:
                    ip = ipaddress.ip_address(m.group(1))
                except ValueError:
                    continue  # a version number, not an address
                if not any(ip in net for net in ALLOWED):
                    bad.append(f"{path.relative_to(TESTS)}:{n}: {ip}")
    assert not bad, "name 127.0.0.1, a 192.0.2.x address or a .invalid name instead:\n" + "\n".join(bad)


def test_the_check_catches_a_private_address():
    line = 'URL = "http://10.0.0.5:8000"  # and 172.16.1.1, 192.168.0.9'
    found = [ipaddress.ip_address(m.group(1)) for m in IPV4.finditer(line)]
    assert [str(ip) for ip in found if not any(ip in net for net in ALLOWED)] == [
        "10.0.0.5",
        "172.16.1.1",
        "192.168.0.9",
    ]
