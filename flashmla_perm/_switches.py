"""On/off switches read from the environment, one definition for all of them.

``1``, ``true``, ``on``, ``yes`` mean on; ``0``, ``false``, ``off``, ``no``
mean off; any case, blanks around the word ignored. Unset or blank: the
default. Anything else is refused (ValueError naming the variable and the
value): a switch that reads a typo as "on" or "off" does what nobody asked.
csrc/switches.h reads the native module's the same way. Imports nothing of
the package: setup.py loads this file on its own.
"""

import os

ON_WORDS = ("1", "true", "on", "yes")
OFF_WORDS = ("0", "false", "off", "no")


def parse(name: str, value, default: bool) -> bool:
    """``value`` (a string, or None for unset) as the switch ``name``."""
    word = (value or "").strip().lower()
    if not word:
        return default
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise ValueError(
        f"{name}={value!r} is not a switch value: use one of {', '.join(ON_WORDS)} (on)"
        f" or {', '.join(OFF_WORDS)} (off), in any case"
    )


def switch(name: str, default: bool, environ=None) -> bool:
    """The switch ``name`` from ``environ`` (default: ``os.environ``)."""
    return parse(name, (os.environ if environ is None else environ).get(name), default)
