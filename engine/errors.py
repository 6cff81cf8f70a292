"""Errors a user can fix themselves.

Anything raised as a :class:`UserError` is reported by the CLI as one line on stderr with exit
code 2 (and by the server as an HTTP 400); everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ModelSourceError(UserError):
    """The model could not be found, downloaded or converted."""


class WeightsError(UserError):
    """The weight files exist but cannot be used (corrupt, missing tensors, too large)."""


class RequestError(UserError):
    """A request the engine must refuse (prompt longer than the context, bad parameters)."""
