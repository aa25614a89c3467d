"""Run inside an environment: import every module of the named packages, as a user's program
might, and print each that fails with why (exit 1 if any does). A module that needs a tool its
user brings (the pytest plugin needs pytest) is named with it and left out where it is absent.

    python import_every_module.py lmrpc conformance
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys

BRINGS_ITS_OWN = {"conformance.pytest_plugin": "pytest"}


def main(packages: list[str]) -> int:
    failed = 0
    imported = 0
    for top in packages:
        package = importlib.import_module(top)
        for module in pkgutil.walk_packages(package.__path__, f"{top}."):
            if module.name.endswith(".__main__"):
                continue
            needs = BRINGS_ITS_OWN.get(module.name)
            if needs is not None and importlib.util.find_spec(needs) is None:
                continue
            try:
                importlib.import_module(module.name)
                imported += 1
            except Exception as exc:
                failed += 1
                print(f"{module.name}: {type(exc).__name__}: {exc}")
    print(f"imported {imported} modules of {', '.join(packages)}; {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
