"""The one reader of the environment variables collectived's Python client and torch backend
read. Every variable is in the table generated from rpc/client_environment.h
(environment_table.py); its default and meaning are in docs/clients.md."""

import os

from collectived.environment_table import VARIABLES


def get(name, default=None):
    """``$name`` when set and not empty, else ``default``. KeyError for a name the table does not
    hold (a typo, or a variable to add to rpc/client_environment.h first)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a client environment variable of rpc/client_environment.h")
    value = os.environ.get(name)
    return value if value else default
