"""The one error type a user can cause. The CLI catches it once and prints its message."""


class CbsiteError(Exception):
    """A mistake the user can fix: a bad name, a missing run, a bad option.

    The message says what went wrong *and what to do*. Anything that is not a CbsiteError is a bug
    and keeps its traceback.
    """


def user_code_error(what: str, exc: BaseException, label: str) -> CbsiteError:
    """A CbsiteError for an exception raised by the user's own code (a provider, the model's forward).

    The message is one line: what raised, the exception's type and text, and the file in the temp
    directory that holds the full traceback (`cbsite-<label>-*.log`); the exception stays chained.
    """
    import tempfile
    import traceback

    fd, name = tempfile.mkstemp(prefix=f"cbsite-{label}-", suffix=".log", text=True)
    with open(fd, "w") as f:
        f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:300] + "…"
    return CbsiteError(f"{what} raised {type(exc).__name__}{': ' + text if text else ''} (full traceback in {name})")
