"""One exception type for mistakes a user can fix; the CLI prints it as a single line."""


class SBDError(ValueError):
    """Bad input or an unusable model, reported before any work is wasted."""
