"""The one error type a user can cause. The CLI catches it once and prints its message."""


class CbsiteError(Exception):
    """A mistake the user can fix: a bad name, a missing run, a bad option.

    The message says what went wrong *and what to do*. Anything that is not a CbsiteError is a bug
    and keeps its traceback.
    """
