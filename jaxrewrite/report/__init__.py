"""What a rewrite tells its user: records of applied and declined rewrites, `explain()`, and
the logger."""
