"""Errors a user can fix. The CLI turns them into one line and exit status 2."""


class TailtrainError(Exception):
    """Base class of every error tailtrain raises on purpose."""


class UsageError(TailtrainError, ValueError):
    """Bad input: the message names what is wrong and how to fix it."""
