"""How one run executes: the target, the session and its budgets, the context a case body gets,
the runner (isolation, liveness) and the commands behind the CLI."""
