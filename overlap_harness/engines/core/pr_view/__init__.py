"""A pull request's view of an engine tree: its head and its base run the same variants; what
is reported is the difference (new races attributed to the changed line that made them, races
fixed, necessity changed) and which changed lines the variants ran (docs/pull-requests.md)."""
