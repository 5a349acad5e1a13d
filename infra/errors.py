"""The one exception type the evaluation CLI reports as a message rather than a traceback."""


class UserError(Exception):
    """Bad input the user can fix (a missing path, an unknown name, a clashing output dir).

    The message must say what was wrong and how to fix it; `python -m evaluation` prints it
    and exits with status 2.
    """
