"""Errors a user can act on.

`UserError` (and subclasses) carry a message that names the problem and the fix; the CLI
prints them without a traceback and exits non-zero. Anything else is a bug or an
infrastructure failure and keeps its traceback.
"""


class UserError(Exception):
    """Bad input or environment that the user can fix."""


class ConfigError(UserError):
    """An invalid option, config file or target."""


class ModelError(UserError):
    """A model that cannot be fetched or imported."""


class BoardError(UserError):
    """A tracker or board that cannot be reached or misbehaves (retryable)."""


class ArtifactError(Exception):
    """An artifact in the store that is missing or does not match its manifest."""
