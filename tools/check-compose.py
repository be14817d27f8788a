#!/usr/bin/env python3
"""Checks contrib/compose.yaml without a container engine: it parses, its relays share one
Postgres store, and compose waits longer than each relay's shutdown grace before SIGKILL."""
import re
import sys
from pathlib import Path

import yaml

repo = Path(__file__).resolve().parent.parent
path = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / "contrib" / "compose.yaml"
compose = yaml.safe_load(path.read_text())


def seconds(text):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h)", str(text)):
        total += int(number) * units[unit]
    if total == 0:
        sys.exit(f"{path}: {text!r} is not a duration")
    return total


services = compose["services"]
relays = {n: s for n, s in services.items() if n.startswith("relay-")}
errors = []
if len(relays) != 3:
    errors.append(f"expected three relay services, found {sorted(relays)}")
stores = {s["environment"]["IDEMRELAY_STORE"] for s in relays.values()}
if len(stores) != 1 or not next(iter(stores)).startswith("postgres://"):
    errors.append(f"the relays must share one Postgres store, found {stores}")
host_ports = [p.split(":")[0] for s in relays.values() for p in s.get("ports", [])]
if len(host_ports) != len(set(host_ports)):
    errors.append(f"host ports collide: {host_ports}")
for name, service in relays.items():
    if "postgres" not in service.get("depends_on", {}):
        errors.append(f"{name} does not wait for postgres")
    grace = seconds(service["environment"].get("IDEMRELAY_SHUTDOWN_GRACE", "30s"))
    stop = seconds(service.get("stop_grace_period", "10s"))
    if stop <= grace:
        errors.append(f"{name}: stop_grace_period {stop}s must exceed shutdown grace {grace}s")

# The image itself must fit `docker stop`'s default 10 s.
dockerfile = (repo / "Dockerfile").read_text()
match = re.search(r"IDEMRELAY_SHUTDOWN_GRACE=(\S+)", dockerfile)
if not match or seconds(match.group(1)) >= 10:
    errors.append("the Dockerfile must set IDEMRELAY_SHUTDOWN_GRACE under docker stop's 10 s")

if errors:
    sys.exit("\n".join(f"{path}: {e}" for e in errors))
print(f"{path}: three relays on one Postgres, stop grace periods fit")
