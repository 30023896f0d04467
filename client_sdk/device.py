"""Client functions of the terminal chat that act on this machine.

They implement the demo agent's client functions: the battery is read from the
operating system where it reports one; a machine without a battery says so.
"""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["battery_level", "nearest_store", "settings_report"]

_POWER_SUPPLY = Path("/sys/class/power_supply")

# A small store directory for the demo: zip code -> store.
_STORES = {
    10001: ("Midtown", "350 5th Ave, New York, NY"),
    60601: ("Loop", "233 S Wacker Dr, Chicago, IL"),
    92031: ("Vista", "1 Main St, Vista, CA"),
    94103: ("SoMa", "500 Howard St, San Francisco, CA"),
    98101: ("Downtown", "1420 5th Ave, Seattle, WA"),
}


def battery_level() -> dict[str, Any]:
    """Read the battery from the OS: ``{"level": 0..1, "charging": bool}``.

    Raises:
        RuntimeError: this machine reports no battery (a desktop, a server, a VM).
    """
    if _POWER_SUPPLY.is_dir():
        for supply in sorted(_POWER_SUPPLY.iterdir()):
            kind = (supply / "type").read_text().strip() if (supply / "type").exists() else ""
            if kind == "Battery" and (supply / "capacity").exists():
                level = int((supply / "capacity").read_text().strip()) / 100
                status = (
                    (supply / "status").read_text().strip() if (supply / "status").exists() else ""
                )
                return {"level": level, "charging": status == "Charging"}
    if platform.system() == "Darwin":
        output = subprocess.run(
            ["pmset", "-g", "batt"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
        found = re.search(r"(\d+)%;\s*(\w+)", output)
        if found:
            return {"level": int(found.group(1)) / 100, "charging": found.group(2) == "charging"}
    raise RuntimeError("battery level not available: this machine reports no battery")


def nearest_store(zip_code: str) -> dict[str, Any]:
    """The demo store directory's store nearest to a US zip code."""
    if not re.fullmatch(r"\d{5}", zip_code):
        raise ValueError(f"not a US zip code: {zip_code!r}")
    wanted = int(zip_code)
    store_zip = min(_STORES, key=lambda z: abs(z - wanted))
    name, address = _STORES[store_zip]
    return {
        "name": name,
        "address": address,
        "distance_km": round(abs(store_zip - wanted) * 0.8, 1),
    }


def settings_report(url: str, session_id: str, functions: list[str]) -> str:
    """What the chat's 'settings panel' shows."""
    return "\n".join(
        [
            "  ┌ settings",
            f"  │ gateway:   {url}",
            f"  │ session:   {session_id}",
            f"  │ functions: {', '.join(functions)}",
            "  └",
        ]
    )
