"""Boolean switches in the environment (FLASHMLA_PERM_*): 0/1, true/false,
on/off and yes/no, in any case, blanks around them ignored; unset or empty is
the default, and any other value is refused, naming the variable and the
value. csrc/switches.h reads them the same way. No import of the package:
setup.py loads this file on its own."""

import os

TRUE = ("1", "true", "on", "yes")
FALSE = ("0", "false", "off", "no")


def parse(name, raw, default):
    word = (raw or "").strip().lower()
    if not word:
        return default
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f"flashmla_perm: {name} must be one of 0/1, true/false, on/off, yes/no, got {raw!r}")


def switch(name, default=False):
    return parse(name, os.environ.get(name), default)
