
DEFAULT_OUT = "overlap-reports"
"""Where ``run`` and ``report`` write by default: a folder in the working directory, never
inside the installed packages."""
